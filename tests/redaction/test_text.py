"""The text rules' shortcuts change nothing: the literal checks in front of each rule, and the
one scan (``may_hold_secret``) in front of them all, only skip what no rule would change."""

from __future__ import annotations

import pytest

from app.redaction import may_hold_secret, redact_text
from app.redaction.text import rules


def every_rule(text: str) -> str:
    """The reference: every rule's pass, without the scan or the literal checks."""
    for rule in rules():
        text = rule.apply(text)
    return text


@pytest.mark.parametrize(
    "text",
    [
        "AUTHORIZATION: BEARER abcdefghijklmnop and BeArEr qrstuvwxyz012345",
        '{"Password" : "hunter2hunter2", "API-Key": "k3y-value", "Token":"zzzz"}',
        "-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY----- mail a@b.io",
        "ASIAABCDEFGHIJKLMNOP whsec_abcdefghijklmnop eyJa1234567.eyJb1234567.sig12345678",
        '"author_association": "OWNER", "login": "octocat", plain text with no secret',
        "SET-COOKIE: a=b; Path=/ and ftp://u:p4ss@host/ and BASIC dXNlcjpwYXNz",
        "4111-1111-1111-1111 and 1234 5678 9012 3456 7",
        "numbers 2026-11-29 12:00 and #4711, nothing else",
    ],
)
def test_shortcuts_skip_only_what_no_rule_changes(text: str) -> None:
    assert redact_text(text) == every_rule(text)
    if redact_text(text) != text:
        assert may_hold_secret(text)


def test_long_runs_of_what_the_patterns_repeat() -> None:
    key = "password" + "_1" * 20_000  # digits are dropped: still a password
    assert redact_text(f"{key}=x y") == f"{key}=[REDACTED:password] y"
    digits = "1 " * 20_000 + "4111 1111 1111 1111"
    assert redact_text(digits).endswith("1 [REDACTED:card]")
    assert redact_text("a_" * 20_000 + "=x") == "a_" * 20_000 + "=x"


def test_long_runs_of_spaces_and_markers() -> None:
    """The shapes that once took seconds (``bench.redaction`` times them) come out right."""
    spaces = " " * 20_000
    assert redact_text(f"password{spaces}: x, y") == f"password{spaces}: [REDACTED:password], y"
    assert redact_text(f"password{spaces}bearer") == f"password{spaces}bearer"
    assert redact_text(f"cookie{spaces}=a\nok") == f"cookie{spaces}=[REDACTED:cookie]\nok"
    begins = "-----BEGIN PRIVATE KEY-----" * 1_000
    assert redact_text(f"key: {begins}") == "key: [REDACTED:private_key]"
    dashes = "eyJ-" * 5_000
    assert redact_text(f"{dashes}x Bearer") == f"{dashes}x Bearer"


def test_a_private_key_cut_short_is_redacted_to_the_end_of_the_text() -> None:
    cut = "log: -----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq\nMIIEbody"
    assert redact_text(cut) == "log: [REDACTED:private_key]"
    whole = cut + "\n-----END RSA PRIVATE KEY-----\nafter"
    assert redact_text(whole) == "log: [REDACTED:private_key]\nafter"


def test_the_words_of_a_key_are_separated_by_spaces() -> None:
    """As the scan reads names: "api key" is one, a tab ends a key ("password\t_" is "_")."""
    assert redact_text("api key: k-1, x") == "api key: [REDACTED:api_key], x"
    assert redact_text("password\t_=x") == "password\t_=x"
    assert every_rule("password\t_=x") == "password\t_=x"


def test_an_assignment_inside_a_value_that_is_no_secret_is_found() -> None:
    assert redact_text("see https://host/cb?password=pw-1&x=1") == (
        "see https://host/cb?password=[REDACTED:password]&x=1"
    )
    assert redact_text("db:password=pw-2 user: bob") == "db:password=[REDACTED:password] user: bob"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4111 1111 1111 1111", "[REDACTED:card]"),
        ("3782-822463-10005", "[REDACTED:card]"),
        ("4222 2222 2222 2", "[REDACTED:card]"),  # a 13-digit Visa
        ("6759 6498 2643 8453 003", "[REDACTED:card]"),  # 19 digits in five groups
        ("ids 12 4111 1111 1111 1111 7", "ids 12 [REDACTED:card] 7"),
        # Six groups or more: no one writes a card that way.
        ("4 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "4 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"),
        ("411 111 111 111 111 1", "411 111 111 111 111 1"),
    ],
)
def test_a_card_is_written_in_at_most_five_groups(text: str, expected: str) -> None:
    assert redact_text(text) == expected

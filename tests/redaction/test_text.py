"""The text rules' shortcuts change nothing: the literal checks in front of each rule, and the
one scan (``may_hold_secret``) in front of them all, only skip what no rule would change."""

from __future__ import annotations

import pytest

from app.redaction import may_hold_secret, redact_text
from app.redaction.text import rules


def every_rule(text: str) -> str:
    """The reference: every rule's pass, without the scan or the literal checks."""
    for _, pattern, replacement in rules():
        text = pattern.sub(replacement, text)
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

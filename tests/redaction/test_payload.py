"""The structural redaction of event payloads: keys that name secrets, values that look like
credentials, JSON held in strings, form bodies, card numbers, depth, and what stays intact."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.redaction import (
    MAX_DEPTH,
    NestingTooDeep,
    redact_payload,
    redact_text,
    redact_to_json,
    secret_kind,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "payloads"
BASIC = base64.b64encode(b"deploy:S3cr3t-basic").decode()


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("password", "password"),
        ("PASSWORD", "password"),
        ("db_password", "password"),
        ("dbPassword", "password"),
        ("adminpassword", "password"),
        ("password2", "password"),
        ("password_confirmation", "password"),
        ("passwd", "password"),
        ("pwd", "password"),
        ("passphrase", "password"),
        ("secret", "secret"),
        ("client_secret", "secret"),
        ("clientSecret", "secret"),
        ("token", "token"),
        ("access_token", "token"),
        ("X-Auth-Token", "token"),
        ("refreshToken", "token"),
        ("api_key", "api_key"),
        ("apiKey", "api_key"),
        ("APIKey", "api_key"),
        ("x-api-key", "api_key"),
        ("apikey", "api_key"),
        ("aws_secret_access_key", "access_key"),
        ("AWS_SECRET_ACCESS_KEY", "access_key"),
        ("secret_key", "secret_key"),
        ("private_key", "private_key"),
        ("privateKey", "private_key"),
        ("credentials", "credentials"),
        ("Authorization", "authorization"),
        ("proxy-authorization", "authorization"),
        ("basic_auth", "authorization"),
        ("cookie", "cookie"),
        ("Set-Cookie", "cookie"),
        ("session_id", "session"),
        ("sessionId", "session"),
        ("JSESSIONID", "session"),
        ("card_number", "card"),
        ("cardNumber", "card"),
        ("pan", "card"),
        ("cvv", "card"),
        ("cvv2", "card"),
        ("user.password", "password"),
        ("passwords", "password"),
        ("api_keys", "api_key"),
        ("accessKeys", "access_key"),
        ("access_tokens", "token"),
        ("credit_cards", "card"),
    ],
)
def test_keys_naming_a_secret(key: str, kind: str) -> None:
    assert secret_kind(key) == kind


@pytest.mark.parametrize(
    "key",
    [
        "access_tokens_url",
        "keys_url",
        "token_type",
        "max_tokens",
        "tokens_used",
        "input_tokens",
        "key",
        "public_key",
        "ssh_key",
        "secret_scanning",
        "secret_type",
        "password_hash",
        "author",
        "author_association",
        "monkey",
        "span",
        "japan",
        "session",
        "id",
        "number",
        "signature",
        "tokens",
        "auths",
        "pans",
    ],
)
def test_keys_that_only_mention_a_secret(key: str) -> None:
    assert secret_kind(key) is None


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("x_" * 200 + "api_key", "api_key"),
        ("a." * 30_000, None),
        ("password" + "_new" * 100, "password"),  # only qualifiers in the last characters
        ("x" * 300 + "password", "password"),  # one word: it ends with a secret word
        ("db_" + "x" * 300 + "password", None),  # two words: the last is not a secret word
    ],
)
def test_long_keys_are_decided_as_short_ones(key: str, kind: str | None) -> None:
    assert secret_kind(key) == kind


@pytest.mark.parametrize(
    "value",
    ["hunter2", 12345, 4111111111111111, None, True, {"user": "a", "pass": "b"}, ["x", "y"]],
)
def test_a_secret_keys_value_is_replaced_whatever_its_type(value: Any) -> None:
    payload = {"config": {"db_password": value, "host": "db"}, "n": 1}
    assert redact_payload(payload) == {
        "config": {"db_password": "[REDACTED:password]", "host": "db"},
        "n": 1,
    }


def test_github_keys_that_mention_tokens_are_kept() -> None:
    payload = {
        "installation": {"id": 1, "access_tokens_url": "https://api.github.com/x/access_tokens"},
        "repository": {"keys_url": "https://api.github.com/repos/a/b/keys{/key_id}"},
        "usage": {"token_type": "bearer", "max_tokens": 1024, "tokens_used": 17},
        "key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB",
    }
    assert redact_payload(payload) == payload


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("github_*.json")), ids=lambda p: p.stem)
def test_github_fixtures_stay_byte_identical(path: Path) -> None:
    raw = path.read_bytes()
    payload = orjson.loads(raw)
    assert orjson.dumps(redact_payload(payload)) == orjson.dumps(payload)
    kept, data = redact_to_json(payload)
    assert kept is payload
    assert data == orjson.dumps(payload)


@pytest.mark.parametrize(
    ("text", "leaked", "expected"),
    [
        (
            "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq\n"
            "-----END RSA PRIVATE KEY-----\nend",
            "MIIEowIBAAKCAQEA7bq",
            "key:\n[REDACTED:private_key]\nend",
        ),
        (
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0",
            "eyJzdWIiOiIxMjM0NTY3ODkwIn0",
            "jwt [REDACTED:jwt]",
        ),
        ("sent Bearer abcdefghijklmnop123 ok", "abcdefghijklmnop123", "sent [REDACTED:bearer] ok"),
        ("sk-ant-api03-abcdefghijklmnopqrstuv", "abcdefghijklmnop", "[REDACTED:api_key]"),
        ("use sk-proj-abcdefghijklmnop", "abcdefghijklmnop", "use [REDACTED:api_key]"),
        ("xoxb-1234567890-abcdefghij", "1234567890", "[REDACTED:api_key]"),
        ("ghp_0123456789abcdefghijklmnopqrstuvwxyz", "0123456789abc", "[REDACTED:api_key]"),
        ("github_pat_11ABCDEFG0123456789_abcdefghijkl", "11ABCDEFG", "[REDACTED:api_key]"),
        ("id AKIAIOSFODNN7EXAMPLE.", "AKIAIOSFODNN7EXAMPLE", "id [REDACTED:aws_key]."),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2La", "MfKQ9r8GKYqr", "[REDACTED:whsec]"),
        (f"Basic {BASIC}", BASIC, "Basic [REDACTED:basic_auth]"),
        (f"curl -H 'X: basic {BASIC}'", BASIC, "curl -H 'X: basic [REDACTED:basic_auth]'"),
        (
            "postgres://app:hunter2pw@db.internal:5432/app",
            "hunter2pw",
            "postgres://app:[REDACTED:password]@db.internal:5432/app",
        ),
        (
            "redis://:cache-pw-1@cache:6379/0",
            "cache-pw-1",
            "redis://:[REDACTED:password]@cache:6379/0",
        ),
        (
            "see https://bot:p@ss:w0rd@example.com/path?q=1",
            "p@ss:w0rd",
            "see https://bot:[REDACTED:password]@example.com/path?q=1",
        ),
        ("password=hunter2", "hunter2", "password=[REDACTED:password]"),
        ("db password: hunter2 (rotated)", "hunter2", "db password: [REDACTED:password] (rotated)"),
        (
            "level=error msg=auth failed api_key=k-9f8e7d user=bob",
            "k-9f8e7d",
            "level=error msg=auth failed api_key=[REDACTED:api_key] user=bob",
        ),
        (
            'export AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI/K7MDENG/bPxRfiCY"',
            "wJalrXUtnFEMI",
            'export AWS_SECRET_ACCESS_KEY="[REDACTED:access_key]"',
        ),
        (
            "Authorization: Basic abc123xyz",
            "abc123xyz",
            "Authorization: [REDACTED:authorization]",
        ),
        ("Cookie: sid=abc; theme=dark", "sid=abc", "Cookie: [REDACTED:cookie]"),
        ("card 4111 1111 1111 1111 exp 12/29", "4111 1111", "card [REDACTED:card] exp 12/29"),
        ("5555-5555-5555-4444", "5555-5555", "[REDACTED:card]"),
        ("amex 378282246310005.", "378282246310005", "amex [REDACTED:card]."),
        ("mc2 2223003122003222", "2223003122003222", "mc2 [REDACTED:card]"),
        ("jcb 3530111333300000", "3530111333300000", "jcb [REDACTED:card]"),
        ("diners 30569309025904", "30569309025904", "diners [REDACTED:card]"),
        ("disc 6011111111111117", "6011111111111117", "disc [REDACTED:card]"),
    ],
)
def test_credential_looking_strings(text: str, leaked: str, expected: str) -> None:
    assert redact_text(text) == expected
    assert leaked not in redact_text(text)
    assert redact_payload({"note": text, "list": [text]}) == {"note": expected, "list": [expected]}


@pytest.mark.parametrize(
    "text",
    [
        "jane.doe@example.org wrote it",  # e-mail addresses are not secrets
        "a basic question about the build",
        "Basic aGVsbG8gd29ybGQ=",  # decodes to "hello world": no user:password
        "4111111111111112",  # bad Luhn sum
        "1234567812345670",  # good Luhn sum, no card issuer starts with 1
        "7000000000000005",
        "411111111111",  # 12 digits
        "order 1700000000000 at 2026-11-29T21:00:00Z",  # a timestamp in ms
        "ratio 0.4111111111111111",  # the digits of a fraction
        "commit 4f2a9c81e0b1d2c3f4a5b6c7d8e9f0a1b2c3d4e5",
        "https://user@example.com/path and git@github.com:acme/api.git",
        "token budget exceeded",
        "the secret is out",
        "monkey: banana",
        "Bearer short",
    ],
)
def test_ordinary_strings_are_kept(text: str) -> None:
    assert redact_text(text) == text
    assert redact_payload({"v": text}) == {"v": text}


def test_card_numbers_as_json_numbers_are_redacted_only_by_key() -> None:
    payload = {"id": 4111111111111111, "card_number": 4111111111111111, "ids": [5555555555554444]}
    assert redact_payload(payload) == {
        "id": 4111111111111111,
        "card_number": "[REDACTED:card]",
        "ids": [5555555555554444],
    }


def test_json_in_strings_is_redacted_structurally_several_levels_deep() -> None:
    level3 = orjson.dumps({"client_secret": "cs-level3", "ok": 3}).decode()
    level2 = orjson.dumps({"password": "pw-level2", "next": level3}).decode()
    level1 = orjson.dumps({"token": "tk-level1", "next": level2, "plain": "kept"}).decode()
    out = redact_payload({"body": level1})
    text = orjson.dumps(out).decode()
    for secret in ("cs-level3", "pw-level2", "tk-level1"):
        assert secret not in text
    one = orjson.loads(out["body"])
    two = orjson.loads(one["next"])
    three = orjson.loads(two["next"])
    assert one["token"] == "[REDACTED:token]" and one["plain"] == "kept"
    assert two["password"] == "[REDACTED:password]"
    assert three == {"client_secret": "[REDACTED:secret]", "ok": 3}


def test_json_in_a_string_with_nothing_to_redact_is_kept_as_written() -> None:
    text = '{ "a" : 1,\n  "b": [1, 2] }'
    assert redact_payload({"raw": text}) == {"raw": text}
    # Not JSON after all: the text rules still apply.
    broken = '{"password": "hunter2", "truncated'
    assert redact_payload({"raw": broken}) == {
        "raw": '{"password": "[REDACTED:password]", "truncated'
    }


def test_form_bodies_and_query_strings() -> None:
    payload = {
        "form": "user=bob&password=hunter2&remember=1",
        "callback": "https://app.example.com/cb?state=xyz&access_token=at-123&x=1",
        "escaped": '{\\"password\\": \\"pw-escaped\\"}',
    }
    assert redact_payload(payload) == {
        "form": "user=bob&password=[REDACTED:password]&remember=1",
        "callback": "https://app.example.com/cb?state=xyz&access_token=[REDACTED:token]&x=1",
        "escaped": '{\\"password\\": \\"[REDACTED:password]\\"}',
    }


def test_arrays_at_any_level() -> None:
    payload = [
        {"items": [{"token": "t-1"}, {"name": "kept"}]},
        ["Bearer abcdefghijklmnop", 3, None, ["password=deep-in-a-list"]],
    ]
    assert redact_payload(payload) == [
        {"items": [{"token": "[REDACTED:token]"}, {"name": "kept"}]},
        ["[REDACTED:bearer]", 3, None, ["password=[REDACTED:password]"]],
    ]


def test_the_input_is_not_changed() -> None:
    payload = {"password": "hunter2", "nested": [{"token": "t"}]}
    before = orjson.dumps(payload)
    redact_payload(payload)
    redact_to_json(payload)
    assert orjson.dumps(payload) == before


def test_redact_to_json_returns_the_redacted_payload_and_its_json() -> None:
    payload = {"a": 1, "password": "hunter2"}
    redacted, data = redact_to_json(payload)
    assert redacted == {"a": 1, "password": "[REDACTED:password]"}
    assert data == orjson.dumps(redacted)
    clean = {"a": [1, 2, {"b": "c"}]}
    same, data = redact_to_json(clean)
    assert same is clean and data == orjson.dumps(clean)


def _nest(levels: int, leaf: Any) -> Any:
    node = leaf
    for n in range(levels):
        node = {"password": "pw", "next": node} if n % 2 else [node, "Bearer abcdefghijklmnop"]
    return node


def test_depth_254_is_redacted_and_255_refused() -> None:
    assert MAX_DEPTH == 254
    deep = redact_payload(_nest(254, 1))
    assert "Bearer abcdefghijklmnop" not in orjson.dumps(deep).decode()
    _, data = redact_to_json(_nest(254, 1))
    assert b'"pw"' not in data
    plain: Any = "nothing to redact"
    for _ in range(255):
        plain = [plain]
    for payload in (_nest(255, 1), _nest(5000, 1), plain):
        with pytest.raises(NestingTooDeep, match="JSON is nested deeper than 254 levels"):
            redact_payload(payload)
        with pytest.raises(NestingTooDeep, match="JSON is nested deeper than 254 levels"):
            redact_to_json(payload)


def test_json_in_a_string_has_the_same_depth_limit() -> None:
    ok = "[" * 254 + '"password=x"' + "]" * 254
    assert "password=x" not in orjson.dumps(redact_payload({"s": ok})).decode()
    # orjson parses up to 1024 levels: the walker, not Python's recursion, must stop it.
    too_deep = "[" * 1000 + '"password=x"' + "]" * 1000
    with pytest.raises(NestingTooDeep):
        redact_payload({"s": too_deep})
    with pytest.raises(NestingTooDeep):
        redact_to_json({"s": too_deep})

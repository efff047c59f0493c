"""Price table lookups and overrides; redaction of secrets and addresses in audit text."""

from __future__ import annotations

import pytest

from app.config import parse_config
from app.llm.pricing import PriceTable, Usage
from app.llm.redaction import _PATTERNS, audit_text, prompt_hash, redact
from tests.llm.harness import config_text


def test_prices_match_ids_by_prefix_and_bedrock_ids() -> None:
    table = PriceTable.from_config(parse_config(config_text()))
    usage = Usage(1_000_000, 1_000_000, 1_000_000, 1_000_000)
    assert table.cost_usd("claude-sonnet-4-6", usage) == pytest.approx(3 + 15 + 3.75 + 0.30)
    assert table.cost_usd("us.anthropic.claude-haiku-4-5-20251001-v1:0", usage) == (
        pytest.approx(1 + 5 + 1.25 + 0.10)
    )
    # The longer key wins: opus-4-1 is not priced as opus-4-5 or opus-4.
    assert table.cost_usd("claude-opus-4-1", Usage(output_tokens=1_000_000)) == 75.0
    assert table.cost_usd("some-other-model", usage) == 0.0


def test_config_prices_override_the_builtin_table() -> None:
    extra = """
models:
  claude-sonnet-4-6:
    requests_per_minute: 50
    price: {input: 1, output: 2, cache_write: 3, cache_read: 4}
"""
    config = parse_config(config_text() + extra)
    table = PriceTable.from_config(config)
    assert table.cost_usd("claude-sonnet-4-6", Usage(1_000_000, 0, 0, 1_000_000)) == 5.0
    assert config.models["claude-sonnet-4-6"].requests_per_minute == 50


@pytest.mark.parametrize(
    ("text", "leaked", "kind"),
    [
        ("contact jane.doe@example.org now", "jane.doe@example.org", "email"),
        ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop", "bearer"),
        ("key sk-ant-api03-abcdefghijklmnopqrstuv", "abcdefghijklmnopqrstuv", "api_key"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", "aws_key"),
        ('{"password": "hunter2hunter2"}', "hunter2hunter2", "secret"),
        ("ghp_0123456789abcdefghijklmnop", "0123456789abcdef", "api_key"),
        ("jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.c2lnbmF0dXJlMTIz", "eyJzdWIiOiIxMjM0", "jwt"),
    ],
)
def test_redaction_removes_secrets_and_addresses(text: str, leaked: str, kind: str) -> None:
    redacted = redact(text)
    assert leaked not in redacted
    assert f"[REDACTED:{kind}]" in redacted


def _every_pattern(text: str) -> str:
    """The reference: every pattern's pass, without the literal pre-checks."""
    for kind, _, pattern in _PATTERNS:
        replacement = r"\1[REDACTED:secret]" if kind == "secret" else f"[REDACTED:{kind}]"
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
    ],
)
def test_literal_pre_checks_skip_no_match(text: str) -> None:
    assert redact(text) == _every_pattern(text)


def test_audit_text_modes_and_hash() -> None:
    blocks = [{"type": "text", "text": "mail me at a@b.io"}]
    assert audit_text("none", blocks) is None
    assert "a@b.io" in (audit_text("full", blocks) or "")
    assert "a@b.io" not in (audit_text("redacted", blocks) or "")
    assert prompt_hash({"a": 1, "b": 2}) == prompt_hash({"b": 2, "a": 1})
    assert prompt_hash({"a": 1}) != prompt_hash({"a": 2})

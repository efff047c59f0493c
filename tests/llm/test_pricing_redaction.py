"""Price table lookups and overrides; redaction of secrets and addresses in audit text."""

from __future__ import annotations

import pytest

from app.config import parse_config
from app.decide.audit_text import audit_text, prompt_hash, redact
from app.llm.pricing import PriceTable, Usage
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
        ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop", "authorization"),
        ("sent Bearer abcdefghijklmnop", "abcdefghijklmnop", "bearer"),
        ("key sk-ant-api03-abcdefghijklmnopqrstuv", "abcdefghijklmnopqrstuv", "api_key"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", "aws_key"),
        ('{"password": "hunter2hunter2"}', "hunter2hunter2", "password"),
        ("ghp_0123456789abcdefghijklmnop", "0123456789abcdef", "api_key"),
        ("jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.c2lnbmF0dXJlMTIz", "eyJzdWIiOiIxMjM0", "jwt"),
    ],
)
def test_redaction_removes_secrets_and_addresses(text: str, leaked: str, kind: str) -> None:
    redacted = redact(text)
    assert leaked not in redacted
    assert f"[REDACTED:{kind}]" in redacted


def test_audit_text_modes_and_hash() -> None:
    blocks = [{"type": "text", "text": "mail me at a@b.io"}]
    assert audit_text("none", blocks) is None
    assert "a@b.io" in (audit_text("full", blocks) or "")
    assert "a@b.io" not in (audit_text("redacted", blocks) or "")
    assert prompt_hash({"a": 1, "b": 2}) == prompt_hash({"b": 2, "a": 1})
    assert prompt_hash({"a": 1}) != prompt_hash({"a": 2})


def test_redacted_audit_text_catches_secrets_behind_escaped_quotes() -> None:
    # The prompt is serialised into the audit row, so the payload's quotes arrive escaped.
    prompt = '<event_payload>\n{"db":{"password":"pw-in-prompt","card":"4111 1111 1111 1111"}}'
    text = audit_text("redacted", [{"role": "user", "content": prompt}]) or ""
    assert "pw-in-prompt" not in text
    assert "4111 1111 1111 1111" not in text
    assert "[REDACTED:password]" in text

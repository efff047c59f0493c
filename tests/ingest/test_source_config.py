"""Source config validation: each error names the key it is about."""

from __future__ import annotations

import pytest

from app.config import ConfigError, parse_config

BASE = """
pipelines:
  p: {model: m, system: s, tools: [t]}
tools:
  t: {description: d, input_schema: {type: object}}
"""


def errors_for(source: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(f"sources:\n  s:\n{source}{BASE}", env={})
    return info.value.errors


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("    type: github\n    pipeline: p\n", "sources.s: a 'github' source needs 'secret'"),
        ("    type: alertmanager\n    pipeline: p\n", "needs 'token' or 'basic_auth'"),
        ("    type: aws-sns\n    pipeline: p\n", "needs 'topic_arns'"),
        (
            "    type: github\n    pipeline: p\n    secret: sc-secret-0123456\n    split: true\n",
            "split: not used by a 'github'",
        ),
        (
            "    type: token\n    pipeline: p\n    token: sc-token-01234567\n"
            "    collapse: {window_seconds: 60}\n",
            "collapse.fingerprint: needed",
        ),
        (
            "    type: hmac\n    pipeline: p\n    secret: sc-secret-0123456\n"
            "    signature: {algorithm: md5}\n",
            "sources.s.signature.algorithm",
        ),
        (
            "    type: hmac\n    pipeline: p\n    secret: sc-secret-0123456\n"
            "    signature: {signed_payload: '{ts}.{body}'}\n",
            "signed_payload may use only",
        ),
        (
            "    type: token\n    pipeline: p\n    token: sc-token-01234567\n"
            "    filters: {require: [{path: a, equals: 1, gt: 2}]}\n",
            "needs exactly one of",
        ),
        ("    type: nope\n    pipeline: p\n", "sources.s.type"),
    ],
)
def test_bad_source_config_names_the_key(source: str, expected: str) -> None:
    assert any(expected in e for e in errors_for(source)), errors_for(source)


def test_llm_group_id_policy_needs_the_property() -> None:
    text = """
sources:
  s: {type: token, pipeline: p, token: sc-token-01234567}
pipelines:
  p: {model: m, system: s, tools: [t]}
tools:
  t: {description: d, input_schema: {type: object}, group_id: llm}
"""
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert any("tools.t" in e and "message_group_id" in e for e in info.value.errors)
    ok = text.replace(
        "{type: object}", "{type: object, properties: {message_group_id: {type: string}}}"
    )
    assert parse_config(ok, env={}).tools["t"].group_id == "llm"

"""Secrets in realistic payload shapes that once survived redaction into the stored event (and
so into the prompt, the audit log and the admin API). ``redact_to_json`` is what ingest runs
on every event; the last test goes over HTTP."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.redaction import redact_to_json

PASSWORD = "Qx7Lm2Vz9-hunter"


def _stored(payload: Any) -> str:
    """The payload's JSON as ingest queues it (redaction on, the default)."""
    _, data = redact_to_json(payload)
    return data.decode()


@pytest.mark.parametrize(
    "payload",
    [
        {"db": {"passwords": [PASSWORD]}},
        {"service": {"api_keys": [PASSWORD]}},
        {"tls": {"private_keys": {"web": PASSWORD}}},
        {"accessKeys": [PASSWORD]},
        {"oauth": {"refresh_tokens": [PASSWORD]}},
        {"form": f"user=bob&passwords={PASSWORD}"},
    ],
    ids=["passwords", "api_keys", "private_keys", "accessKeys", "refresh_tokens", "in-text"],
)
def test_plural_secret_keys_are_redacted(payload: dict[str, Any]) -> None:
    assert PASSWORD not in _stored(payload)


def test_tokens_alone_are_counted_not_secret() -> None:
    usage = {"usage": {"max_tokens": 1024, "input_tokens": 17, "tokens": 30}, "auths": {"a": 1}}
    assert _stored(usage) == orjson.dumps(usage).decode()

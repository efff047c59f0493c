"""Prompt and response text for the audit log: ``full``, ``redacted`` or ``none``.

``redacted`` applies the credential rules of ``app.redaction`` (keys, tokens, private keys,
passwords in URLs, card numbers ...) to the serialised text, and replaces e-mail addresses
too: they are kept in payloads, but the audit log has no need for them. Payloads were
redacted structurally at ingest already, so this is a second line. The prompt hash is always
taken over the full request, so equal prompts can be found even when their text is not stored.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

import orjson

from app.redaction import redact_text

TextMode = Literal["full", "redacted", "none"]

_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")


def redact(text: str) -> str:
    text = redact_text(text)
    return _EMAIL.sub("[REDACTED:email]", text) if "@" in text else text


def audit_text(mode: TextMode, value: Any) -> str | None:
    """``value`` (a string, or JSON-able blocks) as the audit log keeps it under ``mode``."""
    if mode == "none" or value is None:
        return None
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if mode == "full" else redact(text)


def prompt_hash(request: dict[str, Any]) -> str:
    """sha256 of the canonical request (model, system, tools, messages)."""
    return hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).hexdigest()

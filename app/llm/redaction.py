"""Prompt and response text for the audit log: ``full``, ``redacted`` or ``none``.

``redacted`` replaces e-mail addresses, bearer tokens, API keys (Anthropic, OpenAI-style,
AWS, GitHub, Slack), JWTs, PEM private keys and ``secret=...``-style assignments with
``[REDACTED:<kind>]``. The prompt hash is always taken over the full request, so equal
prompts can be found even when their text is not stored.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

import orjson

TextMode = Literal["full", "redacted", "none"]

# (kind, a literal every match contains (in lower case for a case-blind pattern), pattern).
# The literal is checked first: a substring test costs a fraction of a regex pass, and most
# prompts contain few of them.
_PATTERNS: list[tuple[str, str | None, re.Pattern[str]]] = [
    (
        "private_key",
        "PRIVATE KEY-----",
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
    ),
    (
        "jwt",
        "eyJ",
        re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ),
    ("bearer", "bearer", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}")),
    (
        "api_key",
        None,
        re.compile(r"\b(?:sk-ant-|sk-|xox[abprs]-|gh[pousr]_|github_pat_)[A-Za-z0-9_-]{10,}"),
    ),
    ("aws_key", "IA", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("whsec", "whsec_", re.compile(r"\bwhsec_[A-Za-z0-9+/=]{10,}")),
    (
        # Group 1 (kept) is the name and separator; an opening quote before the name stays
        # in place either way, so the match starts at the name.
        "secret",
        None,
        re.compile(
            r"(?i)((?:password|passwd|secret|token|api[_-]?key|access[_-]?key|auth)\"?"
            r"\s*[:=]\s*\"?)([^\s\"',}]{4,})"
        ),
    ),
    ("email", "@", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")),
]


def redact(text: str) -> str:
    # Taken once: a replacement ("[REDACTED:...]") cannot create a literal checked later.
    lowered = text.lower()
    for kind, literal, pattern in _PATTERNS:
        if literal is not None:
            haystack = lowered if pattern.flags & re.IGNORECASE else text
            if literal not in haystack:
                continue
        if kind == "secret":
            text = pattern.sub(r"\1[REDACTED:secret]", text)
        else:
            text = pattern.sub(f"[REDACTED:{kind}]", text)
    return text


def audit_text(mode: TextMode, value: Any) -> str | None:
    """``value`` (a string, or JSON-able blocks) as the audit log keeps it under ``mode``."""
    if mode == "none" or value is None:
        return None
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if mode == "full" else redact(text)


def prompt_hash(request: dict[str, Any]) -> str:
    """sha256 of the canonical request (model, system, tools, messages)."""
    return hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).hexdigest()

"""Secrets out of payloads, logs and audit text; below every stage (it imports none of them).

- ``keys``: which keys name a secret (the rule is in its docstring).
- ``text``: credential-looking text (the rules, and the one scan in front of them).
- ``payload``: the structural walk over a JSON payload, with the scan as its pre-check.

The ingest stage redacts each event's payload once, when the event is built; the LLM stage's
audit text and the log processor use the text rules as a second line.
"""

from app.redaction.keys import secret_kind
from app.redaction.payload import (
    MAX_DEPTH,
    NestingTooDeep,
    payload_to_json,
    redact_payload,
    redact_to_json,
)
from app.redaction.text import may_hold_secret, redact_text

__all__ = [
    "MAX_DEPTH",
    "NestingTooDeep",
    "may_hold_secret",
    "payload_to_json",
    "redact_payload",
    "redact_text",
    "redact_to_json",
    "secret_kind",
]

"""Bounds on the event fields that become database columns, applied once at ingest.

Every source type's ``Described`` events pass through here before anything is queued, so an
event answered 2xx is one the worker can store: ``type`` and ``delivery_id`` are
``String(200)`` columns and ``group_key`` is ``String(512)`` (``app/store/models.py``), and
PostgreSQL text refuses NUL.

- A key (group key, delivery id) that is too long or holds a control character is replaced
  by a sanitised prefix + ``#sha256:<hex of the original>``, within the column's length: the
  same input always gives the same key, so dedup and per-key order still hold, and a person
  reading it still recognises the start of the original.
- An event type that is too long or holds a control character is refused (400): it is the
  name filters, prompts and published messages show, and a stand-in would silently change
  which ``allow_types``/``deny_types`` match.

(The payload's own limit, 254 levels of nesting, is checked where it is serialised:
``app.redaction.payload_to_json``.)
"""

from __future__ import annotations

import hashlib
import re

from app.sources.exceptions import InvalidPayload

MAX_TYPE_CHARS = 200
MAX_DELIVERY_ID_CHARS = 200
MAX_GROUP_KEY_CHARS = 512

# C0 and C1 controls, DEL, and lone surrogates (which cannot be encoded as UTF-8 at all).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_DIGEST_CHARS = len("#sha256:") + 64


def bounded_key(value: str, limit: int) -> str:
    """``value`` itself when it fits and is printable; else its deterministic stand-in."""
    if len(value) <= limit and _CONTROL.search(value) is None:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    prefix = _CONTROL.sub("", value)[: limit - _DIGEST_CHARS]
    return f"{prefix}#sha256:{digest}"


def checked_type(value: str) -> str:
    if len(value) > MAX_TYPE_CHARS:
        raise InvalidPayload(
            f"event type is {len(value)} characters long; at most {MAX_TYPE_CHARS} are allowed"
        )
    if _CONTROL.search(value) is not None:
        raise InvalidPayload("event type contains a control character")
    return value

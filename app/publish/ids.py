"""SNS FIFO ids. Both are derived from data we own, never from the LLM's text."""

from __future__ import annotations

import hashlib
import re

# SNS allows letters, digits and punctuation, up to 128 characters.
_VALID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")


def message_group_id(group_key: str) -> str:
    """The group key itself when SNS accepts it, else a stable hash of it."""
    if _VALID.match(group_key):
        return group_key
    return "h-" + hashlib.sha256(group_key.encode()).hexdigest()


def deduplication_id(event_id: str, index: int, generation: int = 0) -> str:
    """Same value for the same tool call however often it is retried.

    An operator replay is a new decision (``generation`` > 0) and gets new ids, so SNS does
    not drop it as a duplicate of the earlier publish; generation 0 keeps the original value.
    """
    key = f"{event_id}:{index}" if generation == 0 else f"{event_id}:{index}:g{generation}"
    return hashlib.sha256(key.encode()).hexdigest()

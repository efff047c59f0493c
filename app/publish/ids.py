"""SNS FIFO ids. Both are derived from data we own, never from the LLM's text."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

# SNS allows letters, digits and punctuation, up to 128 characters.
# fullmatch, never match with $: "$" also matches before a trailing newline.
_VALID = re.compile(r"[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}")


def message_group_id(group_key: str) -> str:
    """The group key itself when SNS accepts it, else a stable hash of it."""
    if _VALID.fullmatch(group_key):
        return group_key
    return "h-" + hashlib.sha256(group_key.encode()).hexdigest()


def deduplication_id(event_id: str, index: int, generation: int = 0) -> str:
    """Same value for the same tool call however often it is retried.

    An operator replay is a new decision (``generation`` > 0) and gets new ids, so SNS does
    not drop it as a duplicate of the earlier publish; generation 0 keeps the original value.
    """
    key = f"{event_id}:{index}" if generation == 0 else f"{event_id}:{index}:g{generation}"
    return hashlib.sha256(key.encode()).hexdigest()


GroupIdPolicy = Literal["event", "llm"]


def resolve_group_id(policy: GroupIdPolicy, event_key: str, tool_input: Any) -> tuple[str, bool]:
    """The MessageGroupId of one tool call, and whether Claude proposed a different one.

    ``event``: always the event's key (Claude's ``message_group_id``, if any, is only compared).
    ``llm``: Claude's ``message_group_id`` when it is a valid SNS id, else the event's key.
    ``disagreed`` is True when Claude proposed an id that differs from the event's.
    """
    event_id = message_group_id(event_key)
    proposed = tool_input.get("message_group_id") if isinstance(tool_input, dict) else None
    if not isinstance(proposed, str) or not proposed:
        return event_id, False
    disagreed = proposed not in (event_key, event_id)
    if policy == "llm" and _VALID.fullmatch(proposed):
        return proposed, disagreed
    return event_id, disagreed

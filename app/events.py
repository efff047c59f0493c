"""The event: what every stage passes on, so it lives in none of them.

Ingest makes an event from a verified delivery, the queue carries its bytes, the decide stage
renders it for Claude, the store keeps its row, the admin API replays it. ``make_event`` is the
one way to build one from a source's config, for a new delivery and for a replay alike, so a
replayed event is rendered exactly as the original was.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from pydantic import BaseModel

from app.source_config import SourceConfig


class EventStatus:
    """The stored states of an event. A delivery a filter drops is answered ``filtered`` and
    counted, but never stored, so it has no status here.

    ``held``: the decision is stored, and every tool call of it still to publish has no topic,
    so the relay will never send it. Not final: the event is done with as far as the gateway
    can take it, but a tool call of it was not published (``published`` says they all were).
    A topic configured later does not release them: the topic is stored with each call when
    it is decided.

    ``windowed``: a pipeline with a ``window`` took the event into a window of its key; the
    window is decided as one event of source ``window`` (``app/decide/windows.py``), whose
    status says what came of it. Final for the event itself.
    """

    QUEUED = "queued"
    PROCESSING = "processing"
    HELD = "held"
    PUBLISHED = "published"
    NO_ACTION = "no_action"
    DEAD_LETTERED = "dead_lettered"
    WINDOWED = "windowed"


FINAL_STATUSES = frozenset(
    {
        EventStatus.PUBLISHED,
        EventStatus.NO_ACTION,
        EventStatus.DEAD_LETTERED,
        EventStatus.WINDOWED,
    }
)
# The source of the event that stands for a closed window (not a configured source).
WINDOW_SOURCE = "window"


class Event(BaseModel):
    id: str
    source: str
    type: str
    group_key: str
    delivery_id: str
    pipeline: str
    received_at: datetime
    payload: Any
    # How the prompt renders the payload: the source's type and its prompt budget.
    source_type: str | None = None
    prompt_budget_chars: int | None = None
    # Operator replays so far (0 for a fresh event); part of the published dedup ids.
    generation: int = 0

    def to_bytes(self, *, payload_json: bytes | None = None) -> bytes:
        """``payload_json``, when given, must be the payload's own JSON: it is embedded as is
        (ingest has it already), so the payload is neither serialised twice nor one level
        deeper than orjson's limit."""
        # orjson serializes the payload and the datetime natively: about 7x faster on the
        # ingest hot path than a pydantic model_dump of the whole payload first.
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        if payload_json is not None:
            fields["payload"] = orjson.Fragment(payload_json)
        return orjson.dumps(fields)

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Event:
        return cls.model_validate(orjson.loads(data))

    def summary(self) -> dict[str, str]:
        """The event fields that every published message carries."""
        return {
            "id": self.id,
            "source": self.source,
            "type": self.type,
            "group_key": self.group_key,
            "received_at": self.received_at.isoformat(),
        }


def make_event(
    *,
    id: str,
    source: str,
    config: SourceConfig | None,
    type: str,
    group_key: str,
    delivery_id: str,
    pipeline: str,
    received_at: datetime,
    payload: Any,
    generation: int = 0,
) -> Event:
    """An event of ``source``, rendered as its ``config`` says (None when the source is no
    longer configured: the generic rendering)."""
    return Event(
        id=id,
        source=source,
        type=type,
        group_key=group_key,
        delivery_id=delivery_id,
        pipeline=pipeline,
        received_at=received_at,
        payload=payload,
        source_type=config.type if config is not None else None,
        prompt_budget_chars=config.prompt_budget_chars if config is not None else None,
        generation=generation,
    )

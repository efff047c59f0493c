"""Admin API response shapes.

Audit rows (``llm_calls``) and tool calls (outbox rows) are serialized column by column, so
columns added to those tables appear in the API without a schema change here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

T = TypeVar("T")

EventStatusName = Literal[
    "queued", "processing", "held", "published", "no_action", "dead_lettered", "windowed"
]


class Window(BaseModel, Generic[T]):
    """One page of a listing, newest first, without a count (the console's: as fast with a
    million rows as with ten); pass ``next_cursor`` back as ``cursor`` for the next page
    (null on the last one)."""

    items: list[T]
    next_cursor: str | None


class Page(Window[T], Generic[T]):
    """A ``Window`` with ``total``, the count of every match of the filters."""

    total: int


class TimelineEntry(BaseModel):
    at: datetime | None
    stage: str
    detail: str | None = None


class DeadLetterOut(BaseModel):
    id: int
    event_id: str
    stage: str
    reason: str
    created_at: datetime
    replayed_at: datetime | None


class EventSummary(BaseModel):
    event_id: str
    source: str | None
    type: str | None
    group_key: str | None
    status: EventStatusName
    received_at: datetime | None
    updated_at: datetime | None = None
    generation: int = 0
    error: str | None = None


class EventDetail(EventSummary):
    # What the sender's headers said (delivery id, event type) and the payload as stored
    # (redacted at ingest unless EVENTGATE_PAYLOAD_REDACTION=off).
    delivery_id: str | None = None
    pipeline: str | None = None
    deliveries: int = 0
    payload: dict[str, Any] | None = None
    timeline: list[TimelineEntry]
    llm_calls: list[dict[str, Any]]
    tool_calls: list[dict[str, Any]]
    dead_letter: DeadLetterOut | None
    # Shadow candidates' decisions of this event (none unless a pipeline has shadows).
    shadow: list[dict[str, Any]] = []
    # The window the event was decided in (a ``windowed`` event), or that it stands for (an
    # event of source ``window``): its bounds, and the event that decided it.
    window: dict[str, Any] | None = None
    # Its requests through the Message Batches API (a ``mode: batch`` pipeline), oldest first.
    batch: list[dict[str, Any]] = []


class ReplayAccepted(BaseModel):
    dead_letter_id: int
    event_id: str
    generation: int
    status: Literal["queued"] = "queued"


class EventReplayAccepted(BaseModel):
    event_id: str
    generation: int
    status: Literal["queued"] = "queued"

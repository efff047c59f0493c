"""Tables: events, llm_calls (the audit log), outbox, dead_letters.

An event row is written by the worker when it first processes the event; until then the
event lives only in its Redis stream (status ``queued``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC)


class FreeText(TypeDecorator[str]):
    """Text that can come from outside (errors quoting Claude's reply or a tool name, the
    prompt and reply texts): PostgreSQL refuses NUL in text, so a NUL is stored as the six
    characters ``\\u0000``. Without it one NUL in a reply made the decision impossible to
    store, and every retry paid for another Claude call."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is not None and "\x00" in value:
            return value.replace("\x00", "\\u0000")
        return value


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class EventRow(Base):
    __tablename__ = "events"
    # A key's earlier events, for the prompt's history (migration 0008).
    __table_args__ = (Index("ix_events_group_key_received", "group_key", "received_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    source: Mapped[str] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(200))
    group_key: Mapped[str] = mapped_column(String(512))
    delivery_id: Mapped[str] = mapped_column(String(200))
    pipeline: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32), index=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, index=True
    )
    deliveries: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(FreeText, default=None)
    # Times an operator replayed the event; the current generation of its outbox rows.
    replays: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Lease epoch of the latest worker tenure that started processing it (see the worker).
    fence: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The window it was taken into (``windowed``), and its place there (migration 0011).
    window_id: Mapped[int | None] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), default=None, index=True
    )
    window_position: Mapped[int | None] = mapped_column(Integer, default=None)


class BatchRequestStatus:
    """``pending``: waiting for a batch; ``submitting``: claimed by a process that is sending
    it (``claimed_at``); ``submitted``: in batch ``batch_id``; ``answered``: its reply is
    stored, waiting for its key's earlier requests; ``done``: decided, or dead-lettered."""

    PENDING = "pending"
    SUBMITTING = "submitting"
    SUBMITTED = "submitted"
    ANSWERED = "answered"
    DONE = "done"


class BatchRequestRow(Base):
    """One event's Claude request through the Message Batches API (``app/decide/
    batch_lane.py``, migration 0012): one per event and generation."""

    __tablename__ = "batch_requests"
    __table_args__ = (
        UniqueConstraint("event_id", "generation", name="uq_batch_requests_event"),
        Index("ix_batch_requests_status", "status"),
        Index("ix_batch_requests_key", "pipeline", "group_key", "id"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    event_id: Mapped[str] = mapped_column(String(64))
    generation: Mapped[int] = mapped_column(Integer, default=0)
    pipeline: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # The Messages API request as sent (``ClaudeRequest.as_api()``), redacted as the prompt is.
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    batch_id: Mapped[str | None] = mapped_column(String(100), default=None, index=True)
    llm_call_id: Mapped[str | None] = mapped_column(String(64), default=None)
    # The reply (``ClaudeReply`` fields) once the batch answered, until it is decided.
    reply: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    error: Mapped[str | None] = mapped_column(FreeText, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    submitted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)


class WindowStatus:
    """``open`` takes the key's events; ``closed`` (by time or count) takes no more and its
    event is to be enqueued; ``enqueued``: its event is on the stream (``event_id``)."""

    OPEN = "open"
    CLOSED = "closed"
    ENQUEUED = "enqueued"


class WindowRow(Base):
    """A window of one pipeline's key (``app/decide/windows.py``, migration 0011). At most one
    is open per pipeline and key."""

    __tablename__ = "windows"
    __table_args__ = (
        Index(
            "uq_windows_open",
            "pipeline",
            "group_key",
            unique=True,
            postgresql_where=text("status = 'open'"),
            sqlite_where=text("status = 'open'"),
        ),
        Index("ix_windows_status_closes", "status", "closes_at"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    pipeline: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(16))
    events: Mapped[int] = mapped_column(Integer, default=0)
    first_event_id: Mapped[str | None] = mapped_column(String(64), default=None)
    last_event_id: Mapped[str | None] = mapped_column(String(64), default=None)
    opened_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    closes_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    closed_by: Mapped[str | None] = mapped_column(String(16), default=None)  # time | count
    # The event that stands for the window once closed (source ``window``).
    event_id: Mapped[str | None] = mapped_column(String(64), default=None)


class LlmCallStatus:
    """``unknown`` is written before the call and completed after it: a row left ``unknown``
    is an attempt whose process died (or lost the database) before the outcome was known."""

    UNKNOWN = "unknown"
    OK = "ok"
    RETRY = "retry"
    ERROR = "error"
    INVALID_TOOL_INPUT = "invalid_tool_input"
    # The call succeeded, but another worker had already stored this event's decision.
    SUPERSEDED = "superseded"


class LlmCallRow(Base):
    """One row per attempt: success, API error, timeout or connection failure."""

    __tablename__ = "llm_calls"
    __table_args__ = (Index("ix_llm_calls_event_attempt", "event_id", "attempt"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(64))
    pipeline: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String(100), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32), index=True)
    request_id: Mapped[str | None] = mapped_column(String(200), default=None)
    latency_ms: Mapped[float] = mapped_column(Float)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cache_creation_input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cache_read_input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    stop_reason: Mapped[str | None] = mapped_column(String(64), default=None)
    tool_calls: Mapped[list[Any]] = mapped_column(JSON, default=list)
    error_type: Mapped[str | None] = mapped_column(String(100), default=None)
    error: Mapped[str | None] = mapped_column(FreeText, default=None)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, index=True
    )
    # Added by migration 0002_llm_audit.
    provider: Mapped[str] = mapped_column(String(32), default="anthropic")
    retry_reason: Mapped[str | None] = mapped_column(String(200), default=None)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    breaker_state: Mapped[str | None] = mapped_column(String(16), default=None)
    prompt_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    prompt_text: Mapped[str | None] = mapped_column(FreeText, default=None)
    response_text: Mapped[str | None] = mapped_column(FreeText, default=None)
    # Added by migration 0009: the decision came from the response cache (no call, no cost).
    cache_hit: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Added by migration 0012: the Message Batches batch the attempt went in (``mode: batch``).
    batch_id: Mapped[str | None] = mapped_column(String(100), default=None, index=True)
    # Added by migration 0006: ``live``, or a run that publishes nothing (CallPurpose).
    purpose: Mapped[str] = mapped_column(
        String(16), default="live", server_default="live", index=True
    )


class CallPurpose:
    """Why a call was made: only ``live`` calls decide what is published."""

    LIVE = "live"
    SHADOW = "shadow"
    REPLAY = "replay"
    CONSISTENCY = "consistency"
    EVAL = "eval"


class ShadowDecisionRow(Base):
    """A shadow candidate's decision of one live event, beside the live one (migration 0007).

    The calls are ``[{"tool", "input"}]`` in order: the live decision as stored in the outbox,
    the candidate's as the live path would have stored it. ``candidate_calls`` is None, and
    ``error`` says why, when the candidate gave no decision.
    """

    __tablename__ = "shadow_decisions"
    __table_args__ = (Index("ix_shadow_decisions_candidate_created", "candidate", "created_at"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    event_id: Mapped[str] = mapped_column(String(64), index=True)
    baseline: Mapped[str] = mapped_column(String(64))
    candidate: Mapped[str] = mapped_column(String(64))
    baseline_calls: Mapped[list[Any]] = mapped_column(JSON)
    candidate_calls: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    agreement: Mapped[str] = mapped_column(String(16))  # exact | action | none | error
    baseline_cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    candidate_cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    baseline_latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    candidate_latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(FreeText, default=None)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, index=True
    )


class OutboxStatus:
    PENDING = "pending"
    PUBLISHED = "published"
    DEAD = "dead"


# Relay slots: a message group's rows all carry its slot, and relays split the slots between
# them (``app/publish/shards.py``). Stored in rows, so the count can never change.
RELAY_SLOTS = 256


def slot_of(group_id: str) -> int:
    """The relay slot of a message group (migration 0010 computes the same)."""
    return zlib.crc32(group_id.encode()) % RELAY_SLOTS


def _slot_default(context: DefaultExecutionContext) -> int:
    """For writers that leave the slot out (the worker sets it, ``outbox_row``)."""
    parameters = context.get_current_parameters()  # type: ignore[no-untyped-call]
    return slot_of(parameters["group_id"])


class OutboxRow(Base):
    """A tool call waiting to be (or already) published; ``id`` order is publish order.

    ``generation`` is the event's replay count when the row was written: a replay stores a new
    generation beside the earlier one (kept as history) with its own dedup ids.

    ``relay_slot`` is ``slot_of(group_id)``, set when the row is written; NULL in a row that a
    process older than migration 0010 wrote during an upgrade, which the relay reads as the
    slot computed from its group (``OutboxRepository.pending``).
    """

    __tablename__ = "outbox"
    __table_args__ = (
        UniqueConstraint("event_id", "generation", "seq", name="uq_outbox_event_generation_seq"),
        Index("ix_outbox_status_id", "status", "id"),
        Index("ix_outbox_status_slot_id", "status", "relay_slot", "id"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    event_id: Mapped[str] = mapped_column(String(64), ForeignKey("events.id"))
    # The event's source: a message attribute, kept here so the relay never parses the body.
    source: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(Integer)
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    llm_call_id: Mapped[str] = mapped_column(String(64))
    tool: Mapped[str] = mapped_column(String(64))
    topic_arn: Mapped[str | None] = mapped_column(String(300), default=None)
    group_id: Mapped[str] = mapped_column(String(128))
    relay_slot: Mapped[int | None] = mapped_column(SmallInteger, default=_slot_default)
    dedup_id: Mapped[str] = mapped_column(String(128), unique=True)
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(32), default=OutboxStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(FreeText, default=None)
    sns_message_id: Mapped[str | None] = mapped_column(String(200), default=None)
    sns_sequence_number: Mapped[str | None] = mapped_column(String(200), default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)


@dataclass(slots=True)
class PendingRow:
    """An outbox row as the relay's fetch returns it: the columns' values in the table's
    order (``PendingRow(*row)``), without ORM state. The relay only reads them, and building
    an ``OutboxRow`` per fetched row took 18 µs, more than the fetch of 500 rows itself."""

    id: int
    event_id: str
    source: str
    seq: int
    generation: int
    llm_call_id: str
    tool: str
    topic_arn: str | None
    group_id: str
    relay_slot: int | None
    dedup_id: str
    body: str
    status: str
    attempts: int
    last_error: str | None
    sns_message_id: str | None
    sns_sequence_number: str | None
    created_at: datetime
    published_at: datetime | None


class DeadLetterRow(Base):
    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    event_id: Mapped[str] = mapped_column(String(64), index=True)
    stage: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(FreeText)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    replayed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)

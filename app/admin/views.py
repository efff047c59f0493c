"""Rows → admin API shapes: audit rows and tool calls column by column, and the timeline."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import inspect

from app.admin.pagination import as_utc
from app.admin.schemas import DeadLetterOut, EventSummary, TimelineEntry
from app.store.models import (
    Base,
    CallPurpose,
    DeadLetterRow,
    EventRow,
    LlmCallRow,
    OutboxRow,
)


def columns(row: Base, *, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every mapped column of ``row`` (new columns included), datetimes in UTC."""
    out: dict[str, Any] = {}
    for attr in inspect(type(row)).column_attrs:
        if attr.key in exclude:
            continue
        value = getattr(row, attr.key)
        out[attr.key] = as_utc(value) if isinstance(value, datetime) else value
    return out


def llm_call(row: LlmCallRow) -> dict[str, Any]:
    """The audit row; ``shadow`` marks a shadow candidate's call (``purpose`` says which run
    a call that is not live belongs to)."""
    return columns(row) | {"shadow": row.purpose == CallPurpose.SHADOW}


def tool_call(row: OutboxRow) -> dict[str, Any]:
    """The outbox row, with the published message body parsed instead of its JSON text."""
    out = columns(row, exclude=frozenset({"body"}))
    out["message"] = orjson.loads(row.body)
    return out


def dead_letter(row: DeadLetterRow) -> DeadLetterOut:
    return DeadLetterOut.model_validate(columns(row))


def summary(row: EventRow) -> EventSummary:
    return EventSummary(
        event_id=row.id,
        source=row.source,
        type=row.type,
        group_key=row.group_key,
        status=row.status,  # written from EventStatus only
        received_at=as_utc(row.received_at),
        updated_at=as_utc(row.updated_at),
        generation=row.replays,
        error=row.error,
    )


def timeline(
    event: EventRow,
    *,
    calls: Sequence[LlmCallRow],
    outbox: Sequence[OutboxRow],
    dead_letters: Sequence[DeadLetterRow],
) -> list[TimelineEntry]:
    """What happened to the event, oldest first (ties keep the order they were added)."""
    entries = [
        TimelineEntry(at=as_utc(event.received_at), stage="received", detail="verified and queued")
    ]
    for call in calls:
        outcome = call.status if not call.error_type else f"{call.status} ({call.error_type})"
        run = "" if call.purpose == CallPurpose.LIVE else f" ({call.purpose}, {call.pipeline})"
        entries.append(
            TimelineEntry(
                at=as_utc(call.created_at),
                stage="llm_call",
                detail=f"{call.model} attempt {call.attempt}{run}: {outcome}",
            )
        )
    for row in outbox:
        where = row.topic_arn or "no topic configured"
        entries.append(
            TimelineEntry(
                at=as_utc(row.created_at),
                stage="tool_call_stored",
                detail=f"{row.tool} #{row.seq} (generation {row.generation}) → {where}",
            )
        )
        if row.published_at is not None:
            entries.append(
                TimelineEntry(
                    at=as_utc(row.published_at),
                    stage="published",
                    detail=f"{row.tool} #{row.seq}: SNS message {row.sns_message_id}",
                )
            )
    for dead in dead_letters:
        entries.append(
            TimelineEntry(
                at=as_utc(dead.created_at),
                stage="dead_lettered",
                detail=f"{dead.stage}: {dead.reason}",
            )
        )
        if dead.replayed_at is not None:
            entries.append(
                TimelineEntry(
                    at=as_utc(dead.replayed_at),
                    stage="replayed",
                    detail=f"dead letter {dead.id} replayed",
                )
            )
    return sorted(entries, key=lambda e: e.at or as_utc(event.received_at))

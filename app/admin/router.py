"""Admin API, HTTP only (Bearer EVENTGATE_ADMIN_TOKEN on every route)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import AfterValidator

from app.admin.deps import AdminServiceDep, require_admin
from app.admin.repository import DeadLetterFilter, EventFilter, LlmCallFilter
from app.admin.schemas import (
    DeadLetterOut,
    EventDetail,
    EventReplayAccepted,
    EventStatusName,
    EventSummary,
    Page,
    ReplayAccepted,
)
from app.errors import error_responses

_ERRORS = error_responses(
    [
        (400, "InvalidCursor", "cursor is not one this API handed out"),
        (401, "Unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)"),
        (404, "NotFound", "no event with that id"),
        (409, "AlreadyReplayed", "this dead letter was already replayed"),
        (422, "ValidationError", "query.limit: Input should be less than or equal to 500"),
        (503, "AdminDisabled", "admin API is disabled: set EVENTGATE_ADMIN_TOKEN"),
    ]
)

router = APIRouter(tags=["admin"], dependencies=[Depends(require_admin)], responses=_ERRORS)

Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
# Ids are 64-bit row ids: a larger number is a 422, not an overflow deep in the driver.
DeadLetterId = Annotated[int, Path(ge=1, le=2**63 - 1)]
Cursor = Annotated[str | None, Query(description="next_cursor of the previous page")]
# PostgreSQL refuses NUL in text: a filter or id carrying one is a 422, not a driver error.
_NO_NUL = r"^[^\x00]*$"
Text = Annotated[str | None, Query(pattern=_NO_NUL, max_length=512)]


def _utc(value: datetime) -> datetime:
    """Query times without an offset are read as UTC; one that leaves datetime's range once
    moved to UTC (9999-12-31T23:59-14:00) is a 422."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("time is out of range once converted to UTC") from None


Time = Annotated[datetime | None, AfterValidator(lambda v: None if v is None else _utc(v))]


@router.get("/v1/events/{event_id}", response_model=EventDetail)
async def get_event(
    event_id: Annotated[str, Path(pattern=_NO_NUL, max_length=512)], service: AdminServiceDep
) -> EventDetail:
    """State, timeline, every LLM attempt, every tool call and the latest dead letter.

    An event still on the queue (no worker has stored it yet) is `queued` with only its id.
    """
    return await service.event(event_id)


@router.get("/v1/events", response_model=Page[EventSummary])
async def list_events(
    service: AdminServiceDep,
    status: EventStatusName | None = None,
    source: Text = None,
    since: Time = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> Page[EventSummary]:
    """Stored events, newest first."""
    flt = EventFilter(status=status, source=source, since=since)
    return await service.events(flt, limit=limit, cursor=cursor)


@router.post("/v1/events/{event_id}/replay", status_code=202, response_model=EventReplayAccepted)
async def replay_held_event(
    event_id: Annotated[str, Path(pattern=_NO_NUL, max_length=512)], service: AdminServiceDep
) -> EventReplayAccepted:
    """Put a `held` event back on its queue as a new generation, once its tools have a
    topic: Claude decides again and the new tool calls are published (the held ones stay
    unpublished). 409 unless the event is `held`."""
    return await service.replay_held(event_id)


@router.get("/v1/llm-calls", response_model=Page[dict[str, Any]])
async def list_llm_calls(
    service: AdminServiceDep,
    event_id: Text = None,
    pipeline: Text = None,
    model: Text = None,
    status: Text = None,
    since: Time = None,
    until: Time = None,
    purpose: Text = None,
    shadow: bool | None = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> Page[dict[str, Any]]:
    """The audit log (one row per Claude attempt: tokens, cost, latency, outcome), newest
    first; `since` inclusive, `until` exclusive. `purpose`: `live`, or the run that publishes
    nothing (`shadow`, `replay`, `consistency`, `eval`); `shadow=true|false`: only, or no,
    shadow candidates' calls (each row says `shadow`)."""
    flt = LlmCallFilter(
        event_id=event_id,
        pipeline=pipeline,
        model=model,
        status=status,
        since=since,
        until=until,
        purpose=purpose,
        shadow=shadow,
    )
    return await service.llm_calls(flt, limit=limit, cursor=cursor)


@router.get("/v1/shadow")
async def shadow(
    service: AdminServiceDep,
    candidate: Annotated[str, Query(pattern=_NO_NUL, max_length=64)],
    since: Time = None,
    until: Time = None,
) -> dict[str, Any]:
    """How a shadow candidate's decisions of live events compare with the live ones (its
    newest 10,000 in the window): `events`, `action_agreement`, `exact_agreement`, `fields`
    (per enum/boolean/number input field), `group_id_agreement` (fractions, null when nothing
    was compared), `cost_usd` and `latency_ms` of each side, `errors`, `disagreements`."""
    return await service.shadow(candidate, since=since, until=until)


@router.get("/v1/dead-letters", response_model=Page[DeadLetterOut])
async def list_dead_letters(
    service: AdminServiceDep,
    event_id: Text = None,
    stage: Text = None,
    replayed: bool | None = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> Page[DeadLetterOut]:
    """Dead letters, newest first; `replayed=false` lists the ones still to handle."""
    flt = DeadLetterFilter(event_id=event_id, stage=stage, replayed=replayed)
    return await service.dead_letters(flt, limit=limit, cursor=cursor)


@router.post(
    "/v1/dead-letters/{dead_letter_id}/replay", status_code=202, response_model=ReplayAccepted
)
async def replay_dead_letter(
    dead_letter_id: DeadLetterId, service: AdminServiceDep
) -> ReplayAccepted:
    """Put the event back on its queue as a new generation: Claude decides again and its
    tool calls get new deduplication ids. 409 if already replayed or the event moved on."""
    return await service.replay(dead_letter_id)

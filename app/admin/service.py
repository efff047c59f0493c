"""Admin logic: what happened to an event, the audit log, dead letters and their replay, and
the replay of a held event.

Replay invariant (both replays): the event row is locked, reset (status ``queued``, a new
generation) and only committed after its entry is on the stream, so a worker never sees the
entry before the reset (on PostgreSQL it waits for the lock) and a failed XADD leaves the
dead letter, or the held event, as it was.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin import views
from app.admin.exceptions import (
    DeadLetterNotFound,
    EventNotFound,
    ReplayConflict,
    ShadowCandidateNotFound,
)
from app.admin.pagination import (
    as_utc,
    decode_id_cursor,
    decode_time_cursor,
    id_cursor,
    time_cursor,
)
from app.admin.repository import AdminRepository, DeadLetterFilter, EventFilter, LlmCallFilter
from app.admin.schemas import (
    DeadLetterOut,
    EventDetail,
    EventReplayAccepted,
    EventSummary,
    Page,
    ReplayAccepted,
    TimelineEntry,
    Window,
)
from app.admin.shadow import event_shadows, shadow_report, shadow_rows
from app.errors import QueueUnavailable
from app.events import WINDOW_SOURCE, Event, EventStatus, make_event
from app.faults import REDIS_ERRORS
from app.queue.requeue import requeue_event
from app.queue.streams import EventQueue
from app.source_config import SourceConfig
from app.store import batches
from app.store.models import EventRow, ShadowDecisionRow, WindowRow, utcnow
from app.store.repository import (
    DeadLetterRepository,
    EventRepository,
    LlmCallRepository,
    OutboxRepository,
)
from app.store.windows import window_view

log = structlog.get_logger(__name__)
R = TypeVar("R")
T = TypeVar("T")


class AdminService:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        queue: EventQueue,
        sources: Mapping[str, SourceConfig],
        tool_schemas: Mapping[str, Mapping[str, Any]] | None = None,
        candidates: frozenset[str] = frozenset(),
    ) -> None:
        self.sessions = sessions
        self.queue = queue
        self.sources = sources
        self.tool_schemas = tool_schemas or {}
        self.candidates = candidates  # configured shadow candidates

    async def event(self, event_id: str) -> EventDetail:
        async with self.sessions() as session:
            row = await EventRepository(session).get(event_id)
            if row is None:
                return await self._queued_only(event_id)
            calls = await LlmCallRepository(session).for_event(event_id)
            outbox = await OutboxRepository(session).for_event(event_id)
            dead = await DeadLetterRepository(session).for_event(event_id)
            shadows = await session.scalars(
                select(ShadowDecisionRow)
                .where(ShadowDecisionRow.event_id == event_id)
                .order_by(ShadowDecisionRow.id)
            )
            window = await _window_of(session, row)
            batch = [
                views.columns(r, exclude=frozenset({"request", "reply"}))
                for r in await batches.of_event(session, event_id)
            ]
        return EventDetail(
            window=window,
            batch=batch,
            shadow=event_shadows(shadows.all()),
            **views.summary(row).model_dump(),
            delivery_id=row.delivery_id,
            pipeline=row.pipeline,
            deliveries=row.deliveries,
            payload=row.payload,
            timeline=views.timeline(row, calls=calls, outbox=outbox, dead_letters=dead),
            llm_calls=[views.llm_call(c) for c in calls],
            tool_calls=[views.tool_call(o) for o in outbox],
            dead_letter=views.dead_letter(dead[-1]) if dead else None,
        )

    async def shadow(
        self, candidate: str, *, since: datetime | None, until: datetime | None
    ) -> dict[str, Any]:
        async with self.sessions() as session:
            rows = await shadow_rows(session, candidate, since=since, until=until)
        if not rows and candidate not in self.candidates:
            known = ", ".join(sorted(self.candidates)) or "none"
            raise ShadowCandidateNotFound(
                f"no shadow candidate {candidate!r} (configured: {known}) and no decisions of it"
            )
        return shadow_report(candidate, rows, self.tool_schemas)

    async def _queued_only(self, event_id: str) -> EventDetail:
        """An event on the stream that no worker has stored yet: only Redis knows it."""
        try:
            queued = await self.queue.is_queued(event_id)
        except REDIS_ERRORS as exc:
            raise QueueUnavailable("the event queue is unreachable; retry later") from exc
        if not queued:
            raise EventNotFound(f"no event {event_id!r} (unknown, or deleted by retention)")
        return EventDetail(
            event_id=event_id,
            source=None,
            type=None,
            group_key=None,
            status="queued",
            received_at=None,
            timeline=[TimelineEntry(at=None, stage="queued", detail="waiting for a worker")],
            llm_calls=[],
            tool_calls=[],
            dead_letter=None,
        )

    async def events(
        self, flt: EventFilter, *, limit: int, cursor: str | None
    ) -> Page[EventSummary]:
        window, total = await self._event_rows(flt, limit=limit, cursor=cursor, count=True)
        return _counted(window, total)

    async def event_window(
        self, flt: EventFilter, *, limit: int, cursor: str | None
    ) -> Window[EventSummary]:
        """``events`` without the count (the console's listing)."""
        window, _ = await self._event_rows(flt, limit=limit, cursor=cursor, count=False)
        return window

    async def _event_rows(
        self, flt: EventFilter, *, limit: int, cursor: str | None, count: bool
    ) -> tuple[Window[EventSummary], int | None]:
        after = decode_time_cursor(cursor)
        return await self._window(
            lambda repo: repo.events(flt, limit=limit, after=after, count=count),
            render=views.summary,
            cursor_of=lambda row: time_cursor(row.received_at, row.id),
            limit=limit,
        )

    async def llm_calls(
        self, flt: LlmCallFilter, *, limit: int, cursor: str | None
    ) -> Page[dict[str, object]]:
        after = decode_time_cursor(cursor)
        window, total = await self._window(
            lambda repo: repo.llm_calls(flt, limit=limit, after=after),
            render=views.llm_call,
            cursor_of=lambda row: time_cursor(row.created_at, row.id),
            limit=limit,
        )
        return _counted(window, total)

    async def dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> Page[DeadLetterOut]:
        window, total = await self._dead_letter_rows(flt, limit=limit, cursor=cursor, count=True)
        return _counted(window, total)

    async def dead_letter_window(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None
    ) -> Window[DeadLetterOut]:
        """``dead_letters`` without the count (the console's listing)."""
        window, _ = await self._dead_letter_rows(flt, limit=limit, cursor=cursor, count=False)
        return window

    async def _dead_letter_rows(
        self, flt: DeadLetterFilter, *, limit: int, cursor: str | None, count: bool
    ) -> tuple[Window[DeadLetterOut], int | None]:
        after = decode_id_cursor(cursor)
        return await self._window(
            lambda repo: repo.dead_letters(flt, limit=limit, after=after, count=count),
            render=views.dead_letter,
            cursor_of=lambda row: id_cursor(row.id),
            limit=limit,
        )

    async def outbox_pending(self, *, cap: int) -> tuple[int, datetime | None]:
        """Tool calls not yet published (counted up to ``cap``) and the oldest one's time."""
        async with self.sessions() as session:
            count, oldest = await AdminRepository(session).outbox_pending(cap=cap)
        return count, as_utc(oldest) if oldest is not None else None

    async def _window(
        self,
        fetch: Callable[[AdminRepository], Awaitable[tuple[Sequence[R], int | None]]],
        *,
        render: Callable[[R], T],
        cursor_of: Callable[[R], str],
        limit: int,
    ) -> tuple[Window[T], int | None]:
        """One page of a listing and its total (when counted); the next page starts after
        the last row of a full one."""
        async with self.sessions() as session:
            rows, total = await fetch(AdminRepository(session))
        last = rows[-1] if rows and len(rows) == limit else None
        window: Window[T] = Window(
            items=[render(row) for row in rows],
            next_cursor=cursor_of(last) if last is not None else None,
        )
        return window, total

    async def replay(self, dead_letter_id: int) -> ReplayAccepted:
        """Send the dead letter's event through the pipeline again, as a new generation."""
        async with self.sessions() as session:
            repo = AdminRepository(session)
            dead = await repo.dead_letter(dead_letter_id, lock=True)
            if dead is None:
                raise DeadLetterNotFound(f"no dead letter {dead_letter_id}")
            if dead.replayed_at is not None:
                raise ReplayConflict(f"dead letter {dead_letter_id} was already replayed")
            row = await repo.lock_event(dead.event_id)
            if row is None:
                raise ReplayConflict(f"event {dead.event_id} is gone (deleted by retention)")
            if row.status != EventStatus.DEAD_LETTERED:
                raise ReplayConflict(
                    f"event {row.id} is {row.status}, not dead_lettered: nothing to replay"
                )
            dead.replayed_at = now = utcnow()
            event, partition = await self._requeue(session, row, now=now)
        log.info(
            "dead_letter_replayed",
            dead_letter_id=dead_letter_id,
            event_id=event.id,
            source=event.source,
            partition=partition,
            generation=event.generation,
        )
        return ReplayAccepted(
            dead_letter_id=dead_letter_id, event_id=event.id, generation=event.generation
        )

    async def replay_held(self, event_id: str) -> EventReplayAccepted:
        """Send a ``held`` event through the pipeline again, as a new generation: once its
        tools have a topic, the new decision's calls are published. Its held calls stay as
        they are (history), never published."""
        async with self.sessions() as session:
            row = await AdminRepository(session).lock_event(event_id)
            if row is None:
                raise EventNotFound(f"no stored event {event_id}")
            if row.status != EventStatus.HELD:
                raise ReplayConflict(f"event {row.id} is {row.status}, not held: nothing to replay")
            event, partition = await self._requeue(session, row, now=utcnow())
        log.info(
            "held_event_replayed",
            event_id=event.id,
            source=event.source,
            partition=partition,
            generation=event.generation,
        )
        return EventReplayAccepted(event_id=event.id, generation=event.generation)

    async def _requeue(
        self, session: AsyncSession, row: EventRow, *, now: datetime
    ) -> tuple[Event, int]:
        """Reset the locked event row to a new generation and put the event on its stream;
        the reset is committed only once the entry is added (the module's invariant)."""
        row.replays += 1
        row.status = EventStatus.QUEUED
        row.deliveries = 0
        row.error = None
        row.updated_at = now
        await session.flush()
        event = make_event(
            id=row.id,
            source=row.source,
            config=self.sources.get(row.source),
            type=row.type,
            group_key=row.group_key,
            delivery_id=row.delivery_id,
            pipeline=row.pipeline,
            received_at=as_utc(row.received_at),
            payload=row.payload,
            generation=row.replays,
        )
        try:
            partition = await requeue_event(self.queue, event)
        except REDIS_ERRORS as exc:
            await session.rollback()
            raise QueueUnavailable("the event queue is unreachable; retry later") from exc
        await session.commit()
        return event, partition


async def _window_of(session: AsyncSession, row: EventRow) -> dict[str, Any] | None:
    """A windowed event's window (with the event that decided it, and how that ended), or
    the window an event of source ``window`` stands for (with its events in order)."""
    if row.window_id is not None:
        window = await session.get(WindowRow, row.window_id)
        if window is None:
            return None
        decided_by = await session.get(EventRow, window.event_id) if window.event_id else None
        return window_view(window) | {
            "position": row.window_position,
            "event_id": window.event_id,
            "decision_status": decided_by.status if decided_by is not None else None,
        }
    if row.source != WINDOW_SOURCE:
        return None
    window = await session.scalar(select(WindowRow).where(WindowRow.event_id == row.id))
    if window is None:
        return None
    members = await session.scalars(
        select(EventRow.id)
        .where(EventRow.window_id == window.id)
        .order_by(EventRow.window_position)
    )
    return window_view(window) | {"event_id": row.id, "members": list(members.all())}


def _counted(window: Window[T], total: int | None) -> Page[T]:
    return Page(items=window.items, next_cursor=window.next_cursor, total=total or 0)

"""The window closer: closes windows whose time has come and puts the event of every closed
window on its key's stream (``app/decide/windows.py`` says what a window is).

Invariants:
- Every process with a worker runs it; they may race, and that is safe: closing is a
  conditional update (one of them closes a window), and a window's event is enqueued
  deduplicated by its id, which every process derives alike, before the window is marked
  ``enqueued``. A process that dies between the two leaves the window ``closed``, and the
  next round of any process enqueues it.
- A key's windows reach the stream in the order they opened: a flush enqueues the key's
  closed windows oldest first, one after the other, each answered (queued or duplicate)
  before the next, so a window's event is on the stream before the next one's.
- Redis or the database being down is waited out (the next round tries again); any other
  failure ends the loop, which the supervisor logs and restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.decide.windows import window_event
from app.events import WINDOW_SOURCE
from app.faults import dependency_unavailable
from app.observability.metrics import WINDOWS_CLOSED
from app.queue.streams import EventQueue, NewEntry
from app.store import windows

log = structlog.get_logger(__name__)
POLL_SECONDS = 0.5
# Where no pipeline has a window: only windows a former config left are closed.
IDLE_POLL_SECONDS = 5.0
DEDUP_WINDOW_MS = 7 * 86_400_000


class WindowCloser:
    def __init__(
        self,
        *,
        queue: EventQueue,
        sessions: async_sessionmaker[AsyncSession],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.queue = queue
        self.sessions = sessions
        self.clock = clock
        self.sleep = sleep
        self.poll_seconds = poll_seconds

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception as exc:
                if not dependency_unavailable(exc):
                    raise
                log.warning("window_round_failed", error=type(exc).__name__)
            await self.sleep(self.poll_seconds)

    async def round(self) -> None:
        """Close the windows whose time has come, then enqueue every closed one."""
        async with self.sessions() as session:
            closed = await windows.close_due(session, now=self.clock())
            await session.commit()
        for pipeline, _ in closed:
            WINDOWS_CLOSED.labels(pipeline=pipeline, reason="time").inc()
        async with self.sessions() as session:
            waiting = await windows.to_enqueue(session)
        for pipeline, key in dict.fromkeys((row.pipeline, row.group_key) for row in waiting):
            await self.flush(pipeline, key)

    async def flush(self, pipeline: str, group_key: str) -> None:
        """Enqueue the events of the key's closed windows, oldest first."""
        async with self.sessions() as session:
            rows = await windows.to_enqueue(session, pipeline=pipeline, group_key=group_key)
        for row in rows:
            event = window_event(row)
            result = await self.queue.enqueue(
                NewEntry(
                    event_id=event.id,
                    source=WINDOW_SOURCE,
                    delivery_id=event.delivery_id,
                    group_key=event.group_key,
                    data=event.to_bytes(),
                    dedup_window_ms=DEDUP_WINDOW_MS,
                )
            )
            async with self.sessions() as session:
                await windows.mark_enqueued(session, row.id, event.id)
                await session.commit()
            log.info(
                "window_enqueued",
                pipeline=pipeline,
                window=row.id,
                event_id=event.id,
                events=row.events,
                closed_by=row.closed_by,
                status="queued" if result.created else "duplicate",
            )

"""The windows table: a pipeline's key's events taken in until the window closes.

Invariants:
- at most one window is open per pipeline and key (a unique partial index): the event that
  finds none opens one, the event that finds one past its time closes it and opens the next;
- an event joins one window once: ``window_id`` is set only where it is still empty and the
  event's fence is not newer than the joining tenure's lease epoch (a stalled worker's late
  join is refused), and the window's count moves in the same transaction;
- a window closes once (``open`` → ``closed``, a conditional update) and its event is
  enqueued after that (``closed`` → ``enqueued``), so its members are fixed before anybody
  builds the event that stands for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.events import EventStatus
from app.store.models import EventRow, WindowRow, WindowStatus


@dataclass(frozen=True, slots=True)
class Joined:
    window_id: int
    position: int
    closed: bool  # this event filled it
    closed_earlier: bool  # it found the key's open window past its time and closed it


def as_utc(moment: datetime) -> datetime:
    """SQLite gives naive datetimes back; they were stored in UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def join(
    session: AsyncSession,
    *,
    event_id: str,
    pipeline: str,
    group_key: str,
    seconds: float,
    max_events: int,
    epoch: int,
    now: datetime,
) -> Joined | None:
    """Take the event into its key's open window (opening one when there is none); None
    when the event is in a window already or a later tenure started it (nothing changed:
    the caller rolls back). The caller commits."""
    closed_earlier = False
    while True:
        current = await session.scalar(
            select(WindowRow)
            .where(
                WindowRow.pipeline == pipeline,
                WindowRow.group_key == group_key,
                WindowRow.status == WindowStatus.OPEN,
            )
            .with_for_update()
        )
        if current is not None and as_utc(current.closes_at) <= now:
            closed_earlier = await _close(session, current.id, now=now, by="time")
            current = None
        if current is None:
            current = WindowRow(
                pipeline=pipeline,
                group_key=group_key,
                status=WindowStatus.OPEN,
                events=0,
                opened_at=now,
                closes_at=now + timedelta(seconds=seconds),
            )
            session.add(current)
            await session.flush()
            position = 1
            break
        # SQLite has no row lock: the closer may have closed (and enqueued) the window since
        # it was read. Whoever changes it first holds it until commit; a closed one is left
        # alone and the event opens the next.
        claimed = await session.scalar(
            update(WindowRow)
            .where(WindowRow.id == current.id, WindowRow.status == WindowStatus.OPEN)
            .values(events=WindowRow.events + 1)
            .returning(WindowRow.events)
        )
        if claimed is not None:
            position = int(claimed)
            break
    taken = await session.execute(
        update(EventRow)
        .where(EventRow.id == event_id, EventRow.window_id.is_(None), EventRow.fence <= epoch)
        .values(
            status=EventStatus.WINDOWED,
            window_id=current.id,
            window_position=position,
            updated_at=now,
        )
    )
    if not getattr(taken, "rowcount", 0):
        return None
    current.events = position
    current.first_event_id = current.first_event_id or event_id
    current.last_event_id = event_id
    filled = position >= max_events
    if filled:
        current.status, current.closed_at, current.closed_by = WindowStatus.CLOSED, now, "count"
    await session.flush()
    return Joined(current.id, position, filled, closed_earlier)


async def _close(session: AsyncSession, window_id: int, *, now: datetime, by: str) -> bool:
    """Close the window if it is still open; False when somebody else closed it first."""
    result = await session.execute(
        update(WindowRow)
        .where(WindowRow.id == window_id, WindowRow.status == WindowStatus.OPEN)
        .values(status=WindowStatus.CLOSED, closed_at=now, closed_by=by)
    )
    return bool(getattr(result, "rowcount", 0))


async def close_due(session: AsyncSession, *, now: datetime) -> list[tuple[str, str]]:
    """Close every open window whose time has come; their (pipeline, key). The caller
    commits."""
    result = await session.execute(
        update(WindowRow)
        .where(WindowRow.status == WindowStatus.OPEN, WindowRow.closes_at <= now)
        .values(status=WindowStatus.CLOSED, closed_at=now, closed_by="time")
        .returning(WindowRow.pipeline, WindowRow.group_key)
    )
    return [(str(p), str(k)) for p, k in result.all()]


async def to_enqueue(
    session: AsyncSession, *, pipeline: str | None = None, group_key: str | None = None
) -> Sequence[WindowRow]:
    """Closed windows whose event is not on the stream yet, oldest first (a key's windows
    must reach the stream in the order they opened)."""
    query = select(WindowRow).where(WindowRow.status == WindowStatus.CLOSED)
    if pipeline is not None:
        query = query.where(WindowRow.pipeline == pipeline, WindowRow.group_key == group_key)
    return (await session.scalars(query.order_by(WindowRow.id).limit(500))).all()


async def mark_enqueued(session: AsyncSession, window_id: int, event_id: str) -> None:
    await session.execute(
        update(WindowRow)
        .where(WindowRow.id == window_id, WindowRow.status == WindowStatus.CLOSED)
        .values(status=WindowStatus.ENQUEUED, event_id=event_id)
    )


async def members(session: AsyncSession, window_id: int) -> Sequence[EventRow]:
    """The window's events in the order they joined it."""
    return (
        await session.scalars(
            select(EventRow)
            .where(EventRow.window_id == window_id)
            .order_by(EventRow.window_position)
        )
    ).all()


def window_view(row: WindowRow) -> dict[str, Any]:
    """What the admin API and the published messages say of a window."""
    return {
        "id": row.id,
        "status": row.status,
        "events": row.events,
        "first_event_id": row.first_event_id,
        "last_event_id": row.last_event_id,
        "opened_at": as_utc(row.opened_at).isoformat(),
        "closes_at": as_utc(row.closes_at).isoformat(),
        "closed_at": as_utc(row.closed_at).isoformat() if row.closed_at else None,
        "closed_by": row.closed_by,
    }

"""Admin queries: filtered listings with keyset pagination, and the replay's row locks.

Listings are newest first and page on a unique sort key (``(time, id)`` or ``id``), so a
page boundary never skips or repeats a row while new rows arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import (
    CallPurpose,
    DeadLetterRow,
    EventRow,
    LlmCallRow,
    OutboxRow,
    OutboxStatus,
)


@dataclass(frozen=True, slots=True)
class EventFilter:
    status: str | None = None
    source: str | None = None
    since: datetime | None = None


@dataclass(frozen=True, slots=True)
class LlmCallFilter:
    event_id: str | None = None
    pipeline: str | None = None
    model: str | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    purpose: str | None = None
    shadow: bool | None = None


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    event_id: str | None = None
    stage: str | None = None
    replayed: bool | None = None


def _before(time_col: Any, id_col: Any, after: tuple[datetime, str]) -> ColumnElement[bool]:
    """Rows strictly after the cursor in (time desc, id desc) order."""
    at, row_id = after
    return or_(time_col < at, and_(time_col == at, id_col < row_id))


class AdminRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def events(
        self,
        flt: EventFilter,
        *,
        limit: int,
        after: tuple[datetime, str] | None,
        count: bool = True,
    ) -> tuple[Sequence[EventRow], int | None]:
        """A page of events (newest ``received_at`` first) and the total matching (None
        without ``count``)."""
        conditions = []
        if flt.status is not None:
            conditions.append(EventRow.status == flt.status)
        if flt.source is not None:
            conditions.append(EventRow.source == flt.source)
        if flt.since is not None:
            conditions.append(EventRow.received_at >= flt.since)
        total = await self._count(EventRow, conditions) if count else None
        query = select(EventRow).where(*conditions)
        if after is not None:
            query = query.where(_before(EventRow.received_at, EventRow.id, after))
        query = query.order_by(EventRow.received_at.desc(), EventRow.id.desc()).limit(limit)
        return (await self.session.scalars(query)).all(), total

    async def llm_calls(
        self, flt: LlmCallFilter, *, limit: int, after: tuple[datetime, str] | None
    ) -> tuple[Sequence[LlmCallRow], int]:
        conditions = [
            column == value
            for column, value in (
                (LlmCallRow.event_id, flt.event_id),
                (LlmCallRow.pipeline, flt.pipeline),
                (LlmCallRow.model, flt.model),
                (LlmCallRow.status, flt.status),
                (LlmCallRow.purpose, flt.purpose),
            )
            if value is not None
        ]
        if flt.shadow is not None:
            shadow = LlmCallRow.purpose == CallPurpose.SHADOW
            conditions.append(shadow if flt.shadow else ~shadow)
        if flt.since is not None:
            conditions.append(LlmCallRow.created_at >= flt.since)
        if flt.until is not None:
            conditions.append(LlmCallRow.created_at < flt.until)
        total = await self._count(LlmCallRow, conditions)
        query = select(LlmCallRow).where(*conditions)
        if after is not None:
            query = query.where(_before(LlmCallRow.created_at, LlmCallRow.id, after))
        query = query.order_by(LlmCallRow.created_at.desc(), LlmCallRow.id.desc()).limit(limit)
        return (await self.session.scalars(query)).all(), total

    async def dead_letters(
        self, flt: DeadLetterFilter, *, limit: int, after: int | None, count: bool = True
    ) -> tuple[Sequence[DeadLetterRow], int | None]:
        conditions: list[ColumnElement[bool]] = []
        if flt.event_id is not None:
            conditions.append(DeadLetterRow.event_id == flt.event_id)
        if flt.stage is not None:
            conditions.append(DeadLetterRow.stage == flt.stage)
        if flt.replayed is not None:
            replayed = DeadLetterRow.replayed_at
            conditions.append(replayed.is_not(None) if flt.replayed else replayed.is_(None))
        total = await self._count(DeadLetterRow, conditions) if count else None
        query = select(DeadLetterRow).where(*conditions)
        if after is not None:
            query = query.where(DeadLetterRow.id < after)
        query = query.order_by(DeadLetterRow.id.desc()).limit(limit)
        return (await self.session.scalars(query)).all(), total

    async def _count(self, table: Any, conditions: Sequence[ColumnElement[bool]]) -> int:
        result = await self.session.scalar(
            select(func.count()).select_from(table).where(*conditions)
        )
        return int(result or 0)

    async def outbox_pending(self, *, cap: int) -> tuple[int, datetime | None]:
        """Tool calls waiting for SNS, counted up to ``cap`` (a relay down for a day must not
        make the count read the whole table), and when the oldest was stored."""
        pending = OutboxRow.status == OutboxStatus.PENDING
        ids = select(OutboxRow.id).where(pending).limit(cap).subquery()
        count = await self.session.scalar(select(func.count()).select_from(ids))
        oldest = await self.session.scalar(
            select(OutboxRow.created_at).where(pending).order_by(OutboxRow.id).limit(1)
        )
        return int(count or 0), oldest

    async def dead_letter(self, dead_letter_id: int, *, lock: bool = False) -> DeadLetterRow | None:
        return await self.session.get(DeadLetterRow, dead_letter_id, with_for_update=lock)

    async def lock_event(self, event_id: str) -> EventRow | None:
        """The event row, locked until the caller's transaction ends (a worker's
        ``start_delivery`` waits for it on PostgreSQL)."""
        return await self.session.get(EventRow, event_id, with_for_update=True)

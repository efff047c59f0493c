"""All SQL lives here. Repositories never commit; the caller's unit of work does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import (
    DeadLetterRow,
    EventRow,
    EventStatus,
    LlmCallRow,
    OutboxRow,
    OutboxStatus,
    utcnow,
)


class EventRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, event_id: str) -> EventRow | None:
        return await self.session.get(EventRow, event_id)

    async def start_delivery(self, *, fields: dict[str, Any]) -> EventRow:
        """Insert the event on first delivery; count every delivery.

        The count is an UPDATE issued before the read, so the read runs under the write lock
        (SQLite) or row lock (PostgreSQL) and sees a replay committed meanwhile: an operator
        replay holds that lock until its stream entry is added and its reset committed.
        """
        counted = await self.session.execute(
            update(EventRow)
            .where(EventRow.id == fields["id"])
            .values(deliveries=EventRow.deliveries + 1, updated_at=utcnow())
        )
        if getattr(counted, "rowcount", 0) == 0:
            row = EventRow(**fields, status=EventStatus.PROCESSING, deliveries=1)
            self.session.add(row)
            await self.session.flush()
            return row
        found = await self.session.get(EventRow, fields["id"], populate_existing=True)
        assert found is not None  # just updated, in this transaction
        if found.status == EventStatus.QUEUED:  # an operator replay put it back on the queue
            found.status = EventStatus.PROCESSING
            await self.session.flush()
        return found

    async def set_status(self, event_id: str, status: str, *, error: str | None = None) -> None:
        await self.session.execute(
            update(EventRow)
            .where(EventRow.id == event_id)
            .values(status=status, error=error, updated_at=utcnow())
        )


class LlmCallRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    def add(self, row: LlmCallRow) -> None:
        self.session.add(row)

    async def for_event(self, event_id: str) -> Sequence[LlmCallRow]:
        result = await self.session.scalars(
            select(LlmCallRow)
            .where(LlmCallRow.event_id == event_id)
            .order_by(LlmCallRow.created_at, LlmCallRow.attempt)
        )
        return result.all()


class OutboxRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    def add_all(self, rows: Sequence[OutboxRow]) -> None:
        self.session.add_all(rows)

    async def for_event(
        self, event_id: str, *, generation: int | None = None
    ) -> Sequence[OutboxRow]:
        """The event's tool calls: of one replay generation, or of all (oldest first)."""
        query = select(OutboxRow).where(OutboxRow.event_id == event_id)
        if generation is not None:
            query = query.where(OutboxRow.generation == generation)
        result = await self.session.scalars(query.order_by(OutboxRow.generation, OutboxRow.seq))
        return result.all()

    async def pending(self, *, limit: int) -> Sequence[OutboxRow]:
        """Oldest pending rows that have a topic; rows without one wait for configuration."""
        result = await self.session.scalars(
            select(OutboxRow)
            .where(OutboxRow.status == OutboxStatus.PENDING, OutboxRow.topic_arn.is_not(None))
            .order_by(OutboxRow.id)
            .limit(limit)
        )
        return result.all()

    async def mark_published(
        self, row_id: int, *, message_id: str, sequence_number: str | None
    ) -> None:
        await self.session.execute(
            update(OutboxRow)
            .where(OutboxRow.id == row_id)
            .values(
                status=OutboxStatus.PUBLISHED,
                sns_message_id=message_id,
                sns_sequence_number=sequence_number,
                published_at=utcnow(),
                attempts=OutboxRow.attempts + 1,
                last_error=None,
            )
        )

    async def mark_failed(self, row_id: int, *, error: str, dead: bool) -> None:
        values: dict[str, Any] = {"attempts": OutboxRow.attempts + 1, "last_error": error}
        if dead:
            values["status"] = OutboxStatus.DEAD
        await self.session.execute(update(OutboxRow).where(OutboxRow.id == row_id).values(values))

    async def unpublished_count(self, event_id: str, *, generation: int = 0) -> int:
        """Rows of one generation not yet published (earlier generations are history)."""
        result = await self.session.scalar(
            select(func.count())
            .select_from(OutboxRow)
            .where(
                OutboxRow.event_id == event_id,
                OutboxRow.generation == generation,
                OutboxRow.status != OutboxStatus.PUBLISHED,
            )
        )
        return int(result or 0)


class DeadLetterRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    def add(self, *, event_id: str, stage: str, reason: str) -> None:
        self.session.add(DeadLetterRow(event_id=event_id, stage=stage, reason=reason))

    async def for_event(self, event_id: str) -> Sequence[DeadLetterRow]:
        result = await self.session.scalars(
            select(DeadLetterRow)
            .where(DeadLetterRow.event_id == event_id)
            .order_by(DeadLetterRow.id)
        )
        return result.all()

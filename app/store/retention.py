"""Retention: delete audit rows and finished events older than a configured age.

An event is deleted only in a final state (published, no_action, dead_lettered, windowed)
and only when its last change is older than the cutoff; its tool calls, dead letters and
batch requests (which keep its whole prompt) go with it. A windowed event stays as long as
its window does, and a window as long as its event (the one decided on the members'
prompt): a dead-lettered window event can be replayed with all its members until retention
takes it, and its window with it; the members go in a later round. Audit rows
(``llm_calls``) go by their own age. Deletes run in small batches, each its own transaction,
so the job never holds long locks; several gateways running it at once only repeat
idempotent deletes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta

import structlog
from sqlalchemy import delete, exists, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.events import FINAL_STATUSES
from app.observability.metrics import RETENTION_DELETED
from app.store.models import (
    BatchRequestRow,
    DeadLetterRow,
    EventRow,
    LlmCallRow,
    OutboxRow,
    ShadowDecisionRow,
    WindowRow,
    utcnow,
)

log = structlog.get_logger(__name__)


class RetentionRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def delete_llm_calls(self, *, before: datetime, limit: int) -> int:
        ids = (
            await self.session.scalars(
                select(LlmCallRow.id).where(LlmCallRow.created_at < before).limit(limit)
            )
        ).all()
        if ids:
            await self.session.execute(delete(LlmCallRow).where(LlmCallRow.id.in_(ids)))
        return len(ids)

    async def delete_shadow_decisions(self, *, before: datetime, limit: int) -> int:
        ids = (
            await self.session.scalars(
                select(ShadowDecisionRow.id)
                .where(ShadowDecisionRow.created_at < before)
                .limit(limit)
            )
        ).all()
        if ids:
            await self.session.execute(
                delete(ShadowDecisionRow).where(ShadowDecisionRow.id.in_(ids))
            )
        return len(ids)

    async def finished_event_ids(self, *, before: datetime, limit: int) -> Sequence[str]:
        # A member stays while its window does: the window's event lists the members in
        # its prompt, and a replay of it reads them again.
        in_a_window = exists().where(WindowRow.id == EventRow.window_id)
        result = await self.session.scalars(
            select(EventRow.id)
            .where(
                EventRow.status.in_(FINAL_STATUSES),
                EventRow.updated_at < before,
                ~in_a_window,
            )
            .limit(limit)
        )
        return result.all()

    async def delete_events(self, ids: Sequence[str]) -> dict[str, int]:
        """The events, their outbox rows, dead letters and batch requests (children first:
        foreign keys), and the windows they were decided for (their members go once their
        window has: ``finished_event_ids``)."""
        counts = {}
        for table, column in (
            (OutboxRow, OutboxRow.event_id),
            (BatchRequestRow, BatchRequestRow.event_id),
            (DeadLetterRow, DeadLetterRow.event_id),
            (WindowRow, WindowRow.event_id),
            (EventRow, EventRow.id),
        ):
            result = await self.session.execute(delete(table).where(column.in_(ids)))
            counts[table.__tablename__] = int(getattr(result, "rowcount", 0) or 0)
        return counts


class RetentionJob:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        max_age_seconds: int,
        interval_seconds: float,
        batch_size: int = 500,
    ) -> None:
        self.sessions = sessions
        self.max_age = timedelta(seconds=max_age_seconds)
        self.interval_seconds = interval_seconds
        self.batch_size = batch_size

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:
                log.exception("retention_failed")
            await asyncio.sleep(self.interval_seconds)

    async def run_once(self, *, now: datetime | None = None) -> dict[str, int]:
        """Delete everything past the cutoff; returns rows deleted per table."""
        cutoff = (now or utcnow()) - self.max_age
        totals = {
            "llm_calls": 0,
            "shadow_decisions": 0,
            "windows": 0,
            "outbox": 0,
            "dead_letters": 0,
            "batch_requests": 0,
            "events": 0,
        }
        while True:
            async with self.sessions() as session:
                repo = RetentionRepository(session)
                calls = await repo.delete_llm_calls(before=cutoff, limit=self.batch_size)
                shadows = await repo.delete_shadow_decisions(before=cutoff, limit=self.batch_size)
                ids = await repo.finished_event_ids(before=cutoff, limit=self.batch_size)
                counts = await repo.delete_events(ids) if ids else {}
                await session.commit()
            counts["llm_calls"] = calls
            counts["shadow_decisions"] = shadows
            for table, count in counts.items():
                totals[table] += count
                RETENTION_DELETED.labels(table=table).inc(count)
            if max(calls, shadows, len(ids)) < self.batch_size:
                break
        if any(totals.values()):
            log.info("retention_deleted", cutoff=cutoff.isoformat(), **totals)
        return totals

"""Dead-lettering an event: its dead-letter row and its status in one transaction, then the
metrics and the log line. Every stage that gives up on an event comes through here.

``add_unprocessable`` is for an event whose processing keeps failing, possibly because the
database refuses the event's own row: it stores the row with every text field made storable
(control characters replaced, cut to the column's length) and, if even that is refused, without
the payload, so a poison event always ends ``dead_lettered`` and visible.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.events import EventStatus
from app.faults import LeaseLost, dependency_unavailable
from app.observability.metrics import DEAD_LETTERS, EVENTS_FINISHED
from app.store.models import EventRow, utcnow
from app.store.repository import EVENTS, DeadLetterRepository, EventRepository

log = structlog.get_logger(__name__)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# The events table's text columns and their lengths.
_TEXT_LIMITS = {
    "id": 64,
    "source": 64,
    "type": 200,
    "group_key": 512,
    "delivery_id": 200,
    "pipeline": 64,
}


class DeadLetters:
    def __init__(self, *, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def add(
        self, event_id: str, *, stage: str, reason: str, epoch: int | None = None
    ) -> None:
        async with self.sessions() as session:
            await self.add_in(session, event_id, stage=stage, reason=reason, epoch=epoch)
            await session.commit()
        self.count(event_id, stage=stage, reason=reason)

    @staticmethod
    async def add_in(
        session: AsyncSession,
        event_id: str,
        *,
        stage: str,
        reason: str,
        epoch: int | None = None,
    ) -> None:
        """Within the caller's transaction; with ``epoch``, only while no later lease tenure
        started the event (else ``LeaseLost``). The caller commits, then calls ``count``."""
        events = EventRepository(session)
        if epoch is None:
            await events.set_status(event_id, EventStatus.DEAD_LETTERED, error=reason)
        elif not await events.set_status_fenced(
            event_id, EventStatus.DEAD_LETTERED, epoch=epoch, error=reason
        ):
            raise LeaseLost("a later lease tenure started the event: not dead-lettered here")
        DeadLetterRepository(session).add(event_id=event_id, stage=stage, reason=reason)

    @staticmethod
    def count(event_id: str, *, stage: str, reason: str) -> None:
        DEAD_LETTERS.labels(stage=stage).inc()
        EVENTS_FINISHED.labels(status=EventStatus.DEAD_LETTERED).inc()
        log.warning("event_dead_lettered", event_id=event_id, stage=stage, reason=reason)

    async def add_unprocessable(self, fields: dict[str, Any], *, reason: str) -> None:
        """Dead-letter (stage ``worker``) an event given by its column values."""
        reason = _storable(reason, 2000)
        fields = fields | {"id": _storable(str(fields["id"]), _TEXT_LIMITS["id"])}
        try:
            await self._unprocessable(fields, reason=reason, keep_payload=True)
        except DBAPIError as exc:
            if dependency_unavailable(exc):
                raise
            log.error("dead_letter_without_payload", event_id=fields["id"], exc_info=exc)
            await self._unprocessable(fields, reason=reason, keep_payload=False)
        self.count(fields["id"], stage="worker", reason=reason)

    async def _unprocessable(
        self, fields: dict[str, Any], *, reason: str, keep_payload: bool
    ) -> None:
        async with self.sessions() as session:
            exists = await session.get(EventRow, fields["id"]) is not None
            if exists:
                await EventRepository(session).set_status(
                    fields["id"], EventStatus.DEAD_LETTERED, error=reason
                )
            else:
                row = {
                    name: _storable(str(fields[name]), limit)
                    for name, limit in _TEXT_LIMITS.items()
                }
                payload = fields["payload"] if keep_payload else {"not_stored": reason}
                received: datetime = fields["received_at"]
                await session.execute(
                    insert(EVENTS).values(
                        **row,
                        payload=payload,
                        received_at=received,
                        status=EventStatus.DEAD_LETTERED,
                        error=reason,
                        deliveries=0,
                        replays=0,
                        fence=0,
                        updated_at=utcnow(),
                    )
                )
            DeadLetterRepository(session).add(event_id=fields["id"], stage="worker", reason=reason)
            await session.commit()


def _storable(text: str, limit: int) -> str:
    return _CONTROL.sub("?", text)[:limit]

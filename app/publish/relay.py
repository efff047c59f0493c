"""Outbox → SNS FIFO. Strictly in order per message group; groups in parallel.

Within one group the relay never has two publishes outstanding: the next row is sent only
after the previous one is marked published. A group whose publish fails waits (with backoff)
and keeps its place; retryable failures never drop a row, permanent ones dead-letter it.
Across processes one relay holds the lease (Redis) at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime

import orjson
import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.observability.metrics import DEAD_LETTERS, END_TO_END, EVENTS_FINISHED, PUBLISHED
from app.publish.sns import OutgoingMessage, Publisher, PublishError
from app.store.models import EventStatus, OutboxRow
from app.store.repository import DeadLetterRepository, EventRepository, OutboxRepository

log = structlog.get_logger(__name__)

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class RelayLease:
    """One relay publishes at a time across all gateway processes."""

    def __init__(self, redis: Redis, *, key: str, owner: str, ttl_ms: int = 15_000) -> None:
        self.redis = redis
        self.key = key
        self.owner = owner
        self.ttl_ms = ttl_ms
        self._renew = redis.register_script(_RENEW)

    async def hold(self) -> bool:
        try:
            if await self._renew(keys=[self.key], args=[self.owner, self.ttl_ms]):
                return True
            return bool(await self.redis.set(self.key, self.owner, nx=True, px=self.ttl_ms))
        except (RedisError, OSError):
            return False

    async def release(self) -> None:
        with contextlib.suppress(RedisError, OSError):  # it expires by itself
            await self.redis.eval(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1])"
                " end return 0",
                1,
                self.key,
                self.owner,
            )


class OutboxRelay:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        publisher: Publisher,
        lease: RelayLease | None,
        poll_seconds: float,
        batch_size: int = 200,
        group_concurrency: int = 32,
        max_backoff: float = 30.0,
    ) -> None:
        self.sessions = sessions
        self.publisher = publisher
        self.lease = lease
        self.poll_seconds = poll_seconds
        self.batch_size = batch_size
        self.max_backoff = max_backoff
        self._slots = asyncio.Semaphore(group_concurrency)
        self._wake = asyncio.Event()
        # group id → (consecutive failures, monotonic time before which it is not retried)
        self._backoff: dict[str, tuple[int, float]] = {}

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
                self._wake.clear()
                if self.lease is not None and not await self.lease.hold():
                    continue
                try:
                    while await self.publish_pending():
                        pass
                except Exception:
                    log.exception("relay_round_failed")
        finally:
            if self.lease is not None:
                await self.lease.release()

    async def publish_pending(self) -> int:
        """One round over the oldest pending rows; returns how many were published."""
        async with self.sessions() as session:
            rows = await OutboxRepository(session).pending(limit=self.batch_size)
        groups: OrderedDict[str, list[OutboxRow]] = OrderedDict()
        for row in rows:
            groups.setdefault(row.group_id, []).append(row)
        now = time.monotonic()
        ready = [g for g in groups.values() if self._backoff.get(g[0].group_id, (0, 0))[1] <= now]
        counts = await asyncio.gather(*(self._publish_group(g) for g in ready))
        return sum(counts)

    async def _publish_group(self, rows: Sequence[OutboxRow]) -> int:
        published = 0
        async with self._slots:
            for row in rows:
                if not await self._publish_row(row):
                    break
                published += 1
        return published

    async def _publish_row(self, row: OutboxRow) -> bool:
        """True when the row is done (published or dead); False stops its group this round."""
        assert row.topic_arn is not None
        body = orjson.loads(row.body)
        message = OutgoingMessage(
            topic_arn=row.topic_arn,
            body=row.body,
            group_id=row.group_id,
            dedup_id=row.dedup_id,
            attributes={
                "tool": row.tool,
                "source": body["event"]["source"],
                "event_id": row.event_id,
            },
        )
        topic = row.topic_arn.rsplit(":", 1)[-1]
        try:
            result = await self.publisher.publish(message)
        except PublishError as exc:
            PUBLISHED.labels(topic=topic, outcome="retry" if exc.retryable else "dead").inc()
            await self._failed(row, exc)
            return not exc.retryable
        PUBLISHED.labels(topic=topic, outcome="published").inc()
        self._backoff.pop(row.group_id, None)
        async with self.sessions() as session:
            outbox = OutboxRepository(session)
            await outbox.mark_published(
                row.id, message_id=result.message_id, sequence_number=result.sequence_number
            )
            if await outbox.unpublished_count(row.event_id, generation=row.generation) == 0:
                await self._finish_event(session, row.event_id)
            await session.commit()
        log.info(
            "tool_call_published",
            event_id=row.event_id,
            tool=row.tool,
            group_id=row.group_id,
            message_id=result.message_id,
        )
        return True

    async def _finish_event(self, session: AsyncSession, event_id: str) -> None:
        events = EventRepository(session)
        event = await events.get(event_id)
        if event is None or event.status != EventStatus.PROCESSING:
            return
        await events.set_status(event_id, EventStatus.PUBLISHED)
        EVENTS_FINISHED.labels(status=EventStatus.PUBLISHED).inc()
        received = event.received_at
        if received.tzinfo is None:  # SQLite returns naive datetimes
            received = received.replace(tzinfo=UTC)
        END_TO_END.observe((datetime.now(UTC) - received).total_seconds())

    async def _failed(self, row: OutboxRow, exc: PublishError) -> None:
        async with self.sessions() as session:
            await OutboxRepository(session).mark_failed(
                row.id, error=f"{exc.code}: {exc}"[:2000], dead=not exc.retryable
            )
            if not exc.retryable:
                reason = f"SNS {exc.code}: {exc}"[:2000]
                DeadLetterRepository(session).add(
                    event_id=row.event_id, stage="publish", reason=reason
                )
                await EventRepository(session).set_status(
                    row.event_id, EventStatus.DEAD_LETTERED, error=reason
                )
                DEAD_LETTERS.labels(stage="publish").inc()
                EVENTS_FINISHED.labels(status=EventStatus.DEAD_LETTERED).inc()
            await session.commit()
        if exc.retryable:
            failures = self._backoff.get(row.group_id, (0, 0.0))[0] + 1
            delay = random.uniform(0, min(self.max_backoff, 0.5 * 2**failures))
            self._backoff[row.group_id] = (failures, time.monotonic() + delay)
            log.warning(
                "publish_retry",
                event_id=row.event_id,
                group_id=row.group_id,
                code=exc.code,
                retry_in=round(delay, 2),
            )
        else:
            log.error("publish_dead_lettered", event_id=row.event_id, code=exc.code)

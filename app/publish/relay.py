"""Outbox → SNS FIFO. Strictly in order per message group; groups batched together.

A fetch takes the first few pending rows of every group not in backoff, every group's head
before any second row, so no group's backlog or throttling keeps another group waiting.
Each round then takes the head row of every fetched group — never two rows of one group at
once, so a group never has two unacknowledged publishes — and sends the heads with
PublishBatch (≤10 entries, ≤256 KiB, per topic). A group whose head fails with a retryable
error waits with backoff and keeps its place; a permanent error dead-letters that row and
its group moves on. A batch SNS refuses as a whole for good is sent again one entry at a
time, so only the entries refused on their own are dead-lettered. Across processes the
relays split the message groups by relay slot (``shards.py``; one relay for all of them with
the single ``RelayLease``): a relay fetches and publishes only the slots it holds, and
abandons a publish its lease no longer covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.events import EventStatus
from app.faults import LeaseLost
from app.observability.metrics import END_TO_END, EVENTS_FINISHED, PUBLISHED, labelled
from app.publish.coordination import PublishedMemory, PublishLease
from app.publish.messages import outgoing
from app.publish.sns import Published, Publisher, PublishError
from app.store.dead_letters import DeadLetters
from app.store.driver import DriverPool
from app.store.models import PendingRow, slot_of
from app.store.published import mark_and_finish
from app.store.repository import EventRepository, OutboxRepository, pending_on_driver

log = structlog.get_logger(__name__)
BATCH_ENTRIES = 10
BATCH_BYTES = 256 * 1024
# Rows fetched per group: one call publishes at most this many rows of a busy group before
# fetching again, so a group that turns up meanwhile waits that many rounds at most.
ROWS_PER_GROUP = 10
# Groups in backoff the fetch skips in SQL; past this many, the ones that come out of
# backoff soonest are fetched and set aside, at the cost of the fetch slots they take.
MAX_SKIPPED_GROUPS = 1000


class OutboxRelay:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        publisher: Publisher,
        lease: PublishLease | None,
        memory: PublishedMemory | None,
        poll_seconds: float,
        fetch_size: int = 500,
        rows_per_group: int = ROWS_PER_GROUP,
        max_skipped_groups: int = MAX_SKIPPED_GROUPS,
        max_backoff: float = 30.0,
        batch_concurrency: int = 4,
        clock: Callable[[], float] = time.monotonic,
        reads: async_sessionmaker[AsyncSession] | None = None,
        driver: DriverPool | None = None,
    ) -> None:
        self.sessions = sessions
        # The fetch of pending rows is one read: on autocommit sessions when given.
        self.reads = reads or sessions
        # The fetch and the write after each round, on PostgreSQL (None: through
        # ``reads`` and ``sessions``).
        self.driver = driver
        self.publisher = publisher
        self.lease = lease
        self.memory = memory
        self.poll_seconds = poll_seconds
        self.fetch_size = fetch_size
        self.rows_per_group = rows_per_group
        self.max_skipped_groups = max_skipped_groups
        self.max_backoff = max_backoff
        self.clock = clock
        self._wake = asyncio.Event()
        # PublishBatch calls in flight at once (different groups only, so order is unaffected).
        self._batch_slots = asyncio.Semaphore(batch_concurrency)
        # group id → (consecutive failures, monotonic time before which it is not retried)
        self._backoff: dict[str, tuple[int, float]] = {}

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Runs until cancelled. A cancel that a library below swallows (Python 3.11's
        ``wait_for`` can, when its inner call finishes at the same moment — seen while the
        database was down at shutdown) still ends the loop: ``cancelling()`` is checked."""
        task = asyncio.current_task()
        try:
            while task is None or not task.cancelling():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_seconds):
                        await self._wake.wait()
                self._wake.clear()
                try:
                    while await self.publish_pending():
                        pass
                except Exception:
                    log.exception("relay_round_failed")
            raise asyncio.CancelledError
        finally:
            if self.lease is not None:
                await self.lease.release()

    async def _holds_lease(self) -> bool:
        return self.lease is None or await self.lease.hold()

    def _slots(self) -> frozenset[int] | None:
        """The relay slots this relay publishes now (None: every slot)."""
        return None if self.lease is None else self.lease.slots

    async def publish_pending(self) -> int:
        """Publish the first few pending rows of each ready group; returns how many were
        settled (published or dead-lettered), so a caller can loop while there is progress.

        The fetch skips groups in backoff and takes every group's head before any group's
        second row, so neither a throttled group nor a long backlog of one group keeps the
        others' heads out of it."""
        if not await self._holds_lease():
            return 0
        now = self.clock()
        skip_groups, slots = self._in_backoff(now), self._slots()
        if self.driver is not None:
            rows = await pending_on_driver(
                self.driver,
                limit=self.fetch_size,
                per_group=self.rows_per_group,
                skip_groups=skip_groups,
                slots=slots,
            )
        else:
            async with self.reads() as session:
                rows = await OutboxRepository(session).pending(
                    limit=self.fetch_size,
                    per_group=self.rows_per_group,
                    skip_groups=skip_groups,
                    slots=slots,
                )
        groups: OrderedDict[str, list[PendingRow]] = OrderedDict()
        for row in rows:
            # Only needed for groups past ``max_skipped_groups`` that the fetch could not skip.
            if self._backoff.get(row.group_id, (0, 0.0))[1] <= now:
                groups.setdefault(row.group_id, []).append(row)
        settled = 0
        while groups:
            heads = [queue[0] for queue in groups.values()]
            outcomes = await self._publish_heads(heads)
            for row in heads:
                if outcomes[row.id]:
                    settled += 1
                    groups[row.group_id].pop(0)
                    if not groups[row.group_id]:
                        del groups[row.group_id]
                else:
                    del groups[row.group_id]  # retryable failure: the group waits
            # Renewed after every round, not only per call: with a slow SNS one call can
            # outlast the lease, and a relay publishing past it would race the next holder.
            if groups and not await self._holds_lease():
                break
            # A shard given back (another relay joined) or lost: its groups are not ours.
            if (slots := self._slots()) is not None:
                for group in [g for g in groups if slot_of(g) not in slots]:
                    del groups[group]
        return settled

    def _in_backoff(self, now: float) -> list[str]:
        """Groups not to be retried yet; those waiting longest when there are too many."""
        waiting = [(until, group) for group, (_, until) in self._backoff.items() if until > now]
        if len(waiting) > self.max_skipped_groups:
            waiting = heapq.nlargest(self.max_skipped_groups, waiting)
        return [group for _, group in waiting]

    async def _publish_heads(self, heads: Sequence[PendingRow]) -> dict[int, bool]:
        """Publish one row per group; True for rows that are settled."""
        remembered = (
            await self.memory.recall_many([r.dedup_id for r in heads])
            if self.memory
            else [None] * len(heads)
        )
        done = [
            (row, Published(mid, None))
            for row, mid in zip(heads, remembered, strict=True)
            if mid is not None
        ]
        by_topic: dict[str, list[PendingRow]] = {}
        for row, mid in zip(heads, remembered, strict=True):
            if mid is None:
                assert row.topic_arn is not None
                by_topic.setdefault(row.topic_arn, []).append(row)
        batches = [batch for rows in by_topic.values() for batch in _batches(rows)]
        replies = await asyncio.gather(*(self._send(batch) for batch in batches))
        settled = {row.id: True for row, _ in done}
        fresh: list[tuple[PendingRow, Published]] = []
        for batch, results in zip(batches, replies, strict=True):
            for row, result in zip(batch, results, strict=True):
                if isinstance(result, Published):
                    fresh.append((row, result))
                    settled[row.id] = True
                else:
                    await self._failed(row, result)
                    settled[row.id] = not result.retryable
        await self._mark_published(done, outcome="already_published")
        await self._mark_published(fresh, outcome="published")
        return settled

    async def _send(self, batch: list[PendingRow]) -> list[Published | PublishError]:
        """One result per row. A batch SNS refuses as a whole is sent again entry by entry
        when the refusal is permanent: one bad entry must not dead-letter the heads of up to
        nine other groups. A transient refusal is every row's (each group waits)."""
        try:
            return await self._publish(batch)
        except PublishError as exc:
            if exc.retryable or len(batch) == 1:
                return [exc] * len(batch)
            log.warning("publish_batch_refused", code=exc.code, entries=len(batch))
        # Each entry is the head of its own group, so sending them side by side keeps order.
        alone = await asyncio.gather(*(self._send([row]) for row in batch))
        return [result for (result,) in alone]

    async def _publish(self, batch: list[PendingRow]) -> list[Published | PublishError]:
        """A publish must be answered while this relay counts on its lease: past that, the
        next holder may have published the group's later rows, and a late send of this row
        would arrive after them. That time starts once the publish has a batch slot, on a
        renewal of the lease, and the lease is renewed while SNS takes its time
        (``CoveredLease.covering``): a slow SNS delays a publish, and only a lease lost to
        another relay, or not renewed in time, abandons it. An abandoned publish is retried
        by whoever holds the lease (if it did reach SNS, the same deduplication id makes
        the retry a no-op)."""
        covered: contextlib.AbstractAsyncContextManager[None] = (
            self.lease.covering() if self.lease is not None else contextlib.nullcontext()
        )
        try:
            # The slot first: waiting for one is not the publish's time under the lease.
            async with self._batch_slots, covered:
                results = await self.publisher.publish_batch([outgoing(r) for r in batch])
        except LeaseLost:
            raise PublishError(
                "abandoned: the relay lost its lease before SNS answered",
                code="LeaseExpired",
                retryable=True,
            ) from None
        # Remembered at once: the window in which a crash leads to a second publish is this
        # one round trip to Redis (SNS FIFO's own 5-minute dedup covers that).
        if self.memory is not None:
            await self.memory.remember_many(
                [
                    (row.dedup_id, result.message_id)
                    for row, result in zip(batch, results, strict=True)
                    if isinstance(result, Published)
                ]
            )
        return results

    async def _mark_published(
        self, published: list[tuple[PendingRow, Published]], *, outcome: str
    ) -> None:
        """Mark a round's published rows and finish their events: on PostgreSQL, the events
        locked and then one statement, on the driver (``app/store/published.py``); else one
        transaction of three statements whatever the round's size (a fourth when some events
        are left with only held calls: they become ``held``)."""
        if not published:
            return
        finished, held = await self._write_round(published)
        if held:
            EVENTS_FINISHED.labels(status=EventStatus.HELD).inc(held)
        now = datetime.now(UTC)
        for received in finished:
            labelled(EVENTS_FINISHED, EventStatus.PUBLISHED).inc()
            if received.tzinfo is None:  # SQLite returns naive datetimes
                received = received.replace(tzinfo=UTC)
            END_TO_END.observe((now - received).total_seconds())
        for row, result in published:
            self._backoff.pop(row.group_id, None)
            labelled(PUBLISHED, (row.topic_arn or "").rsplit(":", 1)[-1], outcome).inc()
            log.info(
                "tool_call_published",
                event_id=row.event_id,
                tool=row.tool,
                group_id=row.group_id,
                message_id=result.message_id,
            )

    async def _write_round(
        self, published: list[tuple[PendingRow, Published]]
    ) -> tuple[list[datetime], int]:
        """Mark the rows published and finish their events; the finished events'
        ``received_at`` times and how many became ``held``."""
        marks = [(row.id, result.message_id, result.sequence_number) for row, result in published]
        events = list(dict.fromkeys((r.event_id, r.generation) for r, _ in published))
        if self.driver is not None:
            return await mark_and_finish(self.driver, marks, events)
        async with self.sessions() as session:
            outbox = OutboxRepository(session)
            await outbox.mark_published(marks)
            done = await outbox.finished(events)
            repository = EventRepository(session)
            finished = await repository.finish_published(done.published)
            held = await repository.finish_held(done.held)
            await session.commit()
        return finished, held

    async def _failed(self, row: PendingRow, exc: PublishError) -> None:
        topic = (row.topic_arn or "").rsplit(":", 1)[-1]
        PUBLISHED.labels(topic=topic, outcome="retry" if exc.retryable else "dead").inc()
        async with self.sessions() as session:
            await OutboxRepository(session).mark_failed(
                row.id, error=f"{exc.code}: {exc}"[:2000], dead=not exc.retryable
            )
            reason = f"SNS {exc.code}: {exc}"[:2000]
            if not exc.retryable:
                await DeadLetters.add_in(session, row.event_id, stage="publish", reason=reason)
            await session.commit()
        if not exc.retryable:
            DeadLetters.count(row.event_id, stage="publish", reason=reason)
        if exc.retryable:
            failures = self._backoff.get(row.group_id, (0, 0.0))[0] + 1
            delay = random.uniform(0, min(self.max_backoff, 0.5 * 2**failures))
            self._backoff[row.group_id] = (failures, self.clock() + delay)
            log.warning(
                "publish_retry",
                event_id=row.event_id,
                group_id=row.group_id,
                code=exc.code,
                retry_in=round(delay, 2),
            )
        else:
            log.error("publish_dead_lettered", event_id=row.event_id, code=exc.code)


def _batches(rows: list[PendingRow]) -> Iterator[list[PendingRow]]:
    """Chunks of ≤10 entries and ≤256 KiB of message bodies and attributes."""
    batch: list[PendingRow] = []
    size = 0
    for row in rows:
        row_size = len(row.body.encode()) + 200  # attributes and ids, generously
        if batch and (len(batch) == BATCH_ENTRIES or size + row_size > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += row_size
    if batch:
        yield batch

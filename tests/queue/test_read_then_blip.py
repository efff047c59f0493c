"""A bad day: a Redis blip right after a read must not put a key's events out of order.

``QueueWorker._read_once`` reads new entries (``XREADGROUP``: they are now pending with this
consumer), then asks for entries pending with other consumers. When the second call failed
(Redis restarting, a connection reset), the entries already read were never submitted: they
stayed pending with this consumer, which the next reads (``>``: new entries only) and the
stale-owner claim (other consumers only) never return, so a later event of the same key was
processed first and the lost one came back through the orphan sweep, three lease TTLs later.
The same happens when the read's reply itself is lost with the connection, and when handing
the read's entries on fails half way (the read loop is restarted by its supervisor). After a
failed read, and when the read loop starts again, the worker takes every pending entry of
its partitions again, in order, first.

The worker runs on the real Redis; its queue is an ``EventQueue`` whose call fails once, as a
dropped connection makes it fail (a subclass passed to the constructor).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from app.events import Event
from app.queue.leases import LeaseGuard, PartitionLeases
from app.queue.streams import EventQueue, NewEntry, StreamEntry
from app.queue.worker import QueueWorker

TTL_MS = 2000


class QueueWithOneBlip(EventQueue):
    """The connection drops once, right after the first read that returned entries."""

    blipped = False

    async def claim_foreign_pending(
        self, *, consumer: str, partitions: list[int]
    ) -> list[StreamEntry]:
        if partitions and not self.blipped:
            self.blipped = True
            raise RedisConnectionError("Connection reset by peer")
        return await super().claim_foreign_pending(consumer=consumer, partitions=partitions)


class QueueLosingOneReply(EventQueue):
    """The first read that took entries loses its reply: Redis delivered them, the client
    saw a dropped connection."""

    blipped = False

    async def read_new(
        self, *, consumer: str, partitions: list[int], count: int, block_ms: int
    ) -> list[StreamEntry]:
        entries = await super().read_new(
            consumer=consumer, partitions=partitions, count=count, block_ms=block_ms
        )
        if entries and not self.blipped:
            self.blipped = True
            raise RedisConnectionError("Connection reset by peer")
        return entries


class QueueFailingOneAck(EventQueue):
    """The ack of an entry that cannot be read (dropped as it arrives) fails once: the
    submission of that read's entries raises half way, and the read loop is restarted."""

    blipped = False

    async def ack(self, entry: StreamEntry, event_id: str, *, token: str | None = None) -> bool:
        if not event_id and not self.blipped:
            self.blipped = True
            raise RedisConnectionError("Connection reset by peer")
        return await super().ack(entry, event_id, token=token)


def _event(n: int) -> Event:
    return Event(
        id=f"evt_{n:03d}",
        source="s",
        type="t",
        group_key="acme/api",
        delivery_id=f"d{n}",
        pipeline="p",
        received_at=datetime.now(UTC),
        payload={"n": n},
    )


async def _enqueue(queue: EventQueue, event: Event) -> None:
    await queue.enqueue(
        NewEntry(
            event_id=event.id,
            source=event.source,
            delivery_id=event.delivery_id,
            group_key=event.group_key,
            data=event.to_bytes(),
            dedup_window_ms=60_000,
        )
    )


async def _until(condition: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


Blipping = type[QueueWithOneBlip | QueueLosingOneReply | QueueFailingOneAck]


@pytest.mark.parametrize("blipping", [QueueWithOneBlip, QueueLosingOneReply, QueueFailingOneAck])
async def test_a_blip_after_a_read_does_not_let_a_later_event_of_the_key_go_first(
    redis: Redis, redis_prefix: str, blipping: Blipping
) -> None:
    queue = blipping(redis, prefix=redis_prefix, partitions=1)
    processed: list[str] = []

    async def process(event: Event, _: LeaseGuard) -> None:
        processed.append(event.id)

    async def give_up(event: Event, reason: str) -> None:
        raise AssertionError(f"{event.id} given up: {reason}")

    worker = QueueWorker(
        queue=queue,
        leases=PartitionLeases(redis, prefix=redis_prefix, partitions=1, owner="w1", ttl_ms=TTL_MS),
        process=process,
        give_up=give_up,
        consumer="w1",
        concurrency=2,
        grace_seconds=1,
        retry_delay=0.01,
        max_retry_delay=0.1,
    )
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: worker.reading, timeout=10)
        if blipping is QueueFailingOneAck:  # an unreadable entry just before evt_001
            async with redis.pipeline(transaction=True) as pipe:
                pipe.xadd(queue.stream_key(0), {"e": b"not an event"})
                pipe.xadd(queue.stream_key(0), {"e": _event(1).to_bytes()})
                await pipe.execute()
        else:
            await _enqueue(queue, _event(1))  # read, then the blip
        await _until(lambda: queue.blipped, timeout=10)
        await _enqueue(queue, _event(2))  # the same key, later
        # Both are processed well within one lease TTL when nothing is lost.
        await _until(lambda: len(processed) == 2, timeout=3 * TTL_MS / 1000 + 5)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 15)
    assert processed == ["evt_001", "evt_002"], f"processed in this order: {processed}"

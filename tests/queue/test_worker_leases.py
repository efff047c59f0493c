"""The worker keeps its leases while processing is stalled and its buffer is full."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from app.events import Event
from app.queue.layout import check_partition_count
from app.queue.leases import LeaseGuard, PartitionLeases
from app.queue.streams import EventQueue, NewEntry
from app.queue.worker import QueueWorker
from app.supervision import Supervisor


async def _never_gives_up(event: Event, reason: str) -> None:
    raise AssertionError(f"gave up on {event.id}: {reason}")


async def _enqueue(queue: EventQueue, count: int, *, keys: int) -> None:
    for n in range(count):
        event = Event(
            id=f"evt_{n}",
            source="s",
            type="t",
            group_key=f"k{n % keys}",
            delivery_id=f"d{n}",
            pipeline="p",
            received_at=datetime.now(UTC),
            payload={},
        )
        await queue.enqueue(
            NewEntry(
                event_id=event.id,
                source="s",
                delivery_id=event.delivery_id,
                group_key=event.group_key,
                data=event.to_bytes(),
                dedup_window_ms=60_000,
            )
        )


async def test_leases_are_renewed_while_the_buffer_is_full(redis: Redis, redis_prefix: str) -> None:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=2)
    await _enqueue(queue, 30, keys=5)
    stalled = asyncio.Event()

    async def stuck(_: Event, __: LeaseGuard) -> None:
        await stalled.wait()  # Claude never answers

    leases = PartitionLeases(redis, prefix=redis_prefix, partitions=2, owner="w1", ttl_ms=400)
    worker = QueueWorker(
        queue=queue,
        leases=leases,
        process=stuck,
        give_up=_never_gives_up,
        consumer="w1",
        concurrency=2,
        grace_seconds=0.1,
        max_buffered=3,
    )
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(0.5)
    held = dict(leases.tokens)
    assert sorted(held) == [0, 1]
    await asyncio.sleep(1.6)  # four lease lifetimes with the read loop waiting for room
    assert worker.dispatcher.free_slots() == 0
    for partition, token in held.items():
        assert await redis.get(leases.lease_key(partition)) == token.encode()
    worker.stop()
    stalled.set()
    await asyncio.wait_for(task, 10)
    assert leases.owned() == []  # given back on the way out


async def test_a_read_takes_no_more_entries_than_the_buffer_has_room_for(
    redis: Redis, redis_prefix: str
) -> None:
    """XREADGROUP's COUNT is per stream: the room is shared out over the partitions read, so
    a stalled worker holds about its buffer's worth of entries, not partitions times that."""
    partitions = 8
    queue = EventQueue(redis, prefix=redis_prefix, partitions=partitions)
    await _enqueue(queue, 200, keys=200)
    stalled = asyncio.Event()

    async def stuck(_: Event, __: LeaseGuard) -> None:
        await stalled.wait()

    leases = PartitionLeases(redis, prefix=redis_prefix, partitions=partitions, owner="w1")
    worker = QueueWorker(
        queue=queue,
        leases=leases,
        process=stuck,
        give_up=_never_gives_up,
        consumer="w1",
        concurrency=2,
        grace_seconds=0.1,
        max_buffered=16,
    )
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(1.0)
    read = 0
    for partition in range(partitions):
        read += (await redis.xpending(queue.stream_key(partition), "eventgate"))["pending"]
    assert 16 <= read <= 16 + partitions  # was up to 8 x 16 with COUNT = room per stream
    worker.stop()
    stalled.set()
    await asyncio.wait_for(task, 10)


def _idle_worker(
    queue: EventQueue, leases: PartitionLeases, *, supervisor: Supervisor | None = None
) -> QueueWorker:
    """A worker whose processing does nothing (these tests look at its leases)."""
    return QueueWorker(
        queue=queue,
        leases=leases,
        process=lambda _, __: asyncio.sleep(0),
        give_up=_never_gives_up,
        consumer="w1",
        concurrency=1,
        grace_seconds=0.1,
        supervisor=supervisor,
    )


class _SwallowingLeases(PartitionLeases):
    """Its tick swallows a cancel, as Python 3.11's ``wait_for`` can when the awaited call
    finishes at the same moment."""

    async def tick(self, **kwargs: Any) -> Any:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
        return await super().tick(**kwargs)


async def test_the_lease_keeper_ends_on_a_cancel_swallowed_below(
    redis: Redis, redis_prefix: str
) -> None:
    leases = _SwallowingLeases(redis, prefix=redis_prefix, partitions=1, owner="w1", ttl_ms=400)
    worker = _idle_worker(EventQueue(redis, prefix=redis_prefix, partitions=1), leases)
    keeper = Supervisor().start("lease-keeper", worker._keep_leases)
    await asyncio.sleep(0.02)  # inside the first tick
    await asyncio.wait_for(keeper.stop(), 2)  # a swallowed cancel is cancelled again
    assert keeper.current is not None and keeper.current.done()


async def test_a_worker_with_another_partition_count_takes_no_partition(
    redis: Redis, redis_prefix: str
) -> None:
    """The queue was made with 2 partitions; a worker configured with 4 takes no lease and
    reads nothing, and its loops are down (what ``/readyz`` reports)."""
    await check_partition_count(redis, prefix=redis_prefix, partitions=2)
    leases = PartitionLeases(redis, prefix=redis_prefix, partitions=4, owner="w1", ttl_ms=400)
    supervisor = Supervisor(restart_seconds=0.05)
    worker = _idle_worker(
        EventQueue(redis, prefix=redis_prefix, partitions=4), leases, supervisor=supervisor
    )
    worker.start()
    await asyncio.sleep(0.5)
    down = supervisor.down()
    assert "PartitionCountMismatch" in down.get("lease-keeper", ""), down
    assert "PartitionCountMismatch" in down.get("read-loop", ""), down
    assert leases.tokens == {}
    assert not await redis.exists(f"{redis_prefix}:{{p0}}:lease")
    await worker.shutdown()
    await supervisor.stop_all()

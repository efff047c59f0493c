"""The worker on a bad day: poison events end dead-lettered, an unavailable dependency is not
the event's fault, a stalled previous owner cannot reorder a key, and a failing key does not
hold the concurrency that other keys need."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import OperationalError

from app.events import Event
from app.queue.connection import connect_redis
from app.queue.dispatcher import KeyOrderedDispatcher
from app.queue.leases import LeaseGuard, PartitionLeases
from app.queue.streams import GROUP, EventQueue, NewEntry
from app.queue.worker import QueueWorker
from app.supervision import Supervisor


def _event(n: int, key: str) -> Event:
    return Event(
        id=f"evt_{n:03d}",
        source="s",
        type="t",
        group_key=key,
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


async def _until(condition: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _worker(
    queue: EventQueue,
    redis: Redis,
    prefix: str,
    *,
    process: object,
    given_up: list[tuple[str, str]],
    owner: str = "w1",
    max_failures: int = 3,
    retry_delay: float = 0.01,
) -> QueueWorker:
    async def give_up(event: Event, reason: str) -> None:
        given_up.append((event.id, reason))

    return QueueWorker(
        queue=queue,
        leases=PartitionLeases(redis, prefix=prefix, partitions=1, owner=owner, ttl_ms=2000),
        process=process,  # type: ignore[arg-type]
        give_up=give_up,
        consumer=owner,
        concurrency=2,
        grace_seconds=1,
        max_failures=max_failures,
        retry_delay=retry_delay,
        max_retry_delay=retry_delay * 10,
    )


async def test_a_poison_event_is_given_up_after_max_failures_and_others_go_on(
    redis: Redis, redis_prefix: str
) -> None:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=1)
    done: list[str] = []
    given_up: list[tuple[str, str]] = []

    async def process(event: Event, _: LeaseGuard) -> None:
        if event.group_key == "poison":
            raise ValueError("value too long for type character varying(200)")
        done.append(event.id)

    worker = _worker(queue, redis, redis_prefix, process=process, given_up=given_up)
    await _enqueue(queue, _event(1, "poison"))
    await _enqueue(queue, _event(2, "healthy"))
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: given_up and "evt_002" in done)
        await _until(lambda: worker.in_flight == 0)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
    assert given_up[0][0] == "evt_001"
    assert given_up[0][1].startswith("processing failed 3 times; last: ValueError")
    assert await redis.xlen(queue.stream_key(0)) == 0  # both acked
    assert await redis.hlen(queue.failures_key(0)) == 0  # its count went with the ack


async def test_an_unavailable_dependency_never_counts_against_the_event(
    redis: Redis, redis_prefix: str
) -> None:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=1)
    outages = [RedisConnectionError("down"), OperationalError("SELECT 1", {}, OSError("gone"))]
    attempts: list[int] = []
    given_up: list[tuple[str, str]] = []

    async def process(event: Event, _: LeaseGuard) -> None:
        attempts.append(1)
        if len(attempts) <= 6:
            raise outages[len(attempts) % 2]

    worker = _worker(
        queue, redis, redis_prefix, process=process, given_up=given_up, retry_delay=0.001
    )
    await _enqueue(queue, _event(1, "k"))
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: len(attempts) == 7 and worker.in_flight == 0)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
    assert given_up == []  # six failures, max_failures 3: none was the event's
    assert await redis.xlen(queue.stream_key(0)) == 0


async def test_failures_are_counted_across_restarts(redis: Redis, redis_prefix: str) -> None:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=1)
    await _enqueue(queue, _event(1, "poison"))
    entries = await redis.xrange(queue.stream_key(0))
    assert entries
    entry_id = entries[0][0]
    assert isinstance(entry_id, bytes)
    given_up: list[tuple[str, str]] = []

    async def fails(event: Event, _: LeaseGuard) -> None:
        raise ValueError("refused")

    async def failures() -> int:
        return int(await redis.hget(queue.failures_key(0), entry_id) or 0)

    for life, owner in enumerate(("first", "second", "third"), start=1):
        # Each process fails once (its own retry would come after a minute), then stops.
        worker = _worker(
            queue, redis, redis_prefix, process=fails, given_up=given_up, owner=owner,
            retry_delay=60,
        )  # fmt: skip
        running = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 10
        while not given_up and await failures() < life:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(running, 10)
    assert [event_id for event_id, _ in given_up] == ["evt_001"]


async def test_entries_a_stalled_previous_owner_took_are_processed_before_newer_ones(
    redis_url: str, redis: Redis, redis_prefix: str
) -> None:
    if redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis: two clients blocked on one stream")
    queue = EventQueue(redis, prefix=redis_prefix, partitions=1)
    await queue.ensure_groups([0])
    order: list[str] = []

    async def process(event: Event, _: LeaseGuard) -> None:
        order.append(event.id)

    # A previous owner that lost its lease while its blocking read was still at Redis (it
    # was stalled): that read is first in line and takes the next entry into its own
    # pending list, which only it could ack.
    stale_client = connect_redis(redis_url)
    stale_queue = EventQueue(stale_client, prefix=redis_prefix, partitions=1)
    stale = asyncio.create_task(
        stale_queue.read_new(consumer="stale", partitions=[0], count=1, block_ms=5000)
    )
    await asyncio.sleep(0.2)
    worker = _worker(queue, redis, redis_prefix, process=process, given_up=[])
    running = asyncio.create_task(worker.run())
    try:
        await _until(lambda: worker.reading)
        await asyncio.sleep(0.2)  # the worker's own blocking read is in line too
        await _enqueue(queue, _event(1, "k"))
        assert [e.entry_id for e in await stale] != []
        await _enqueue(queue, _event(2, "k"))
        await _until(lambda: len(order) == 2)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
        await stale_client.aclose()
    assert order == ["evt_001", "evt_002"]  # was: 2, then 1 once three lease TTLs passed
    assert (await redis.xpending(queue.stream_key(0), GROUP))["pending"] == 0


async def test_a_failing_key_does_not_hold_a_runner_while_it_waits_to_retry() -> None:
    done: list[str] = []

    async def handler(key: str) -> None:
        if key == "bad":
            raise RuntimeError("fails")
        done.append(key)

    dispatcher: KeyOrderedDispatcher[str] = KeyOrderedDispatcher(
        handler, concurrency=1, max_buffered=10, retry_delay=30, max_retry_delay=30
    )
    dispatcher.start(Supervisor())
    try:
        await dispatcher.submit("bad", "bad")
        await asyncio.sleep(0.05)  # the one runner took "bad", failed, waits up to 60 s
        await dispatcher.submit("good", "good")
        await _until(lambda: done == ["good"], timeout=2)  # was: after the retry delay
    finally:
        await dispatcher.stop()

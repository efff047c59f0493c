"""EnqueueBatcher: same answers as one Lua call per event, fewer round trips."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from app.queue.batching import EnqueueBatcher
from app.queue.connection import connect_redis
from app.queue.streams import EnqueueResult, EventQueue, NewEntry, unpack_entry
from tests.support import free_port

WINDOW_MS = 60_000


@pytest.fixture
def queue(redis: Redis, redis_prefix: str) -> EventQueue:
    return EventQueue(redis, prefix=redis_prefix, partitions=4)


def _enqueue(
    batcher: EnqueueBatcher, *, event_id: str, key: str, delivery: str | None = None
) -> asyncio.Future[EnqueueResult]:
    return asyncio.ensure_future(
        batcher.enqueue(
            NewEntry(
                event_id=event_id,
                source="github",
                delivery_id=delivery or f"d-{event_id}",
                group_key=key,
                data=orjson.dumps({"id": event_id, "key": key}),
                dedup_window_ms=WINDOW_MS,
            )
        )
    )


async def _stream_ids_by_key(queue: EventQueue) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for partition in range(queue.partitions):
        for _, fields in await queue.redis.xrange(queue.stream_key(partition)) or []:
            assert fields is not None
            entry = orjson.loads(unpack_entry(fields[b"e"]))  # type: ignore[arg-type]
            found.setdefault(entry["key"], []).append(entry["id"])
    return found


@pytest.mark.cluster_too
async def test_concurrent_calls_share_one_round_trip_and_get_their_own_results(
    queue: EventQueue,
) -> None:
    batcher = EnqueueBatcher(queue)
    results = await asyncio.gather(
        *(_enqueue(batcher, event_id=f"evt_{i}", key=f"repo/{i}") for i in range(20))
    )
    assert results == [EnqueueResult(f"evt_{i}", True) for i in range(20)]
    assert batcher.round_trips <= 2  # one, plus one more if Redis had to load the script
    assert await _stream_ids_by_key(queue) == {f"repo/{i}": [f"evt_{i}"] for i in range(20)}
    assert (await queue.backlog())[0] == 20
    assert await queue.is_queued("evt_7")


@pytest.mark.cluster_too
async def test_duplicate_within_one_batch_gets_the_first_event_id(queue: EventQueue) -> None:
    batcher = EnqueueBatcher(queue)
    first, second = await asyncio.gather(
        _enqueue(batcher, event_id="evt_a", key="acme/api", delivery="same"),
        _enqueue(batcher, event_id="evt_b", key="acme/api", delivery="same"),
    )
    assert first == EnqueueResult("evt_a", True)
    assert second == EnqueueResult("evt_a", False)
    assert (await queue.backlog())[0] == 1
    assert not await queue.is_queued("evt_b")


@pytest.mark.cluster_too
async def test_duplicate_across_batches_and_of_a_single_enqueue(queue: EventQueue) -> None:
    batcher = EnqueueBatcher(queue)
    assert await _enqueue(batcher, event_id="evt_a", key="k", delivery="d1") == EnqueueResult(
        "evt_a", True
    )
    assert await _enqueue(batcher, event_id="evt_b", key="k", delivery="d1") == EnqueueResult(
        "evt_a", False
    )
    # Same keys and script semantics as EventQueue.enqueue: each sees the other's deliveries.
    single = await queue.enqueue(
        NewEntry(
            event_id="evt_c",
            source="github",
            delivery_id="d2",
            group_key="k",
            data=b"{}",
            dedup_window_ms=WINDOW_MS,
        )
    )
    assert single == EnqueueResult("evt_c", True)
    assert await _enqueue(batcher, event_id="evt_d", key="k", delivery="d2") == EnqueueResult(
        "evt_c", False
    )
    assert (await queue.backlog())[0] == 2
    dedup_key = queue.dedup_key(queue.partition_of("k"), "github", "d1")
    assert 0 < await queue.redis.pttl(dedup_key) <= WINDOW_MS


@pytest.mark.cluster_too
async def test_per_key_order_is_call_order_across_many_batches(queue: EventQueue) -> None:
    batcher = EnqueueBatcher(queue, max_batch=7)
    keys = [f"repo/{k}" for k in range(5)]
    calls = [(f"evt_{n:03d}", keys[(n * 3) % 5]) for n in range(60)]
    futures = [_enqueue(batcher, event_id=event_id, key=key) for event_id, key in calls]
    await asyncio.gather(*futures)
    # More calls while a batch is in flight land in later batches, still in order.
    late = [(f"evt_{n:03d}", keys[n % 5]) for n in range(60, 80)]
    await asyncio.gather(*(_enqueue(batcher, event_id=e, key=k) for e, k in late))
    assert batcher.round_trips >= 60 // 7 + 1
    expected: dict[str, list[str]] = {}
    for event_id, key in calls + late:
        expected.setdefault(key, []).append(event_id)
    assert await _stream_ids_by_key(queue) == expected


async def test_script_is_loaded_when_redis_does_not_know_it() -> None:
    # A fresh in-process Redis has no scripts: the first EVALSHA answers NOSCRIPT.
    redis = connect_redis("memory://")
    batcher = EnqueueBatcher(EventQueue(redis, prefix="p", partitions=2))
    results = await asyncio.gather(
        *(_enqueue(batcher, event_id=f"evt_{i}", key=f"k{i}") for i in range(4))
    )
    assert all(result.created for result in results)
    assert batcher.round_trips == 2
    await redis.aclose()


@pytest.mark.parametrize("layout_checked", [True, False])
async def test_a_redis_error_fails_every_waiter_of_the_batch(layout_checked: bool) -> None:
    """Redis gone in the enqueue round trip, or already in the once-per-process check of the
    partition count before it."""
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    queue = EventQueue(redis, prefix="p", partitions=4)
    queue._layout_checked = layout_checked
    batcher = EnqueueBatcher(queue)
    results = await asyncio.gather(
        *(_enqueue(batcher, event_id=f"evt_{i}", key=f"k{i}") for i in range(5)),
        return_exceptions=True,
    )
    assert batcher.round_trips == (1 if layout_checked else 0)
    assert all(isinstance(result, RedisConnectionError) for result in results)
    # The batcher keeps working for later calls (it fails them too, it does not hang).
    with pytest.raises(RedisConnectionError):
        await _enqueue(batcher, event_id="evt_late", key="k")
    await redis.aclose()


@pytest.mark.cluster_too
async def test_a_cancelled_caller_does_not_cancel_the_others(queue: EventQueue) -> None:
    batcher = EnqueueBatcher(queue)
    gone = _enqueue(batcher, event_id="evt_gone", key="k")
    kept = _enqueue(batcher, event_id="evt_kept", key="k")
    await asyncio.sleep(0)  # both are waiting on the shared round trip
    gone.cancel()
    assert await kept == EnqueueResult("evt_kept", True)
    assert gone.cancelled()
    # The cancelled caller's event was still committed: a redelivery is a duplicate.
    assert (await queue.backlog())[0] == 2

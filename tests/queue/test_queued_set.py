"""The partition's queued set: an event is "queued" for the admin API exactly as long as its
entry is on the stream, and costs a hash field, not a key of its own."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from redis.asyncio import Redis

from app.events import Event
from app.queue.batching import EnqueueBatcher
from app.queue.requeue import requeue_event
from app.queue.streams import EventQueue, NewEntry

CONSUMER = "test-consumer"


@pytest.fixture
async def queue(redis: Redis, redis_prefix: str) -> EventQueue:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=2)
    await queue.ensure_groups([0, 1])
    return queue


def _entry(event_id: str, *, window_ms: int) -> NewEntry:
    return NewEntry(
        event_id=event_id,
        source="github",
        delivery_id=f"d-{event_id}",
        group_key="acme/api",
        data=orjson.dumps({"id": event_id}),
        dedup_window_ms=window_ms,
        replay_id=f"signed-{event_id}",
    )


@pytest.mark.cluster_too
async def test_an_event_stays_queued_past_its_dedup_window_until_acked(
    queue: EventQueue,
) -> None:
    """A backlog older than the dedup window (a long outage) is still shown as queued."""
    await queue.enqueue(_entry("evt_old", window_ms=50))
    await asyncio.sleep(0.2)
    assert await queue.is_queued("evt_old")
    entries = await queue.read_new(consumer=CONSUMER, partitions=[0, 1], count=10, block_ms=0)
    assert len(entries) == 1
    assert await queue.ack(entries[0], "evt_old")
    assert not await queue.is_queued("evt_old")


@pytest.mark.cluster_too
async def test_queued_events_cost_one_hash_per_partition_not_a_key_each(
    queue: EventQueue, redis: Redis, redis_prefix: str
) -> None:
    batcher = EnqueueBatcher(queue)
    await asyncio.gather(
        *(batcher.enqueue(_entry(f"evt_{i}", window_ms=60_000)) for i in range(50))
    )
    keys = {key.decode() async for key in redis.scan_iter(match=f"{redis_prefix}:*queued*")}
    assert keys == {queue.queued_key(queue.partition_of("acme/api"))}
    assert await redis.hlen(queue.queued_key(queue.partition_of("acme/api"))) == 50


@pytest.mark.cluster_too
async def test_an_operator_replay_is_queued_again_and_leaves_on_ack(queue: EventQueue) -> None:
    event = Event.model_validate(
        {
            "id": "evt_replayed",
            "source": "github",
            "type": "issues.opened",
            "group_key": "acme/api",
            "delivery_id": "d-1",
            "pipeline": "default",
            "received_at": "2026-12-02T10:00:00Z",
            "payload": {},
        }
    )
    await requeue_event(queue, event)
    assert await queue.is_queued("evt_replayed")
    (entry,) = await queue.read_new(consumer=CONSUMER, partitions=[0, 1], count=10, block_ms=0)
    assert await queue.ack(entry, "evt_replayed")
    assert not await queue.is_queued("evt_replayed")


@pytest.mark.cluster_too
async def test_a_marker_left_by_an_older_gateway_is_still_found(
    queue: EventQueue, redis: Redis
) -> None:
    """Events queued before an upgrade (a marker key each, with a TTL) keep their status."""
    await redis.set(queue.old_queued_marker_key(1, "evt_before"), b"1", px=60_000)
    assert await queue.is_queued("evt_before")
    assert not await queue.is_queued("evt_unknown")

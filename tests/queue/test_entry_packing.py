"""Queued events of a KiB or more are deflated on the stream when that is smaller, smaller
ones stay plain, and all are read back as they were, whoever wrote them (this gateway, an
older one that wrote them plain or deflated them all, an operator replay)."""

from __future__ import annotations

import os
import zlib

import orjson
import pytest
from redis.asyncio import Redis

from app.events import Event
from app.queue.batching import EnqueueBatcher
from app.queue.requeue import requeue_event
from app.queue.streams import DEFLATE_FROM_BYTES, EventQueue, NewEntry, pack_entry, unpack_entry
from tests.support import issue_payload

CONSUMER = "test-consumer"
LONG_BODY = "The deploy of api failed on step 3 of 7; the logs follow. " * 20


@pytest.fixture
async def queue(redis: Redis, redis_prefix: str) -> EventQueue:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=1)
    await queue.ensure_groups([0])
    return queue


def _event(n: int, *, body: str = "") -> Event:
    """A GitHub issue event; ``body`` as the issue's text (real deliveries run to KiBs)."""
    payload = issue_payload("acme/api", n)
    payload["issue"]["body"] = body
    return Event.model_validate(
        {
            "id": f"evt_{n}",
            "source": "github",
            "type": "issues.opened",
            "group_key": "acme/api",
            "delivery_id": f"d-{n}",
            "pipeline": "default",
            "received_at": "2026-12-02T10:00:00Z",
            "payload": payload,
        }
    )


def _new(event: Event) -> NewEntry:
    return NewEntry(
        event_id=event.id,
        source=event.source,
        delivery_id=event.delivery_id,
        group_key=event.group_key,
        data=event.to_bytes(),
        dedup_window_ms=60_000,
    )


async def _raw(queue: EventQueue) -> list[bytes]:
    raw: list[bytes] = []
    for _, fields in await queue.redis.xrange(queue.stream_key(0)) or []:
        assert fields is not None
        value = fields[b"e"]
        assert isinstance(value, bytes)
        raw.append(value)
    return raw


@pytest.mark.cluster_too
async def test_a_github_event_is_stored_deflated_and_read_back_unchanged(
    queue: EventQueue,
) -> None:
    first, second = _event(1, body=LONG_BODY), _event(2, body=LONG_BODY)
    assert len(first.to_bytes()) >= DEFLATE_FROM_BYTES
    await queue.enqueue(_new(first))
    await EnqueueBatcher(queue).enqueue(_new(second))
    raw = await _raw(queue)
    assert all(len(r) < len(e.to_bytes()) * 0.7 for r, e in zip(raw, (first, second), strict=True))
    entries = await queue.read_new(consumer=CONSUMER, partitions=[0], count=10, block_ms=0)
    assert [Event.from_bytes(entry.data) for entry in entries] == [first, second]


@pytest.mark.cluster_too
async def test_a_small_event_is_stored_plain_and_read_back_unchanged(queue: EventQueue) -> None:
    """Under a KiB, deflate costs more CPU than the bytes it saves are worth."""
    small = _event(6)
    assert len(small.to_bytes()) < DEFLATE_FROM_BYTES
    assert len(zlib.compress(small.to_bytes(), 1)) < len(small.to_bytes())  # would deflate
    await EnqueueBatcher(queue).enqueue(_new(small))
    assert await _raw(queue) == [small.to_bytes()]
    entries = await queue.read_new(consumer=CONSUMER, partitions=[0], count=10, block_ms=0)
    assert [Event.from_bytes(entry.data) for entry in entries] == [small]


@pytest.mark.cluster_too
async def test_entries_written_plain_are_read_as_they_are(queue: EventQueue) -> None:
    """An older gateway's entries (large ones too), and ones deflate would only make longer."""
    event = _event(3, body=LONG_BODY)
    await queue.redis.xadd(queue.stream_key(0), {"e": event.to_bytes()})
    noise = os.urandom(2 * DEFLATE_FROM_BYTES)
    assert pack_entry(noise) == noise  # deflate would make it longer
    entries = await queue.read_new(consumer=CONSUMER, partitions=[0], count=10, block_ms=0)
    assert Event.from_bytes(entries[0].data) == event


@pytest.mark.cluster_too
async def test_small_entries_an_older_gateway_deflated_still_unpack(queue: EventQueue) -> None:
    """Before the threshold every event that deflate made smaller was deflated."""
    event = _event(7)
    await queue.redis.xadd(queue.stream_key(0), {"e": zlib.compress(event.to_bytes(), 1)})
    entries = await queue.read_new(consumer=CONSUMER, partitions=[0], count=10, block_ms=0)
    assert Event.from_bytes(entries[0].data) == event


@pytest.mark.cluster_too
async def test_an_operator_replay_is_deflated_too_and_pending_entries_unpack(
    queue: EventQueue,
) -> None:
    event = _event(4, body=LONG_BODY)
    await requeue_event(queue, event)
    assert len((await _raw(queue))[0]) < len(event.to_bytes())
    await queue.read_new(consumer=CONSUMER, partitions=[0], count=10, block_ms=0)
    (taken,) = await queue.claim_pending(consumer="other", partition=0, min_idle_ms=0)
    assert Event.from_bytes(taken.data) == event


def test_a_damaged_deflated_entry_comes_back_raw_so_it_fails_as_poison() -> None:
    damaged = pack_entry(_event(5, body=LONG_BODY).to_bytes())[:-8]
    assert unpack_entry(damaged) == damaged
    with pytest.raises(orjson.JSONDecodeError):
        Event.from_bytes(unpack_entry(damaged))

"""eventgate_queue_oldest_age_seconds comes from the first entry id of each stream."""

from __future__ import annotations

import asyncio

from app.queue.connection import connect_redis
from app.queue.streams import EventQueue, NewEntry


async def test_oldest_age_follows_the_first_unacked_entry(
    redis_url: str, redis_prefix: str
) -> None:
    redis = connect_redis(redis_url)
    queue = EventQueue(redis, prefix=redis_prefix, partitions=4)
    try:
        assert (await queue.backlog())[1] == 0.0
        await queue.enqueue(
            NewEntry(
                event_id="evt_old",
                source="github",
                delivery_id="d1",
                group_key="acme/api",
                data=b"{}",
                dedup_window_ms=60_000,
            )
        )
        await asyncio.sleep(0.3)
        await queue.enqueue(
            NewEntry(
                event_id="evt_new",
                source="github",
                delivery_id="d2",
                group_key="acme/web",
                data=b"{}",
                dedup_window_ms=60_000,
            )
        )
        age = (await queue.backlog())[1]
        assert 0.25 <= age < 30
        await queue.ensure_groups(list(range(4)))
        entries = await queue.read_new(
            consumer="c", partitions=list(range(4)), count=10, block_ms=100
        )
        for entry in entries:
            await queue.ack(entry, "")
        assert (await queue.backlog())[1] == 0.0
    finally:
        await redis.delete(*[queue.stream_key(p) for p in range(4)])
        await redis.aclose()

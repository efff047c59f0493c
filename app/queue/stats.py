"""Queue gauges read from Redis at scrape time.

Acked entries are deleted from their stream (XACK + XDEL), so the first entry of a stream is
the oldest one not yet done, and its id (``<ms>-<seq>``) is the time it was added by Redis's
own clock, compared here with Redis's ``TIME`` so gateway clock skew does not matter.
"""

from __future__ import annotations

from app.queue.streams import EventQueue


async def oldest_entry_age_seconds(queue: EventQueue) -> float:
    async with queue.redis.pipeline(transaction=False) as pipe:
        for partition in range(queue.partitions):
            pipe.xrange(queue.stream_key(partition), count=1)
        pipe.time()
        *firsts, (seconds, micros) = await pipe.execute()
    added_ms = [int(entries[0][0].split(b"-", 1)[0]) for entries in firsts if entries]
    if not added_ms:
        return 0.0
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    return max(0.0, (now_ms - min(added_ms)) / 1000)

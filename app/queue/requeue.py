"""Put a stored event back on its partition stream, bypassing the delivery dedup.

Used by an operator replay: the original delivery id is still in the dedup window, so the
ingest path (``EventQueue.enqueue``) would answer "duplicate". The entry and the
partition's queued set share its hash tag, so one MULTI/EXEC writes both (Cluster-safe).
"""

from __future__ import annotations

from app.events import Event
from app.queue.streams import EventQueue, pack_entry


async def requeue_event(queue: EventQueue, event: Event) -> int:
    """XADD ``event`` to the partition of its group key; returns the partition."""
    partition = queue.partition_of(event.group_key)
    async with queue.redis.pipeline(transaction=True) as pipe:
        pipe.xadd(queue.stream_key(partition), {"e": pack_entry(event.to_bytes())})
        pipe.hset(queue.queued_key(partition), event.id, b"")
        await pipe.execute()
    return partition

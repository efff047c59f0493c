"""The partition count a queue was made with, kept beside it in Redis, and the one safe way
to change it.

A group key's partition is ``crc32(key) % partitions``: started with another count, a
process would put a key's next events on another stream than its earlier, still queued
ones, and two workers would run them out of order. So the count is stored under
``{prefix}:partitions`` on first start (an older queue, made before the count was stored,
tells its own by its streams) and every process refuses to start on another one
(``check_partition_count``).

``repartition`` changes it: only once every stream is empty and no worker is alive (nothing
queued can move), then the streams beyond the new count go and the new count is stored.
Dedup keys do not depend on the count on one Redis (they are source-wide: ``streams.py``),
so deliveries seen before the change stay duplicates after it. Keys of a queue made before
that (``{prefix}:{p3}:dedup:…`` and ``…:signed:…``) are renamed to their source-wide names
when the count is first stored.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.leases import members_key, partition_epoch_key, partition_lease_key

_PARTITION_KEY = re.compile(r"\{p(\d+)\}:(stream|dedup|signed)(?::(.+))?$")
# A worker seen this recently (the lease keeper beats every lease TTL / 3) counts as alive.
ALIVE_SECONDS = 60


class PartitionCountMismatch(Exception):
    """The configured count is not the one the queue in Redis was made with."""


class NotDrained(Exception):
    """``repartition`` refused: something is still queued, or a worker is alive."""


@dataclass(frozen=True, slots=True)
class Repartitioned:
    before: int
    after: int
    streams_removed: int


def count_key(prefix: str) -> str:
    return f"{prefix}:partitions"


async def check_partition_count(
    redis: Redis, *, prefix: str, partitions: int, source_wide_dedup: bool = True
) -> int:
    """The stored count, recorded now when there is none; ``PartitionCountMismatch`` when it
    is not ``partitions``. ``source_wide_dedup``: the queue keeps its dedup keys source-wide
    (one Redis), so an older queue's partition-scoped ones are renamed."""
    stored = await _stored(redis, prefix)
    if stored is None:
        found = await _migrate_older_queue(redis, prefix, rename=source_wide_dedup)
        await redis.set(count_key(prefix), found or partitions, nx=True)
        stored = await _stored(redis, prefix)
    if stored != partitions:
        raise PartitionCountMismatch(
            f"EVENTGATE_PARTITIONS is {partitions}, but the queue under prefix {prefix!r} was "
            f"made with {stored} partitions: with another count a group key's next events "
            "would go to another stream than its queued ones, out of order. Set "
            f"EVENTGATE_PARTITIONS={stored}, or change the count with `eventgate repartition "
            f"{partitions}` once the queue is drained and every process is stopped "
            "(docs/operations.md, 'Changing the partition count')."
        )
    return stored


async def repartition(
    redis: Redis, *, prefix: str, partitions: int, source_wide_dedup: bool = True
) -> Repartitioned:
    """Store ``partitions`` as the count, once nothing queued can move: every stream empty
    (acked entries are deleted, so an empty stream has nothing new nor pending), no
    partition lease held and no worker seen for ``ALIVE_SECONDS``. ``source_wide_dedup`` as
    for ``check_partition_count`` (False in a cluster)."""
    if partitions < 1:
        raise ValueError("the partition count must be at least 1")
    before = await _stored(redis, prefix)
    if before is None:
        before = await _migrate_older_queue(redis, prefix, rename=source_wide_dedup) or partitions
    streams = await _streams(redis, prefix)
    queued = {p: int(await redis.xlen(key)) for p, key in streams.items()}
    waiting = {p: n for p, n in queued.items() if n}
    if waiting:
        total = sum(waiting.values())
        raise NotDrained(
            f"{total} events are still queued in partitions {sorted(waiting)}: stop ingest "
            "(or the senders), let the workers finish them, then stop every process"
        )
    held = [
        p
        for p in range(max(before, partitions))
        if await redis.exists(partition_lease_key(prefix, p))
    ]
    seen = await redis.zrangebyscore(
        members_key(prefix), (time.time() - ALIVE_SECONDS) * 1000, "+inf"
    )
    if held or seen:
        raise NotDrained(
            f"workers are still running (partition leases held: {held or 'none'}; workers "
            f"seen in the last {ALIVE_SECONDS} s: {len(seen)}): stop every process first"
        )
    removed = [p for p in streams if p >= partitions]
    for p in removed:
        stream = streams[p]
        failures = stream.removesuffix(":stream") + ":failures"
        await redis.delete(stream, failures, partition_epoch_key(prefix, p))
    await redis.set(count_key(prefix), partitions)
    return Repartitioned(before=before, after=partitions, streams_removed=len(removed))


async def _stored(redis: Redis, prefix: str) -> int | None:
    value = await redis.get(count_key(prefix))
    return None if value is None else int(value)


async def _streams(redis: Redis, prefix: str) -> dict[int, str]:
    found: dict[int, str] = {}
    async for raw in redis.scan_iter(match=f"{prefix}:{{p*}}:stream", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        match = _PARTITION_KEY.search(key)
        if match:
            found[int(match.group(1))] = key
    return found


async def _migrate_older_queue(redis: Redis, prefix: str, *, rename: bool) -> int | None:
    """A queue made before its count was stored: the count its streams show (every stream is
    made at a worker's start), and its partition-scoped dedup keys renamed to the
    source-wide names (the same digest), keeping their expiry. A cross-partition claim of
    that time (``"<event id> <proof key>"``) whose event was queued was just overwritten by
    its partition's key; one still in that form never was, and goes. None when there is no
    such queue. Without ``rename`` (a cluster: dedup keys stay in their partition's slot)
    only the count."""
    if rename:
        await _rename_dedup_keys(redis, prefix)
    streams = await _streams(redis, prefix)
    return max(streams) + 1 if streams else None


async def _rename_dedup_keys(redis: Redis, prefix: str) -> None:
    for pattern, family in (("dedup", "dedup"), ("signed", "replays")):
        async for raw in redis.scan_iter(match=f"{prefix}:{{p*}}:{pattern}:*", count=1000):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            match = _PARTITION_KEY.search(key)
            if match is None or match.group(3) is None:
                continue
            try:
                await redis.rename(key, f"{prefix}:{family}:{match.group(3)}")
            except ResponseError:  # renamed meanwhile by another process starting
                continue
    async for raw in redis.scan_iter(match=f"{prefix}:replays:*", count=1000):
        value = await redis.get(raw)
        if value is not None and b" " in (value if isinstance(value, bytes) else value.encode()):
            await redis.delete(raw)

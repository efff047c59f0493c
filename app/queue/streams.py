"""Partitioned Redis Streams: the durable queue between ingest and the worker.

Keys carry a hash tag per partition (``{prefix}:{p7}:...``) so the dedup keys and the stream
of one partition live in the same Redis Cluster slot and one Lua call can touch them all.
``cluster`` (on by itself with redis-py's cluster client, ``connection.py``) keeps every
command and script call within one slot, and reads each partition on its own (``slots.py``);
on one Redis a batch of events goes in one call whatever partitions it touches, and dedup
keys are source-wide:
an event's second identity (``replays.py``) and its delivery id are found whatever
partition a copy lands in, and whatever the partition count (``layout.py``).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.leases import partition_lease_key
from app.queue import slots
from app.queue.connection import is_cluster
from app.queue.layout import check_partition_count
from app.queue.replays import Claim, ReplayClaims, ReplayInFlight
from app.redis_scripts import ScriptCall, run_scripts

GROUP = b"eventgate"

# Dedup and enqueue in one atomic step, for one event or a batch (the one enqueue script: the
# batched ingest path and ``EventQueue.enqueue`` both run it). Per event, in call order:
# KEYS: dedup key, second dedup key, stream key, the partition's queued set;
# ARGV: event id, window (ms), event bytes.
# An event is a duplicate when either dedup key holds an event id (the first one's is
# answered); else it is XADDed, both keys are set and the event id joins the partition's
# queued set (a hash, for the admin API, until the worker has stored it and acked). An event
# without a second identity passes its dedup key twice. A 2xx is only sent once the XADD has
# happened.
# The second dedup key is the source-wide replay key (``replays.py``) on one Redis; in a Redis
# Cluster, where a call may only touch one partition's keys, the partition's own (the
# source-wide claim is then taken first, in a round trip of its own).
# Per event the reply is a code and an event id: CREATED, or a duplicate found by the
# delivery id (BY_DELIVERY) or by the second identity alone (BY_REPLAY: the same request).
ENQUEUE = """
local out = {}
for i = 0, #KEYS / 4 - 1 do
  local k, a = i * 4, i * 3
  local existing = redis.call('GET', KEYS[k + 1])
  local found = 0
  if not existing then
    existing = redis.call('GET', KEYS[k + 2])
    found = 2
  end
  if existing then
    out[#out + 1] = found
    out[#out + 1] = existing
  else
    redis.call('XADD', KEYS[k + 3], '*', 'e', ARGV[a + 3])
    redis.call('SET', KEYS[k + 1], ARGV[a + 1], 'PX', ARGV[a + 2])
    redis.call('SET', KEYS[k + 2], ARGV[a + 1], 'PX', ARGV[a + 2])
    redis.call('HSET', KEYS[k + 4], ARGV[a + 1], '')
    out[#out + 1] = 1
    out[#out + 1] = ARGV[a + 1]
  end
end
return out
"""

BY_DELIVERY, CREATED, BY_REPLAY = 0, 1, 2

# A queued event of DEFLATE_FROM_BYTES or more is kept deflated when that makes it smaller:
# a backlog is mostly payload JSON, and the fixtures' GitHub deliveries (7-26 KB) deflate to
# 15-24% of their size at the fastest level. A smaller event stays plain: deflate took about
# 16 µs of ingest's CPU under load for a 691-byte event (a tenth of a request) to save some
# 300 bytes, less than its keys and stream entry take anyway (a backlog of such events took
# 1.2 KiB of Redis memory each; docs/benchmarks.md). An event is a JSON object, so its first
# byte is "{", never the "x" a zlib stream starts with; an entry written plain (small,
# before this, or by an operator) reads as it is.
DEFLATE_FROM_BYTES = 1024
_DEFLATED = b"x"


def pack_entry(data: bytes) -> bytes:
    """What goes on the stream for an event's bytes: deflated when it is at least
    ``DEFLATE_FROM_BYTES`` long and deflating makes it smaller."""
    if len(data) < DEFLATE_FROM_BYTES:
        return data
    deflated = zlib.compress(data, 1)
    return deflated if len(deflated) < len(data) else data


def unpack_entry(raw: bytes) -> bytes:
    """An event's bytes as queued; an entry that is not a zlib stream comes back as is (a
    malformed one then fails to parse as an event, as any other poison entry does)."""
    if raw[:1] != _DEFLATED:
        return raw
    try:
        return zlib.decompress(raw)
    except zlib.error:
        return raw


# Fenced ack: a worker whose lease tenure ended (ARGV[3] no longer the lease value) cannot ack.
# The event leaves the partition's queued set (KEYS[2]) and the entry's failure count
# (KEYS[4]) goes with it.
_ACK = """
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then return 0 end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[4])
redis.call('HDEL', KEYS[4], ARGV[2])
return 1
"""


@dataclass(frozen=True, slots=True)
class StreamEntry:
    partition: int
    entry_id: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class NewEntry:
    """One event to put on its partition's stream (the partition of its group key), unless
    it is a duplicate: its ``delivery_id`` and ``replay_id`` (a second identity: a digest of
    what its signature covers, when the delivery id is not signed) are remembered for
    ``dedup_window_ms``, and a match on either is a duplicate."""

    event_id: str
    source: str
    delivery_id: str
    group_key: str
    data: bytes
    dedup_window_ms: int
    replay_id: str | None = None


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    event_id: str
    created: bool


class EventQueue:
    def __init__(
        self, redis: Redis, *, prefix: str, partitions: int, cluster: bool | None = None
    ) -> None:
        """``cluster``: keep every call within one slot; None: when ``redis`` is a cluster
        client (True on one Redis runs the cluster's way there, for tests)."""
        self.redis = redis
        self.prefix = prefix
        self.partitions = partitions
        self.cluster = is_cluster(redis) if cluster is None else cluster
        self._layout_checked = False
        self._enqueue = redis.register_script(ENQUEUE)
        self._ack = redis.register_script(_ACK)
        self.replays = ReplayClaims(redis, prefix=prefix)

    async def check_layout(self) -> None:
        """Once per process, before the first enqueue or read: the partition count is the
        one the queue was made with (``layout.py``; ``PartitionCountMismatch`` if not)."""
        if not self._layout_checked:
            await check_partition_count(
                self.redis,
                prefix=self.prefix,
                partitions=self.partitions,
                source_wide_dedup=not self.cluster,
            )
            self._layout_checked = True

    def partition_of(self, group_key: str) -> int:
        return zlib.crc32(group_key.encode()) % self.partitions

    def stream_key(self, partition: int) -> str:
        return f"{self.prefix}:{{p{partition}}}:stream"

    def dedup_key(self, partition: int, source: str, delivery_id: str) -> str:
        """Source-wide on one Redis (so it outlives a change of the partition count,
        ``layout.py``); in the partition's slot in a cluster."""
        digest = hashlib.sha256(f"{source}\0{delivery_id}".encode()).hexdigest()[:32]
        if not self.cluster:
            return f"{self.prefix}:dedup:{digest}"
        return f"{self.prefix}:{{p{partition}}}:dedup:{digest}"

    def failures_key(self, partition: int) -> str:
        """Hash of entry id → processing failures, for the entries not yet acked."""
        return f"{self.prefix}:{{p{partition}}}:failures"

    def replay_key(self, partition: int, source: str, replay_id: str) -> str:
        digest = hashlib.sha256(f"{source}\0{replay_id}".encode()).hexdigest()[:32]
        return f"{self.prefix}:{{p{partition}}}:signed:{digest}"

    def queued_key(self, partition: int) -> str:
        """Hash of the partition's event ids on the stream and not yet acked: one field per
        event (about half the Redis memory of a key of its own with a TTL, docs/benchmarks.md),
        and it lasts exactly as long as its entry."""
        return f"{self.prefix}:{{p{partition}}}:queued"

    def old_queued_marker_key(self, partition: int, event_id: str) -> str:
        """Where a gateway before the queued hash marked an event (a key with the dedup
        window as TTL); still read, so events queued across an upgrade are found."""
        return f"{self.prefix}:{{p{partition}}}:queued:{event_id}"

    def enqueue_keys(self, partition: int, entry: NewEntry) -> tuple[str, str, str, str]:
        """The KEYS of one event for ``ENQUEUE``: in a cluster all in the partition's hash
        tag; on one Redis the dedup keys are source-wide (a copy relabelled into another
        partition finds them, and they outlive a change of the partition count)."""
        dedup = self.dedup_key(partition, entry.source, entry.delivery_id)
        replay = entry.replay_id
        if replay is None:
            second = dedup
        elif self.cluster:
            second = self.replay_key(partition, entry.source, replay)
        else:
            second = self.replays.claim_key(entry.source, replay)
        return dedup, second, self.stream_key(partition), self.queued_key(partition)

    async def is_queued(self, event_id: str) -> bool:
        """True while the event is on a stream and not yet stored by a worker."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for partition in range(self.partitions):
                pipe.hexists(self.queued_key(partition), event_id)
                pipe.exists(self.old_queued_marker_key(partition, event_id))
            found = await pipe.execute()
        return any(found)

    def claim_of(self, entry: NewEntry) -> Claim | None:
        """The cross-partition claim of an event with a second identity (``replays.py``),
        taken before its enqueue script runs in a cluster; None on one Redis, where the
        script itself checks and sets the source-wide key."""
        if entry.replay_id is None or not self.cluster:
            return None
        return Claim(
            key=self.replays.claim_key(entry.source, entry.replay_id),
            event_id=entry.event_id,
            window_ms=entry.dedup_window_ms,
            proof_key=self.replay_key(
                self.partition_of(entry.group_key), entry.source, entry.replay_id
            ),
        )

    async def enqueue(self, entry: NewEntry) -> EnqueueResult:
        """One event: one Lua call (in a cluster, after its replay claim when it has a second
        identity)."""
        await self.check_layout()
        claim = self.claim_of(entry)
        if claim is not None:
            (held,) = await self.replays.take([claim])
            if isinstance(held, ReplayInFlight):
                raise held
            if held is not None:
                return EnqueueResult(held, created=False)
        keys = self.enqueue_keys(self.partition_of(entry.group_key), entry)
        try:
            code, stored = await self._enqueue(
                keys=list(keys),
                args=[entry.event_id, entry.dedup_window_ms, pack_entry(entry.data)],
            )
        except BaseException:
            if claim is not None:
                await self.replays.settle([(claim, None)])
            raise
        stored_id = stored.decode() if isinstance(stored, bytes) else str(stored)
        if claim is not None and code != CREATED:
            await self.replays.settle([(claim, stored_id if code == BY_REPLAY else None)])
        return EnqueueResult(stored_id, code == CREATED)

    async def ensure_groups(self, partitions: list[int]) -> None:
        for partition in partitions:
            try:
                await self.redis.xgroup_create(
                    self.stream_key(partition), GROUP, id="0", mkstream=True
                )
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def read_new(
        self, *, consumer: str, partitions: list[int], count: int, block_ms: int
    ) -> list[StreamEntry]:
        """New entries of ``partitions`` (up to ``count`` per stream), waiting up to
        ``block_ms`` for some. On one Redis one blocking XREADGROUP over all the streams; in a
        cluster, where one command may only name one slot's keys, a non-blocking read per
        partition, repeated while nothing came (``slots.py``)."""
        if not partitions:
            return []
        if self.cluster:
            found = await slots.poll_streams(
                self.redis,
                keys=[self.stream_key(p) for p in partitions],
                group=GROUP,
                consumer=consumer,
                count=count,
                block_ms=block_ms,
            )
            return self._entries(found)
        streams: dict[Any, Any] = {self.stream_key(p): ">" for p in partitions}
        reply = await self.redis.xreadgroup(
            GROUP.decode(),
            consumer,
            streams,
            count=count,
            block=block_ms,
        )
        return self._entries(reply)

    async def claim_pending(
        self, *, consumer: str, partition: int, min_idle_ms: int
    ) -> list[StreamEntry]:
        """Take over entries delivered but never acked (a crashed or departed consumer)."""
        claimed: list[StreamEntry] = []
        cursor: bytes | str = "0-0"
        while True:
            reply = await self.redis.xautoclaim(
                self.stream_key(partition),
                GROUP,
                consumer,
                min_idle_time=min_idle_ms,
                start_id=cursor,
                count=100,
            )
            cursor, messages = reply[0], reply[1]
            claimed += [
                StreamEntry(partition, mid, unpack_entry(fields[b"e"]))
                for mid, fields in messages
                if fields
            ]
            if cursor in (b"0-0", "0-0"):
                return claimed

    async def claim_foreign_pending(
        self, *, consumer: str, partitions: list[int]
    ) -> list[StreamEntry]:
        """Entries of ``partitions`` pending with any other consumer, claimed for ``consumer``
        (oldest first). One pipelined round trip when there are none, the common case."""
        if not partitions:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for partition in partitions:
                pipe.xpending(self.stream_key(partition), GROUP)
            summaries = await pipe.execute()
        claimed: list[StreamEntry] = []
        for partition, summary in zip(partitions, summaries, strict=True):
            others = [c for c in summary.get("consumers") or [] if _name(c["name"]) != consumer]
            if any(int(c["pending"]) > 0 for c in others):
                claimed += await self.claim_pending(
                    consumer=consumer, partition=partition, min_idle_ms=0
                )
        return sorted(claimed, key=lambda e: _entry_order(e.entry_id))

    async def record_failure(self, entry: StreamEntry) -> int:
        """Count one failed processing of ``entry``; the total so far (kept until the ack)."""
        count = await self.redis.hincrby(
            self.failures_key(entry.partition), entry.entry_id.decode(), 1
        )
        return int(count)

    async def forget_idle_consumers(self, *, partition: int, keep: str) -> int:
        """Delete the group's other consumers that hold nothing (processes that left or were
        restarted): without this every process start leaves a name behind on every stream."""
        key = self.stream_key(partition)
        removed = 0
        for consumer in await self.redis.xinfo_consumers(key, GROUP):
            name = _name(consumer["name"])
            if name != keep and int(consumer["pending"]) == 0:
                await self.redis.xgroup_delconsumer(key, GROUP, name)
                removed += 1
        return removed

    async def ack(self, entry: StreamEntry, event_id: str, *, token: str | None = None) -> bool:
        """Ack + delete the entry; with ``token``, only while that lease tenure still holds."""
        keys = [
            self.stream_key(entry.partition),
            self.queued_key(entry.partition),
            partition_lease_key(self.prefix, entry.partition),
            self.failures_key(entry.partition),
        ]
        args = [GROUP, entry.entry_id, token or "", event_id]
        # With the other acks (and scripts) of this turn: events of one read end together.
        (result,) = await run_scripts([ScriptCall(self._ack, keys, args)])
        return bool(result)

    async def check_writable(self) -> None:
        """Raise unless an enqueue could be written now: a write in every partition's slot
        (``slots.py``). On one Redis that is one round trip; a plain client given a cluster's
        node (its mode undetected at start) fails it with MovedError, as its enqueues do."""
        await slots.check_writable(
            self.redis, [f"{self.prefix}:{{p{p}}}:ready" for p in range(self.partitions)]
        )

    async def backlog(self) -> tuple[int, float]:
        """(entries on all streams, age in seconds of the oldest one; 0 when empty).

        Acked entries are deleted, so a stream's first entry is its oldest unfinished one;
        its id (``<ms>-<seq>``) is compared with Redis's own ``TIME``, so gateway clock skew
        does not matter.
        """
        # The cluster client has no TIME in a pipeline: asked on its own there.
        clustered = is_cluster(self.redis)
        async with self.redis.pipeline(transaction=False) as pipe:
            for partition in range(self.partitions):
                pipe.xlen(self.stream_key(partition))
                pipe.xrange(self.stream_key(partition), count=1)
            if not clustered:
                pipe.time()
            replies = await pipe.execute()
        seconds, micros = await self.redis.time() if clustered else replies.pop()
        depth = sum(int(n) for n in replies[0::2])
        added_ms = [int(r[0][0].split(b"-", 1)[0]) for r in replies[1::2] if r]
        if not added_ms:
            return depth, 0.0
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        return depth, max(0.0, (now_ms - min(added_ms)) / 1000)

    def _entries(self, reply: Any) -> list[StreamEntry]:
        entries: list[StreamEntry] = []
        if not reply:
            return entries
        items = reply.items() if isinstance(reply, dict) else reply  # RESP3 vs RESP2
        for stream, messages in items:
            name = stream.decode() if isinstance(stream, bytes) else str(stream)
            partition = int(name.split("{p", 1)[1].split("}", 1)[0])
            for mid, fields in messages:
                entries.append(StreamEntry(partition, mid, unpack_entry(fields[b"e"])))
        return entries


def _name(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry_order(entry_id: bytes) -> tuple[int, int]:
    millis, _, seq = entry_id.partition(b"-")
    return int(millis), int(seq or 0)

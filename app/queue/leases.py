"""Partition leases: one owner per partition at a time, spread over live processes.

A lease is ``SET {prefix}:{pN}:lease <owner>:<epoch> NX PX ttl``; the epoch comes from an
INCR at acquisition (never below Redis's clock in ms), so a token names one tenure and later
tenures have larger epochs. The owner renews every ``ttl/4``; a process
that dies stops renewing and its partitions are free after ``ttl`` (taken over on the next
rebalance tick). Members announce themselves in a sorted set with a heartbeat; each takes at
most ceil(partitions / live members) so load spreads as processes come and go. Acks are
fenced with the token (see ``EventQueue.ack``): a process that lost a lease cannot ack.

``still_owns`` answers from the local clock while the last renewal (or the acquisition) is
less than half a TTL old: the key then cannot have expired, so no other process can hold
it, and the check costs no round trip on every event's path. Past that (renewals stalled,
the process was paused) it asks Redis. A clock that stopped while Redis's ran on (a
suspended VM) could make it answer wrongly for up to half a TTL. The check only saves
work, as it did before (a lease can also be lost just after a Redis check): the ack stays
fenced in Redis, and an event processed twice is published once (unique outbox dedup ids).

Every change of the lease set (``tick``, ``give_back_extras``, ``release``, ``release_all``)
runs under one lock: the lease keeper and the read loop are separate tasks, and a partition
given back while a renewal of it was on the wire must not be mistaken for, or crash on, a lost
lease.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from redis.asyncio import Redis

from app.faults import LeaseLost
from app.leases import LeaseScripts, members_key, partition_epoch_key, partition_lease_key

log = structlog.get_logger(__name__)

# The epoch never goes back, even when Redis lost its data (restarted empty): it is at least
# Redis's clock in milliseconds, so the database can keep fencing by it.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local now = redis.call('TIME')
local floor = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local epoch = redis.call('INCR', KEYS[2])
if epoch < floor then
  epoch = floor
  redis.call('SET', KEYS[2], string.format('%d', epoch))
end
local token = ARGV[1] .. ':' .. string.format('%d', epoch)
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
"""


@dataclass(frozen=True, slots=True)
class LeaseGuard:
    """The lease one stream entry was read under: its epoch (tenures of a partition have
    increasing epochs, so the store can refuse a stale owner's write) and a check that the
    tenure still holds (a local clock check within half a TTL of the last renewal, else Redis).
    """

    partition: int
    epoch: int
    holds: Callable[[], Awaitable[bool]]

    async def check(self) -> None:
        if not await self.holds():
            raise LeaseLost(f"the lease of partition {self.partition} moved to another process")


@dataclass
class LeaseChanges:
    acquired: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)


class PartitionLeases:
    def __init__(
        self, redis: Redis, *, prefix: str, partitions: int, owner: str, ttl_ms: int = 10_000
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.partitions = partitions
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.tokens: dict[int, str] = {}
        # partition → monotonic time a renewal or acquisition that succeeded was sent
        self._confirmed: dict[int, float] = {}
        self.share = partitions
        self._lock = asyncio.Lock()
        self._scripts = LeaseScripts(redis)
        self._acquire = redis.register_script(_ACQUIRE)

    @property
    def members_key(self) -> str:
        return members_key(self.prefix)

    def lease_key(self, partition: int) -> str:
        return partition_lease_key(self.prefix, partition)

    def epoch_key(self, partition: int) -> str:
        return partition_epoch_key(self.prefix, partition)

    def owned(self) -> list[int]:
        return sorted(self.tokens)

    async def live_members(self) -> int:
        now_ms = int(time.time() * 1000)
        await self.redis.zremrangebyscore(self.members_key, 0, now_ms - self.ttl_ms)
        return max(1, int(await self.redis.zcard(self.members_key)))

    async def tick(
        self, *, busy: set[int] | None = None, acquire: bool = True, give_back: bool = True
    ) -> LeaseChanges:
        """Heartbeat, renew, give back extras (only idle ones, and only with ``give_back``),
        take free ones up to a share (unless ``acquire`` is False: a stopping process only
        keeps what it has)."""
        async with self._lock:
            return await self._tick(busy=busy or set(), acquire=acquire, give_back=give_back)

    async def _tick(self, *, busy: set[int], acquire: bool, give_back: bool) -> LeaseChanges:
        changes = LeaseChanges()
        await self.redis.zadd(self.members_key, {self.owner: int(time.time() * 1000)})
        for partition, token in list(self.tokens.items()):
            sent = time.monotonic()
            if await self._scripts.renew(
                self.lease_key(partition), holder=token, ttl_ms=self.ttl_ms
            ):
                self._confirmed[partition] = sent
            else:
                del self.tokens[partition]
                self._confirmed.pop(partition, None)
                changes.lost.append(partition)
                log.warning("lease_lost", partition=partition)
        share = math.ceil(self.partitions / await self.live_members())
        self.share = share
        if give_back:
            changes.lost += await self._give_back_extras(busy=busy)
        if acquire and len(self.tokens) < share:
            free = [p for p in range(self.partitions) if p not in self.tokens]
            random.shuffle(free)  # processes starting together should not collide in order
            for partition in free:
                if len(self.tokens) >= share:
                    break
                sent = time.monotonic()
                token = await self._acquire(
                    keys=[self.lease_key(partition), self.epoch_key(partition)],
                    args=[self.owner, self.ttl_ms],
                )
                if token:
                    self.tokens[partition] = token.decode() if isinstance(token, bytes) else token
                    self._confirmed[partition] = sent
                    changes.acquired.append(partition)
        if changes.acquired or changes.lost:
            log.info(
                "leases_changed",
                acquired=changes.acquired,
                lost=changes.lost,
                owned=len(self.tokens),
                share=share,
            )
        return changes

    async def give_back_extras(self, *, busy: set[int]) -> list[int]:
        """Release idle partitions held beyond the last computed share."""
        async with self._lock:
            return await self._give_back_extras(busy=busy)

    async def _give_back_extras(self, *, busy: set[int]) -> list[int]:
        released: list[int] = []
        extra = len(self.tokens) - self.share
        for partition in sorted(self.tokens, reverse=True):
            if extra <= 0:
                break
            if partition in busy:
                continue
            await self._release(partition)
            released.append(partition)
            extra -= 1
        return released

    async def still_owns(self, partition: int) -> bool:
        token = self.tokens.get(partition)
        if token is None:
            return False
        confirmed = self._confirmed.get(partition)
        if confirmed is not None and time.monotonic() - confirmed < self.ttl_ms / 2000:
            return True
        current = await self.redis.get(self.lease_key(partition))
        if isinstance(current, bytes):
            current = current.decode()
        return current == token

    def guard(self, partition: int) -> LeaseGuard | None:
        """A guard for work read under the current tenure of ``partition`` (None if not held).

        It holds while this process owns the partition, in this tenure or a later one of its
        own: work in flight when a lease expired and was taken back by this same process is
        still this process's (the new tenure skipped it when it claimed what was pending), so
        it must go on rather than be dropped and wait as an orphan behind later entries."""
        token = self.tokens.get(partition)
        if token is None:
            return None

        async def holds() -> bool:
            return await self.still_owns(partition)

        return LeaseGuard(partition, epoch_of(token), holds)

    async def release(self, partition: int) -> None:
        async with self._lock:
            await self._release(partition)

    async def release_all(self) -> None:
        async with self._lock:
            for partition in list(self.tokens):
                await self._release(partition)
            await self.redis.zrem(self.members_key, self.owner)

    async def _release(self, partition: int) -> None:
        token = self.tokens.pop(partition, None)
        self._confirmed.pop(partition, None)
        if token is not None:
            await self._scripts.release(self.lease_key(partition), holder=token)


def epoch_of(token: str) -> int:
    """The tenure's epoch: tokens are ``<owner>:<epoch>``."""
    return int(token.rsplit(":", 1)[1])

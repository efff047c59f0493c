"""Partition leases: one owner per partition at a time, spread over live processes.

A lease is ``SET {prefix}:{pN}:lease <owner>:<epoch> NX PX ttl``; the epoch comes from an
INCR at acquisition, so a token names one tenure. The owner renews every ``ttl/4``; a process
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
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import structlog
from redis.asyncio import Redis

log = structlog.get_logger(__name__)

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local epoch = redis.call('INCR', KEYS[2])
local token = ARGV[1] .. ':' .. epoch
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


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
        self._renew = redis.register_script(_RENEW)
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)

    @property
    def members_key(self) -> str:
        return f"{self.prefix}:members"

    def lease_key(self, partition: int) -> str:
        return f"{self.prefix}:{{p{partition}}}:lease"

    def epoch_key(self, partition: int) -> str:
        return f"{self.prefix}:{{p{partition}}}:epoch"

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
        changes = LeaseChanges()
        await self.redis.zadd(self.members_key, {self.owner: int(time.time() * 1000)})
        for partition, token in list(self.tokens.items()):
            sent = time.monotonic()
            if await self._renew(keys=[self.lease_key(partition)], args=[token, self.ttl_ms]):
                self._confirmed[partition] = sent
            else:
                del self.tokens[partition]
                self._confirmed.pop(partition, None)
                changes.lost.append(partition)
                log.warning("lease_lost", partition=partition)
        share = math.ceil(self.partitions / await self.live_members())
        self.share = share
        if give_back:
            changes.lost += await self.give_back_extras(busy=busy or set())
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
        released: list[int] = []
        extra = len(self.tokens) - self.share
        for partition in sorted(self.tokens, reverse=True):
            if extra <= 0:
                break
            if partition in busy:
                continue
            await self.release(partition)
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

    async def release(self, partition: int) -> None:
        token = self.tokens.pop(partition, None)
        self._confirmed.pop(partition, None)
        if token is not None:
            await self._release(keys=[self.lease_key(partition)], args=[token])

    async def release_all(self) -> None:
        for partition in list(self.tokens):
            await self.release(partition)
        await self.redis.zrem(self.members_key, self.owner)

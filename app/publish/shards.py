"""Relays that split the outbox between them: shard leases, a fair share each.

Every outbox row carries its message group's relay slot (``slot_of``, 0 to 255); shard ``s`` of
``shards`` is the slots with ``slot % shards == s``. A group has one slot, so one shard, so
one relay at a time publishes it: its order holds as with a single relay, and the record of
what was published (dedup ids, ``PublishedMemory``) is the same.

``hold()`` is one script: a heartbeat in the members set (a member silent for a ttl is
dropped), share = ceil(shards / live members), renew the shards held, give back those beyond
the share, take free ones up to it. The relay calls it only between rounds, with nothing in
flight, so a shard given back has no publish outstanding. A dead relay's shards are free a
ttl after its last renewal and taken on the next ``hold()`` of another. A publish runs inside
``covering()``, with ``RelayLease``'s rules: every held shard is renewed while SNS answers, and
the publish is abandoned once a renewal finds one lost, or at ``valid_until``.

Rolling upgrade: a relay of the previous version takes the single relay lease. Sharded relays
keep that key set to ``SHARDED`` (renewed with their shards) so an old relay never takes it
while they run, and publish nothing while an old relay holds it: that one keeps publishing
every group until it stops and its lease expires, and the sharded relays take over then.

A relay started with another shard count than the live ones holds nothing, and does not count
as a member, until they are gone: shards of two counts would overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Awaitable, Callable

import structlog
from redis.asyncio import Redis

from app.faults import REDIS_ERRORS
from app.leases import (
    LeaseScripts,
    relay_layout_key,
    relay_lease_key,
    relay_members_key,
    relay_shard_key,
)
from app.publish.coordination import SAFE_FRACTION, CoveredLease
from app.store.models import RELAY_SLOTS

log = structlog.get_logger(__name__)

# The single relay lease's value while sharded relays run; no relay is named so.
SHARDED = "sharded-relays"

# KEYS: members, layout, shard 0 .. shard n-1. ARGV: owner, ttl ms, n, where to start taking.
# Returns {share, held shards (0-based)...}, or {-1, the live relays' count} when n differs.
_TICK = """
local owner, ttl, count = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
local layout = redis.call('GET', KEYS[2])
if layout and tonumber(layout) ~= count then
  local others = redis.call('ZCARD', KEYS[1])
  if redis.call('ZSCORE', KEYS[1], owner) then others = others - 1 end
  if others > 0 then
    redis.call('ZREM', KEYS[1], owner)
    for i = 1, count do
      if redis.call('GET', KEYS[i + 2]) == owner then redis.call('DEL', KEYS[i + 2]) end
    end
    return {-1, tonumber(layout)}
  end
end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[1], now, owner)
local share = math.ceil(count / redis.call('ZCARD', KEYS[1]))
local held = {}
for i = 1, count do
  if redis.call('GET', KEYS[i + 2]) == owner then held[#held + 1] = i end
end
while #held > share do
  redis.call('DEL', KEYS[table.remove(held) + 2])
end
for _, i in ipairs(held) do redis.call('PEXPIRE', KEYS[i + 2], ttl) end
local start = tonumber(ARGV[4])
for j = 0, count - 1 do
  if #held >= share then break end
  local i = (j + start) % count + 1
  if redis.call('SET', KEYS[i + 2], owner, 'NX', 'PX', ttl) then held[#held + 1] = i end
end
local reply = {share}
for _, i in ipairs(held) do reply[#reply + 1] = i - 1 end
return reply
"""
# KEYS: shard keys. ARGV: owner, ttl ms. Extends those still the owner's; 1 for each, else 0.
_RENEW = """
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
"""
# KEYS: members, shard keys. ARGV: owner.
_RELEASE = """
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""
# The single relay lease: kept at SHARDED, or taken for it when free; 0 while an old relay
# holds it.
_TAKE_SINGLE = """
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if value then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


def shard_slots(shard: int, shards: int) -> frozenset[int]:
    return frozenset(range(shard, RELAY_SLOTS, shards))


class RelayShards(CoveredLease):
    """The shard leases of one relay process; ``slots`` are what it may publish now."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        owner: str,
        shards: int,
        ttl_ms: int = 15_000,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not 1 <= shards <= RELAY_SLOTS:
            raise ValueError(f"relay shards must be 1..{RELAY_SLOTS}, not {shards}")
        self.redis = redis
        self.owner = owner
        self.shards = shards
        self.ttl_ms = ttl_ms
        self.sleep = sleep  # between the renewals of ``covering()``
        self.valid_until = 0.0
        self.held: tuple[int, ...] = ()  # shard numbers, as the last hold or renewal left them
        self.share = shards
        # A shard lost under a publish: no block is covered again until the next hold() (a
        # publish of the lost shard's rows may be waiting for its block).
        self._lost = False
        self._single = relay_lease_key(prefix)
        self._members = relay_members_key(prefix)
        self._tick_keys = [
            self._members,
            relay_layout_key(prefix),
            *(relay_shard_key(prefix, shard) for shard in range(shards)),
        ]
        self._shard_keys = self._tick_keys[2:]
        # Processes starting together begin taking at different shards.
        self._start = zlib.crc32(owner.encode()) % shards
        self._scripts = LeaseScripts(redis)
        self._tick = redis.register_script(_TICK)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)
        self._take_single = redis.register_script(_TAKE_SINGLE)

    @property
    def slots(self) -> frozenset[int]:
        """The relay slots of the shards held; none while this relay cannot count on them."""
        if not self.valid_until:
            return frozenset()
        return frozenset().union(*(shard_slots(s, self.shards) for s in self.held))

    async def hold(self) -> bool:
        """Heartbeat, renew, give back beyond the share, take up to it (between rounds only:
        a shard given back must have nothing in flight). True when it holds any shard and
        no relay of the previous version holds the single lease."""
        started = asyncio.get_running_loop().time()
        before = self.held
        try:
            single = bool(await self._take_single(keys=[self._single], args=[SHARDED, self.ttl_ms]))
            reply = await self._tick(
                keys=self._tick_keys, args=[self.owner, self.ttl_ms, self.shards, self._start]
            )
        except REDIS_ERRORS:
            self.valid_until = 0.0
            return False
        self._lost = False
        share, *held = (int(value) for value in reply)
        if share < 0:
            log.error("relay_shards_mismatch", shards=self.shards, live_relays_shards=held[0])
            self.held, self.share = (), 0
        else:
            self.held, self.share = tuple(sorted(held)), share
        if not single:
            log.warning("relay_waits_for_single_lease", detail="a relay of an older version runs")
        valid = single and bool(self.held)
        self.valid_until = started + self.ttl_ms / 1000 * SAFE_FRACTION if valid else 0.0
        if self.held != before:
            log.info("relay_shards_changed", held=list(self.held), share=self.share)
        return valid

    async def _extend(self) -> bool:
        """Renew the single lease's ``SHARDED`` and every held shard, only if still held.
        ``valid_until`` moves on when all are, and becomes 0.0 when one is not (the lost
        shards are dropped); Redis errors are raised, leaving it as it was."""
        if self._lost:
            self.valid_until = 0.0
            return False
        started = asyncio.get_running_loop().time()
        held = self.held  # several blocks renew at once: each its own snapshot
        single = await self._scripts.renew(self._single, holder=SHARDED, ttl_ms=self.ttl_ms)
        keys = [self._shard_keys[shard] for shard in held]
        renewed = await self._renew(keys=keys, args=[self.owner, self.ttl_ms]) if keys else []
        lost = {shard for shard, ok in zip(held, renewed, strict=True) if not int(ok)}
        if lost:
            log.warning("relay_shards_lost", lost=sorted(lost))
            self.held = tuple(shard for shard in self.held if shard not in lost)
            self._lost = True
        extended = single and bool(held) and not self._lost
        self.valid_until = started + self.ttl_ms / 1000 * SAFE_FRACTION if extended else 0.0
        return extended

    async def release(self) -> None:
        """Give back every shard and leave the members (the others take them on their next
        hold). The single lease's ``SHARDED`` is left to expire: other relays may run."""
        self.valid_until, self.held = 0.0, ()
        with contextlib.suppress(*REDIS_ERRORS):  # they expire by themselves
            await self._release(keys=[self._members, *self._shard_keys], args=[self.owner])

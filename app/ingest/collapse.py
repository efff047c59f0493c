"""Alert collapse: a fingerprint that fires again within its window bumps a counter in Redis
instead of costing another Claude call.

One hash per (source, fingerprint): ``event_id`` (the event that went to Claude) and
``repeats``; it expires ``window_seconds`` after the first firing, so a still-firing alert is
looked at again once per window. A resolved alert deletes its key: the next firing is news.

A delivery collapses only when *every* firing fingerprint in it is already remembered (an
alert group that gains a new alert goes to Claude). Fingerprints are remembered only after
the event is on the stream, so a delivery answered 503 and retried is not collapsed into an
event that was never queued. Two first firings racing each other may both reach Claude;
that is the cost of not holding a lock across the enqueue.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from redis.asyncio import Redis

_REPEAT = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 0 then return false end
end
local first = redis.call('HGET', KEYS[1], 'event_id')
local most = 0
for _, key in ipairs(KEYS) do
  local n = redis.call('HINCRBY', key, 'repeats', 1)
  if n > most then most = n end
end
return {first, most}
"""
_REMEMBER = """
for _, key in ipairs(KEYS) do
  if redis.call('HSETNX', key, 'event_id', ARGV[1]) == 1 then
    redis.call('HSET', key, 'repeats', 0)
    redis.call('PEXPIRE', key, ARGV[2])
  end
end
return #KEYS
"""


@dataclass(frozen=True, slots=True)
class Repeat:
    event_id: str
    repeats: int


class AlertCollapser:
    def __init__(self, redis: Redis, *, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self._repeat = redis.register_script(_REPEAT)
        self._remember = redis.register_script(_REMEMBER)

    def key(self, source: str, fingerprint: str) -> str:
        digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:32]
        # One hash tag per source: the scripts touch several keys, which must share a slot.
        return f"{self.prefix}:{{collapse:{source}}}:{digest}"

    async def repeat_of(self, *, source: str, fingerprints: tuple[str, ...]) -> Repeat | None:
        """If every fingerprint is remembered, count the repeat and return the original."""
        if not fingerprints:
            return None
        keys = [self.key(source, f) for f in fingerprints]
        reply = await self._repeat(keys=keys)
        if not reply:
            return None
        first, repeats = reply
        return Repeat(first.decode() if isinstance(first, bytes) else str(first), int(repeats))

    async def remember(
        self, *, source: str, fingerprints: tuple[str, ...], event_id: str, window_ms: int
    ) -> None:
        if fingerprints:
            keys = [self.key(source, f) for f in fingerprints]
            await self._remember(keys=keys, args=[event_id, window_ms])

    async def forget(self, *, source: str, fingerprints: tuple[str, ...]) -> None:
        if fingerprints:
            await self.redis.delete(*(self.key(source, f) for f in fingerprints))

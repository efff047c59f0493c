"""Circuit breaker per provider + model, its state shared by every process through Redis.

closed ──(≥ failure_ratio of ≥ min_calls in the rolling window fail,
          or consecutive_failures in a row)──▶ open
open ──(cooldown passed; the first caller becomes the one probe)──▶ half_open
half_open ──(probe succeeds)──▶ closed     half_open ──(probe fails)──▶ open (new cooldown)

While open (or while a probe is out) callers are refused with the time to wait; they wait,
they never fail the event. A probe that never reports back (its process died) expires after
``probe_ttl`` and the next caller becomes the probe. Only results recorded while closed enter
the window; in half_open only the probe's result moves the state. Failures are what say the
upstream is unwell (5xx, 529, 408, timeouts, connection errors); 4xx and 429 are not.
The consecutive rule matters after a long healthy spell: a window full of successes would
otherwise need as many failures again before the ratio trips, while events burn retries.
Time comes from an injectable clock and is passed to the scripts, so tests drive it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog
from redis.asyncio import Redis

from app.observability.metrics import CIRCUIT_BREAKER_STATE, labelled
from app.redis_scripts import ScriptCall

log = structlog.get_logger(__name__)

_ALLOW = """
local now = tonumber(ARGV[1])
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'closed' then return {1, state, '0'} end
if state == 'open' then
  local remaining = tonumber(redis.call('HGET', KEYS[1], 'opened_at')) + tonumber(ARGV[2]) - now
  if remaining > 0 then return {0, state, tostring(remaining)} end
  local probe_until = tostring(now + tonumber(ARGV[3]))
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe_until', probe_until)
  return {1, 'half_open', '0'}
end
local probe_until = tonumber(redis.call('HGET', KEYS[1], 'probe_until') or '0')
if now >= probe_until then
  redis.call('HSET', KEYS[1], 'probe_until', tostring(now + tonumber(ARGV[3])))
  return {1, 'half_open', '0'}
end
return {0, 'half_open', tostring(probe_until - now)}
"""

# KEYS: state, calls, fails. ARGV: now, ok, probe, window, min_calls, ratio, member,
# consecutive_failures. Returns {state, 1 if this call changed it}.
_RECORD = """
local now = tonumber(ARGV[1])
local ok = ARGV[2] == '1'
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'half_open' then
  if ARGV[3] ~= '1' then return {state, 0} end
  redis.call('DEL', KEYS[2], KEYS[3])
  if ok then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'consecutive', '0')
    return {'closed', 1}
  end
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', tostring(now))
  return {'open', 1}
end
if state == 'open' then return {state, 0} end
local consecutive = 0
if not ok then consecutive = redis.call('HINCRBY', KEYS[1], 'consecutive', 1)
else redis.call('HSET', KEYS[1], 'consecutive', '0') end
local window = tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], now, ARGV[7])
if not ok then redis.call('ZADD', KEYS[3], now, ARGV[7]) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
redis.call('EXPIRE', KEYS[2], math.ceil(window) + 1)
redis.call('EXPIRE', KEYS[3], math.ceil(window) + 1)
local calls = redis.call('ZCARD', KEYS[2])
local fails = redis.call('ZCARD', KEYS[3])
local tripped = calls >= tonumber(ARGV[5]) and fails >= tonumber(ARGV[6]) * calls
if tripped or consecutive >= tonumber(ARGV[8]) then
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', tostring(now), 'consecutive', '0')
  return {'open', 1}
end
return {'closed', 0}
"""


class BreakerState(StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


STATE_VALUE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    window_seconds: float = 30.0
    min_calls: int = 5
    failure_ratio: float = 0.5
    cooldown_seconds: float = 15.0
    consecutive_failures: int = 5
    # How long a half-open probe may stay out before another caller may probe.
    probe_ttl_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class Permit:
    allowed: bool
    state: BreakerState
    wait: float = 0.0

    @property
    def probe(self) -> bool:
        return self.allowed and self.state is BreakerState.HALF_OPEN


class CircuitBreaker:
    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        policy: BreakerPolicy,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.policy = policy
        self.clock = clock
        self._allow = redis.register_script(_ALLOW)
        self._record = redis.register_script(_RECORD)

    def _keys(self, provider: str, model: str) -> list[str]:
        base = f"{self.prefix}:{{cb:{provider}:{model}}}"
        return [f"{base}:state", f"{base}:calls", f"{base}:fails"]

    async def allow(self, provider: str, model: str) -> Permit:
        """May a call to ``model`` start now? A half-open permit makes the caller the probe."""
        return self.allowed(model, await self.allow_call(provider, model).run())

    def allow_call(self, provider: str, model: str) -> ScriptCall:
        """``allow``, for ``run_scripts`` (its reply read by ``allowed``)."""
        p = self.policy
        return ScriptCall(
            self._allow,
            self._keys(provider, model)[:1],
            [self.clock(), p.cooldown_seconds, p.probe_ttl_seconds],
        )

    def allowed(self, model: str, reply: Any) -> Permit:
        granted, state, wait = reply
        permit = Permit(bool(granted), BreakerState(_text(state)), float(_text(wait)))
        labelled(CIRCUIT_BREAKER_STATE, model).set(STATE_VALUE[permit.state])
        return permit

    async def record(self, provider: str, model: str, *, ok: bool, permit: Permit) -> BreakerState:
        call = self.record_call(provider, model, ok=ok, permit=permit)
        return self.recorded(provider, model, await call.run())

    def record_call(self, provider: str, model: str, *, ok: bool, permit: Permit) -> ScriptCall:
        """``record``, for ``run_scripts`` (its reply read by ``recorded``)."""
        p = self.policy
        return ScriptCall(
            self._record,
            self._keys(provider, model),
            [
                self.clock(),
                int(ok),
                int(permit.probe),
                p.window_seconds,
                p.min_calls,
                p.failure_ratio,
                uuid.uuid4().hex,
                p.consecutive_failures,
            ],
        )

    def recorded(self, provider: str, model: str, reply: Any) -> BreakerState:
        raw, changed = reply
        state = BreakerState(_text(raw))
        if changed:
            log.warning("circuit_breaker_changed", provider=provider, model=model, state=state)
        labelled(CIRCUIT_BREAKER_STATE, model).set(STATE_VALUE[state])
        return state

    async def state(self, provider: str, model: str) -> BreakerState:
        raw = await self.redis.hget(self._keys(provider, model)[0], "state")
        return BreakerState(_text(raw)) if raw else BreakerState.CLOSED


def _text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

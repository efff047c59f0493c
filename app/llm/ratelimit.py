"""Shared per-model rate limits in Redis: requests, input tokens and output tokens per minute.

Three token buckets per model live in one hash (``{prefix}:{llm:<model>}:rate``) and are
taken together by one Lua script, so every process sees the same buckets and a call is
admitted only when all three have room (all-or-nothing; a refused caller takes nothing).

Estimate, then settle: a call reserves its estimated input tokens and ``max_tokens`` output
tokens; after the reply the difference to the real usage is given back (or owed: a bucket
may go below zero, which delays later callers). Cache reads do not count as input tokens,
as on the API. The API's own view wins: ``anthropic-ratelimit-*-remaining`` caps a bucket,
a remaining of 0 holds the model until the header's reset time, and ``retry-after`` on a
429 holds it for every process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from redis.asyncio import Redis

from app.observability.metrics import LLM_RATE_WAIT
from app.redis_scripts import ScriptCall

_DIMS = ("requests", "input-tokens", "output-tokens")

_ACQUIRE = """
local now = tonumber(ARGV[1])
local names = {'r', 'i', 'o'}
local wait = 0
local hold = tonumber(redis.call('HGET', KEYS[1], 'hold') or '0')
if hold > now then wait = hold - now end
local levels = {}
for n = 1, 3 do
  local cap = tonumber(ARGV[2 * n])
  local cost = tonumber(ARGV[2 * n + 1])
  if cap > 0 then
    local rate = cap / 60.0
    local tokens = tonumber(redis.call('HGET', KEYS[1], names[n]) or cap)
    local ts = tonumber(redis.call('HGET', KEYS[1], names[n] .. '_ts') or now)
    tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
    if cost > cap then cost = cap end
    levels[n] = tokens - cost
    if tokens < cost then wait = math.max(wait, (cost - tokens) / rate) end
  end
end
if wait > 0 then return tostring(wait) end
for n = 1, 3 do
  if levels[n] then
    redis.call('HSET', KEYS[1], names[n], tostring(levels[n]), names[n] .. '_ts', tostring(now))
  end
end
redis.call('EXPIRE', KEYS[1], 300)
return '0'
"""

# ARGV: now, then per dimension (cap, delta to take, ceiling or -1), then hold-until or 0.
_ADJUST = """
local now = tonumber(ARGV[1])
local names = {'r', 'i', 'o'}
for n = 1, 3 do
  local cap = tonumber(ARGV[3 * n - 1])
  local delta = tonumber(ARGV[3 * n])
  local ceiling = tonumber(ARGV[3 * n + 1])
  if cap > 0 then
    local rate = cap / 60.0
    local tokens = tonumber(redis.call('HGET', KEYS[1], names[n]) or cap)
    local ts = tonumber(redis.call('HGET', KEYS[1], names[n] .. '_ts') or now)
    tokens = math.min(cap, tokens + math.max(0, now - ts) * rate - delta)
    if ceiling >= 0 then tokens = math.min(tokens, ceiling) end
    redis.call('HSET', KEYS[1], names[n], tostring(tokens), names[n] .. '_ts', tostring(now))
  end
end
local hold = tonumber(ARGV[11])
if hold > 0 and hold > tonumber(redis.call('HGET', KEYS[1], 'hold') or '0') then
  redis.call('HSET', KEYS[1], 'hold', tostring(hold))
end
redis.call('EXPIRE', KEYS[1], 300)
return 1
"""


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """Per minute; 0 means no local limit for that dimension."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Reservation:
    model: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Headroom:
    """What a model's shared buckets hold now, per minute-limit (None: no local limit in that
    dimension), and how long every process is held back from it (0: not held)."""

    limits: ModelLimits
    requests: float | None
    input_tokens: float | None
    output_tokens: float | None
    held_seconds: float


def estimate_input_tokens(request: Mapping[str, Any]) -> int:
    """About 3.5 characters per token over the JSON the API receives; errs high on purpose."""
    return int(len(orjson.dumps(request)) / 3.5) + 1


class RateLimiter:
    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        limits: Callable[[str], ModelLimits],
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        max_hold_seconds: float = 60.0,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.limits = limits
        self.clock = clock
        self.sleep = sleep
        self.max_hold = max_hold_seconds
        self._acquire = redis.register_script(_ACQUIRE)
        self._adjust = redis.register_script(_ADJUST)

    def key(self, model: str) -> str:
        return f"{self.prefix}:{{llm:{model}}}:rate"

    async def try_acquire(self, model: str, *, input_tokens: int, output_tokens: int) -> float:
        """Take one request and the tokens and return 0, or take nothing and return the wait."""
        call = self._acquire_call(model, input_tokens=input_tokens, output_tokens=output_tokens)
        return float(await call.run())

    def acquire_call(
        self, model: str, *, input_tokens: int, output_tokens: int
    ) -> ScriptCall | None:
        """``try_acquire``, for ``run_scripts`` (its reply is the wait, 0: taken); None when
        this limiter's acquire is more than that one script."""
        return self._acquire_call(model, input_tokens=input_tokens, output_tokens=output_tokens)

    def _acquire_call(self, model: str, *, input_tokens: int, output_tokens: int) -> ScriptCall:
        lim = self.limits(model)
        args = [self.clock(), lim.requests, 1, lim.input_tokens, input_tokens]
        args += [lim.output_tokens, output_tokens]
        return ScriptCall(self._acquire, [self.key(model)], args)

    async def acquire(self, model: str, *, input_tokens: int, output_tokens: int) -> Reservation:
        while (
            wait := await self.try_acquire(
                model, input_tokens=input_tokens, output_tokens=output_tokens
            )
        ) > 0:
            LLM_RATE_WAIT.labels(model=model).inc(wait)
            await self.sleep(min(wait, self.max_hold))
        return Reservation(model, input_tokens, output_tokens)

    async def headroom(self, model: str) -> Headroom:
        """Read only: the buckets as the acquire script would refill them now."""
        raw = await self.redis.hgetall(self.key(model))
        fields = {_str(k): float(_str(v)) for k, v in raw.items()}
        now = self.clock()
        lim = self.limits(model)

        def level(name: str, cap: int) -> float | None:
            if cap <= 0:
                return None
            if name not in fields:
                return float(cap)
            elapsed = max(0.0, now - fields.get(f"{name}_ts", now))
            return min(float(cap), fields[name] + elapsed * cap / 60.0)

        return Headroom(
            limits=lim,
            requests=level("r", lim.requests),
            input_tokens=level("i", lim.input_tokens),
            output_tokens=level("o", lim.output_tokens),
            held_seconds=max(0.0, fields.get("hold", 0.0) - now),
        )

    async def settle(
        self,
        reservation: Reservation,
        *,
        input_tokens: int,
        output_tokens: int,
        headers: Mapping[str, str],
    ) -> None:
        """Give back (or owe) the difference to the real usage; apply the API's headers."""
        call = self.settle_call(
            reservation, input_tokens=input_tokens, output_tokens=output_tokens, headers=headers
        )
        if call is not None:
            await call.run()

    def settle_call(
        self,
        reservation: Reservation,
        *,
        input_tokens: int,
        output_tokens: int,
        headers: Mapping[str, str],
    ) -> ScriptCall | None:
        """``settle``, for ``run_scripts``; None when it would change nothing."""
        deltas = (
            0,
            input_tokens - reservation.input_tokens,
            output_tokens - reservation.output_tokens,
        )
        return self._adjust_call(reservation.model, deltas=deltas, headers=headers)

    async def release(self, reservation: Reservation) -> None:
        """Give all of an unused reservation back, its request too: no call was made."""
        deltas = (-1, -reservation.input_tokens, -reservation.output_tokens)
        call = self._adjust_call(reservation.model, deltas=deltas, headers={})
        if call is not None:
            await call.run()

    async def hold(self, model: str, seconds: float) -> None:
        """No process starts a call to ``model`` for ``seconds`` (e.g. a 429's retry-after)."""
        seconds = min(max(seconds, 0.0), self.max_hold)
        call = self._adjust_call(model, deltas=(0, 0, 0), headers={}, hold=self.clock() + seconds)
        if call is not None:
            await call.run()

    def _adjust_call(
        self,
        model: str,
        *,
        deltas: tuple[int, int, int],
        headers: Mapping[str, str],
        hold: float = 0.0,
    ) -> ScriptCall | None:
        now = self.clock()
        lim = self.limits(model)
        caps = (lim.requests, lim.input_tokens, lim.output_tokens)
        args: list[float] = [now]
        for dim, cap, delta in zip(_DIMS, caps, deltas, strict=True):
            remaining = _int(headers.get(f"anthropic-ratelimit-{dim}-remaining"))
            args += [cap, delta, -1 if remaining is None else remaining]
            if remaining == 0:
                reset = _reset_at(headers.get(f"anthropic-ratelimit-{dim}-reset"))
                until = min(reset if reset is not None else now + 1.0, now + self.max_hold)
                hold = max(hold, until)
        if hold <= 0 and not any(caps):
            return None  # no local limit and no hold: the script would change nothing
        args.append(hold)
        return ScriptCall(self._adjust, [self.key(model)], args)


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _reset_at(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# The share of every shared rate limit that runs publishing nothing (shadow candidates,
# replay, consistency, eval) leave to live events.
LIVE_RATE_RESERVE = 0.5


class YieldingRateLimiter(RateLimiter):
    """The limiter of runs that publish nothing (replay, consistency, eval): they take from
    the same shared buckets, but only while each bucket keeps ``reserve`` of its capacity
    afterwards, so live events always find that share of every limit free (a run never
    drains a bucket they need). Live callers still use the whole bucket."""

    def __init__(self, redis: Redis, *, reserve: float, **options: Any) -> None:
        super().__init__(redis, **options)
        self.reserve = reserve
        # The check and the take are two round trips: one caller of the run at a time
        # between them, or concurrent callers all see the same headroom and all take.
        self._turn = asyncio.Lock()

    async def acquire(self, model: str, *, input_tokens: int, output_tokens: int) -> Reservation:
        costs = (1, input_tokens, output_tokens)
        async with self._turn:
            while (wait := self._short_of_reserve(await self.headroom(model), costs)) > 0:
                LLM_RATE_WAIT.labels(model=model).inc(wait)
                await self.sleep(min(wait, self.max_hold))
            return await super().acquire(
                model, input_tokens=input_tokens, output_tokens=output_tokens
            )

    def acquire_call(
        self, model: str, *, input_tokens: int, output_tokens: int
    ) -> ScriptCall | None:
        return None  # the reserve is checked first, under the lock: see ``acquire``

    def _short_of_reserve(self, room: Headroom, costs: tuple[int, int, int]) -> float:
        """Seconds until every capped bucket holds its cost above the reserve (0: now)."""
        lim = room.limits
        wait = 0.0
        for cap, level, cost in zip(
            (lim.requests, lim.input_tokens, lim.output_tokens),
            (room.requests, room.input_tokens, room.output_tokens),
            costs,
            strict=True,
        ):
            if cap <= 0 or level is None:
                continue
            keep = self.reserve * cap
            need = keep + min(cost, cap - keep) - level
            if need > 0:
                wait = max(wait, need / (cap / 60.0))
        return wait

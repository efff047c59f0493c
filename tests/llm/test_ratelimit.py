"""The shared rate limiter under concurrent callers, against real Redis when reachable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from app.llm.ratelimit import ModelLimits, RateLimiter, estimate_input_tokens
from app.queue.connection import connect_redis
from tests.llm.helpers import FakeClock, RecordedSleeps

M = "claude-sonnet-4-6"


@pytest.fixture
async def processes(redis: Redis, redis_url: str) -> AsyncIterator[list[Redis]]:
    """Three Redis clients, as three gateway processes would have (memory:// shares one)."""
    if redis_url.startswith("memory://"):
        yield [redis, redis, redis]
        return
    clients = [connect_redis(redis_url) for _ in range(3)]
    yield clients
    for client in clients:
        await client.aclose()


def _limiters(
    clients: list[Redis], prefix: str, clock: FakeClock, limits: ModelLimits
) -> list[RateLimiter]:
    return [
        RateLimiter(client, prefix=prefix, limits=lambda _: limits, clock=clock)
        for client in clients
    ]


async def test_concurrent_callers_in_several_processes_never_exceed_rpm(
    processes: list[Redis], redis_prefix: str
) -> None:
    clock = FakeClock()
    limiters = _limiters(processes, redis_prefix, clock, ModelLimits(requests=10))
    waits = await asyncio.gather(
        *(limiters[i % 3].try_acquire(M, input_tokens=100, output_tokens=100) for i in range(40))
    )
    assert sum(1 for w in waits if w == 0) == 10
    # The refused 30 are told to wait about one request's refill time (6 s at 10/min).
    assert all(w == pytest.approx(6.0, abs=0.01) for w in waits if w > 0)
    clock.advance(6.0)
    again = await asyncio.gather(
        *(limiters[i % 3].try_acquire(M, input_tokens=1, output_tokens=1) for i in range(5))
    )
    assert sum(1 for w in again if w == 0) == 1


async def test_token_buckets_are_all_or_nothing_and_settle_refunds(
    processes: list[Redis], redis_prefix: str
) -> None:
    clock = FakeClock()
    limits = ModelLimits(input_tokens=1000, output_tokens=600)
    limiters = _limiters(processes, redis_prefix, clock, limits)
    waits = await asyncio.gather(
        *(limiters[i % 3].try_acquire(M, input_tokens=300, output_tokens=200) for i in range(8))
    )
    # Output tokens bind first: 3 x 200 = 600.
    assert sum(1 for w in waits if w == 0) == 3
    # A refused caller took nothing: input still has 100 left for a small request ...
    assert await limiters[0].try_acquire(M, input_tokens=100, output_tokens=0) == 0
    # ... and nothing more.
    assert await limiters[0].try_acquire(M, input_tokens=1, output_tokens=0) > 0
    # One call used only 40 of its 200 reserved output tokens: 160 come back.
    reservation = await limiters[1].acquire(M, input_tokens=0, output_tokens=0)
    await limiters[1].settle(
        type(reservation)(M, 300, 200), input_tokens=300, output_tokens=40, headers={}
    )
    assert await limiters[2].try_acquire(M, input_tokens=0, output_tokens=160) == 0
    assert await limiters[2].try_acquire(M, input_tokens=0, output_tokens=1) > 0


async def test_usage_above_the_estimate_is_owed(redis: Redis, redis_prefix: str) -> None:
    clock = FakeClock()
    limiter = RateLimiter(
        redis, prefix=redis_prefix, limits=lambda _: ModelLimits(input_tokens=600), clock=clock
    )
    reservation = await limiter.acquire(M, input_tokens=100, output_tokens=0)
    await limiter.settle(reservation, input_tokens=1100, output_tokens=0, headers={})
    # The bucket is at -500: a 10-token call waits for 510 tokens at 10 tokens/s.
    assert await limiter.try_acquire(M, input_tokens=10, output_tokens=0) == pytest.approx(51.0)


async def test_api_headers_cap_buckets_and_hold_every_process(
    processes: list[Redis], redis_prefix: str
) -> None:
    clock = FakeClock()
    one, two, _ = _limiters(processes, redis_prefix, clock, ModelLimits(requests=100))
    reservation = await one.acquire(M, input_tokens=10, output_tokens=10)
    await one.settle(
        reservation,
        input_tokens=10,
        output_tokens=10,
        headers={"anthropic-ratelimit-requests-remaining": "2"},
    )
    waits = [await two.try_acquire(M, input_tokens=1, output_tokens=1) for _ in range(3)]
    assert [w == 0 for w in waits] == [True, True, False]
    # With no local limit configured, a remaining of 0 holds the model until the reset.
    free = _limiters(processes, redis_prefix + "-free", clock, ModelLimits())
    reset = datetime.fromtimestamp(clock.now + 20, UTC).isoformat().replace("+00:00", "Z")
    reservation = await free[0].acquire(M, input_tokens=1, output_tokens=1)
    await free[0].settle(
        reservation,
        input_tokens=1,
        output_tokens=1,
        headers={
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-reset": reset,
        },
    )
    assert await free[1].try_acquire(M, input_tokens=1, output_tokens=1) == pytest.approx(20.0)


async def test_a_settle_that_can_change_nothing_sends_nothing(
    redis: Redis, redis_prefix: str
) -> None:
    """With no local limit, settling only matters when a header holds the model: the other
    settles (every call's, by default) make no round trip."""
    limiter = RateLimiter(redis, prefix=redis_prefix, limits=lambda _: ModelLimits())
    sent: list[object] = []
    adjust = limiter._adjust

    async def counted(**kwargs: Any) -> Any:
        sent.append(kwargs)
        return await adjust(**kwargs)

    limiter._adjust = counted  # type: ignore[assignment]
    reservation = await limiter.acquire(M, input_tokens=100, output_tokens=100)
    remaining = {"anthropic-ratelimit-requests-remaining": "7"}
    await limiter.settle(reservation, input_tokens=5, output_tokens=5, headers=remaining)
    assert sent == []
    await limiter.settle(
        reservation,
        input_tokens=5,
        output_tokens=5,
        headers={"anthropic-ratelimit-requests-remaining": "0"},
    )
    assert len(sent) == 1
    assert await limiter.try_acquire(M, input_tokens=1, output_tokens=1) > 0
    # With a local limit every settle goes to Redis: it gives back what the estimate took.
    limited = RateLimiter(
        redis, prefix=redis_prefix + "-lim", limits=lambda _: ModelLimits(input_tokens=1000)
    )
    reservation = await limited.acquire(M, input_tokens=900, output_tokens=1)
    await limited.settle(reservation, input_tokens=0, output_tokens=0, headers={})
    assert await limited.try_acquire(M, input_tokens=900, output_tokens=1) == 0


async def test_retry_after_holds_the_model_and_is_clamped(redis: Redis, redis_prefix: str) -> None:
    clock = FakeClock()
    sleeps = RecordedSleeps(clock)
    limiter = RateLimiter(
        redis, prefix=redis_prefix, limits=lambda _: ModelLimits(), clock=clock, sleep=sleeps
    )
    await limiter.hold(M, 5)
    assert await limiter.try_acquire(M, input_tokens=1, output_tokens=1) == pytest.approx(5.0)
    await limiter.acquire(M, input_tokens=1, output_tokens=1)
    assert sleeps.delays == [pytest.approx(5.0)]
    await limiter.hold(M, 10_000)  # a hostile or broken retry-after
    assert await limiter.try_acquire(M, input_tokens=1, output_tokens=1) == pytest.approx(60.0)
    # Other models are not held.
    assert await limiter.try_acquire("claude-haiku-4-5", input_tokens=1, output_tokens=1) == 0


def test_token_estimate_errs_high() -> None:
    request = {"messages": [{"role": "user", "content": "x" * 3500}]}
    assert estimate_input_tokens(request) > 1000

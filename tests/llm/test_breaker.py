"""Circuit breaker transitions with an injected clock, state shared through real Redis."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from app.llm.breaker import BreakerPolicy, BreakerState, CircuitBreaker, Permit
from app.observability.metrics import CIRCUIT_BREAKER_STATE
from tests.llm.helpers import FakeClock

POLICY = BreakerPolicy(
    window_seconds=30,
    min_calls=5,
    failure_ratio=0.5,
    cooldown_seconds=15,
    probe_ttl_seconds=60,
    consecutive_failures=100,  # the ratio rule alone, except where a test says otherwise
)
M = "claude-sonnet-4-6"


def _breaker(redis: Redis, prefix: str, clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(redis, prefix=prefix, policy=POLICY, clock=clock)


async def _outcomes(breaker: CircuitBreaker, results: list[bool]) -> BreakerState:
    state = BreakerState.CLOSED
    for ok in results:
        permit = await breaker.allow("anthropic", M)
        assert permit.allowed
        state = await breaker.record("anthropic", M, ok=ok, permit=permit)
    return state


async def test_opens_only_at_the_failure_ratio_over_min_calls(
    redis: Redis, redis_prefix: str
) -> None:
    clock = FakeClock()
    breaker = _breaker(redis, redis_prefix, clock)
    # Four failures are below min_calls: still closed.
    assert await _outcomes(breaker, [False] * 4) is BreakerState.CLOSED
    # The fifth call makes 5 calls with 100% failures: open.
    assert await _outcomes(breaker, [False]) is BreakerState.OPEN
    denied = await breaker.allow("anthropic", M)
    assert not denied.allowed
    assert denied.state is BreakerState.OPEN
    assert denied.wait == pytest.approx(15, abs=1e-3)
    assert CIRCUIT_BREAKER_STATE.labels(model=M)._value.get() == 2


async def test_a_failure_ratio_below_threshold_stays_closed(
    redis: Redis, redis_prefix: str
) -> None:
    breaker = _breaker(redis, redis_prefix, FakeClock())
    # One failure in three, as in the end-to-end run: 4/12 fail, never open.
    assert await _outcomes(breaker, [True, True, False] * 4) is BreakerState.CLOSED


async def test_consecutive_failures_open_it_even_after_a_long_healthy_spell(
    redis: Redis, redis_prefix: str
) -> None:
    policy = BreakerPolicy(window_seconds=30, min_calls=5, consecutive_failures=3)
    breaker = CircuitBreaker(redis, prefix=redis_prefix, policy=policy, clock=FakeClock())
    # 40 successes: the ratio rule would need 40 failures more.
    assert await _outcomes(breaker, [True] * 40) is BreakerState.CLOSED
    # A success in between resets the run.
    assert await _outcomes(breaker, [False, False, True, False, False]) is BreakerState.CLOSED
    assert await _outcomes(breaker, [False]) is BreakerState.OPEN


async def test_old_calls_leave_the_rolling_window(redis: Redis, redis_prefix: str) -> None:
    clock = FakeClock()
    breaker = _breaker(redis, redis_prefix, clock)
    await _outcomes(breaker, [False] * 4)
    clock.advance(31)  # those four failures are outside the 30 s window now
    assert await _outcomes(breaker, [False]) is BreakerState.CLOSED
    assert await _outcomes(breaker, [True] * 3 + [False]) is BreakerState.CLOSED


async def test_cooldown_then_one_probe_then_close_or_reopen(
    redis: Redis, redis_prefix: str
) -> None:
    clock = FakeClock()
    breaker = _breaker(redis, redis_prefix, clock)
    await _outcomes(breaker, [False] * 5)
    clock.advance(14.9)
    assert not (await breaker.allow("anthropic", M)).allowed
    clock.advance(0.2)
    probe = await breaker.allow("anthropic", M)
    assert probe.allowed
    assert probe.probe
    assert probe.state is BreakerState.HALF_OPEN
    # Only one probe: everyone else waits while it is out.
    other = await breaker.allow("anthropic", M)
    assert not other.allowed
    assert other.state is BreakerState.HALF_OPEN
    # A straggler's result (not the probe) does not move the state.
    straggler = Permit(True, BreakerState.CLOSED)
    assert await breaker.record("anthropic", M, ok=True, permit=straggler) is (
        BreakerState.HALF_OPEN
    )
    # The probe fails: open again for a whole new cooldown.
    assert await breaker.record("anthropic", M, ok=False, permit=probe) is BreakerState.OPEN
    assert (await breaker.allow("anthropic", M)).wait == pytest.approx(15, abs=1e-3)
    clock.advance(15)
    probe = await breaker.allow("anthropic", M)
    assert probe.probe
    assert await breaker.record("anthropic", M, ok=True, permit=probe) is BreakerState.CLOSED
    assert (await breaker.allow("anthropic", M)).allowed
    assert CIRCUIT_BREAKER_STATE.labels(model=M)._value.get() == 0
    # Closing starts a fresh window: one failure does not reopen it.
    assert await _outcomes(breaker, [False]) is BreakerState.CLOSED


async def test_a_lost_probe_expires_and_another_caller_probes(
    redis: Redis, redis_prefix: str
) -> None:
    clock = FakeClock()
    breaker = _breaker(redis, redis_prefix, clock)
    await _outcomes(breaker, [False] * 5)
    clock.advance(15)
    assert (await breaker.allow("anthropic", M)).probe  # this probe never reports back
    clock.advance(59)
    assert not (await breaker.allow("anthropic", M)).allowed
    clock.advance(1)
    assert (await breaker.allow("anthropic", M)).probe


async def test_state_is_shared_between_processes_and_kept_per_provider_and_model(
    redis: Redis, redis_url: str, redis_prefix: str
) -> None:
    clock = FakeClock()
    one = _breaker(redis, redis_prefix, clock)
    # A second client stands for a second gateway process.
    other_client = Redis.from_url(redis_url) if redis_url.startswith("redis") else redis
    two = _breaker(other_client, redis_prefix, clock)
    await _outcomes(one, [False] * 5)
    assert not (await two.allow("anthropic", M)).allowed
    assert await two.state("anthropic", M) is BreakerState.OPEN
    assert (await two.allow("bedrock", M)).allowed
    assert (await two.allow("anthropic", "claude-haiku-4-5")).allowed
    if other_client is not redis:
        await other_client.aclose()

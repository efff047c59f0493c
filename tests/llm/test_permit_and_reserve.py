"""The breaker's permit and the rate limit are asked for in one Redis round trip before a
call (``GuardedCaller._permit_and_reserve``); when one of them says wait, what the other
gave must not be lost or kept wrongly. Claude is mocked at the HTTP edge (respx); Redis is
real when it answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.llm.breaker import BreakerState
from app.llm.client import ClaudeRequest
from tests.llm.harness import BASE, build, config_text, make_event, reply

M = "claude-sonnet-4-6"


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(base_url=BASE, using="httpcore2") as router:
        yield router


async def _open_breaker(redis: Redis, prefix: str, *, opened_at: float) -> None:
    key = f"{prefix}:{{cb:anthropic:{M}}}:state"
    await redis.hset(key, mapping={"state": "open", "opened_at": str(opened_at)})


async def test_a_refused_permit_gives_the_rate_limit_back(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    """One request a minute, the breaker open for its 15 s cooldown: the request the first
    ask took is given back, so once the breaker lets the probe go the limit does not make
    it wait most of a minute for a request nobody made."""
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        text=config_text(fallback=False),  # no other model to call meanwhile
        llm_requests_per_minute=1,
    )
    route = api.post("/v1/messages").mock(return_value=reply())
    await _open_breaker(redis, redis_prefix, opened_at=h.clock())
    await h.processor.process(make_event())
    assert route.call_count == 1
    assert sum(h.sleeps.delays) < 16  # the cooldown only, in polls of at most a second
    assert max(h.sleeps.delays) <= 1.0
    assert await h.caller.breaker.state("anthropic", M) is BreakerState.CLOSED


async def test_a_granted_probe_is_kept_while_the_rate_limit_says_wait(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    """The cooldown is over, so the ask makes this caller the half-open probe; the rate
    limit is spent for one more second. The caller waits that second and calls: asking the
    breaker again would find the probe out and wait its 60 s TTL."""
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        text=config_text(fallback=False),
        llm_requests_per_minute=60,
    )
    route = api.post("/v1/messages").mock(return_value=reply())
    for _ in range(60):  # the minute's requests, taken now
        await h.caller.limiter.acquire(M, input_tokens=1, output_tokens=1)
    await _open_breaker(redis, redis_prefix, opened_at=h.clock() - 100)
    await h.processor.process(make_event())
    assert route.call_count == 1
    assert sum(h.sleeps.delays) < 5
    assert await h.caller.breaker.state("anthropic", M) is BreakerState.CLOSED


async def test_a_failing_permit_script_does_not_keep_the_request_it_took(
    sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    """The breaker's script fails in the joint round trip while the rate limit's took the
    request: the caller sees the error and the request goes back to the shared bucket."""
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        text=config_text(fallback=False),
        llm_requests_per_minute=1,
    )
    # A breaker hash the ALLOW script errors on ('open' without 'opened_at').
    await redis.hset(f"{redis_prefix}:{{cb:anthropic:{M}}}:state", "state", "open")
    pipeline = h.config.pipelines[next(iter(h.config.pipelines))]
    request = ClaudeRequest(model=M, max_tokens=10, system=[], messages=[], tools=[])
    with pytest.raises(ResponseError):
        await h.caller._permit_and_reserve(pipeline, request)
    room = await h.caller.limiter.headroom(M)
    assert room.requests == pytest.approx(1.0, abs=0.05)  # the one request a minute is back

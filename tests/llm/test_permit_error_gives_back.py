"""Attack: the breaker's script fails (an error reply) in the joint ask of
``_permit_and_reserve`` while the rate limit's script, in the same pipeline, took the
request. ``run_scripts`` raises the first error after every script ran, so the caller never
sees that it holds a reservation: the request is lost from the shared bucket (before the
change the permit was asked first, and nothing was taken when it failed)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.llm.client import ClaudeRequest
from tests.llm.harness import build, config_text

M = "claude-sonnet-4-6"


async def test_a_failing_permit_script_does_not_keep_the_request_it_took(
    sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
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

"""The health page reads what the workers share in Redis, through the workers' own classes:
an open breaker, a rate-limit bucket half used, spend today, who owns which partition, and the
tool calls the outbox still holds."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.leases import members_key, partition_lease_key
from app.llm.breaker import BreakerPolicy, CircuitBreaker
from app.llm.budget import BudgetLedger
from app.llm.ratelimit import ModelLimits, RateLimiter
from app.store.models import EventRow, OutboxRow, utcnow
from tests.console.conftest import ADMIN_TOKEN, csrf_of

MODEL = "claude-sonnet-4-6"


async def _shared_state(redis: Redis, prefix: str) -> None:
    breaker = CircuitBreaker(redis, prefix=prefix, policy=BreakerPolicy(consecutive_failures=3))
    for _ in range(3):
        permit = await breaker.allow("anthropic", MODEL)
        await breaker.record("anthropic", MODEL, ok=False, permit=permit)
    limiter = RateLimiter(redis, prefix=prefix, limits=lambda _: ModelLimits(requests=60))
    for _ in range(30):
        assert await limiter.try_acquire(MODEL, input_tokens=10, output_tokens=10) == 0
    await BudgetLedger(redis, prefix=prefix).charge("triage", tokens=4321, cost_usd=0.25)
    await redis.set(partition_lease_key(prefix, 2), "worker-a:1764662400000")
    await redis.zadd(members_key(prefix), {"worker-a": int(time.time() * 1000)})


async def _pending_tool_call(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as session:
        session.add(
            EventRow(
                id="evt_held",
                source="github",
                type="issues.opened",
                group_key="acme/api",
                delivery_id="d1",
                pipeline="triage",
                status="published",
                payload={},
                received_at=utcnow(),
                deliveries=1,
            )
        )
        await session.flush()
        session.add(
            OutboxRow(
                event_id="evt_held",
                source="github",
                seq=0,
                llm_call_id="llm_1",
                tool="publishAlert",
                group_id="acme/api",
                dedup_id="dedup-held-0",
                body="{}",
            )
        )
        await session.commit()


async def test_the_health_page_shows_what_the_workers_share(
    inprocess_gateway: Any,
    redis: Redis,
    redis_prefix: str,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await _shared_state(redis, redis_prefix)
    await _pending_tool_call(sessions)
    url = inprocess_gateway(llm_requests_per_minute=60)
    async with httpx.AsyncClient(base_url=url) as client:
        form = await client.get("/console/sign-in")
        await client.post(
            "/console/sign-in", data={"token": ADMIN_TOKEN, "csrf": csrf_of(form.text)}
        )
        page = await client.get("/console/health")
    assert page.status_code == 200
    text = re.sub(r"<[^>]+>", " ", page.text)
    text = re.sub(r"\s+", " ", text)
    assert f"{MODEL} anthropic open" in text
    left = re.search(r"open (\d+) of 60", text)
    assert left is not None
    assert 30 <= int(left.group(1)) <= 32  # 30 taken, refilling at one a second
    assert "triage 4321 $0.2500 no budget" in text
    assert "Tool calls pending 1 " in text
    assert "2 worker-a 3 free" in text
    assert "0 free 1 free" in text
    assert re.search(r"worker-a , last heartbeat \d+\.\d s ago", text)
    assert "Could not be read" not in text

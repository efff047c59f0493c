"""Redis failing between Claude's answer and the stored outcome: the attempt keeps its audit
row, a success keeps its decision, and the event's retry does not call Claude again.

The rate-limit, breaker and budget updates run beside the database write (``run_together``);
before, they ran first, and a Redis error there lost the audit row of a paid call and made
the retry pay for a second one. Claude is mocked at the HTTP edge (respx)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.llm.breaker import BreakerState, CircuitBreaker, Permit
from app.llm.budget import BudgetLedger
from app.llm.caller import run_together
from app.redis_scripts import ScriptCall
from tests.llm.harness import BASE, Script, build, error, make_event, reply
from tests.llm.helpers import on_a_redis_gone

# Armed by the Claude stub, i.e. once the request has reached Claude.
outage = {"on": False}


class LedgerLosingRedis(BudgetLedger):
    def charge_call(self, pipeline: str, *, tokens: int, cost_usd: float) -> ScriptCall:
        call = super().charge_call(pipeline, tokens=tokens, cost_usd=cost_usd)
        if outage["on"]:
            return on_a_redis_gone(call)
        return call


class BreakerLosingRedis(CircuitBreaker):
    async def record(self, provider: str, model: str, *, ok: bool, permit: Permit) -> BreakerState:
        if outage["on"]:
            raise RedisConnectionError("Redis went away")
        return await super().record(provider, model, ok=ok, permit=permit)


@pytest.fixture
def api() -> Iterator[respx.Router]:
    outage["on"] = False
    with respx.mock(base_url=BASE, using="httpcore2") as router:
        yield router
    outage["on"] = False


def _answer_then_lose_redis(answer: httpx.Response) -> Script:
    def respond(_: object) -> httpx.Response:
        outage["on"] = True
        return answer

    return Script([respond])


async def test_a_success_is_stored_and_not_bought_twice_when_redis_fails_after_it(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, budgets=LedgerLosingRedis)
    script = _answer_then_lose_redis(reply())
    api.post("/v1/messages").mock(side_effect=script)
    event = make_event()
    with pytest.raises(RedisConnectionError):
        await h.processor.process(event)
    out = await h.rows(event.id)
    assert [c.status for c in out.calls] == ["ok"]
    assert len(out.outbox) == 1
    assert out.event.status == "held"  # stored; the tool has no topic

    outage["on"] = False
    await h.processor.process(event)  # the dispatcher's retry
    assert len(script.bodies) == 1  # Claude was not asked again
    assert len((await h.rows(event.id)).outbox) == 1


async def test_a_failed_attempt_keeps_its_audit_row_when_redis_fails_after_it(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, breaker=BreakerLosingRedis)
    api.post("/v1/messages").mock(side_effect=_answer_then_lose_redis(error(500)))
    event = make_event()
    with pytest.raises(RedisConnectionError):
        await h.processor.process(event)
    out = await h.rows(event.id)
    assert [(c.status, c.error_type) for c in out.calls] == [("retry", "InternalServerError")]


async def test_run_together_waits_for_every_step_before_raising_the_first_failure() -> None:
    finished: list[str] = []

    async def fails() -> None:
        raise ValueError("first")

    async def slow() -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        finished.append("slow")

    with pytest.raises(ValueError, match="first"):
        await run_together(fails(), slow())
    assert finished == ["slow"]

"""A bad day: Redis flapping must not dead-letter the events that were in flight.

docs/how-it-works.md: "A failure of an unreachable Redis or database never counts: the event
waits for it." The worker kept that promise for its own counter, but every call of
``EventProcessor.process`` began with ``start_delivery``, which added one to the event row's
``deliveries``, and ``process`` dead-letters the event once ``deliveries >
EVENTGATE_MAX_DELIVERIES``: five in-place retries while Redis (breaker, rate limiter and
budget live there) was unreachable dead-lettered the event without Claude ever being asked.
The test drives ``process`` as the worker does: again after each unavailable-dependency
failure. Redis itself stays real; the breaker's scripts go to a Redis nobody listens on (a
subclass passed to the constructor, like ``test_bookkeeping_outage.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.faults import dependency_unavailable
from app.llm.breaker import CircuitBreaker
from app.redis_scripts import ScriptCall
from tests.llm.harness import BASE, build, make_event, reply
from tests.llm.helpers import on_a_redis_gone

outage = {"on": False}


class BreakerBehindFlappingRedis(CircuitBreaker):
    def allow_call(self, provider: str, model: str) -> ScriptCall:
        call = super().allow_call(provider, model)
        return on_a_redis_gone(call) if outage["on"] else call


@pytest.fixture
def api() -> Iterator[respx.Router]:
    outage["on"] = False
    with respx.mock(base_url=BASE, using="httpcore2", assert_all_called=False) as router:
        yield router
    outage["on"] = False


async def test_retries_while_redis_is_unreachable_do_not_dead_letter_the_event(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
) -> None:
    h = build(
        sessions=sessions, redis=redis, prefix=redis_prefix, breaker=BreakerBehindFlappingRedis
    )
    route = api.post("/v1/messages").mock(return_value=reply())
    event = make_event()

    outage["on"] = True
    for _ in range(5):  # five in-place retries during the flaps
        with pytest.raises(RedisConnectionError) as failure:
            await h.processor.process(event)
        assert dependency_unavailable(failure.value)  # so the worker does not count it
    outage["on"] = False

    await h.processor.process(event)  # Redis is back
    outcome = await h.rows(event.id)
    assert outcome.event.status == "held" and len(outcome.outbox) == 1, (  # no topic
        f"the event ended {outcome.event.status!r} ({outcome.event.error}) after "
        f"{outcome.event.deliveries} deliveries; Claude was asked {route.call_count} times"
    )

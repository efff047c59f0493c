"""Scripts in one round trip, one caller's and those of every caller of the same turn
(``app/redis_scripts.py``), against real Redis when it answers (fakeredis otherwise)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from app.redis_scripts import ScriptCall, run_scripts

COUNT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


@pytest.mark.cluster_too
async def test_replies_come_back_in_order_and_each_script_runs_once(
    redis: Redis, redis_prefix: str
) -> None:
    count, echo = redis.register_script(COUNT), redis.register_script("return ARGV[1]")
    calls = [
        ScriptCall(count, [f"{redis_prefix}:{{a}}"], [2]),
        ScriptCall(echo, [f"{redis_prefix}:{{b}}"], ["hello"]),
        ScriptCall(count, [f"{redis_prefix}:{{a}}"], [3]),
    ]
    assert await run_scripts(calls) == [2, b"hello", 5]
    # Redis forgot every script (a restart, SCRIPT FLUSH): each is loaded and run once more,
    # none twice.
    await redis.script_flush()
    assert await run_scripts(calls) == [7, b"hello", 10]
    assert await redis.get(f"{redis_prefix}:{{a}}") == b"10"


@pytest.mark.cluster_too
async def test_an_error_reply_raises_once_every_other_script_has_run(
    redis: Redis, redis_prefix: str
) -> None:
    count = redis.register_script(COUNT)
    fails = redis.register_script("return redis.error_reply('refused here')")
    key = f"{redis_prefix}:{{c}}"
    calls = [ScriptCall(fails, [key], []), ScriptCall(count, [key], [1])]
    with pytest.raises(ResponseError, match="refused here"):
        await run_scripts(calls)
    assert await redis.get(key) == b"1"


async def test_scripts_of_different_clients_run_each_on_its_own(
    redis: Redis, redis_prefix: str, redis_url: str
) -> None:
    if redis_url.startswith("memory://"):
        pytest.skip("one in-memory Redis: a second client would not share it")
    other = Redis.from_url(redis_url)
    try:
        key = f"{redis_prefix}:{{d}}"
        calls = [
            ScriptCall(redis.register_script(COUNT), [key], [1]),
            ScriptCall(other.register_script(COUNT), [key], [1]),
        ]
        assert await run_scripts(calls) == [1, 2]
    finally:
        await other.aclose()


def _count_pipelines(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    pipeline = redis.pipeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return pipeline(*args, **kwargs)

    monkeypatch.setattr(redis, "pipeline", counted)
    return made


@pytest.mark.cluster_too
async def test_callers_of_one_turn_share_a_round_trip_and_each_gets_its_own_replies(
    redis: Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, on_cluster: bool
) -> None:
    """On one Redis; on a cluster each caller has a pipeline of its own (a shared one spans
    the nodes, and one master down would fail it for all)."""
    count = redis.register_script(COUNT)
    fails = redis.register_script("return redis.error_reply('refused here')")
    made = _count_pipelines(redis, monkeypatch)

    def calls(n: int) -> list[ScriptCall]:
        return [ScriptCall(count, [f"{redis_prefix}:{{k{n}}}"], [n])]

    outcomes = await asyncio.gather(
        run_scripts(calls(1)),
        run_scripts([ScriptCall(fails, [f"{redis_prefix}:{{x}}"], []), *calls(2)]),
        run_scripts(calls(3)),
        return_exceptions=True,
    )
    assert made == ([1, 1, 1] if on_cluster else [1])
    assert outcomes[0] == [1] and outcomes[2] == [3]
    assert isinstance(outcomes[1], ResponseError)  # its error, its caller's only
    assert await redis.get(f"{redis_prefix}:{{k2}}") == b"2"  # its other script still ran
    await run_scripts(calls(4))  # a later turn: a round trip of its own
    assert len(made) == (4 if on_cluster else 2)


async def test_a_lost_connection_fails_every_caller_of_the_turn() -> None:
    gone = Redis(host="127.0.0.1", port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    count = gone.register_script(COUNT)
    outcomes = await asyncio.wait_for(
        asyncio.gather(
            run_scripts([ScriptCall(count, ["a"], [1])]),
            run_scripts([ScriptCall(count, ["b"], [1])]),
            return_exceptions=True,
        ),
        timeout=5,
    )
    assert [type(outcome) for outcome in outcomes] == [RedisConnectionError] * 2


async def test_a_caller_that_stops_waiting_does_not_take_the_others_scripts_with_it(
    redis: Redis, redis_prefix: str
) -> None:
    count = redis.register_script(COUNT)
    key = f"{redis_prefix}:{{e}}"
    first = asyncio.ensure_future(run_scripts([ScriptCall(count, [key], [1])]))
    second = asyncio.ensure_future(run_scripts([ScriptCall(count, [key], [10])]))
    await asyncio.sleep(0)
    first.cancel()
    assert await second in ([10], [11])
    with pytest.raises(asyncio.CancelledError):
        await first

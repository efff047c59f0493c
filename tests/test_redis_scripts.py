"""Several scripts in one round trip (``app/redis_scripts.py``), against real Redis when it
answers (fakeredis otherwise)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
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

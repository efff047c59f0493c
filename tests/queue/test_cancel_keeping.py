"""A task working on the gateway's Redis client stops when it is cancelled, and a deadline
around its commands fires: redis-py bounds each write with ``asyncio.wait_for``, which on
Python 3.11 drops a cancel that arrives as the write completes (``KeepsCancels``)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from app.queue.connection import connect_redis

TRIALS = 30


async def _commands(client: Redis, key: str) -> None:
    while True:
        await client.get(key)


@pytest.fixture
async def client(redis_url: str) -> Redis:
    if redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis (fakeredis has no socket writes)")
    return connect_redis(redis_url)


async def test_a_task_sending_commands_stops_when_cancelled(
    client: Redis, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:cancel"
    await client.set(key, b"v")
    try:
        kept = 0
        for trial in range(TRIALS):
            task = asyncio.create_task(_commands(client, key))
            await asyncio.sleep(0.002 + trial * 0.001)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=2)
            assert done == {task}, "the task still runs after its cancel"
            kept += task.cancelled()
        assert kept == TRIALS, f"{TRIALS - kept} of {TRIALS} cancels were swallowed"
        assert await client.get(key) == b"v"  # the pool's connections still answer
    finally:
        await client.delete(key)
        await client.aclose()


async def _within(client: Redis, key: str, seconds: float) -> None:
    async with asyncio.timeout(seconds):
        await _commands(client, key)


async def test_a_deadline_around_commands_fires(client: Redis, redis_prefix: str) -> None:
    key = f"{redis_prefix}:deadline"
    try:
        for trial in range(TRIALS):
            task = asyncio.create_task(_within(client, key, 0.002 + trial * 0.001))
            done, _ = await asyncio.wait([task], timeout=2)
            while not task.done():  # the deadline passed unnoticed: stop it to fail
                task.cancel()
                await asyncio.wait([task], timeout=0.1)
            assert done == {task}, f"trial {trial}: the deadline passed and the commands went on"
            assert isinstance(task.exception(), TimeoutError)
    finally:
        await client.aclose()

"""The Redis client's pool takes a burst beyond redis-py's default of 100 connections."""

from __future__ import annotations

import asyncio

import pytest

from app.queue.connection import connect_redis


async def test_a_burst_of_300_concurrent_commands_gets_connections(
    redis_url: str, redis_prefix: str
) -> None:
    if redis_url.startswith("memory://"):
        pytest.skip("fakeredis has no connection pool (real Redis is not reachable here)")
    client = connect_redis(redis_url)
    key = f"{redis_prefix}:burst"
    try:
        # Each holds its connection for 50 ms server-side, so all 300 need one at once; with
        # the default pool the 101st raised MaxConnectionsError.
        replies = await asyncio.gather(*(client.blpop([key], timeout=0.05) for _ in range(300)))
        assert replies == [None] * 300
    finally:
        await client.aclose()

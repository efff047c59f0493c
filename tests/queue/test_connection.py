"""The Redis client waits for a free pooled connection instead of failing a burst."""

from __future__ import annotations

import asyncio

import pytest

from app.queue import connection
from app.queue.connection import connect_redis


async def test_a_burst_beyond_the_pool_waits_instead_of_failing(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if redis_url.startswith("memory://"):
        pytest.skip("fakeredis has no connection pool (real Redis is not reachable here)")
    monkeypatch.setattr(connection, "MAX_CONNECTIONS", 4)
    client = connect_redis(redis_url)
    key = f"{redis_prefix}:burst"
    try:
        # 50 commands at once on 4 connections: each blocks for 50 ms server-side.
        replies = await asyncio.gather(*(client.blpop([key], timeout=0.05) for _ in range(50)))
        assert replies == [None] * 50
        assert len(client.connection_pool._in_use_connections) == 0
        assert len(client.connection_pool._available_connections) <= 4
    finally:
        await client.aclose()

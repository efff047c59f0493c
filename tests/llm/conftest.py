"""Fixtures for the LLM stage: a Redis client per test (real when reachable) and cleanup."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from app.queue.connection import connect_redis


@pytest.fixture
async def redis(redis_url: str, redis_prefix: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url)
    yield client
    keys = [key async for key in client.scan_iter(match=f"{redis_prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()

"""Clients shared by the relay tests: an aioboto3 SNS client on moto and a Redis client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aioboto3
import pytest
from redis.asyncio import Redis

from app.queue.connection import connect_redis
from tests.support import SnsFixture


@pytest.fixture
async def sns_client(sns: SnsFixture, moto_endpoint: str) -> AsyncIterator[object]:
    async with aioboto3.Session().client(
        "sns", region_name="us-east-1", endpoint_url=moto_endpoint
    ) as client:
        yield client


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url)
    yield client
    await client.aclose()

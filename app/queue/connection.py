"""Redis clients: a real server, or ``memory://`` (fakeredis in-process, same commands)."""

from __future__ import annotations

from redis.asyncio import Redis


def connect_redis(url: str) -> Redis:
    if url.startswith("memory://"):
        from fakeredis import FakeAsyncRedis, FakeServer

        return FakeAsyncRedis(server=FakeServer(), decode_responses=False)
    return Redis.from_url(
        url,
        decode_responses=False,
        health_check_interval=30,
        socket_connect_timeout=2,
        socket_timeout=10,
    )

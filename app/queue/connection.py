"""Redis clients: a real server, or ``memory://`` (fakeredis in-process, same commands)."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis

# Connections per process. Past this, a command waits (up to POOL_WAIT_SECONDS) for one to
# be free instead of failing: with the plain pool, a burst of worker and ingest commands
# beyond its size raised MaxConnectionsError, which ingest answered with 503.
MAX_CONNECTIONS = 100
POOL_WAIT_SECONDS = 10


def connect_redis(url: str) -> Redis:
    if url.startswith("memory://"):
        from fakeredis import FakeAsyncRedis, FakeServer

        return FakeAsyncRedis(server=FakeServer(), decode_responses=False)
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT_SECONDS,
        decode_responses=False,
        health_check_interval=30,
        socket_connect_timeout=2,
        socket_timeout=10,
    )
    return Redis.from_pool(pool)  # closing the client closes its pool

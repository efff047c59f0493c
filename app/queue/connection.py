"""Redis clients: a real server, or ``memory://`` (fakeredis in-process, same commands)."""

from __future__ import annotations

import redis
from redis.asyncio import Redis
from redis.driver_info import DriverInfo

# Connections per process. redis-py's default pool (100) raised MaxConnectionsError when the
# worker's runners and a burst of webhooks needed more at once, which ingest answered with
# 503. redis-py's BlockingConnectionPool (wait instead) was tried and dropped: a gateway
# stopping with it hung once in CI, and it has known cancellation deadlocks.
MAX_CONNECTIONS = 1000
# Given, not looked up: without it redis-py asks importlib.metadata for its own version each
# time it opens a connection (CLIENT SETINFO), which doubled the CPU of a new connection and
# stalled the event loop while a burst grew the pool (docs/benchmarks.md).
DRIVER_INFO = DriverInfo(lib_version=redis.__version__)


def connect_redis(url: str) -> Redis:
    if url.startswith("memory://"):
        from fakeredis import FakeAsyncRedis, FakeServer

        return FakeAsyncRedis(server=FakeServer(), decode_responses=False)
    return Redis.from_url(
        url,
        decode_responses=False,
        max_connections=MAX_CONNECTIONS,
        health_check_interval=30,
        socket_connect_timeout=2,
        socket_timeout=10,
        driver_info=DRIVER_INFO,
    )

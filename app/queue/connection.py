"""Redis clients: a real server, a Redis Cluster, or ``memory://`` (fakeredis in-process, same
commands).

``open_redis`` is what the gateway builds its client with: given any node of a Redis Cluster
(``INFO cluster`` says ``cluster_enabled:1``), or told so (``EVENTGATE_REDIS_CLUSTER=true``),
it returns redis-py's cluster client, which follows the slots to their nodes; otherwise a
plain client. The cluster client is typed as ``Redis``: it has the same commands, and the
gateway's calls each stay within one hash slot (``EventQueue.cluster``).

Both clients' connections keep a task's cancellation (``KeepsCancels``): redis-py bounds each
write with ``asyncio.wait_for``, which on Python 3.11 drops a cancel that arrives as the write
completes or fails, so a stopping loop went on and a deadline around a command did not fire.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import cast

import redis
import structlog
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.driver_info import DriverInfo

from app.faults import REDIS_ERRORS

log = structlog.get_logger(__name__)

# Connections per process (per node of a cluster). redis-py's default pool (100) raised
# MaxConnectionsError when the worker's runners and a burst of webhooks needed more at once,
# which ingest answered with 503. redis-py's BlockingConnectionPool (wait instead) was tried
# and dropped: a gateway stopping with it hung once in CI, and it has known cancellation
# deadlocks.
MAX_CONNECTIONS = 1000
# Given, not looked up: without it redis-py asks importlib.metadata for its own version each
# time it opens a connection (CLIENT SETINFO), which doubled the CPU of a new connection and
# stalled the event loop while a burst grew the pool (docs/benchmarks.md).
DRIVER_INFO = DriverInfo(lib_version=redis.__version__)
# The cluster client retries a failed command on a fresh view of the slots. redis-py's
# default (10 attempts with backoff) held a webhook for seconds while a master was down;
# three short ones ride out a failover's MOVED without holding the caller long.
_CLUSTER_RETRY_ATTEMPTS = 3

_OPTIONS = {
    "decode_responses": False,
    "max_connections": MAX_CONNECTIONS,
    "health_check_interval": 30,
    "socket_connect_timeout": 2,
    "socket_timeout": 10,
    "driver_info": DRIVER_INFO,
}


class KeepsCancels(AbstractConnection):
    """A connection whose writes never swallow a cancel of the task writing.

    ``AbstractConnection.send_packed_command`` runs the write under ``asyncio.wait_for``
    (with a ``socket_timeout``). On Python 3.11, a cancel that reaches ``wait_for`` once the
    write is done is dropped, and the write returns as if nothing happened; one that arrives
    as the write fails (the server reset the connection) is dropped for the write's error,
    which redis-py then retries. Either way the task's cancel count still says it was asked to
    stop. Such a cancel is raised here instead, once the connection is closed (the command
    may be on the wire, its reply will not be read)."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        try:
            await super().send_packed_command(command, check_health)
        except asyncio.CancelledError:
            raise
        except Exception:
            if task is None or task.cancelling() <= asked:
                raise
            await self.disconnect(nowait=True)
            raise asyncio.CancelledError from None
        if task is not None and task.cancelling() > asked:
            await self.disconnect(nowait=True)
            raise asyncio.CancelledError


class _TcpKeepsCancels(KeepsCancels, Connection):
    pass


class _SslKeepsCancels(KeepsCancels, SSLConnection):
    pass


class _UnixKeepsCancels(KeepsCancels, UnixDomainSocketConnection):
    pass


_KEEPING_CANCELS: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _TcpKeepsCancels,
    SSLConnection: _SslKeepsCancels,
    UnixDomainSocketConnection: _UnixKeepsCancels,
}


def connect_redis(url: str) -> Redis:
    """A plain client of ``url`` (one Redis), or fakeredis for ``memory://``; its
    connections keep cancels (``KeepsCancels``), whatever the URL's scheme."""
    if url.startswith("memory://"):
        from fakeredis import FakeAsyncRedis, FakeServer

        return FakeAsyncRedis(server=FakeServer(), decode_responses=False)
    pool = ConnectionPool.from_url(url, **_OPTIONS)
    pool.connection_class = _KEEPING_CANCELS[pool.connection_class]
    return Redis.from_pool(pool)


def connect_cluster(url: str) -> Redis:
    """redis-py's cluster client, started from the node at ``url``; its nodes' connections
    keep cancels too."""
    client = RedisCluster.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), _CLUSTER_RETRY_ATTEMPTS),
        **_OPTIONS,
    )
    # The arguments every node is built with (``get_connection_kwargs`` gives the very dict
    # the client keeps, nodes found later included); the startup nodes exist already.
    kwargs = client.get_connection_kwargs()
    given = cast(type[Connection], kwargs["connection_class"])
    keeping = cast(type[Connection], _KEEPING_CANCELS[given])
    kwargs["connection_class"] = keeping
    for node in client.nodes_manager.startup_nodes.values():
        node.connection_class = keeping
    return cast(Redis, client)


async def open_redis(url: str, *, cluster: bool | None = None) -> Redis:
    """The gateway's client of ``url``: a cluster client when ``cluster`` is True, or when
    it is None and the node says it is part of a cluster; a plain one otherwise."""
    if url.startswith("memory://"):
        return connect_redis(url)
    if cluster is None:
        try:
            cluster = await is_cluster_node(url)
        except REDIS_ERRORS as exc:
            # Redis not up yet must not stop the gateway starting (it retries its loops);
            # a plain client then, and should the node turn out to be a cluster's, /readyz
            # says so (``EventQueue.check_writable``) until a restart detects it.
            log.warning(
                "redis_mode_undetected",
                error=type(exc).__name__,
                assumed="single node (set EVENTGATE_REDIS_CLUSTER to be sure)",
            )
            cluster = False
    if not cluster:
        return connect_redis(url)
    client = connect_cluster(url)
    # The slots are read now, once: left to the first commands, a burst of them read them
    # concurrently and some failed on connections another had just replaced.
    with contextlib.suppress(*REDIS_ERRORS):
        await cast(RedisCluster, client).initialize()
    return client


async def is_cluster_node(url: str) -> bool:
    """Does the node at ``url`` run in cluster mode? (Asked with a plain client, closed.)"""
    probe = Redis.from_url(url, **_OPTIONS)  # type: ignore[arg-type]
    try:
        info = await probe.info("cluster")
    finally:
        await probe.aclose()
    return int(info.get("cluster_enabled", 0)) == 1


def is_cluster(client: Redis) -> bool:
    """True for a client built by ``connect_cluster``."""
    return isinstance(client, RedisCluster)

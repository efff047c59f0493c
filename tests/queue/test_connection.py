"""The Redis client's pool takes a burst beyond redis-py's default of 100 connections, and
opening a connection does not scan the installed packages: the plain client and the cluster
client alike."""

from __future__ import annotations

import asyncio
from importlib import metadata
from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster

from app.queue.connection import connect_redis, open_redis
from tests.redis_cluster import LocalCluster


@pytest.mark.cluster_too
async def test_a_burst_of_300_concurrent_commands_gets_connections(
    redis_url: str, redis_prefix: str, on_cluster: bool
) -> None:
    if redis_url.startswith("memory://"):
        pytest.skip("fakeredis has no connection pool (real Redis is not reachable here)")
    client = await open_redis(redis_url, cluster=on_cluster)
    # What is checked is the pool's size, not how fast 300 connects complete: the gateway's
    # 2 s connect timeout made this fail once on a loaded CI machine whose Redis stalled.
    for kwargs in _connection_kwargs(client):
        kwargs["socket_connect_timeout"] = 20
    key = f"{redis_prefix}:burst"
    try:
        # Each holds its connection for 50 ms server-side, so all 300 need one at once; with
        # the default pool the 101st raised MaxConnectionsError.
        replies = await asyncio.gather(*(client.blpop([key], timeout=0.05) for _ in range(300)))
        assert replies == [None] * 300
    finally:
        await client.aclose()


def _connection_kwargs(client: Redis) -> list[dict[str, Any]]:
    """Where the plain client and each of the cluster client's nodes keep the options their
    new connections are made with."""
    if isinstance(client, RedisCluster):
        return [node.connection_kwargs for node in client.get_nodes()]
    return [client.connection_pool.connection_kwargs]


async def test_new_connections_do_not_look_up_the_library_version(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if redis_url.startswith("memory://"):
        pytest.skip("fakeredis opens no connections (real Redis is not reachable here)")
    lookups: list[str] = []
    real_version = metadata.version

    def counting(name: str) -> str:
        lookups.append(name)
        return real_version(name)

    monkeypatch.setattr(metadata, "version", counting)
    client = connect_redis(redis_url)
    try:
        # 20 commands at once: 20 new connections, each sends CLIENT SETINFO lib-ver (the
        # cluster client's, test_cluster_client_is_given_the_library_version).
        await asyncio.gather(
            *(client.blpop(["eventgate-test:none"], timeout=0.05) for _ in range(20))
        )
        pool = client.connection_pool
        assert len(pool._available_connections) + len(pool._in_use_connections) >= 20
        assert "redis" not in lookups
    finally:
        await client.aclose()


async def test_the_cluster_client_does_not_look_up_the_library_version_either(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups: list[str] = []
    real_version = metadata.version

    def counting(name: str) -> str:
        lookups.append(name)
        return real_version(name)

    monkeypatch.setattr(metadata, "version", counting)
    client = await open_redis(redis_cluster.url)  # detected, its slots read
    try:
        # Keys in many slots: new connections to every node.
        await asyncio.gather(
            *(client.blpop([f"eventgate-test:{n}"], timeout=0.05) for n in range(20))
        )
        assert "redis" not in lookups
    finally:
        await client.aclose()

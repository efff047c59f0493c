"""A task working on the gateway's Redis client stops when it is cancelled, and a deadline
around its commands fires: redis-py bounds each write with ``asyncio.wait_for``, which on
Python 3.11 drops a cancel that arrives as the write completes or fails (``KeepsCancels``)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from redis.asyncio import Redis, RedisCluster

from app.queue.connection import KeepsCancels, connect_cluster, connect_redis, open_redis
from tests.redis_cluster import LocalCluster

TRIALS = 30


async def _commands(client: Redis, key: str) -> None:
    while True:
        await client.get(key)


@pytest.fixture
async def client(redis_url: str, on_cluster: bool) -> Redis:
    if redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis (fakeredis has no socket writes)")
    return await open_redis(redis_url, cluster=on_cluster)


@pytest.mark.cluster_too
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


@pytest.mark.cluster_too
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


async def _one_get(client: Redis, key: str) -> object:
    return await client.get(key)


async def test_a_cancel_arriving_as_the_server_resets_the_connection_stops_the_task(
    client: Redis, redis_url: str, redis_prefix: str
) -> None:
    """The write fails (the server reset the connection) in the moment the task is
    cancelled: on Python 3.11 ``wait_for`` raised the write's error instead, redis-py retried
    the command on a new connection, and the task went on as if never cancelled."""
    key = f"{redis_prefix}:reset"
    await client.set(key, b"v")
    resetting = connect_redis(redis_url)  # no connection yet: its first is of the class below
    pool = resetting.connection_pool
    resets: list[str] = []

    class ResetAsCancelled(pool.connection_class):  # type: ignore[misc,name-defined]
        """Its first command's write cancels the writing task and fails as a reset."""

        async def send_packed_command(self, command: object, check_health: bool = True) -> None:
            self.writing = asyncio.current_task()
            await super().send_packed_command(command, check_health)

        async def _send_packed_command(self, command: object) -> None:
            if not resets:
                resets.append("reset")
                cast(asyncio.Task[None], self.writing).cancel()
                raise ConnectionResetError("reset by peer")
            await super()._send_packed_command(command)

    pool.connection_class = ResetAsCancelled
    try:
        task = asyncio.create_task(_one_get(resetting, key))
        done, _ = await asyncio.wait([task], timeout=2)
        assert resets == ["reset"]
        assert done == {task}
        assert task.cancelled(), f"the cancel was swallowed: the GET answered {task.result()!r}"
        assert await resetting.get(key) == b"v"  # the next command gets a new connection
    finally:
        await client.delete(key)
        await client.aclose()
        await resetting.aclose()


async def test_every_node_of_the_cluster_client_keeps_cancels(redis_cluster: LocalCluster) -> None:
    """The startup node (which reads the slots) and the nodes the slots name make their
    connections of the class that keeps cancels."""
    unread = cast(RedisCluster, connect_cluster(redis_cluster.url))
    startup = list(unread.nodes_manager.startup_nodes.values())
    assert startup
    assert all(issubclass(node.connection_class, KeepsCancels) for node in startup)
    await unread.aclose()
    client = cast(RedisCluster, await open_redis(redis_cluster.url))
    try:
        # Keys in many slots: a connection to every node.
        await asyncio.gather(*(client.get(f"eventgate-test:{n}") for n in range(20)))
        nodes = client.get_nodes()
        assert len(nodes) == 3
        for node in nodes:
            assert issubclass(node.connection_class, KeepsCancels), node.name
            assert node._connections, node.name
            assert all(isinstance(c, KeepsCancels) for c in node._connections), node.name
    finally:
        await client.aclose()

"""The queue's reads and probes on a Redis Cluster, where one command may only name keys of
one hash slot.

A blocking XREADGROUP over several partition streams is such a command, so in a cluster each
partition's stream is read on its own, without blocking, and the reads are repeated every
``POLL_MS`` while none brings anything: an idle worker costs one small read per partition
and poll, and a new event waits at most about ``POLL_MS`` before it is read. A master that
is down leaves its slots unwritable while the others go on: ``check_writable`` writes a
short-lived key in the slot of each partition, so readiness fails exactly when some
partition's enqueue would (on one Redis the same probe is a single round trip).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

POLL_MS = 50
# The probe key lives this long: nothing reads it, it only has to be writable.
_PROBE_PX = 1000


async def poll_streams(
    redis: Redis, *, keys: list[str], group: bytes, consumer: str, count: int, block_ms: int
) -> list[Any]:
    """``[stream, entries]`` pairs of the streams that had new entries (XREADGROUP's reply
    shape), waiting up to ``block_ms`` for some."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + block_ms / 1000
    while True:
        replies = await asyncio.gather(
            *(_read_one(redis, key, group=group, consumer=consumer, count=count) for key in keys)
        )
        found = [pair for reply in replies for pair in reply or []]
        left = deadline - loop.time()
        if found or left <= 0:
            return found
        await asyncio.sleep(min(left, POLL_MS / 1000))


async def _read_one(redis: Redis, key: str, *, group: bytes, consumer: str, count: int) -> Any:
    """XREADGROUP of one stream, sent to its slot's node: the cluster client would otherwise
    ask a node for the command's keys first (COMMAND GETKEYS), doubling every poll's round
    trips."""
    if not isinstance(redis, RedisCluster):  # the cluster's way on one Redis (tests)
        reply = await redis.xreadgroup(group.decode(), consumer, {key: ">"}, count=count)
        return reply.items() if isinstance(reply, dict) else reply
    cluster = cast(RedisCluster, redis)
    reply = await cluster.execute_command(
        "XREADGROUP", "GROUP", group, consumer, "COUNT", count, "STREAMS", key, ">",
        target_nodes=cluster.get_node_from_key(key),
    )  # fmt: skip
    return reply.items() if isinstance(reply, dict) else reply  # RESP3 vs RESP2


async def check_writable(redis: Redis, keys: list[str]) -> None:
    """Raise unless every key's slot takes a write now (one SET PX per key, pipelined: one
    round trip per node)."""
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.set(key, b"", px=_PROBE_PX)
        await pipe.execute()

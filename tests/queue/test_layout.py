"""The partition count is kept beside the queue (``app/queue/layout.py``): another count is
refused — at start, by ingest and by the worker's loops — and ``repartition`` changes it
only once nothing queued can move, keeping deliveries seen before it duplicates after it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
import redis as sync_redis
from redis.asyncio import Redis

from app.config import load_config
from app.leases import partition_lease_key
from app.main import create_app
from app.queue.batching import EnqueueBatcher
from app.queue.layout import (
    NotDrained,
    PartitionCountMismatch,
    check_partition_count,
    count_key,
    repartition,
)
from app.queue.streams import EnqueueResult, EventQueue, NewEntry
from app.settings import Settings
from tests.conftest import HAVE_REDIS, REDIS_URL
from tests.support import ServerThread, free_port, github_request, issue_payload


def _entry(event_id: str, delivery: str, key: str = "acme/api") -> NewEntry:
    return NewEntry(
        event_id=event_id,
        source="github",
        delivery_id=delivery,
        group_key=key,
        data=orjson.dumps({"id": event_id}),
        dedup_window_ms=60_000,
    )


async def test_the_first_count_is_kept_and_another_is_refused(
    redis: Redis, redis_prefix: str
) -> None:
    assert await check_partition_count(redis, prefix=redis_prefix, partitions=8) == 8
    assert await check_partition_count(redis, prefix=redis_prefix, partitions=8) == 8
    with pytest.raises(PartitionCountMismatch) as refused:
        await check_partition_count(redis, prefix=redis_prefix, partitions=16)
    text = str(refused.value)
    assert "EVENTGATE_PARTITIONS is 16" in text and "made with 8 partitions" in text
    assert "eventgate repartition 16" in text


async def test_ingest_with_another_count_is_refused_and_queues_nothing(
    redis: Redis, redis_prefix: str
) -> None:
    await check_partition_count(redis, prefix=redis_prefix, partitions=8)
    wrong = EventQueue(redis, prefix=redis_prefix, partitions=16)
    with pytest.raises(PartitionCountMismatch):
        await EnqueueBatcher(wrong).enqueue(_entry("evt_1", "d-1"))
    with pytest.raises(PartitionCountMismatch):
        await wrong.enqueue(_entry("evt_1", "d-1"))
    right = EventQueue(redis, prefix=redis_prefix, partitions=8)
    assert (await right.backlog())[0] == 0
    assert await EnqueueBatcher(right).enqueue(_entry("evt_1", "d-1")) == EnqueueResult(
        "evt_1", True
    )


async def test_a_queue_made_before_the_count_was_stored_tells_its_own(
    redis: Redis, redis_prefix: str
) -> None:
    """Streams of 8 partitions and partition-scoped dedup keys: 16 is refused, and with 8 a
    delivery seen before the upgrade is still a duplicate (its key renamed, expiry kept)."""
    old = EventQueue(redis, prefix=redis_prefix, partitions=8, cluster=True)
    await old.ensure_groups(list(range(8)))
    legacy_key = old.dedup_key(old.partition_of("acme/api"), "github", "d-old")
    await redis.set(legacy_key, "evt_old", px=60_000)
    claim_key = old.replays.claim_key("github", "never-queued")
    await redis.set(claim_key, "evt_gone {x}:{p1}:signed:abc", px=60_000)  # old claim form
    with pytest.raises(PartitionCountMismatch):
        await check_partition_count(redis, prefix=redis_prefix, partitions=16)
    assert await redis.get(count_key(redis_prefix)) == b"8"
    queue = EventQueue(redis, prefix=redis_prefix, partitions=8)
    assert await queue.enqueue(_entry("evt_new", "d-old")) == EnqueueResult("evt_old", False)
    assert await redis.exists(legacy_key) == 0
    assert 0 < await redis.pttl(queue.dedup_key(0, "github", "d-old")) <= 60_000
    assert await redis.exists(claim_key) == 0  # its event never got queued: no duplicate


async def test_repartition_waits_for_a_drained_queue_and_keeps_dedup(
    redis: Redis, redis_prefix: str
) -> None:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=8)
    await queue.ensure_groups(list(range(8)))
    assert (await queue.enqueue(_entry("evt_1", "d-1"))).created
    with pytest.raises(NotDrained, match="1 events are still queued"):
        await repartition(redis, prefix=redis_prefix, partitions=4)
    # Drained (the worker acked and deleted it), but a worker is still alive.
    (entry,) = await queue.read_new(consumer="c", partitions=list(range(8)), count=10, block_ms=0)
    assert await queue.ack(entry, "evt_1")
    await redis.zadd(f"{redis_prefix}:members", {"worker-1": int(time.time() * 1000)})
    with pytest.raises(NotDrained, match="workers are still running"):
        await repartition(redis, prefix=redis_prefix, partitions=4)
    await redis.delete(f"{redis_prefix}:members")

    done = await repartition(redis, prefix=redis_prefix, partitions=4)
    assert (done.before, done.after, done.streams_removed) == (8, 4, 4)
    assert sorted(await redis.keys(f"{redis_prefix}:{{p*}}:stream")) == sorted(
        queue.stream_key(p).encode() for p in range(4)
    )
    with pytest.raises(PartitionCountMismatch):
        await EventQueue(redis, prefix=redis_prefix, partitions=8).enqueue(_entry("e", "d-9"))
    after = EventQueue(redis, prefix=redis_prefix, partitions=4)
    # The delivery seen before the change, whatever partition it maps to now.
    assert await after.enqueue(_entry("evt_2", "d-1")) == EnqueueResult("evt_1", False)


@pytest.mark.skipif(not HAVE_REDIS, reason="needs a Redis shared by two processes")
def test_a_process_with_another_count_refuses_to_start_and_the_cli_changes_it(
    redis_prefix: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTGATE_")}
    env.update(
        EVENTGATE_REDIS_URL=REDIS_URL,
        EVENTGATE_REDIS_PREFIX=redis_prefix,
        EVENTGATE_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path}/eventgate.db",
        EVENTGATE_LOG_FORMAT="json",
    )
    client = sync_redis.Redis.from_url(REDIS_URL)
    client.set(count_key(redis_prefix), 8)
    client.close()
    started = subprocess.run(
        [sys.executable, "-m", "app", "api", "--port", "0"],
        env={**env, "EVENTGATE_PARTITIONS": "16"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode != 0
    assert "partition_count_mismatch" in started.stderr + started.stdout
    assert "made with 8 partitions" in started.stderr + started.stdout

    changed = subprocess.run(
        [sys.executable, "-m", "app", "repartition", "16"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert changed.returncode == 0, changed.stderr
    assert "partitions: 8 → 16" in changed.stdout


def test_redis_down_at_start_then_another_count_found_refuses_ingest(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Redis does not answer when the process starts (no refusal then); once it does, the
    first webhook finds the queue made with another count: 503, nothing queued."""
    port = free_port()
    settings = make_settings(redis_url=f"redis://127.0.0.1:{port}/0", partitions=16)
    with ServerThread(create_app(settings, load_config(None, env={}), role="api")) as server:
        redis_server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
        )
        try:
            client = sync_redis.Redis(port=port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.set(count_key(settings.redis_prefix), 8)
                    break
                except sync_redis.ConnectionError:
                    assert time.monotonic() < deadline, "redis-server did not start"
                    time.sleep(0.1)
            body, headers = github_request("dev-github-secret", issue_payload("acme/api", 1))
            reply = httpx.post(f"{server.url}/v1/webhooks/github", content=body, headers=headers)
            assert reply.status_code == 503, reply.text
            assert reply.json()["error"] == "QueueUnavailable"
            assert not client.keys(f"{settings.redis_prefix}:{{p*}}:stream")
            client.close()
        finally:
            redis_server.terminate()
            redis_server.wait(10)


async def test_two_processes_starting_at_once_with_different_counts_one_is_refused(
    redis: Redis, redis_prefix: str
) -> None:
    """A rollout that mixes counts on a fresh queue: whichever stores first wins, the other
    is refused; never both accepted."""
    results = await asyncio.gather(
        check_partition_count(redis, prefix=redis_prefix, partitions=8),
        check_partition_count(redis, prefix=redis_prefix, partitions=16),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, PartitionCountMismatch)]
    accepted = [r for r in results if isinstance(r, int)]
    assert len(refused) == 1 and len(accepted) == 1, results
    assert await redis.get(count_key(redis_prefix)) == str(accepted[0]).encode()


async def test_repartition_is_refused_while_a_partition_lease_is_held(
    redis: Redis, redis_prefix: str
) -> None:
    await check_partition_count(redis, prefix=redis_prefix, partitions=4)
    await redis.set(partition_lease_key(redis_prefix, 2), "w1:token", px=60_000)
    with pytest.raises(NotDrained, match=r"partition leases held: \[2\]"):
        await repartition(redis, prefix=redis_prefix, partitions=8)
    assert await redis.get(count_key(redis_prefix)) == b"4"

"""A flood of webhooks cannot grow memory without bound: ingest stops at the backlog limit
(503 + Retry-After), and a worker's dispatcher holds at most ``max_buffered`` entries however
long the stream behind it is (the rest stay in Redis, unread)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import httpx
import pytest

from app.config import load_config
from app.events import Event
from app.main import create_app
from app.queue.connection import connect_redis
from app.queue.leases import LeaseGuard, PartitionLeases
from app.queue.streams import GROUP, EventQueue, NewEntry
from app.queue.worker import QueueWorker
from app.settings import Settings
from tests.support import ServerThread, github_request, issue_payload

LIMIT = 50
CLIENTS = 16


async def _flood(url: str, total: int) -> list[httpx.Response]:
    requests = [github_request("dev-github-secret", issue_payload(f"acme/r{n}", n))
                for n in range(total)]  # fmt: skip
    slots = asyncio.Semaphore(CLIENTS)

    async def one(
        client: httpx.AsyncClient, body: bytes, headers: dict[str, str]
    ) -> httpx.Response:
        async with slots:
            return await client.post(f"{url}/v1/webhooks/github", content=body, headers=headers)

    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(*(one(client, b, h) for b, h in requests))


def test_a_flood_stops_at_the_backlog_limit(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(backlog_max_depth=LIMIT)
    app = create_app(settings, load_config(None, env={}), role="api")  # nothing consumes
    with ServerThread(app) as server:
        replies = asyncio.run(_flood(server.url, 400))
        depth = asyncio.run(_depth(settings))
    accepted = [r for r in replies if r.status_code == 202]
    refused = [r for r in replies if r.status_code == 503]
    assert len(accepted) + len(refused) == len(replies)
    assert all(r.headers["Retry-After"].isdigit() for r in refused)
    # In-flight requests may each pass the check once before the count moves: the overshoot
    # is bounded by the concurrency, never by the size of the flood.
    assert LIMIT <= len(accepted) <= LIMIT + CLIENTS
    assert depth == len(accepted)


async def _depth(settings: Settings) -> int:
    redis = connect_redis(settings.redis_url)
    try:
        queue = EventQueue(redis, prefix=settings.redis_prefix, partitions=settings.partitions)
        return (await queue.backlog())[0]
    finally:
        await redis.aclose()


async def test_a_worker_reads_no_more_than_its_buffer(redis_url: str, redis_prefix: str) -> None:
    if redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis")
    redis = connect_redis(redis_url)
    queue = EventQueue(redis, prefix=redis_prefix, partitions=4)
    for n in range(200):
        event = Event(id=f"evt_{n}", source="s", type="t", group_key=f"k{n % 50}",
                      delivery_id=str(uuid.uuid4()), pipeline="p",
                      received_at="2026-01-01T00:00:00Z", payload={"n": n})  # fmt: skip
        await queue.enqueue(NewEntry(event_id=event.id, source="s", delivery_id=event.delivery_id,
                            group_key=event.group_key, data=event.to_bytes(),
                            dedup_window_ms=60_000))  # fmt: skip
    gate = asyncio.Event()
    done: list[str] = []

    async def process(event: Event, _: LeaseGuard) -> None:
        await gate.wait()
        done.append(event.id)

    async def give_up(event: Event, reason: str) -> None:
        raise AssertionError(f"gave up on {event.id}: {reason}")

    worker = QueueWorker(
        queue=queue,
        # A long lease: while the buffer is full the read loop waits in submit and does not
        # renew (a known gap, see the hardening report); this test is about the bound only.
        leases=PartitionLeases(redis, prefix=redis_prefix, partitions=4, owner="w", ttl_ms=60_000),
        process=process,
        give_up=give_up,
        consumer="w",
        concurrency=4,
        grace_seconds=5,
        max_buffered=10,
    )
    running = asyncio.create_task(worker.run())
    try:
        peak_pending = 0
        for _ in range(30):  # 3 s of a stuck processor
            await asyncio.sleep(0.1)
            assert worker.dispatcher.buffered <= 10
            pending = 0
            for p in range(4):
                summary = await redis.xpending(queue.stream_key(p), GROUP)
                pending += int(summary["pending"])
            peak_pending = max(peak_pending, pending)
        # XREADGROUP's COUNT is per stream, so entries read but not yet buffered are bounded
        # by partitions x buffer (4 x 10 here), never by the length of the stream (200).
        assert 0 < peak_pending <= 4 * 10
        gate.set()
        for _ in range(100):
            if len(done) == 200:
                break
            await asyncio.sleep(0.1)
        assert sorted(done) == sorted(f"evt_{n}" for n in range(200))
    finally:
        gate.set()
        worker.stop()
        await asyncio.wait_for(running, 15)
        await redis.aclose()

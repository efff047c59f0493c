"""Faults of every dependency, injected into real gateway processes: Redis unreachable and
restarted empty (a private ``redis-server``), PostgreSQL unreachable and SNS down or
throttling (through a ``FaultProxy``), a process SIGKILLed while its relay publishes.
Asserted at the SQS FIFO subscriber: every event that got a 2xx arrives, once, in arrival
order per group key."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
from sqlalchemy import select

from app.store.db import create_engine, session_factory
from app.store.models import EventRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.conftest import HAVE_POSTGRES
from tests.hardening.conftest import WEBHOOK_SECRET
from tests.hardening.faults import FaultProxy, PrivateRedis
from tests.support import GatewayProcess, SnsFixture, github_request, issue_payload

REPOS = ("acme/api", "acme/web")
Start = Callable[..., GatewayProcess]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    yield server
    server.kill()


def post(url: str, repo: str, number: int, delivery: str | None = None) -> httpx.Response:
    body, headers = github_request(
        WEBHOOK_SECRET, issue_payload(repo, number), delivery=delivery or f"{repo}#{number}"
    )
    return httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers, timeout=15)


def send_until_accepted(url: str, numbers: range, timeout: float = 60) -> dict[str, list[str]]:
    """Each repo's events in order, each retried (same delivery) until it gets a 2xx."""
    accepted: dict[str, list[str]] = {repo: [] for repo in REPOS}
    for number in numbers:
        for repo in REPOS:
            deadline = time.monotonic() + timeout
            while (reply := post(url, repo, number)).status_code not in (200, 202):
                assert reply.status_code == 503, reply.text
                assert time.monotonic() < deadline, "never accepted"
                time.sleep(0.3)
            accepted[repo].append(reply.json()["event_id"])
    return accepted


def received_in_order(sns: SnsFixture, expected: int, timeout: float = 90) -> dict[str, list[str]]:
    messages = sns.receive(sns.fifo_url, expected=expected, timeout=timeout)
    by_group: dict[str, list[str]] = {}
    for message in messages:
        body = orjson.loads(message["Body"])
        by_group.setdefault(message["Attributes"]["MessageGroupId"], []).append(body["event"]["id"])
    return by_group


def merge(*parts: dict[str, list[str]]) -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    for part in parts:
        for key, ids in part.items():
            merged.setdefault(key, []).extend(ids)
    return merged


async def _statuses(database_url: str) -> dict[str, int]:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            rows = (await session.scalars(select(EventRow))).all()
    finally:
        await engine.dispose()
    return dict(Counter(row.status for row in rows))


def _postgres_proxy(database_url: str) -> tuple[FaultProxy, str]:
    """A proxy in front of the test's PostgreSQL, and the database URL that goes through it."""
    address = urlsplit(database_url.replace("+asyncpg", ""))
    proxy = FaultProxy(address.hostname or "127.0.0.1", address.port or 5432)
    return proxy, database_url.replace(address.netloc.split("@")[-1], proxy.address)


def stream_lengths(redis: PrivateRedis, prefix: str) -> int:
    client = redis.client()
    try:
        return sum(int(client.xlen(f"{prefix}:{{p{p}}}:stream")) for p in range(16))
    finally:
        client.close()


def test_redis_unreachable_at_ingest_is_503_and_nothing_accepted_is_lost(
    private_redis: PrivateRedis,  # before start_gateway: torn down after the gateways stop
    start_gateway: Start,
    sns: SnsFixture,
    database_url: str,
) -> None:
    with FaultProxy("127.0.0.1", private_redis.port) as proxy:
        gateway = start_gateway(
            "gw", redis_url=f"redis://{proxy.address}/0", database_url=database_url
        ).wait_ready()
        before = send_until_accepted(gateway.url, range(2))
        proxy.set_mode("cut")
        refused = [post(gateway.url, repo, 2) for repo in REPOS for _ in range(3)]
        assert {r.status_code for r in refused} == {503}
        assert all(r.headers.get("retry-after", "").isdigit() for r in refused)
        assert {r.json()["error"] for r in refused} == {"QueueUnavailable"}
        proxy.set_mode("pass")
        after = send_until_accepted(gateway.url, range(2, 4))  # the refused ones, retried
        assert received_in_order(sns, expected=8) == merge(before, after)
        assert sns.drain_extra(sns.fifo_url) == []


def test_redis_restarted_empty_workers_recover_on_their_own(
    private_redis: PrivateRedis,  # before start_gateway: torn down after the gateways stop
    start_gateway: Start,
    sns: SnsFixture,
    database_url: str,
    redis_prefix: str,
) -> None:
    gateway = start_gateway(
        "gw", redis_url=private_redis.url, database_url=database_url
    ).wait_ready()
    before = send_until_accepted(gateway.url, range(2))
    assert received_in_order(sns, expected=4) == before
    private_redis.kill()
    private_redis.start()  # same port, no data: streams, groups, leases all gone
    after = send_until_accepted(gateway.url, range(2, 5))
    assert received_in_order(sns, expected=6) == after
    # The consumer group is back on every partition (no NOGROUP limbo).
    client = private_redis.client()
    try:
        for p in range(16):
            key = f"{redis_prefix}:{{p{p}}}:stream"
            if client.exists(key):
                assert [g["name"] for g in client.xinfo_groups(key)] == [b"eventgate"]
    finally:
        client.close()
    assert any(e["event"] == "queue_read_failed" for e in gateway.log_events())


@pytest.mark.skipif(not HAVE_POSTGRES, reason="needs PostgreSQL to put a proxy in front of")
def test_postgres_unreachable_workers_pause_without_acking_ingest_unaffected(
    private_redis: PrivateRedis,  # before start_gateway: torn down after the gateways stop
    start_gateway: Start,
    sns: SnsFixture,
    database_url: str,
    redis_prefix: str,
) -> None:
    proxy, proxied = _postgres_proxy(database_url)
    with proxy:
        gateway = start_gateway(
            "gw", redis_url=private_redis.url, database_url=proxied
        ).wait_ready()
        proxy.set_mode("cut")
        accepted = send_until_accepted(gateway.url, range(3), timeout=0.1)  # 202 at once
        time.sleep(3)
        assert sns.receive(sns.fifo_url, expected=1, timeout=1) == []
        assert stream_lengths(private_redis, redis_prefix) == 6  # none acked
        proxy.set_mode("pass")
        assert received_in_order(sns, expected=6) == accepted
        assert sns.drain_extra(sns.fifo_url) == []
        assert stream_lengths(private_redis, redis_prefix) == 0  # acked once stored
        gateway.stop()


@pytest.mark.skipif(not HAVE_POSTGRES, reason="needs PostgreSQL to put a proxy in front of")
def test_sigterm_after_postgres_vanished_stops_in_bounded_time(
    private_redis: PrivateRedis,  # before start_gateway: torn down after the gateways stop
    start_gateway: Start,
    sns: SnsFixture,
    database_url: str,
) -> None:
    """PostgreSQL's host vanishes with the pool's connections open: closing them never
    completes, and this stop used to hang for good in ``engine.dispose()``. Now the pool
    gets DISPOSE_TIMEOUT_SECONDS and the process exits."""
    proxy, proxied = _postgres_proxy(database_url)
    with proxy:
        gateway = start_gateway(
            "gw", redis_url=private_redis.url, database_url=proxied
        ).wait_ready()
        accepted = send_until_accepted(gateway.url, range(3))
        assert received_in_order(sns, expected=6) == accepted  # the pool holds connections
        proxy.vanish()
    time.sleep(2)
    started = time.monotonic()
    # uvicorn re-raises the signal once its shutdown is done: -SIGTERM is a clean stop.
    assert gateway.stop(timeout=40) in (0, -signal.SIGTERM)
    assert time.monotonic() - started < 20
    assert "database_close_timed_out" in [e["event"] for e in gateway.log_events()]
    proxy.drop_leftovers()


def test_sns_outage_and_throttling_outbox_holds_order_kept(
    private_redis: PrivateRedis,  # before start_gateway: torn down after the gateways stop
    start_gateway: Start,
    sns: SnsFixture,
    database_url: str,
    moto_endpoint: str,
    fake_claude: FakeAnthropicServer,
) -> None:
    moto = urlsplit(moto_endpoint)
    with FaultProxy(moto.hostname or "127.0.0.1", moto.port or 80) as proxy:
        gateway = start_gateway(
            "gw",
            redis_url=private_redis.url,
            database_url=database_url,
            sns_endpoint=f"http://{proxy.address}",
        ).wait_ready()
        proxy.set_mode("cut")
        accepted = send_until_accepted(gateway.url, range(3))
        deadline = time.monotonic() + 20
        while len(fake_claude.behaviour.requests) < 6:  # decided, stored in the outbox
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert sns.receive(sns.fifo_url, expected=1, timeout=2) == []
        assert proxy.refused > 0  # the relay tried while SNS was down
        proxy.set_mode("throttle")
        refused_before = proxy.refused
        deadline = time.monotonic() + 30
        while proxy.refused == refused_before:  # ... and while it answered Throttling
            assert time.monotonic() < deadline, "no publish attempt while throttled"
            time.sleep(0.2)
        assert sns.receive(sns.fifo_url, expected=1, timeout=1) == []
        assert asyncio.run(_statuses(database_url)) == {"processing": 6}  # the outbox holds
        proxy.set_mode("pass")
        assert received_in_order(sns, expected=6) == accepted
        assert sns.drain_extra(sns.fifo_url) == []


def test_sigkill_while_publishing_loses_nothing_fifo_sees_each_once(
    private_redis: PrivateRedis,  # before start_gateway: torn down after the gateways stop
    start_gateway: Start,
    sns: SnsFixture,
    database_url: str,
    moto_endpoint: str,
) -> None:
    moto = urlsplit(moto_endpoint)
    with FaultProxy(moto.hostname or "127.0.0.1", moto.port or 80) as proxy:
        victim = start_gateway(
            "victim",
            redis_url=private_redis.url,
            database_url=database_url,
            sns_endpoint=f"http://{proxy.address}",
        ).wait_ready()
        proxy.delay = 2.0  # SNS answers slowly: the kill lands mid-publish
        seen = proxy.requests
        accepted = send_until_accepted(victim.url, range(3))
        deadline = time.monotonic() + 20
        while proxy.requests == seen:
            assert time.monotonic() < deadline, "the relay never published"
            time.sleep(0.02)
        victim.kill()
        proxy.delay = 0.0
        start_gateway(
            "successor",
            redis_url=private_redis.url,
            database_url=database_url,
            sns_endpoint=f"http://{proxy.address}",
        ).wait_ready()
        # moto's FIFO queue dedups only against messages it still holds (SQS remembers ids
        # for 5 minutes): read only once the successor has republished what was in doubt.
        deadline = time.monotonic() + 60
        while asyncio.run(_statuses(database_url)) != {"published": 6}:
            assert time.monotonic() < deadline, asyncio.run(_statuses(database_url))
            time.sleep(0.3)
        assert received_in_order(sns, expected=6) == accepted
        assert sns.drain_extra(sns.fifo_url) == []

"""Several `eventgate serve` processes on one Redis and one Postgres; one is SIGKILLed
mid-stream. Asserted at the SQS FIFO subscriber: every accepted event exactly once, in
arrival order per key. Also: graceful SIGTERM hands partitions over at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from redis import Redis, RedisCluster
from sqlalchemy import func, select

from app.store.db import create_engine, session_factory
from app.store.models import EventRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.conftest import HAVE_POSTGRES, HAVE_REDIS
from tests.support import (
    GatewayProcess,
    SnsFixture,
    gateway_config,
    gateway_env,
    github_request,
    issue_payload,
)

pytestmark = pytest.mark.skipif(
    not (HAVE_REDIS and HAVE_POSTGRES),
    reason="needs a real Redis and PostgreSQL shared by processes",
)
SECRET = "mp-github-secret"


@pytest.fixture
def start_gateway(
    tmp_path: Path,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_prefix: str,
    redis_url: str,
    database_url: str,
    moto_endpoint: str,
) -> Iterator[Callable[..., GatewayProcess]]:
    config = tmp_path / "eventgate.yaml"
    config.write_text(gateway_config(sns.topic_arn))
    started: list[GatewayProcess] = []

    def start(name: str, **env: str) -> GatewayProcess:
        process = GatewayProcess(
            log_path=tmp_path / f"{name}.log",
            env=gateway_env(
                config=config,
                redis_url=redis_url,
                redis_prefix=redis_prefix,
                database_url=database_url,
                claude_url=fake_claude.base_url,
                sns_endpoint=moto_endpoint,
                E2E_GITHUB_SECRET=SECRET,
                EVENTGATE_LLM_MAX_CONCURRENCY="8",
                EVENTGATE_SHUTDOWN_GRACE_SECONDS="10",
                **env,
            ),
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


async def _wait_all_published(database_url: str, total: int, timeout: float = 90) -> None:
    engine = create_engine(database_url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            async with session_factory(engine)() as session:
                done = await session.scalar(
                    select(func.count()).select_from(EventRow).where(EventRow.status == "published")
                )
            if done == total:
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"only {done} of {total} events published")
    finally:
        await engine.dispose()


@pytest.fixture
def lease_owners(redis_url: str, on_cluster: bool) -> Callable[[str], list[str]]:
    """Each partition's lease holder under a prefix ("" when free)."""

    def read(prefix: str, partitions: int = 16) -> list[str]:
        client = RedisCluster.from_url(redis_url) if on_cluster else Redis.from_url(redis_url)
        try:
            values = [client.get(f"{prefix}:{{p{p}}}:lease") for p in range(partitions)]
        finally:
            client.close()
        return [v.decode() if isinstance(v, bytes) else "" for v in values]

    return read


async def _send_all(
    urls: list[str], alive: Callable[[str], bool], keys: int, per_key: int
) -> dict[str, list[str]]:
    """Each key's events are sent one after another (its arrival order); keys in parallel.
    A refused connection is retried on another process with the same delivery, as a load
    balancer would."""
    accepted: dict[str, list[str]] = {}

    async def one_key(client: httpx.AsyncClient, k: int) -> None:
        repo = f"acme/repo-{k:02d}"
        accepted[repo] = []
        for n in range(per_key):
            body, headers = github_request(SECRET, issue_payload(repo, n))
            for attempt in range(20):
                targets = [u for u in urls if alive(u)]
                url = targets[(k + n + attempt) % len(targets)]
                try:
                    reply = await client.post(
                        f"{url}/v1/webhooks/github", content=body, headers=headers
                    )
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
                    continue
                if reply.status_code in (200, 202):
                    event_id = reply.json()["event_id"]
                    if event_id not in accepted[repo]:
                        accepted[repo].append(event_id)
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"{repo} #{n} was never accepted")
            await asyncio.sleep(0.01)

    async with httpx.AsyncClient(timeout=10) as client:
        await asyncio.gather(*(one_key(client, k) for k in range(keys)))
    return accepted


@pytest.mark.cluster_too
def test_sigkill_mid_stream_loses_nothing_duplicates_nothing_keeps_order(
    start_gateway: Callable[..., GatewayProcess],
    on_cluster: bool,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_prefix: str,
    lease_owners: Callable[[str], list[str]],
    database_url: str,
) -> None:
    fake_claude.behaviour.latency = 0.05
    gateways = [start_gateway(f"gw{i}") for i in range(3)]
    for gateway in gateways:
        gateway.wait_ready()
        # On the cluster, each found it from the one node it was given.
        assert f'"redis_cluster":{str(on_cluster).lower()}' in gateway.log_path.read_text()
    deadline = time.monotonic() + 30
    while not all(
        any(f"-{g.proc.pid}-" in o for o in lease_owners(redis_prefix)) for g in gateways
    ):  # wait until the partitions are spread over all three
        assert time.monotonic() < deadline, lease_owners(redis_prefix)
        time.sleep(0.2)
    victim = gateways[1]
    victim_pid = str(victim.proc.pid)
    killed: dict[str, float] = {}
    keys, per_key = 30, 10

    async def run() -> tuple[dict[str, list[str]], float]:
        async def killer() -> float:
            await asyncio.sleep(1.5)  # mid-stream: the victim holds leases and work
            assert any(f"-{victim_pid}-" in o for o in lease_owners(redis_prefix))
            victim.kill()
            killed["at"] = time.monotonic()
            # Takeover: every lease the victim held is held by a live process again.
            while any(
                f"-{victim_pid}-" in o or not o
                for o in await asyncio.to_thread(lease_owners, redis_prefix)
            ):
                assert time.monotonic() - killed["at"] < 30, "leases were not taken over"
                await asyncio.sleep(0.1)
            return time.monotonic() - killed["at"]

        sending = asyncio.create_task(
            _send_all(
                [g.url for g in gateways],
                lambda u: u != victim.url or "at" not in killed,
                keys,
                per_key,
            )
        )
        takeover = await killer()
        return await sending, takeover

    accepted, takeover = asyncio.run(run())
    total = sum(len(ids) for ids in accepted.values())
    assert total == keys * per_key

    # Drain the subscriber once every event is published: a process killed between SNS
    # accepting a batch and remembering it makes its successor publish that batch again, and
    # SNS FIFO drops such a repeat (same MessageDeduplicationId within 5 minutes). moto only
    # drops it while the first copy is still queued, so reading earlier would show a repeat
    # that a real SNS FIFO subscriber never sees.
    asyncio.run(_wait_all_published(database_url, total))
    messages = sns.receive(sns.fifo_url, expected=total, timeout=90)
    received: dict[str, list[str]] = {}
    for message in messages:
        body = orjson.loads(message["Body"])
        assert message["Attributes"]["MessageGroupId"] == body["event"]["group_key"]
        received.setdefault(body["event"]["group_key"], []).append(body["event"]["id"])
    extra = sns.drain_extra(sns.fifo_url)
    lost = total - len({i for ids in received.values() for i in ids})
    duplicated = len(messages) + len(extra) - len({i for ids in received.values() for i in ids})
    out_of_order = sum(1 for repo, ids in accepted.items() if received.get(repo) != ids)
    all_publishes = len(sns.receive(sns.all_url, expected=total, timeout=30))
    all_publishes += len(sns.drain_extra(sns.all_url))
    summary = (
        f"multiprocess: events={total} keys={keys} lost={lost} duplicated={duplicated} "
        f"out_of_order_keys={out_of_order} sns_publishes={all_publishes} "
        f"takeover_s={takeover:.1f} claude_calls={len(fake_claude.behaviour.requests)} "
        f"sqs_redeliveries={sns.redeliveries}"
    )
    print("\n" + summary)
    assert extra == [], summary
    assert received == accepted, summary  # exactly once, in arrival order per key
    assert takeover < 20, summary


def test_sigterm_drains_and_hands_partitions_over(
    start_gateway: Callable[..., GatewayProcess],
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_prefix: str,
    lease_owners: Callable[[str], list[str]],
) -> None:
    fake_claude.behaviour.latency = 0.5
    first = start_gateway("first").wait_ready()
    body_headers = [github_request(SECRET, issue_payload(f"acme/r{k}", 1)) for k in range(6)]
    for body, headers in body_headers:
        assert (
            httpx.post(f"{first.url}/v1/webhooks/github", content=body, headers=headers).status_code
            == 202
        )
    time.sleep(0.3)  # the events are in flight at the slow fake Claude
    second = start_gateway("second").wait_ready()
    stopped_at = time.monotonic()
    first.proc.terminate()
    first.proc.wait(timeout=20)
    drained_in = time.monotonic() - stopped_at
    events = [e["event"] for e in first.log_events()]
    assert "worker_stopped" in events
    stop_line = next(e for e in first.log_events() if e["event"] == "worker_stopped")
    assert stop_line["unfinished"] == 0  # in-flight events finished within the grace period
    # Its leases were released, not left to expire: the second process owns them at once.
    deadline = time.monotonic() + 6
    successor = f"-{second.proc.pid}-"
    while not all(successor in owner for owner in lease_owners(redis_prefix)):
        assert time.monotonic() < deadline, lease_owners(redis_prefix)
        time.sleep(0.2)
    messages = sns.receive(sns.fifo_url, expected=6, timeout=30)
    assert len(messages) == 6
    assert drained_in < 10


def test_processes_joining_and_dying_never_stop_the_survivors(
    start_gateway: Callable[..., GatewayProcess],
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_prefix: str,
    lease_owners: Callable[[str], list[str]],
    database_url: str,
) -> None:
    """Two processes, and a third started and SIGKILLed six times while they rebalance: the
    survivors keep their lease keepers (a partition given back during a renewal used to
    crash one, silently) and go on taking every new webhook."""
    survivors = [
        start_gateway(f"survivor{i}", EVENTGATE_LEASE_TTL_MS="2000").wait_ready() for i in (1, 2)
    ]
    for round_ in range(6):
        joiner = start_gateway(f"joiner{round_}", EVENTGATE_LEASE_TTL_MS="2000").wait_ready()
        deadline = time.monotonic() + 15
        while not any(f"-{joiner.proc.pid}-" in o for o in lease_owners(redis_prefix)):
            assert time.monotonic() < deadline, "the joiner never got a partition"
            time.sleep(0.1)
        joiner.kill()
    total = 0
    for k in range(10):
        body, headers = github_request(SECRET, issue_payload(f"acme/after-{k}", 1))
        url = survivors[k % 2].url
        reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
        assert reply.status_code == 202
        total += 1
    asyncio.run(_wait_all_published(database_url, total, timeout=60))
    for survivor in survivors:
        crashed = [e for e in survivor.log_events() if e["event"] == "task_restarting"]
        assert crashed == [], crashed
        assert httpx.get(f"{survivor.url}/readyz").status_code == 200

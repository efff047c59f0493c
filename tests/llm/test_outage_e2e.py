"""The whole gateway against a misbehaving Claude: one call in three fails, then Claude is
down for a while. Every event must still be published, once, in order per key; during the
outage the breaker keeps the number of calls small. Also: a 401 makes /readyz fail."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import orjson
from sqlalchemy import select

from app.config import parse_config
from app.main import create_app
from app.settings import Settings
from app.store.db import create_engine, session_factory
from app.store.models import LlmCallRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.support import ServerThread, SnsFixture, gateway_config, github_request, issue_payload

SECRET = "outage-github-secret"
OUTAGE_SECONDS = 4.0
COOLDOWN = 1.0


def _config(topic_arn: str) -> str:
    return gateway_config(topic_arn, secret=SECRET)


@contextmanager
def _gateway(
    sns: SnsFixture, redis_url: str, redis_prefix: str, database_url: str
) -> Iterator[ServerThread]:
    settings = Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        database_url=database_url,
        auto_migrate=False,
        partitions=4,
        relay_poll_seconds=0.2,
        llm_max_concurrency=8,
        # One event hitting four "every 3rd" failures in a row is a real dead-letter under
        # the default of 4; this run is about the outage, so give events more room.
        llm_retry_base_seconds=0.05,
        llm_retry_cap_seconds=0.5,
        llm_breaker_window_seconds=10,
        llm_breaker_min_calls=5,
        llm_breaker_failure_ratio=0.5,
        llm_breaker_cooldown_seconds=COOLDOWN,
    )
    app = create_app(settings, parse_config(_config(sns.topic_arn)))
    with ServerThread(app) as server:
        yield server


def _send(client: httpx.Client, repo: str, number: int) -> str:
    body, headers = github_request(SECRET, issue_payload(repo, number))
    answer = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert answer.status_code == 202, answer.text
    event_id: str = answer.json()["event_id"]
    return event_id


async def _audit_rows(database_url: str) -> list[LlmCallRow]:
    engine = create_engine(database_url)
    async with session_factory(engine)() as session:
        rows = list((await session.scalars(select(LlmCallRow))).all())
    await engine.dispose()
    return rows


def test_flaky_then_down_claude_loses_nothing_and_probes_sparingly(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
) -> None:
    fake = fake_claude.behaviour
    fake.fail_every, fake.fail_status, fake.latency = 3, 500, 0.02
    repos = [f"acme/repo{i}" for i in range(5)]
    sent: dict[str, list[str]] = {repo: [] for repo in repos}
    with (
        _gateway(sns, redis_url, redis_prefix, database_url) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        # Phase 1: one call in three fails; retries absorb it.
        for number in range(1, 4):
            for repo in repos:
                sent[repo].append(_send(client, repo, number))
        first = sns.receive(sns.fifo_url, expected=15, timeout=60)
        assert len(first) == 15
        # Phase 2: Claude goes down, and events keep arriving.
        down_from = time.monotonic()
        fake.down_until = down_from + OUTAGE_SECONDS
        for number in range(4, 7):
            for repo in repos:
                sent[repo].append(_send(client, repo, number))
        time.sleep(1.0)
        ready_during = client.get("/readyz").json()
        metrics_during = client.get("/metrics").text
        second = sns.receive(sns.fifo_url, expected=15, timeout=60)
        published_at = time.monotonic()
    assert len(second) == 15
    assert published_at >= fake.down_until  # nothing got through while Claude was down
    received: dict[str, list[str]] = {repo: [] for repo in repos}
    for message in first + second:
        body = orjson.loads(message["Body"])
        received[body["event"]["group_key"]].append(body["event"]["id"])
    assert received == sent  # every event once, in order per repository
    assert len(sns.receive(sns.all_url, expected=30)) == 30
    assert sns.drain_extra(sns.all_url) == []
    # An open breaker is not a readiness failure (events wait), and it is visible.
    assert ready_during["checks"]["llm"] == "ok"
    assert 'eventgate_circuit_breaker_state{model="claude-sonnet-4-6"}' in metrics_during

    outage = [t for t, status in fake.log if down_from <= t < fake.down_until]
    rows = asyncio.run(_audit_rows(database_url))
    probes = [r for r in rows if r.breaker_state == "half_open"]
    failed_probes = [r for r in probes if r.status != "ok"]
    print(
        f"\nclaude calls during a {OUTAGE_SECONDS:.0f}s outage: {len(outage)} "
        f"({len(failed_probes)} failed half-open probes, cooldown {COOLDOWN:.0f}s); "
        f"calls in total: {len(fake.requests)}"
    )
    # At most one probe per cooldown, plus the calls that opened the breaker.
    assert len(failed_probes) <= OUTAGE_SECONDS / COOLDOWN + 1
    assert len(outage) <= len(failed_probes) + 8 + 5
    assert {r.status for r in rows} <= {"ok", "retry"}
    assert not [r for r in rows if r.status == "error"]


def test_an_authentication_failure_makes_readyz_fail(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
) -> None:
    fake_claude.behaviour.faults = [401]
    with (
        _gateway(sns, redis_url, redis_prefix, database_url) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        assert client.get("/readyz").status_code == 200
        _send(client, "acme/api", 1)
        deadline = time.monotonic() + 20
        while client.get("/readyz").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        answer = client.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["checks"]["llm"] == (
            "error: anthropic rejected the credentials (HTTP 401)"
        )
        # The key works again (rotated): the next call succeeds and readiness recovers.
        _send(client, "acme/api", 2)
        assert len(sns.receive(sns.fifo_url, expected=1, timeout=30)) == 1
        assert client.get("/readyz").status_code == 200

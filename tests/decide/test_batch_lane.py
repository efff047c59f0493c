"""The batch lane: a ``mode: batch`` pipeline's events are decided through the Message
Batches API of the fake (grouped, submitted, polled), published once each in per-key order,
each request audited with its batch id and priced at the batch rate; an expired batch and an
errored request are sent again, a request that never gets an answer is dead-lettered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import structlog
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import ConfigError, parse_config
from app.llm.attempts import usage_of
from app.llm.client import ClaudeReply
from app.llm.pricing import PriceTable
from app.main import create_app
from app.settings import Settings
from app.store.models import BatchRequestRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.conftest import HAVE_POSTGRES, HAVE_REDIS
from tests.support import (
    GatewayProcess,
    ServerThread,
    SnsFixture,
    gateway_env,
    github_request,
    issue_payload,
)

SECRET = "batch-tests-github-secret"
TOKEN = "admin-token-0123456789abcdef"


def _config(topic_arn: str, *, wait: float = 0.5) -> str:
    return f"""
sources:
  github: {{type: github, secret: {SECRET}, pipeline: nightly}}
pipelines:
  nightly:
    model: claude-sonnet-4-6
    system: Review these events when it is cheap to.
    tools: [publishAlert]
    mode: batch
    batch: {{wait_seconds: {wait}, max_requests: 100, poll_seconds: 0.2}}
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties: {{severity: {{type: string, enum: [high, low]}}, title: {{type: string}}}}
      required: [severity, title]
    topic_arn: {topic_arn}
"""


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.fixture
def settings(redis_url: str, redis_prefix: str, database_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        database_url=database_url,
        admin_token=TOKEN,
        auto_migrate=False,
        partitions=4,
        log_format="json",
        relay_poll_seconds=0.1,
    )


async def _send(client: httpx.AsyncClient, repo: str, number: int) -> str:
    body, headers = github_request(SECRET, issue_payload(repo, number))
    reply = await client.post("/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 202, reply.text
    return str(reply.json()["event_id"])


async def _parked(sessions: async_sessionmaker[AsyncSession], count: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        async with sessions() as session:
            found = await session.scalar(select(func.count()).select_from(BatchRequestRow))
        if found == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} requests were not parked in time")


async def test_an_expired_batch_is_sent_again_and_each_event_published_once_in_order(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    settings: Settings,
) -> None:
    fake_claude.behaviour.batch_delay = 0.5
    fake_claude.behaviour.batch_expire_first = 1
    config = parse_config(_config(sns.topic_arn))
    app = create_app(settings, config, role="serve")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as client:
            sent = [await _send(client, repo, n) for n, repo in enumerate(["a/x", "b/y"] * 3)]
            received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=6, timeout=60)
            extra = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
            detail = (await client.get(f"/v1/events/{sent[0]}")).json()
            metrics = (await client.get("/metrics")).text
            stats = (await client.get(f"{fake_claude.base_url}/_fake/stats")).json()
    assert extra == [] and len(received) == 6
    bodies = [orjson.loads(m["Body"]) for m in received]
    assert sorted(b["event"]["id"] for b in bodies) == sorted(sent)
    for key in ("a/x", "b/y"):
        order = [b["event"]["id"] for b in bodies if b["event"]["group_key"] == key]
        assert order == [e for n, e in enumerate(sent) if (n % 2 == 0) == (key == "a/x")]
    # Two batches (the first expired), no live call; each event's two attempts audited.
    assert stats["batches"] == 2 and stats["batch_requests"] == 12 and stats["requests"] == 0
    calls = detail["llm_calls"]
    assert [(c["attempt"], c["status"], c["error_type"]) for c in calls] == [
        (1, "retry", "BatchExpired"),
        (2, "ok", None),
    ]
    assert calls[0]["batch_id"] and calls[1]["batch_id"]
    assert calls[0]["batch_id"] != calls[1]["batch_id"]
    assert detail["status"] == "published"
    assert [(b["status"], b["attempts"]) for b in detail["batch"]] == [("done", 2)]
    # Priced at half the standard rate.
    reply = ClaudeReply(
        model=calls[1]["model"],
        request_id=None,
        stop_reason=None,
        content=[],
        latency_ms=0,
        input_tokens=calls[1]["input_tokens"],
        output_tokens=calls[1]["output_tokens"],
        cache_creation_input_tokens=calls[1]["cache_creation_input_tokens"],
        cache_read_input_tokens=calls[1]["cache_read_input_tokens"],
    )
    standard = PriceTable.from_config(config).cost_usd(reply.model, usage_of(reply))
    # Prices are rounded to 8 decimals: half of an odd last digit is off by 5e-9.
    assert standard > 0 and calls[1]["cost_usd"] == pytest.approx(standard / 2, abs=1e-8)
    assert 'eventgate_batch_requests_total{outcome="submitted",pipeline="nightly"} 12.0' in metrics
    assert 'eventgate_batch_requests_total{outcome="expired",pipeline="nightly"} 6.0' in metrics
    assert 'eventgate_batch_requests_total{outcome="succeeded",pipeline="nightly"} 6.0' in metrics


async def test_a_retried_request_holds_its_keys_later_answers_back(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The first batch holds [b/1, a/1, a/2]; an error rate of 0.5 fails its second request
    (a/1). a/2 is answered in that batch but published only after a/1, answered in the next."""
    fake_claude.behaviour.batch_error_rate = 0.5
    app = create_app(settings, parse_config(_config(sns.topic_arn, wait=3)), role="serve")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as client:
            sent = []
            for n, repo in enumerate(["acme/b", "acme/a", "acme/a"]):
                sent.append(await _send(client, repo, n))
                await _parked(sessions, n + 1)
            received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=3, timeout=60)
            first = (await client.get(f"/v1/events/{sent[1]}")).json()
            second = (await client.get(f"/v1/events/{sent[2]}")).json()
    bodies = [orjson.loads(m["Body"]) for m in received]
    assert [b["event"]["id"] for b in bodies if b["event"]["group_key"] == "acme/a"] == sent[1:]
    assert [c["status"] for c in first["llm_calls"]] == ["retry", "ok"]
    assert [c["status"] for c in second["llm_calls"]] == ["ok"]
    # a/2's answer came with the first batch, a/1's with the second.
    assert second["llm_calls"][0]["batch_id"] == first["llm_calls"][0]["batch_id"]
    assert first["tool_calls"][0]["id"] < second["tool_calls"][0]["id"]


async def test_a_request_never_answered_is_dead_lettered_after_three_batches(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    settings: Settings,
) -> None:
    fake_claude.behaviour.batch_expire_first = 100
    app = create_app(settings, parse_config(_config(sns.topic_arn, wait=0)), role="serve")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as client:
            event_id = await _send(client, "a/x", 1)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                detail = (await client.get(f"/v1/events/{event_id}")).json()
                if detail["status"] == "dead_lettered":
                    break
                await asyncio.sleep(0.2)
            extra = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
    assert detail["status"] == "dead_lettered" and extra == []
    assert [c["status"] for c in detail["llm_calls"]] == ["retry", "retry", "error"]
    assert "no answer after 3 batch attempts" in detail["dead_letter"]["reason"]


async def test_a_spent_budget_holds_the_pipelines_requests(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    text = _config(sns.topic_arn, wait=0).replace(
        "    mode: batch\n", "    mode: batch\n    budget: {daily_tokens: 1}\n"
    )
    app = create_app(settings, parse_config(text), role="serve")
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            await _send(client, "acme/a", 1)
            assert len(await asyncio.to_thread(sns.receive, sns.fifo_url, expected=1)) == 1
            held = await _send(client, "acme/a", 2)  # the first answer spent the budget
            await _parked(sessions, 2)
            await asyncio.sleep(3)
            stats = (await client.get(f"{fake_claude.base_url}/_fake/stats")).json()
    async with sessions() as session:
        row = await session.scalar(select(BatchRequestRow).where(BatchRequestRow.event_id == held))
    assert row is not None and (row.status, row.attempts, row.batch_id) == ("pending", 0, None)
    assert stats["batches"] == 1


@pytest.mark.skipif(
    not (HAVE_REDIS and HAVE_POSTGRES),
    reason="needs a real Redis and PostgreSQL shared by processes",
)
async def test_a_sigkill_with_a_batch_in_flight_loses_nothing(
    tmp_path: Path,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    moto_endpoint: str,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The first process parks the events and sends their batch, and is killed before the
    batch ends; the second reads that batch's answers: each event published once, in order,
    and Claude asked once per event."""
    fake_claude.behaviour.batch_delay = 3
    config = tmp_path / "eventgate.yaml"
    config.write_text(_config(sns.topic_arn, wait=0.5))

    def start(name: str) -> GatewayProcess:
        return GatewayProcess(
            log_path=tmp_path / f"{name}.log",
            env=gateway_env(
                config=config,
                redis_url=redis_url,
                redis_prefix=redis_prefix,
                database_url=database_url,
                claude_url=fake_claude.base_url,
                sns_endpoint=moto_endpoint,
                EVENTGATE_PARTITIONS="4",
                EVENTGATE_RELAY_POLL_SECONDS="0.1",
            ),
        ).wait_ready()

    first = start("first")
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=30) as client:
            sent = [await _send(client, repo, n) for n, repo in enumerate(["a/x", "b/y"] * 2)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            async with sessions() as session:
                states = (await session.scalars(select(BatchRequestRow.status))).all()
            if states == ["submitted"] * 4:
                break
            await asyncio.sleep(0.05)
        assert states == ["submitted"] * 4 and len(fake_claude.behaviour.batches) == 1
    finally:
        first.kill()  # the batch sent and recorded, its answers not read yet
    second = start("second")
    try:
        received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=4, timeout=60)
        extra = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
    finally:
        second.stop()
    bodies = [orjson.loads(m["Body"]) for m in received]
    assert extra == [] and sorted(b["event"]["id"] for b in bodies) == sorted(sent)
    for key in ("a/x", "b/y"):
        order = [b["event"]["id"] for b in bodies if b["event"]["group_key"] == key]
        assert order == [e for n, e in enumerate(sent) if (n % 2 == 0) == (key == "a/x")]
    assert len(fake_claude.behaviour.batches) == 1  # not sent again
    async with sessions() as session:
        rows = (await session.scalars(select(BatchRequestRow))).all()
    assert {(r.status, r.attempts) for r in rows} == {("done", 1)}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("    mode: batch\n", "    mode: batch\n    provider: bedrock\n"), "needs provider"),
        (("    mode: batch\n", ""), "need 'mode: batch'"),
    ],
)
def test_batch_settings_are_checked(edit: tuple[str, str], message: str) -> None:
    text = _config("arn:aws:sns:us-east-1:123456789012:t.fifo").replace(*edit)
    with pytest.raises(ConfigError, match=message):
        parse_config(text)


async def test_a_request_parked_before_its_pipeline_left_batch_mode_is_not_left_waiting(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Restarted with no ``mode: batch`` pipeline left, the gateway still runs the lane for
    the requests parked before: the waiting one is sent at once and its event decided and
    published, instead of staying ``processing`` for ever."""
    text = _config(sns.topic_arn, wait=3600)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    app = create_app(settings, parse_config(text), role="serve")
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as client:
            event_id = await _send(client, "a/x", 1)
            await _parked(sessions, 1)
    live = text.replace("    mode: batch\n", "").replace(
        "    batch: {wait_seconds: 3600, max_requests: 100, poll_seconds: 0.2}\n", ""
    )
    assert "batch:" not in live
    app = create_app(settings, parse_config(live), role="serve")
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as client:
            received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=1, timeout=30)
            detail = (await client.get(f"/v1/events/{event_id}")).json()
    assert [orjson.loads(m["Body"])["event"]["id"] for m in received] == [event_id]
    assert [c["status"] for c in detail["llm_calls"]] == ["ok"]
    assert detail["llm_calls"][0]["batch_id"]

"""Scheduled digests: two gateways share a schedule and the digest of each tick is decided
and published once; it lists the period's stored events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import ConfigError, parse_config
from app.main import create_app
from app.schedule.digests import digest_id, next_tick
from app.settings import Settings
from app.store.models import EventRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.support import ServerThread, SnsFixture, github_request, issue_payload

SECRET = "digest-tests-github-secret"


def _config(topic_arn: str, schedule: str = "* * * * * */2") -> str:
    return f"""
sources:
  github: {{type: github, secret: {SECRET}, pipeline: triage}}
pipelines:
  triage:
    model: claude-sonnet-4-6
    system: You triage GitHub events.
    tools: [publishAlert]
  daily:
    model: claude-sonnet-4-6
    system: Write the digest of the period's events.
    tools: [publishAlert]
    schedule: "{schedule}"
    over: {{source: github, hours: 1}}
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


def _event_id(message: dict[str, Any]) -> str:
    event_id: str = orjson.loads(message["Body"])["event"]["id"]
    return event_id


def _drain_webhooks(sns: SnsFixture, count: int) -> list[str]:
    """Receive until the messages of ``count`` webhook events came; the digests' event ids
    received on the way."""
    digests: list[str] = []
    webhooks = 0
    deadline = time.monotonic() + 30
    while webhooks < count and time.monotonic() < deadline:
        for message in sns.receive(sns.fifo_url, expected=1, timeout=5):
            event_id = _event_id(message)
            if event_id.startswith("dg_"):
                digests.append(event_id)
            else:
                webhooks += 1
    assert webhooks == count
    return digests


async def test_two_gateways_decide_each_tick_once(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    if redis_url == "memory://":
        pytest.skip("two gateways share a real Redis only")
    config = parse_config(_config(sns.topic_arn))

    def gateway() -> ServerThread:
        settings = Settings(
            redis_url=redis_url,
            redis_prefix=redis_prefix,
            database_url=database_url,
            auto_migrate=False,
            partitions=4,
            log_format="json",
            relay_poll_seconds=0.1,
        )
        return ServerThread(create_app(settings, config, role="serve"))

    with gateway() as first, gateway():
        async with httpx.AsyncClient(base_url=first.url, timeout=30) as client:
            for n in range(3):
                body, headers = github_request(SECRET, issue_payload("acme/api", n))
                reply = await client.post("/v1/webhooks/github", content=body, headers=headers)
                assert reply.status_code == 202
        # A tick may fire while the webhooks go in: its digest's message is kept for below.
        early = await asyncio.to_thread(_drain_webhooks, sns, 3)
        started = datetime.now(UTC)
        await asyncio.sleep(5.5)  # two or three ticks of 2 s
        stopped = datetime.now(UTC)
    # Both gateways have stopped: what the table says published is in the queue by now.
    async with sessions() as session:
        digests = (await session.scalars(select(EventRow).where(EventRow.type == "digest"))).all()
    ticks = {row.received_at.replace(tzinfo=UTC) for row in digests}
    assert len(digests) == len(ticks) >= 2  # one event per tick
    last = max(ticks)
    for row in digests:
        tick = row.received_at.replace(tzinfo=UTC)
        # The last tick's digest may have been decided as the gateways stopped, not published.
        assert row.id == digest_id("daily", tick)
        assert row.status == "published" or (tick == last and row.status == "processing")
        if tick > started:  # the three events were stored by then
            assert row.payload["events"] == 3 and row.payload["by_type"] == {"issues.opened": 3}
            assert len(row.payload["events_listed_oldest_first"]) == 3
    # Ticks while both ran, none missed (the last may still have been in flight).
    expected, tick = set(), next_tick("* * * * * */2", started)
    while tick < stopped:
        expected.add(tick)
        tick = next_tick("* * * * * */2", tick)
    assert len(expected - ticks) <= 1
    # Claude was asked once per digest, and each was published once.
    asked = [r for r in fake_claude.behaviour.requests if "event type: digest" in str(r)]
    published = [r.id for r in digests if r.status == "published"]
    assert len(published) <= len(asked) <= len(digests)
    messages = await asyncio.to_thread(
        sns.receive, sns.fifo_url, expected=len(digests) - len(early), timeout=4
    )
    received = early + [_event_id(m) for m in messages]
    assert len(received) == len(set(received))  # none twice
    # A digest stopped between its publish and its row's update is in the queue yet "processing".
    in_flight = {r.id for r in digests if r.status == "processing"}
    assert set(published) <= set(received) <= set(published) | in_flight


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('schedule: "* * * * * */2"', 'schedule: "every day"'), "not a cron expression"),
        (("    over: {source: github, hours: 1}\n", ""), "needs both 'schedule'"),
        (("source: github, hours", "source: nope, hours"), "unknown source 'nope'"),
    ],
)
def test_a_digest_needs_a_cron_schedule_and_a_period(edit: tuple[str, str], message: str) -> None:
    text = _config("arn:aws:sns:us-east-1:123456789012:t.fifo").replace(*edit)
    with pytest.raises(ConfigError, match=message):
        parse_config(text)

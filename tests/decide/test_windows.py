"""Windows: a key's events decided together in one Claude call when the window closes (by
count or by time), published once with ids derived from the window, other keys not held up,
what the admin API shows of it; and a SIGKILL with windows open loses nothing."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import structlog
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import ConfigError, parse_config
from app.decide.windows import window_event, window_event_id
from app.main import create_app
from app.publish.ids import deduplication_id
from app.queue.connection import connect_redis
from app.queue.streams import EventQueue, NewEntry
from app.settings import Settings
from app.store.models import EventRow, WindowRow, WindowStatus
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

SECRET = "window-tests-github-secret"
TOKEN = "admin-token-0123456789abcdef"


def _config(topic_arn: str, *, seconds: float = 3, max_events: int = 3) -> str:
    return f"""
sources:
  github: {{type: github, secret: {SECRET}, pipeline: incidents}}
  github-now: {{type: github, secret: {SECRET}, pipeline: now}}
pipelines:
  now:
    model: claude-sonnet-4-6
    system: Decide each event at once.
    tools: [publishAlert]
  incidents:
    model: claude-sonnet-4-6
    system: Write one report for these events.
    tools: [publishAlert]
    window: {{seconds: {seconds}, max_events: {max_events}}}
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


def _numbers(prompt: str) -> list[int]:
    """The issue numbers of a window's events, in the order its user turn lists them."""
    return [int(n) for n in re.findall(r'"number":(\d+)', prompt)]


def _window_prompts(fake: FakeAnthropicServer) -> list[str]:
    prompts = [str(body["messages"][-1]["content"]) for body in fake.behaviour.requests]
    return [p for p in prompts if p.startswith("window of ")]


async def _send(client: httpx.AsyncClient, repo: str, number: int, source: str = "github") -> str:
    body, headers = github_request(SECRET, issue_payload(repo, number))
    reply = await client.post(f"/v1/webhooks/{source}", content=body, headers=headers)
    assert reply.status_code == 202, reply.text
    return str(reply.json()["event_id"])


async def test_a_window_is_decided_once_when_it_fills_or_its_time_is_up(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    settings = Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        database_url=database_url,
        admin_token=TOKEN,
        auto_migrate=False,
        partitions=4,
        log_format="json",
        relay_poll_seconds=0.1,
    )
    app = create_app(settings, parse_config(_config(sns.topic_arn)), role="serve")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as client:
            slow = await _send(client, "acme/slow", 100)  # opens a window of 3 s
            full = [await _send(client, "acme/full", n) for n in (1, 2, 3)]  # fills one
            # The same key through a pipeline without a window is not held behind it.
            now = await _send(client, "acme/slow", 200, source="github-now")
            first = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=2)
            # The full window was decided while the other key's window was still open.
            slow_then = (await client.get(f"/v1/events/{slow}")).json()
            second = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=1)
            extra = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
            member = (await client.get(f"/v1/events/{full[1]}")).json()
            metrics = (await client.get("/metrics")).text
            window_id = member["window"]["event_id"]
            decided = (await client.get(f"/v1/events/{window_id}")).json()
            listed = (await client.get("/v1/events", params={"status": "windowed"})).json()
    assert slow_then["status"] == "windowed" and slow_then["window"]["status"] == "open"
    assert extra == []
    bodies = [orjson.loads(m["Body"]) for m in first + second]
    assert now in {b["event"]["id"] for b in bodies[:2]}  # before the slow key's window
    assert [b["event"]["group_key"] for b in bodies[2:]] == ["acme/slow"]
    bodies = [b for b in bodies if b["event"]["id"] != now]
    # One Claude call per window, listing its events oldest first.
    prompts = _window_prompts(fake_claude)
    assert len(prompts) == 2 and len(fake_claude.behaviour.requests) == 3
    assert _numbers(prompts[0]) == [1, 2, 3] and "window closed by: count" in prompts[0]
    assert _numbers(prompts[1]) == [100] and "window closed by: time" in prompts[1]
    # Ids come from the window: its first and last events.
    expected_id = window_event_id("incidents", full[0], full[2])
    assert window_id == expected_id and bodies[0]["event"]["id"] == expected_id
    assert bodies[0]["window"] == {"first_event_id": full[0], "last_event_id": full[2], "events": 3}
    (attributes,) = [
        m["Attributes"] for m in first if orjson.loads(m["Body"])["event"]["id"] == expected_id
    ]
    assert attributes["MessageDeduplicationId"] == deduplication_id(expected_id, 0)
    assert attributes["MessageGroupId"] == "acme/full"
    # What the admin API says of a member and of the window's event.
    assert member["status"] == "windowed" and member["window"]["position"] == 2
    assert member["window"]["decision_status"] == "published"
    assert member["window"]["closed_by"] == "count" and member["window"]["events"] == 3
    assert decided["source"] == "window" and decided["status"] == "published"
    assert decided["window"]["members"] == full
    assert len(decided["llm_calls"]) == 1 and decided["llm_calls"][0]["cost_usd"] > 0
    assert {e["event_id"] for e in listed["items"]} == {slow, *full}
    assert 'eventgate_windows_closed_total{pipeline="incidents",reason="count"} 1.0' in metrics
    assert 'eventgate_windows_closed_total{pipeline="incidents",reason="time"} 1.0' in metrics

    # A window enqueued again (a closer that died before marking it) publishes nothing more
    # and does not ask Claude again.
    async with sessions() as session:
        await session.execute(update(WindowRow).values(status=WindowStatus.CLOSED, event_id=None))
        await session.commit()
    app2 = create_app(settings, parse_config(_config(sns.topic_arn)), role="serve")
    with ServerThread(app2):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            async with sessions() as session:
                states = set((await session.scalars(select(WindowRow.status))).all())
            if states == {WindowStatus.ENQUEUED}:
                break
            await asyncio.sleep(0.2)
        assert states == {WindowStatus.ENQUEUED}
        await asyncio.sleep(1)
        again = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
    assert again == [] and len(fake_claude.behaviour.requests) == 3


async def test_a_window_event_processed_again_asks_claude_once(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Even with the queue's dedup gone (the window's event enqueued a second time as new),
    the stored decision is not made again: the event is final."""
    if redis_url == "memory://":
        pytest.skip("the in-process Redis cannot be reached from the test")
    settings = Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        database_url=database_url,
        auto_migrate=False,
        partitions=4,
        log_format="json",
        relay_poll_seconds=0.1,
    )
    config = parse_config(_config(sns.topic_arn, max_events=2))
    app = create_app(settings, config, role="serve")
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for n in (1, 2):
                await _send(client, "acme/twice", n)
            assert len(await asyncio.to_thread(sns.receive, sns.fifo_url, expected=1)) == 1
            queue = EventQueue(connect_redis(redis_url), prefix=redis_prefix, partitions=4)
            async with sessions() as session:
                row = (await session.scalars(select(WindowRow))).one()
            again = window_event(row)
            result = await queue.enqueue(
                NewEntry(
                    event_id=again.id,
                    source="window",
                    delivery_id="not-the-dedup-id",
                    group_key=again.group_key,
                    data=again.to_bytes(),
                    dedup_window_ms=60_000,
                )
            )
            assert result.created
            await asyncio.sleep(2)
            extra = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
    assert row.events == 2 and extra == []
    assert len(fake_claude.behaviour.requests) == 1


def test_a_digest_takes_no_window() -> None:
    text = _config("arn:aws:sns:us-east-1:123456789012:t.fifo").replace(
        "    window:",
        '    schedule: "0 9 * * *"\n    over: {source: github, hours: 1}\n    window:',
    )
    with pytest.raises(ConfigError, match="takes no 'window'"):
        parse_config(text)


def test_no_source_may_be_named_like_the_events_of_closed_windows() -> None:
    """A webhook source named ``window`` would send events the processor takes for closed
    windows: its payload's ``window.id`` would put any window's events (of any key) into
    the prompt."""
    text = _config("arn:aws:sns:us-east-1:123456789012:t.fifo").replace(
        "  github: {type: github,", "  window: {type: github,"
    )
    assert "  window: {type: github," in text
    with pytest.raises(ConfigError, match="reserved"):
        parse_config(text)


@pytest.mark.skipif(
    not (HAVE_REDIS and HAVE_POSTGRES),
    reason="needs a real Redis and PostgreSQL shared by processes",
)
async def test_a_sigkill_with_windows_open_loses_nothing(
    tmp_path: Path,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    moto_endpoint: str,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    config = tmp_path / "eventgate.yaml"
    config.write_text(_config(sns.topic_arn, seconds=4, max_events=100))

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
    sent: dict[str, list[str]] = {"acme/a": [], "acme/b": []}
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=30) as client:
            for n in range(6):
                repo = "acme/a" if n % 3 else "acme/b"
                sent[repo].append(await _send(client, repo, n))
        await _wait_for(sessions, lambda rows: len(rows) == 6, status="windowed")
    finally:
        first.kill()  # both windows open, their events acked off the stream
    second = start("second")
    try:
        received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=2, timeout=60)
        extra = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
    finally:
        second.stop()
    bodies = {
        orjson.loads(m["Body"])["event"]["group_key"]: orjson.loads(m["Body"]) for m in received
    }
    assert extra == [] and len(received) == 2
    for repo, ids in sent.items():
        assert bodies[repo]["window"]["first_event_id"] == ids[0]
        assert bodies[repo]["window"]["last_event_id"] == ids[-1]
        assert bodies[repo]["window"]["events"] == len(ids)
    prompts = sorted(_window_prompts(fake_claude), key=len)
    assert len(prompts) == 2
    assert sorted(_numbers(p)[0] for p in prompts) == [0, 1]
    assert [_numbers(p) for p in prompts] in ([[0, 3], [1, 2, 4, 5]], [[1, 2, 4, 5], [0, 3]])


async def _wait_for(
    sessions: async_sessionmaker[AsyncSession], done: Any, *, status: str, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with sessions() as session:
            rows = (await session.scalars(select(EventRow).where(EventRow.status == status))).all()
        if done(rows):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"events did not reach {status!r} in time")


async def test_a_window_left_open_when_its_pipeline_loses_its_window_is_still_decided(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The gateway is restarted with the pipeline's ``window`` taken out while a window of
    it is open: its events were acked off the stream, so the window is closed and decided
    all the same (no pipeline has a window now, but the table still has one)."""
    settings = Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        database_url=database_url,
        admin_token=TOKEN,
        auto_migrate=False,
        partitions=4,
        log_format="json",
        relay_poll_seconds=0.1,
    )
    text = _config(sns.topic_arn, seconds=1, max_events=100)
    app = create_app(settings, parse_config(text), role="serve")
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            sent = [await _send(client, "acme/a", n) for n in (1, 2)]
        await _wait_for(sessions, lambda rows: len(rows) == 2, status="windowed")
    async with sessions() as session:
        await session.execute(update(WindowRow).values(closes_at=WindowRow.opened_at))
        await session.commit()  # the first gateway stopped before its closer's next round
    unwindowed = text.replace("    window: {seconds: 1, max_events: 100}\n", "")
    assert "window:" not in unwindowed
    app = create_app(settings, parse_config(unwindowed), role="serve")
    with ServerThread(app):
        received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=1, timeout=20)
    body = orjson.loads(received[0]["Body"])
    assert (body["window"]["first_event_id"], body["window"]["last_event_id"]) == tuple(sent)

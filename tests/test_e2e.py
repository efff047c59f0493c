"""Webhook → Redis → Claude (fake, over HTTP) → SNS FIFO (moto) → an SQS FIFO subscriber,
with `eventgate serve` running as a real process configured only through its environment."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from sqlalchemy import select

from app.store.db import create_engine, session_factory
from app.store.models import EventRow, LlmCallRow, OutboxRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.support import (
    GatewayProcess,
    SnsFixture,
    gateway_config,
    gateway_env,
    github_request,
    issue_payload,
)

SECRET = "e2e-github-secret"


@pytest.fixture
def gateway(
    tmp_path: Path,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    moto_endpoint: str,
) -> Iterator[str]:
    config = tmp_path / "eventgate.yaml"
    config.write_text(gateway_config(sns.topic_arn))
    process = GatewayProcess(
        log_path=tmp_path / "gateway.log",
        env=gateway_env(
            config=config,
            redis_url=redis_url,
            redis_prefix=redis_prefix,
            database_url=database_url,
            claude_url=fake_claude.base_url,
            sns_endpoint=moto_endpoint,
            E2E_GITHUB_SECRET=SECRET,
            EVENTGATE_AUTO_MIGRATE="true",  # as a gateway on its defaults does
            ANTHROPIC_API_KEY="sk-ant-e2e-not-real",
        ),
    )
    try:
        yield process.wait_ready().url
    finally:
        # uvicorn re-raises SIGTERM after its graceful shutdown: -15 is a clean exit here.
        assert process.stop() in (0, -15)
    assert any(e["event"] == "worker_stopped" for e in process.log_events())
    # No secret reaches the gateway's log.
    text = process.log_path.read_text()
    assert SECRET not in text
    assert "sk-ant-e2e-not-real" not in text


def test_signed_webhooks_reach_the_fifo_subscriber_in_order_once(
    gateway: str,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    database_url: str,
) -> None:
    repos = ["acme/api", "acme/web"]
    sent: dict[str, list[str]] = {repo: [] for repo in repos}
    first_delivery: tuple[bytes, dict[str, str]] | None = None
    with httpx.Client(base_url=gateway, timeout=10) as client:
        for number in range(1, 4):
            for repo in repos:
                body, headers = github_request(SECRET, issue_payload(repo, number))
                first_delivery = first_delivery or (body, headers)
                reply = client.post("/v1/webhooks/github", content=body, headers=headers)
                assert reply.status_code == 202, reply.text
                assert reply.json()["status"] == "queued"
                sent[repo].append(reply.json()["event_id"])
        # GitHub redelivers the first webhook: same delivery id, same body.
        assert first_delivery is not None
        again = client.post(
            "/v1/webhooks/github", content=first_delivery[0], headers=first_delivery[1]
        )
        assert again.status_code == 200
        assert again.json() == {"event_id": sent["acme/api"][0], "status": "duplicate"}

    messages = sns.receive(sns.fifo_url, expected=6)
    assert len(messages) == 6
    received: dict[str, list[str]] = {repo: [] for repo in repos}
    for message in messages:
        body = orjson.loads(message["Body"])
        group = message["Attributes"]["MessageGroupId"]
        assert group == body["event"]["group_key"]
        assert body["tool"] == "publishAlert"
        assert body["input"]["severity"] == "high"
        assert body["event"]["type"] == "issues.opened"
        assert body["event"]["source"] == "github"
        assert body["model"] == "claude-sonnet-4-6"
        assert body["sequence"] == 0
        attributes = {k: v["StringValue"] for k, v in message["MessageAttributes"].items()}
        assert attributes == {
            "tool": "publishAlert",
            "source": "github",
            "event_id": body["event"]["id"],
        }
        received[group].append(body["event"]["id"])
    assert received == sent  # per-repository arrival order, each event once
    # Every publish the gateway made (standard queue sees duplicates too): exactly six.
    assert len(sns.receive(sns.all_url, expected=6)) == 6
    assert sns.drain_extra(sns.all_url) == []
    assert len(fake_claude.behaviour.requests) == 6

    async def audit() -> None:
        engine = create_engine(database_url)
        async with session_factory(engine)() as session:
            calls = (await session.scalars(select(LlmCallRow))).all()
            events = (await session.scalars(select(EventRow))).all()
            outbox = (await session.scalars(select(OutboxRow))).all()
        await engine.dispose()
        assert len(calls) == 6
        assert {c.status for c in calls} == {"ok"}
        assert all(c.request_id and c.request_id.startswith("req_fake_") for c in calls)
        assert all(c.input_tokens > 0 and c.output_tokens == 40 for c in calls)
        assert {e.status for e in events} == {"published"}
        assert all(o.sns_message_id for o in outbox)

    deadline = time.monotonic() + 10
    while True:  # the relay marks events published just after SNS accepted them
        try:
            asyncio.run(audit())
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

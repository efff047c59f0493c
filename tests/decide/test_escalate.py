"""Triage, then escalate: a cheap pipeline decides first; only the events for which it calls
the escalation tool are decided again by the named pipeline; only the final decision
reaches the SNS subscriber; both calls are audited and priced."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import structlog

from app.config import ConfigError, parse_config
from app.main import create_app
from app.settings import Settings
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.support import ServerThread, SnsFixture, github_request, issue_payload

SECRET = "escalate-tests-github-secret"
TOKEN = "admin-token-0123456789abcdef"


def _config(topic_arn: str) -> str:
    return f"""
sources:
  github: {{type: github, secret: {SECRET}, pipeline: triage}}
pipelines:
  triage:
    model: claude-haiku-4-5
    system: Decide cheaply; escalate what needs a closer look.
    tools: [publishAlert, escalate]
    escalate: {{to: deep, when_tool: escalate}}
  deep:
    model: claude-sonnet-4-6
    system: Look closely.
    tools: [publishAlert]
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties: {{severity: {{type: string, enum: [high, low]}}, title: {{type: string}}}}
      required: [severity, title]
    topic_arn: {topic_arn}
  escalate:
    description: Hand the event to the closer look.
    input_schema: {{type: object, properties: {{reason: {{type: string}}}}}}
"""


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def _triage(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The cheap model escalates the urgent repositories' events and alerts on the rest."""
    if body["model"] == "claude-haiku-4-5" and "urgent" in str(body["messages"][-1]["content"]):
        use = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": "escalate"}
        return [{**use, "input": {"reason": "looks bad"}}]
    return None


async def test_only_the_escalated_decision_publishes_and_both_calls_are_audited(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
) -> None:
    fake_claude.behaviour.responder = _triage
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
            ids = {}
            for n, repo in enumerate(["acme/urgent-a", "acme/calm-b", "acme/urgent-c"]):
                body, headers = github_request(SECRET, issue_payload(repo, n))
                reply = await client.post("/v1/webhooks/github", content=body, headers=headers)
                assert reply.status_code == 202, reply.text
                ids[repo] = reply.json()["event_id"]
            received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=3)
            extra = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
            details = {r: (await client.get(f"/v1/events/{i}")).json() for r, i in ids.items()}
            metrics = (await client.get("/metrics")).text
    by_event = {orjson.loads(m["Body"])["event"]["id"]: orjson.loads(m["Body"]) for m in received}
    assert extra == [] and len(by_event) == 3
    # The escalated events were decided by the deep pipeline's model; nothing of escalate.
    assert by_event[ids["acme/urgent-a"]]["model"] == "claude-sonnet-4-6"
    assert by_event[ids["acme/urgent-c"]]["model"] == "claude-sonnet-4-6"
    assert by_event[ids["acme/calm-b"]]["model"] == "claude-haiku-4-5"
    assert {b["tool"] for b in by_event.values()} == {"publishAlert"}
    urgent = details["acme/urgent-a"]
    calls = [(c["pipeline"], c["model"], c["attempt"], c["status"]) for c in urgent["llm_calls"]]
    assert calls == [
        ("triage", "claude-haiku-4-5", 1, "ok"),
        ("deep", "claude-sonnet-4-6", 2, "ok"),
    ]
    assert all(c["cost_usd"] > 0 for c in urgent["llm_calls"])
    assert "escalated to pipeline 'deep'" in urgent["llm_calls"][0]["error"]
    assert [c["pipeline"] for c in details["acme/calm-b"]["llm_calls"]] == ["triage"]
    assert [t["tool"] for t in urgent["tool_calls"]] == ["publishAlert"]
    assert 'eventgate_escalations_total{pipeline="triage",to="deep"} 2.0' in metrics


@pytest.mark.parametrize(
    ("escalate", "message"),
    [
        ("{to: nope, when_tool: escalate}", "unknown pipeline 'nope'"),
        ("{to: triage, when_tool: escalate}", "cannot escalate to itself"),
        ("{to: deep, when_tool: publishNotification}", "not one of this pipeline's tools"),
    ],
)
def test_an_escalation_must_name_another_pipeline_and_an_offered_tool(
    escalate: str, message: str
) -> None:
    text = _config("arn:aws:sns:us-east-1:123456789012:t.fifo").replace(
        "escalate: {to: deep, when_tool: escalate}", f"escalate: {escalate}"
    )
    with pytest.raises(ConfigError, match=message):
        parse_config(text)


def test_escalation_is_one_step() -> None:
    text = _config("arn:aws:sns:us-east-1:123456789012:t.fifo").replace(
        "    tools: [publishAlert]\ntools:",
        "    tools: [publishAlert, escalate]\n    escalate: {to: triage, when_tool: escalate}\n"
        "tools:",
    )
    with pytest.raises(ConfigError, match="escalates too"):
        parse_config(text)

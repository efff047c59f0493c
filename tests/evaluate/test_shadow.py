"""Shadow candidates on live traffic: the SNS subscriber receives exactly the live decisions
while a candidate (another model, answering differently) decides the same events, and the
admin API, the audit log and the metrics measure the two against each other."""

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
from prometheus_client import REGISTRY

from app.config import ConfigError, parse_config
from app.evaluate.shadow import ShadowRunner, sampled
from app.events import Event
from app.main import create_app
from app.settings import Settings
from eventgate_dev.fake_anthropic import FakeAnthropicServer, Persona
from tests.support import ServerThread, SnsFixture, github_request, issue_payload

SECRET = "shadow-tests-github-secret"
TOKEN = "admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _config(topic_arn: str, *, sample: float = 1.0) -> str:
    return f"""
sources:
  github: {{type: github, secret: {SECRET}, pipeline: triage}}
pipelines:
  triage:
    model: claude-sonnet-4-6
    system: You triage GitHub events.
    tools: [publishAlert]
    shadow: [{{pipeline: triage-v2, sample: {sample}}}]
  triage-v2:
    model: claude-haiku-4-5
    system: You triage GitHub events, the second way.
    tools: [publishAlert]
    max_concurrency: 2
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


def _gateway(config: str, redis_url: str, redis_prefix: str, database_url: str) -> ServerThread:
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
    return ServerThread(create_app(settings, parse_config(config), role="serve"))


def _shadowed_count(metrics: str, agreement: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("eventgate_shadow_decisions_total{") and (
            f'agreement="{agreement}"' in line and 'candidate="triage-v2"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _send(client: httpx.AsyncClient, count: int) -> list[str]:
    ids = []
    for n in range(count):
        body, headers = github_request(SECRET, issue_payload(f"acme/repo-{n % 3}", n))
        reply = await client.post("/v1/webhooks/github", content=body, headers=headers)
        assert reply.status_code == 202, reply.text
        ids.append(reply.json()["event_id"])
    return ids


async def _report(client: httpx.AsyncClient, events: int) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        found: dict[str, Any] = (
            await client.get("/v1/shadow", params={"candidate": "triage-v2"})
        ).json()
        if found.get("events", 0) + found.get("errors", 0) >= events:
            return found
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.2)


async def test_the_subscriber_gets_only_the_live_decisions_while_a_candidate_runs(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
) -> None:
    fake_claude.behaviour.personas["claude-haiku-4-5"] = Persona(enum="last")
    with _gateway(_config(sns.topic_arn), redis_url, redis_prefix, database_url) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=30) as client:
            before = (await client.get("/metrics")).text
            ids = await _send(client, 6)
            received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=6)
            report = await _report(client, 6)
            extra = await asyncio.to_thread(sns.drain_extra, sns.fifo_url)
            shadow_calls = (await client.get("/v1/llm-calls", params={"shadow": "true"})).json()
            live_calls = (await client.get("/v1/llm-calls", params={"shadow": "false"})).json()
            detail = (await client.get(f"/v1/events/{ids[0]}")).json()
            after = (await client.get("/metrics")).text
            unknown = await client.get("/v1/shadow", params={"candidate": "triage-v9"})
    # Exactly the live decisions reached the subscriber: one per event, the live model's.
    bodies = [orjson.loads(m["Body"]) for m in received]
    assert sorted(b["event"]["id"] for b in bodies) == sorted(ids) and extra == []
    assert {(b["model"], b["input"]["severity"]) for b in bodies} == {("claude-sonnet-4-6", "high")}
    # The candidate decided all six: same tool, another severity.
    assert report["candidate"] == "triage-v2" and report["baseline"] == "triage"
    assert (report["events"], report["errors"]) == (6, 0)
    assert report["action_agreement"] == 1.0 and report["exact_agreement"] == 0.0
    assert report["fields"] == {"publishAlert.severity": 0.0}
    assert len(report["disagreements"]) == 6
    assert report["disagreements"][0]["candidate"][0]["input"]["severity"] == "low"
    assert set(report["cost_usd"]) == {"baseline", "candidate"}
    assert report["latency_ms"]["candidate"]["p50"] is not None
    assert shadow_calls["total"] == 6 and live_calls["total"] == 6
    assert {c["pipeline"] for c in shadow_calls["items"]} == {"triage-v2"}
    assert all(c["purpose"] == "shadow" for c in shadow_calls["items"])
    (seen,) = detail["shadow"]
    assert (seen["candidate"], seen["agreement"]) == ("triage-v2", "action")
    assert seen["decision"][0]["input"]["severity"] == "low"
    assert _shadowed_count(after, "action") - _shadowed_count(before, "action") == 6
    assert unknown.status_code == 404 and unknown.json()["error"] == "ShadowCandidateNotFound"


async def test_the_sample_is_chosen_by_event_id(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
) -> None:
    config = _config(sns.topic_arn, sample=0.5)
    with _gateway(config, redis_url, redis_prefix, database_url) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=30) as client:
            ids = await _send(client, 12)
            await asyncio.to_thread(sns.receive, sns.fifo_url, expected=12)
            chosen = {i for i in ids if sampled(i, "triage-v2", 0.5)}
            assert 0 < len(chosen) < 12  # 12 ids at 0.5: not all, not none (checked here)
            report = await _report(client, len(chosen))
            await asyncio.sleep(0.5)  # a candidate that wrongly saw more would show by now
            again = (await client.get("/v1/shadow", params={"candidate": "triage-v2"})).json()
    assert report["events"] == again["events"] == len(chosen)
    assert {d["event_id"] for d in again["disagreements"]} <= chosen


def test_sampling_is_deterministic_and_near_its_share() -> None:
    ids = [f"evt_{n}" for n in range(4000)]
    share = sum(sampled(i, "c", 0.25) for i in ids) / len(ids)
    assert 0.22 < share < 0.28
    assert [sampled(i, "c", 0.25) for i in ids] == [sampled(i, "c", 0.25) for i in ids]
    assert all(sampled(i, "c", 1.0) for i in ids[:10])
    assert not any(sampled(i, "c", 0.0) for i in ids)


@pytest.mark.parametrize(
    ("shadow", "message"),
    [
        ("[{pipeline: nope}]", "unknown pipeline 'nope'"),
        ("[{pipeline: triage}]", "shadow itself"),
        ("[{pipeline: triage-v2, sample: 2}]", "less than or equal to 1"),
    ],
)
def test_a_shadow_must_name_another_configured_pipeline(shadow: str, message: str) -> None:
    text = _config("arn:aws:sns:us-east-1:123456789012:t.fifo").replace(
        "shadow: [{pipeline: triage-v2, sample: 1.0}]", f"shadow: {shadow}"
    )
    with pytest.raises(ConfigError, match=message):
        parse_config(text)


async def test_a_candidate_out_of_budget_fails_alone_and_live_goes_on(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
) -> None:
    # The candidate's own budget allows one call a day; "wait" would park its calls.
    config = _config(sns.topic_arn).replace(
        "    max_concurrency: 2\n",
        "    max_concurrency: 1\n    budget: {daily_tokens: 1, on_exhausted: dead_letter}\n",
    )
    with _gateway(config, redis_url, redis_prefix, database_url) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=30) as client:
            ids = await _send(client, 6)
            received = await asyncio.to_thread(sns.receive, sns.fifo_url, expected=6)
            report = await _report(client, 6)
            events = [(await client.get(f"/v1/events/{i}")).json() for i in ids]
    assert len(received) == 6  # every live decision published
    assert {e["status"] for e in events} == {"published"}
    # The first candidate call spent the day's budget; the others gave up, each recorded.
    assert (report["events"], report["errors"]) == (1, 5)
    failed = [s for e in events for s in e["shadow"] if s["agreement"] == "error"]
    assert len(failed) == 5 and all("budget" in s["error"] for s in failed)


def test_a_candidate_whose_queue_is_full_skips_the_event_and_counts_it() -> None:
    config = parse_config(_config("arn:aws:sns:us-east-1:123456789012:t.fifo"))
    runner = ShadowRunner(
        config=config,
        rerunner=None,  # type: ignore[arg-type]  # never reached: the queue is full
        sessions=None,  # type: ignore[arg-type]
        live_caller=None,  # type: ignore[arg-type]
        max_pending=0,
    )
    labels = {"candidate": "triage-v2", "agreement": "skipped"}
    before = REGISTRY.get_sample_value("eventgate_shadow_decisions_total", labels) or 0.0
    event = Event(
        id="evt_full",
        source="github",
        type="push",
        group_key="acme/api",
        delivery_id="d",
        pipeline="triage",
        received_at=datetime.now(UTC),
        payload={},
    )
    runner.after_decided(event, [], None)  # type: ignore[arg-type]
    after = REGISTRY.get_sample_value("eventgate_shadow_decisions_total", labels)
    assert after == before + 1 and runner.tasks == set()

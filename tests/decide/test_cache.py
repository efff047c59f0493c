"""The response cache: the same prompt (apart from when the event arrived) is decided once
and reused; a hit is stored and published like a fresh decision, audited as a hit with no
cost; entries never cross pipelines."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
import uuid
from collections.abc import Iterator

import httpx
import orjson
import pytest
import structlog

from app.config import parse_config
from app.main import create_app
from app.settings import Settings
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.support import ServerThread, SnsFixture

KEY = b"k" * 24
SECRET = "whsec_" + base64.b64encode(KEY).decode()
TOKEN = "admin-token-0123456789abcdef"


def _config(topic_arn: str) -> str:
    pipeline = """
    model: claude-sonnet-4-6
    system: You judge sensor readings.
    tools: [publishAlert]
    cache: {ttl_seconds: 3600}"""
    return f"""
sources:
  sensors: {{type: standard-webhooks, secret: "{SECRET}", group_key: device, pipeline: a}}
  sensors-b: {{type: standard-webhooks, secret: "{SECRET}", group_key: device, pipeline: b}}
pipelines:
  a:{pipeline}
  b:{pipeline}
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties: {{severity: {{type: string, enum: [high, low]}}, title: {{type: string}}}}
      required: [severity, title]
    topic_arn: {topic_arn}
"""


def _signed(body: bytes) -> dict[str, str]:
    msg_id, ts = f"msg_{uuid.uuid4().hex}", str(int(time.time()))
    mac = hmac.new(KEY, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": ts,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


async def test_the_same_prompt_is_paid_for_once_per_pipeline(
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
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
    body = orjson.dumps({"device": "th-1", "temperature": 91})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as client:
            ids = []
            for source in ("sensors", "sensors", "sensors", "sensors-b"):
                reply = await client.post(
                    f"/v1/webhooks/{source}", content=body, headers=_signed(body)
                )
                assert reply.status_code == 202, reply.text
                ids.append(reply.json()["event_id"])
                # One after the other: the first decision is cached before the next asks.
                await asyncio.to_thread(sns.receive, sns.fifo_url, expected=1)
            calls = [
                (await client.get("/v1/llm-calls", params={"event_id": i})).json()["items"][0]
                for i in ids
            ]
            events = [(await client.get(f"/v1/events/{i}")).json() for i in ids]
            metrics = (await client.get("/metrics")).text
    assert len(set(ids)) == 4
    # Claude was asked once for pipeline a and once for pipeline b.
    assert len(fake_claude.behaviour.requests) == 2
    assert [c["cache_hit"] for c in calls] == [False, True, True, False]
    assert [c["pipeline"] for c in calls] == ["a", "a", "a", "b"]
    assert calls[1]["cost_usd"] == 0.0 and calls[1]["provider"] == "cache"
    assert calls[0]["cost_usd"] > 0 and calls[1]["tool_calls"] == calls[0]["tool_calls"]
    assert {e["status"] for e in events} == {"published"}
    published = [e["tool_calls"][0] for e in events]
    assert len({t["dedup_id"] for t in published}) == 4  # each event its own message
    assert 'eventgate_llm_cache_total{outcome="hit",pipeline="a"} 2.0' in metrics


async def test_an_operators_replay_asks_claude_again(
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
) -> None:
    # No topic: the decision is held, and an operator replays it.
    config = _config("x").replace("    topic_arn: x\n", "")
    settings = Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        database_url=database_url,
        admin_token=TOKEN,
        auto_migrate=False,
        partitions=4,
        log_format="json",
    )
    app = create_app(settings, parse_config(config), role="serve")
    body = orjson.dumps({"device": "th-2", "temperature": 12})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=30) as client:
            reply = await client.post("/v1/webhooks/sensors", content=body, headers=_signed(body))
            event_id = reply.json()["event_id"]

            async def status() -> str:
                return str((await client.get(f"/v1/events/{event_id}")).json()["status"])

            for _ in range(100):
                if await status() == "held":
                    break
                await asyncio.sleep(0.1)
            assert (await client.post(f"/v1/events/{event_id}/replay")).status_code == 202
            for _ in range(100):
                calls = (await client.get("/v1/llm-calls", params={"event_id": event_id})).json()
                if calls["total"] == 2 and await status() == "held":
                    break
                await asyncio.sleep(0.1)
    assert len(fake_claude.behaviour.requests) == 2
    assert [c["cache_hit"] for c in calls["items"]] == [False, False]

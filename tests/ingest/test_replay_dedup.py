"""A captured, validly signed request sent again under a new (unsigned) delivery id is a
duplicate, not a new event: ``X-GitHub-Delivery``, a generic ``delivery_header`` and binary
CloudEvents' ``ce-id`` are outside the signature, so anyone who saw one request could have it
decided and published again. Such sources also deduplicate on a digest of what the signature
covers (the body, plus the signed timestamp when the scheme signs one).

Over HTTP into the real app (role "api"), with the batched enqueue and with one Lua call per
request; then the queue itself, where both paths run the same script.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from app.config import parse_config
from app.main import create_app
from app.queue.batching import EnqueueBatcher
from app.queue.connection import connect_redis
from app.queue.streams import EnqueueResult, EventQueue, NewEntry
from app.settings import Settings
from tests.support import ServerThread, github_request, issue_payload

GITHUB_SECRET = "replay-github-secret"
PARTNER_SECRET = "replay-partner-secret"
CE_SECRET = "replay-cloudevents-secret"
CONFIG = f"""
sources:
  github: {{type: github, secret: {GITHUB_SECRET}, pipeline: p}}
  partner:
    type: hmac
    secret: {PARTNER_SECRET}
    signature: {{header: X-Partner-Signature, timestamp_header: X-Partner-Timestamp}}
    delivery_header: X-Partner-Delivery
    pipeline: p
  readings:
    type: hmac
    secret: {PARTNER_SECRET}
    delivery_header: X-Delivery
    split: true
    group_key: device
    pipeline: p
  events:
    type: cloudevents
    secret: {CE_SECRET}
    pipeline: p
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""


@pytest.fixture(params=[True, False], ids=["batched", "one-call-per-request"])
def client(
    request: pytest.FixtureRequest, make_settings: Callable[..., Settings]
) -> Iterator[httpx.Client]:
    settings = make_settings(ingest_batching=request.param)
    app = create_app(settings, parse_config(CONFIG, env={}), role="api")
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        yield http


def _mac(secret: str, data: bytes) -> str:
    return hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def test_a_github_replay_under_a_new_delivery_id_is_a_duplicate(client: httpx.Client) -> None:
    body, headers = github_request(GITHUB_SECRET, issue_payload("acme/api", 1))
    first = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert first.status_code == 202
    replay = client.post(
        "/v1/webhooks/github",
        content=body,
        headers=headers | {"X-GitHub-Delivery": str(uuid.uuid4())},
    )
    assert (replay.status_code, replay.json()) == (
        200,
        {"event_id": first.json()["event_id"], "status": "duplicate"},
    )
    # The unsigned event kind is no way around it either.
    relabelled = client.post(
        "/v1/webhooks/github",
        content=body,
        headers=headers | {"X-GitHub-Delivery": str(uuid.uuid4()), "X-GitHub-Event": "push"},
    )
    assert relabelled.json() == replay.json()
    fresh_body, fresh = github_request(GITHUB_SECRET, issue_payload("acme/api", 2))
    assert client.post("/v1/webhooks/github", content=fresh_body, headers=fresh).status_code == 202


def test_a_signed_timestamp_tells_a_resend_from_a_replay(client: httpx.Client) -> None:
    body = orjson.dumps({"type": "order.failed", "order": {"id": "o-9"}})
    now = int(time.time())

    def send(timestamp: int, delivery: str) -> httpx.Response:
        signed = f"{timestamp}.".encode() + body
        return client.post(
            "/v1/webhooks/partner",
            content=body,
            headers={
                "Content-Type": "application/json",
                "X-Partner-Timestamp": str(timestamp),
                "X-Partner-Signature": _mac(PARTNER_SECRET, signed),
                "X-Partner-Delivery": delivery,
            },
        )

    first = send(now, "d-1")
    assert first.status_code == 202
    replay = send(now, "d-2")  # same timestamp and signature, new delivery id
    assert (replay.status_code, replay.json()["event_id"]) == (200, first.json()["event_id"])
    resent = send(now + 1, "d-3")  # the sender itself, signing again: a new event
    assert resent.status_code == 202
    assert resent.json()["event_id"] != first.json()["event_id"]


def test_a_replayed_batch_is_a_duplicate_reading_by_reading(client: httpx.Client) -> None:
    body = orjson.dumps([{"device": "th-1", "t": 70}, {"device": "th-2", "t": 71}])
    headers = {"Content-Type": "application/json", "X-Signature": _mac(PARTNER_SECRET, body)}
    first = client.post(
        "/v1/webhooks/readings", content=body, headers=headers | {"X-Delivery": "b1"}
    )
    assert [e["status"] for e in first.json()["events"]] == ["queued", "queued"]
    replay = client.post(
        "/v1/webhooks/readings", content=body, headers=headers | {"X-Delivery": "b2"}
    )
    assert replay.status_code == 200
    assert replay.json()["events"] == [
        {"event_id": e["event_id"], "status": "duplicate"} for e in first.json()["events"]
    ]


def test_binary_cloudevents_replayed_under_a_new_ce_id_is_a_duplicate(
    client: httpx.Client,
) -> None:
    data = orjson.dumps({"device": {"id": "th-7"}, "temperature_c": 80})
    headers = {
        "Content-Type": "application/json",
        "X-Signature": _mac(CE_SECRET, data),
        "ce-specversion": "1.0",
        "ce-source": "/plants/lyon",
        "ce-type": "com.acme.reading",
    }
    first = client.post("/v1/webhooks/events", content=data, headers=headers | {"ce-id": "1"})
    assert first.status_code == 202
    replay = client.post("/v1/webhooks/events", content=data, headers=headers | {"ce-id": "2"})
    assert replay.json() == {"event_id": first.json()["event_id"], "status": "duplicate"}
    # In structured mode the id is signed: a new id is a new signed body, a new event.
    for event_id in ("s-1", "s-2"):
        structured = orjson.dumps(
            {"specversion": "1.0", "id": event_id, "source": "/s", "type": "t", "data": {}}
        )
        reply = client.post(
            "/v1/webhooks/events",
            content=structured,
            headers={
                "Content-Type": "application/cloudevents+json",
                "X-Signature": _mac(CE_SECRET, structured),
            },
        )
        assert reply.status_code == 202


@pytest.fixture
async def queue(redis_url: str, redis_prefix: str) -> AsyncIterator[EventQueue]:
    redis: Redis = connect_redis(redis_url)
    yield EventQueue(redis, prefix=redis_prefix, partitions=4)
    await redis.aclose()


@pytest.mark.parametrize("batched", [True, False])
async def test_the_queue_dedups_on_either_identity(queue: EventQueue, batched: bool) -> None:
    enqueuer = EnqueueBatcher(queue) if batched else queue

    async def enqueue(event_id: str, delivery: str, replay: str | None) -> EnqueueResult:
        return await enqueuer.enqueue(
            NewEntry(
                event_id=event_id,
                source="github",
                delivery_id=delivery,
                group_key="acme/api",
                data=orjson.dumps({"id": event_id}),
                dedup_window_ms=60_000,
                replay_id=replay,
            )
        )

    assert await enqueue("evt_1", "d1", "sig-a") == EnqueueResult("evt_1", True)
    assert await enqueue("evt_2", "d2", "sig-a") == EnqueueResult("evt_1", False)
    assert await enqueue("evt_3", "d1", "sig-b") == EnqueueResult("evt_1", False)
    assert await enqueue("evt_4", "d4", None) == EnqueueResult("evt_4", True)
    assert await enqueue("evt_5", "d4", None) == EnqueueResult("evt_4", False)
    assert await enqueue("evt_6", "d6", "sig-b") == EnqueueResult("evt_6", True)
    assert (await queue.backlog())[0] == 3

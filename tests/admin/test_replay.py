"""A dead letter replayed after its cause is fixed reaches the SQS FIFO subscriber, as a new
generation with new deduplication ids; a second replay of it is refused."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import orjson

from app.publish.ids import deduplication_id
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.admin.conftest import GITHUB_SECRET, GatewayFactory
from tests.support import SnsFixture, github_request, issue_payload


def _wait_for(client: httpx.Client, event_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        reply = client.get(f"/v1/events/{event_id}")
        if reply.status_code == 200 and reply.json()["status"] == status:
            body: dict[str, Any] = reply.json()
            return body
        assert time.monotonic() < deadline, f"still {reply.text}"
        time.sleep(0.1)


def _send(client: httpx.Client, repo: str) -> str:
    body, headers = github_request(GITHUB_SECRET, issue_payload(repo, 1))
    reply = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 202, reply.text
    event_id: str = reply.json()["event_id"]
    return event_id


def _late_topic(sns: SnsFixture) -> tuple[str, str]:
    """A topic name and its ARN; the topic does not exist yet."""
    name = f"late{uuid.uuid4().hex[:10]}"
    return name, f"arn:aws:sns:us-east-1:123456789012:{name}.fifo"


def test_publish_dead_letter_replayed_after_the_topic_exists(
    gateway_factory: GatewayFactory,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    auth: dict[str, str],
) -> None:
    name, arn = _late_topic(sns)
    with (
        gateway_factory(role="serve", topic_arn=arn) as server,
        httpx.Client(base_url=server.url, headers=auth, timeout=10) as client,
    ):
        event_id = _send(client, "acme/late")
        dead = _wait_for(client, event_id, "dead_lettered")
        assert dead["dead_letter"]["stage"] == "publish"
        assert "NotFound" in dead["dead_letter"]["reason"]
        [first] = dead["tool_calls"]
        assert first["status"] == "dead"
        assert first["dedup_id"] == deduplication_id(event_id, 0)

        # The operator fixes the cause: the topic now exists, with a FIFO subscriber.
        created = sns.sns.create_topic(Name=f"{name}.fifo", Attributes={"FifoTopic": "true"})
        assert created["TopicArn"] == arn
        sns.topic_arn = arn
        queue_url = sns._queue(f"{name}-sub.fifo", fifo=True)

        dead_letter_id = dead["dead_letter"]["id"]
        replay = client.post(f"/v1/dead-letters/{dead_letter_id}/replay")
        assert replay.status_code == 202, replay.text
        assert replay.json() == {
            "dead_letter_id": dead_letter_id,
            "event_id": event_id,
            "generation": 1,
            "status": "queued",
        }
        [message] = sns.receive(queue_url, expected=1)
        body = orjson.loads(message["Body"])
        assert body["event"]["id"] == event_id
        assert body["tool"] == "publishAlert"
        assert message["Attributes"]["MessageDeduplicationId"] == deduplication_id(event_id, 0, 1)
        assert message["Attributes"]["MessageDeduplicationId"] != first["dedup_id"]

        done = _wait_for(client, event_id, "published")
        assert done["generation"] == 1
        assert [(t["generation"], t["status"]) for t in done["tool_calls"]] == [
            (0, "dead"),
            (1, "published"),
        ]
        assert done["dead_letter"]["replayed_at"] is not None
        assert "replayed" in [entry["stage"] for entry in done["timeline"]]
        assert len(fake_claude.behaviour.requests) == 2  # a replay is a new decision

        again = client.post(f"/v1/dead-letters/{dead_letter_id}/replay")
        assert again.status_code == 409
        listed = client.get("/v1/dead-letters", params={"replayed": "false"}).json()
        assert listed["total"] == 0
    assert sns.drain_extra(queue_url) == []


def test_llm_dead_letter_replayed_after_claude_recovers(
    gateway_factory: GatewayFactory,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    auth: dict[str, str],
) -> None:
    fake_claude.behaviour.faults = [400]  # a request Claude refuses: not retried
    with (
        gateway_factory(role="serve", topic_arn=sns.topic_arn) as server,
        httpx.Client(base_url=server.url, headers=auth, timeout=10) as client,
    ):
        event_id = _send(client, "acme/llm")
        dead = _wait_for(client, event_id, "dead_lettered")
        assert dead["dead_letter"]["stage"] == "llm"
        assert dead["tool_calls"] == []
        assert [c["status"] for c in dead["llm_calls"]] == ["error"]

        replay = client.post(f"/v1/dead-letters/{dead['dead_letter']['id']}/replay")
        assert replay.status_code == 202
        [message] = sns.receive(sns.fifo_url, expected=1)
        assert orjson.loads(message["Body"])["event"]["id"] == event_id
        done = _wait_for(client, event_id, "published")
        assert [c["status"] for c in done["llm_calls"]] == ["error", "ok"]
        assert [c["attempt"] for c in done["llm_calls"]] == [1, 2]
        calls = client.get("/v1/llm-calls", params={"event_id": event_id}).json()
        assert calls["total"] == 2
        # The replayed event is rendered as the original was: as a GitHub event with its
        # summary, not as a generic webhook (the replay used to drop the source's type).
        first, again = (str(r["messages"][-1]["content"]) for r in fake_claude.behaviour.requests)
        assert "source: github (github)" in first
        assert again == first

"""A webhook on a config whose tool has no SNS topic: Claude decides, the tool call is held in
the outbox, and the event says so (``held``) in the admin API, its filter and its schema, the
console and the CLI; a topic configured later does not release it, a replay does."""

from __future__ import annotations

import time
from typing import Any

import httpx
from typer.testing import CliRunner

from app.cli import app as cli
from app.publish.ids import deduplication_id
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.admin.conftest import ADMIN_TOKEN, GITHUB_SECRET, GatewayFactory
from tests.console.conftest import sign_in
from tests.support import SnsFixture, github_request, issue_payload


def _settled(client: httpx.Client, event_id: str) -> dict[str, Any]:
    """The event once the worker has stored its decision (no longer queued or in flight)."""
    deadline = time.monotonic() + 30
    while True:
        reply = client.get(f"/v1/events/{event_id}")
        body: dict[str, Any] = reply.json() if reply.status_code == 200 else {}
        # The attempt's outcome is committed with the decision; the event row, read before
        # the audit rows, may predate it: read again once the outcome is seen.
        if [call["status"] for call in body.get("llm_calls", [])][-1:] == ["ok"]:
            again: dict[str, Any] = client.get(f"/v1/events/{event_id}").json()
            return again
        assert time.monotonic() < deadline, f"still {reply.text}"
        time.sleep(0.1)


def test_a_webhook_on_a_config_without_topics_ends_held(
    gateway_factory: GatewayFactory,
    fake_claude: FakeAnthropicServer,
    auth: dict[str, str],
) -> None:
    with (
        gateway_factory(role="serve", topic_arn=None) as server,
        httpx.Client(base_url=server.url, headers=auth, timeout=10) as client,
    ):
        body, headers = github_request(GITHUB_SECRET, issue_payload("acme/held", 1))
        sent = client.post("/v1/webhooks/github", content=body, headers=headers)
        assert sent.status_code == 202, sent.text
        event_id = sent.json()["event_id"]

        event = _settled(client, event_id)
        assert event["status"] == "held"
        [call] = event["tool_calls"]
        assert (call["tool"], call["status"], call["topic_arn"]) == (
            "publishAlert",
            "pending",
            None,
        )
        assert [c["status"] for c in event["llm_calls"]] == ["ok"]

        held = client.get("/v1/events", params={"status": "held"}).json()
        assert [e["event_id"] for e in held["items"]] == [event_id]
        assert held["total"] == 1
        assert client.get("/v1/events", params={"status": "processing"}).json()["total"] == 0

        schema = client.get("/openapi.json").json()["components"]["schemas"]
        assert "held" in schema["EventSummary"]["properties"]["status"]["enum"]

        with httpx.Client(base_url=server.url, timeout=10) as browser:
            assert sign_in(browser, ADMIN_TOKEN).status_code == 303
            page = browser.get("/console/events", params={"status": "held"})
            assert f'href="/console/events/{event_id}"' in page.text
            assert '<option value="held" selected>' in page.text
            shown = browser.get(f"/console/events/{event_id}")
            assert '<span class="status s-held">held</span>' in shown.text

        cli_auth = ["--url", server.url, "--token", ADMIN_TOKEN]
        listed = CliRunner().invoke(
            cli, ["events", "list", *cli_auth, "--status", "held"], env={"COLUMNS": "250"}
        )
        assert listed.exit_code == 0, listed.output
        (row,) = [line for line in listed.stdout.splitlines() if event_id in line]
        assert row.split()[-1] == "held"
    assert len(fake_claude.behaviour.requests) == 1


def test_a_held_event_is_replayed_once_its_tool_has_a_topic(
    gateway_factory: GatewayFactory,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    auth: dict[str, str],
) -> None:
    with (
        gateway_factory(role="serve", topic_arn=None) as server,
        httpx.Client(base_url=server.url, headers=auth, timeout=10) as client,
    ):
        body, headers = github_request(GITHUB_SECRET, issue_payload("acme/later", 1))
        event_id = client.post("/v1/webhooks/github", content=body, headers=headers).json()[
            "event_id"
        ]
        assert _settled(client, event_id)["status"] == "held"

    # The operator configures the topic and restarts: the held call stays held ...
    with (
        gateway_factory(role="serve", topic_arn=sns.topic_arn) as server,
        httpx.Client(base_url=server.url, headers=auth, timeout=10) as client,
    ):
        time.sleep(0.5)  # a few relay polls
        assert client.get(f"/v1/events/{event_id}").json()["status"] == "held"
        assert sns.receive(sns.fifo_url, expected=1, timeout=1) == []

        # ... until the event is replayed: Claude decides again, and that call is published.
        replay = client.post(f"/v1/events/{event_id}/replay")
        assert replay.status_code == 202, replay.text
        assert replay.json() == {"event_id": event_id, "generation": 1, "status": "queued"}
        [message] = sns.receive(sns.fifo_url, expected=1)
        assert message["Attributes"]["MessageDeduplicationId"] == deduplication_id(event_id, 0, 1)
        done = _wait_for_status(client, event_id, "published")
        assert [(t["generation"], t["status"], t["topic_arn"]) for t in done["tool_calls"]] == [
            (0, "pending", None),
            (1, "published", sns.topic_arn),
        ]
        again = client.post(f"/v1/events/{event_id}/replay")
        assert again.status_code == 409
        assert again.json()["error"] == "ReplayConflict"
        assert client.post("/v1/events/evt_nope/replay").status_code == 404
    assert len(fake_claude.behaviour.requests) == 2  # a replay is a new decision
    assert sns.drain_extra(sns.fifo_url) == []


def _wait_for_status(client: httpx.Client, event_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = client.get(f"/v1/events/{event_id}").json()
        if body["status"] == status:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.1)

"""After a real run (signed webhooks, a redelivery, fake Claude, moto SNS) the /metrics text
parses with prometheus-client's parser and moved as it should; the captured logs are JSON
with event_id / source / partition bound, and no secret appears in them."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.admin.conftest import ADMIN_TOKEN, GITHUB_SECRET, GatewayFactory
from tests.support import SnsFixture, github_request, issue_payload

ISSUE_METRICS = {
    "eventgate_webhooks_received": "counter",
    "eventgate_queue_depth": "gauge",
    "eventgate_queue_oldest_age_seconds": "gauge",
    "eventgate_llm_requests": "counter",
    "eventgate_llm_request_duration_seconds": "histogram",
    "eventgate_llm_tokens": "counter",
    "eventgate_llm_cost_usd": "counter",
    "eventgate_circuit_breaker_state": "gauge",
    "eventgate_published": "counter",
    "eventgate_dead_letters": "counter",
    "eventgate_dedup_hits": "counter",
    "eventgate_end_to_end_seconds": "histogram",
}


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics").text
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _families(url: str) -> dict[str, str]:
    text = httpx.get(url + "/metrics").text
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_a_run_moves_the_metrics_and_logs_no_secret(
    gateway_factory: GatewayFactory,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    capfd: pytest.CaptureFixture[str],
) -> None:
    signatures: list[str] = []
    with gateway_factory(role="serve", topic_arn=sns.topic_arn) as server:
        before = _scrape(server.url)
        with httpx.Client(base_url=server.url, timeout=10) as client:
            for number in (1, 2):
                body, headers = github_request(GITHUB_SECRET, issue_payload("acme/obs", number))
                signatures.append(headers["X-Hub-Signature-256"])
                assert client.post("/v1/webhooks/github", content=body, headers=headers).is_success
            again = client.post("/v1/webhooks/github", content=body, headers=headers)
            assert again.json()["status"] == "duplicate"
            wrong = client.post(
                "/v1/webhooks/github",
                content=body,
                headers={**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64},
            )
            assert wrong.status_code == 401
            assert client.get("/v1/events", headers={"Authorization": "Bearer guess"}).is_error
        assert len(sns.receive(sns.fifo_url, expected=2)) == 2
        deadline = time.monotonic() + 10
        while True:  # the relay records the publish just after SNS accepted it
            after = _scrape(server.url)
            done = after.get(("eventgate_end_to_end_seconds_count", ()), 0)
            if done - before.get(("eventgate_end_to_end_seconds_count", ()), 0) >= 2:
                break
            assert time.monotonic() < deadline, "events never finished"
            time.sleep(0.1)
        families = _families(server.url)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    for name, kind in ISSUE_METRICS.items():
        assert families.get(name) == kind, name
    topic = sns.topic_arn.rsplit(":", 1)[-1]
    assert delta("eventgate_webhooks_received_total", source="github", outcome="queued") == 2
    assert delta("eventgate_webhooks_received_total", source="github", outcome="duplicate") == 1
    assert (
        delta("eventgate_webhooks_received_total", source="github", outcome="InvalidSignature") == 1
    )
    assert delta("eventgate_dedup_hits_total", layer="delivery") == 1
    assert delta("eventgate_llm_requests_total", model="claude-sonnet-4-6", outcome="ok") == 2
    assert delta("eventgate_llm_tokens_total", model="claude-sonnet-4-6", type="output") == 80
    assert delta("eventgate_llm_request_duration_seconds_count") == 2
    assert delta("eventgate_published_total", topic=topic, outcome="published") == 2
    assert after[("eventgate_queue_depth", ())] == 0
    assert after[("eventgate_queue_oldest_age_seconds", ())] == 0

    lines = [
        orjson.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")
    ]
    text = "\n".join(orjson.dumps(line).decode() for line in lines)
    for secret in (GITHUB_SECRET, ADMIN_TOKEN, "sk-ant-test-key-not-real", *signatures):
        assert secret not in text
    decided = [line for line in lines if line["event"] == "llm_decided"]
    assert len(decided) == 2
    assert all({"event_id", "source", "partition"} <= set(line) for line in decided)
    assert {line["source"] for line in decided} == {"github"}
    # The line names the tools Claude called (the fake calls the first tool offered).
    assert [line["tools"] for line in decided] == [["publishAlert"], ["publishAlert"]]
    assert any(line["event"] == "admin_unauthorized" for line in lines)

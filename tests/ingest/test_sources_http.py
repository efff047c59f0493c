"""Every source type through the real app (role "api": ingest without a worker), over HTTP,
with real Redis when reachable: status codes, response shapes, filters, collapse, batches."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import redis

from app.config import GatewayConfig, parse_config
from app.main import create_app
from app.queue.streams import unpack_entry
from app.settings import Settings
from app.sources.base import AdapterDeps
from tests.sources_support import CERT_URL, FakeSnsHttp, SnsSigner, payload
from tests.support import ServerThread, github_request

CONFIG = """
sources:
  github:
    type: github
    secret: sources-http-gh-secret
    pipeline: p
    filters:
      deny_types: ["*.labeled"]
      drop: [{path: sender.type, equals: Bot}]
  alerts:
    type: alertmanager
    token: sources-http-am-token
    pipeline: p
    collapse: {window_seconds: 3600}
  sensors:
    type: hmac
    secret: sources-http-iot-secret
    signature: {header: X-Sensor-Signature, encoding: base64, prefix: "sha256="}
    split: true
    group_key: "{device.site}/{device.id}"
    event_type: status
    pipeline: p
    max_body_bytes: 2048
    filters:
      drop: [{path: status, equals: OK}]
    collapse: {window_seconds: 600, fingerprint: "{device.id}"}
  events:
    type: cloudevents
    token: sources-http-ce-token
    group_key: subject
    pipeline: p
  aws:
    type: aws-sns
    topic_arns: ["arn:aws:sns:eu-west-1:123456789012:ops-alarms"]
    confirm_subscriptions: true
    pipeline: p
pipelines:
  p: {model: claude-sonnet-4-6, system: s, tools: [t]}
tools:
  t: {description: d, input_schema: {type: object}}
"""


@pytest.fixture(scope="module")
def signer() -> SnsSigner:
    return SnsSigner()


@pytest.fixture
def gateway(
    redis_url: str, redis_prefix: str, database_url: str, signer: SnsSigner
) -> Iterator[tuple[httpx.Client, FakeSnsHttp]]:
    config: GatewayConfig = parse_config(CONFIG, env={})
    settings = Settings(
        redis_url=redis_url, redis_prefix=redis_prefix, database_url=database_url, partitions=4
    )
    sns_http = FakeSnsHttp({CERT_URL: signer.cert_pem})
    app = create_app(settings, config, role="api", adapter_deps=AdapterDeps(sns_http=sns_http))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        yield client, sns_http


def stream_entries(redis_url: str, prefix: str) -> list[dict[str, Any]]:
    """Every event on the partition streams (real Redis only)."""
    client = redis.Redis.from_url(redis_url)
    events = []
    for partition in range(4):
        entries: list[Any] = client.xrange(f"{prefix}:{{p{partition}}}:stream")  # type: ignore[assignment]
        events += [orjson.loads(unpack_entry(fields[b"e"])) for _, fields in entries]
    client.close()
    return events


def test_github_queued_duplicate_filtered_and_refused(
    gateway: tuple[httpx.Client, FakeSnsHttp], redis_url: str, redis_prefix: str
) -> None:
    client, _ = gateway
    body, headers = github_request(
        "sources-http-gh-secret", payload("github_push.json"), event="push"
    )
    first = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert first.status_code == 202
    assert first.json() == {"event_id": first.json()["event_id"], "status": "queued"}
    again = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    assert again.json()["event_id"] == first.json()["event_id"]

    labeled = payload("github_pull_request_opened.json") | {"action": "labeled"}
    body, headers = github_request("sources-http-gh-secret", labeled, event="pull_request")
    filtered = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert filtered.status_code == 200
    assert filtered.json()["status"] == "filtered"
    assert "pull_request.labeled" in filtered.json()["detail"]
    bot = payload("github_issues_opened.json")
    bot["sender"] = bot["sender"] | {"type": "Bot", "login": "renovate[bot]"}
    body, headers = github_request("sources-http-gh-secret", bot, event="issues")
    assert client.post("/v1/webhooks/github", content=body, headers=headers).json()["status"] == (
        "filtered"
    )

    body, headers = github_request(
        "not-the-right-secret", payload("github_push.json"), event="push"
    )
    refused = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert refused.status_code == 401
    assert refused.json()["error"] == "InvalidSignature"
    assert "sources-http-gh-secret" not in refused.text

    metrics = client.get("/metrics").text
    assert 'eventgate_events_filtered_total{reason="type_denied",source="github"}' in metrics
    assert 'eventgate_events_filtered_total{reason="dropped",source="github"}' in metrics
    if redis_url.startswith("redis://"):
        queued = stream_entries(redis_url, redis_prefix)
        assert [(e["type"], e["source_type"]) for e in queued] == [("push", "github")]


def test_alert_collapse_counts_repeats_until_resolved(
    gateway: tuple[httpx.Client, FakeSnsHttp],
) -> None:
    client, _ = gateway
    auth = {"Authorization": "Bearer sources-http-am-token", "Content-Type": "application/json"}
    group = payload("alertmanager_v4.json")

    def send(alerts: list[dict[str, Any]]) -> httpx.Response:
        return client.post(
            "/v1/webhooks/alerts", content=orjson.dumps(group | {"alerts": alerts}), headers=auth
        )

    first = send(group["alerts"])
    assert (first.status_code, first.json()["status"]) == (202, "queued")
    # The third alert left the group (no resolve sent): the two still firing are repeats.
    repeat = send(group["alerts"][:2])
    assert repeat.status_code == 200
    assert repeat.json()["status"] == "collapsed"
    assert repeat.json()["event_id"] == first.json()["event_id"]
    assert "repeat 1" in repeat.json()["detail"]
    assert send(group["alerts"][1:]).json()["status"] == "collapsed"
    # A resolution is news, and ends the window for that fingerprint.
    resolved = [group["alerts"][0], group["alerts"][1] | {"status": "resolved"}]
    assert send(resolved).json()["status"] == "queued"
    assert send(group["alerts"][1:2]).json()["status"] == "queued"
    assert client.post("/v1/webhooks/alerts", content=b"{}", headers={}).status_code == 401
    metrics = client.get("/metrics").text
    assert 'eventgate_alerts_collapsed_total{source="alerts"}' in metrics


def _sensor_headers(body: bytes) -> dict[str, str]:
    mac = hmac.new(b"sources-http-iot-secret", body, hashlib.sha256).digest()
    return {
        "Content-Type": "application/json",
        "X-Sensor-Signature": "sha256=" + base64.b64encode(mac).decode(),
    }


def test_iot_batch_split_filter_collapse_and_size_limit(
    gateway: tuple[httpx.Client, FakeSnsHttp],
) -> None:
    client, _ = gateway
    body = orjson.dumps(payload("iot_readings.json"))
    reply = client.post("/v1/webhooks/sensors", content=body, headers=_sensor_headers(body))
    assert reply.status_code == 202
    events = reply.json()["events"]
    assert [e["status"] for e in events] == ["queued", "filtered", "collapsed"]
    assert events[2]["event_id"] == events[0]["event_id"]
    # The sender retries the same batch: the queued reading is a duplicate, nothing new.
    retry = client.post("/v1/webhooks/sensors", content=body, headers=_sensor_headers(body))
    assert retry.status_code == 200
    assert [e["status"] for e in retry.json()["events"]] == ["collapsed", "filtered", "collapsed"]
    big = orjson.dumps([{"device": {"id": "x", "site": "y"}, "pad": "z" * 3000}])
    too_big = client.post("/v1/webhooks/sensors", content=big, headers=_sensor_headers(big))
    assert (too_big.status_code, too_big.json()["error"]) == (413, "PayloadTooLarge")
    bad = client.post("/v1/webhooks/sensors", content=body, headers=_sensor_headers(body + b" "))
    assert bad.status_code == 401


def test_cloudevents_batch_and_binary_over_http(gateway: tuple[httpx.Client, FakeSnsHttp]) -> None:
    client, _ = gateway
    auth = {"Authorization": "Bearer sources-http-ce-token"}
    batch = orjson.dumps(payload("cloudevents_batch.json"))
    reply = client.post(
        "/v1/webhooks/events",
        content=batch,
        headers=auth | {"Content-Type": "application/cloudevents-batch+json"},
    )
    assert reply.status_code == 202
    assert [e["status"] for e in reply.json()["events"]] == ["queued", "queued"]
    # The same event (source + id) in binary mode is a duplicate of the batch's first one.
    first = payload("cloudevents_batch.json")[0]
    binary = client.post(
        "/v1/webhooks/events",
        content=orjson.dumps(first["data"]),
        headers=auth
        | {
            "Content-Type": "application/json",
            "ce-specversion": "1.0",
            "ce-id": first["id"],
            "ce-source": first["source"],
            "ce-type": first["type"],
            "ce-subject": first["subject"],
        },
    )
    assert binary.status_code == 200
    assert binary.json() == {
        "event_id": reply.json()["events"][0]["event_id"],
        "status": "duplicate",
    }
    structured = client.post(
        "/v1/webhooks/events",
        content=orjson.dumps(payload("cloudevent_structured.json")),
        headers=auth | {"Content-Type": "application/cloudevents+json"},
    )
    assert (structured.status_code, structured.json()["status"]) == (202, "queued")


def test_an_empty_batch_is_answered_as_a_batch(gateway: tuple[httpx.Client, FakeSnsHttp]) -> None:
    client, _ = gateway
    empty = client.post(
        "/v1/webhooks/events",
        content=b"[]",
        headers={
            "Authorization": "Bearer sources-http-ce-token",
            "Content-Type": "application/cloudevents-batch+json",
        },
    )
    assert (empty.status_code, empty.json()) == (200, {"events": []})
    split = client.post("/v1/webhooks/sensors", content=b"[]", headers=_sensor_headers(b"[]"))
    assert (split.status_code, split.json()) == (200, {"events": []})


def test_sns_notification_and_subscription_over_http(
    gateway: tuple[httpx.Client, FakeSnsHttp], signer: SnsSigner
) -> None:
    client, sns_http = gateway
    headers = {
        "Content-Type": "text/plain; charset=UTF-8",
        "x-amz-sns-message-type": "Notification",
    }
    body = orjson.dumps(signer.sign(payload("sns_cloudwatch_alarm.json"), version="2"))
    reply = client.post("/v1/webhooks/aws", content=body, headers=headers)
    assert (reply.status_code, reply.json()["status"]) == (202, "queued")
    assert client.post("/v1/webhooks/aws", content=body, headers=headers).json()["status"] == (
        "duplicate"
    )
    confirm = orjson.dumps(signer.sign(payload("sns_subscription_confirmation.json")))
    answer = client.post("/v1/webhooks/aws", content=confirm, headers=headers)
    assert (answer.status_code, answer.json()) == (200, {"status": "ignored"})
    assert len(sns_http.confirmed) == 1
    tampered = orjson.loads(body) | {"Message": "{}"}
    refused = client.post("/v1/webhooks/aws", content=orjson.dumps(tampered), headers=headers)
    assert refused.status_code == 401


def test_sns_certificate_outage_is_a_503_sns_will_retry(
    gateway: tuple[httpx.Client, FakeSnsHttp], signer: SnsSigner
) -> None:
    client, sns_http = gateway
    unreachable = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-down.pem"
    body = orjson.dumps(signer.sign(payload("sns_cloudwatch_alarm.json"), cert_url=unreachable))
    headers = {"Content-Type": "text/plain; charset=UTF-8"}
    for _ in range(2):
        reply = client.post("/v1/webhooks/aws", content=body, headers=headers)
        assert reply.status_code == 503
        assert reply.json()["error"] == "CertificateUnavailable"
        assert 1 <= int(reply.headers["Retry-After"]) <= 30
    assert sns_http.fetched.count(unreachable) == 1  # the failure is remembered for a while

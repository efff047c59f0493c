"""Adapters on real-shaped payloads: types, delivery ids, group keys, batches."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any

import orjson
import pytest

from app.payloads import resolve_key
from app.source_config import SourceConfig
from app.sources.exceptions import InvalidPayload, InvalidSignature
from app.sources.registry import build_adapter
from tests.sources_support import payload
from tests.support import github_request

GH = "adapter-github-secret"
TOKEN = "adapter-bearer-token"
GRAFANA = "adapter-grafana-secret"
CE_SECRET = "adapter-cloudevents-secret"


def config(**keys: Any) -> SourceConfig:
    return SourceConfig.model_validate({"pipeline": "p", **keys})


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


@pytest.mark.parametrize(
    ("name", "kind", "event_type"),
    [
        ("github_push.json", "push", "push"),
        ("github_pull_request_opened.json", "pull_request", "pull_request.opened"),
        ("github_issues_opened.json", "issues", "issues.opened"),
        ("github_workflow_run_completed.json", "workflow_run", "workflow_run.completed"),
    ],
)
async def test_github_common_events(name: str, kind: str, event_type: str) -> None:
    adapter = build_adapter(
        "gh", config(type="github", secret="adapter-secret-new adapter-secret-old")
    )
    body, headers = github_request("adapter-secret-old", payload(name), event=kind, delivery="d-1")
    await adapter.verify(lower(headers), body)  # the rotated-out secret still verifies
    (event,) = await adapter.describe(lower(headers), body)
    assert (event.type, event.delivery_id, event.group_key) == (event_type, "d-1", "acme/widgets")
    body2, bad = github_request("adapter-secret-wrong", payload(name), event=kind)
    with pytest.raises(InvalidSignature):
        await adapter.verify(lower(bad), body2)


async def test_github_ping_is_ignored_and_group_key_rules() -> None:
    adapter = build_adapter(
        "gh",
        config(
            type="github",
            secret=GH,
            group_keys={"pull_request": "{repository.full_name}#{pull_request.number}"},
        ),
    )
    body, headers = github_request(GH, payload("github_ping.json"), event="ping")
    assert await adapter.describe(lower(headers), body) == []
    body, headers = github_request(
        GH, payload("github_pull_request_opened.json"), event="pull_request"
    )
    (event,) = await adapter.describe(lower(headers), body)
    assert event.group_key == "acme/widgets#1347"
    # No repository: organization, then installation, then sender.
    for data, key in [
        ({"action": "created", "organization": {"login": "acme"}}, "acme"),
        (
            {"action": "created", "installation": {"id": 77}, "sender": {"login": "x"}},
            "installation/77",
        ),
        ({"action": "created", "sender": {"login": "mona"}}, "mona"),
    ]:
        body, headers = github_request(GH, data, event="membership")
        (event,) = await adapter.describe(lower(headers), body)
        assert event.group_key == key


async def test_alertmanager_v4_dedup_identity_and_truncated_alerts_kept() -> None:
    adapter = build_adapter("am", config(type="alertmanager", token=TOKEN))
    data = payload("alertmanager_v4.json") | {"truncatedAlerts": 2}
    (event,) = await adapter.describe({}, orjson.dumps(data))
    assert event.type == "alert.firing"
    assert event.group_key == data["groupKey"]
    assert event.payload["truncatedAlerts"] == 2
    assert set(event.firing) == {a["fingerprint"] for a in data["alerts"]}
    # Same group, next group_interval, nothing changed: same delivery id (deduplicated).
    (again,) = await adapter.describe({}, orjson.dumps(data))
    assert again.delivery_id == event.delivery_id
    data["alerts"][0] = data["alerts"][0] | {"status": "resolved"}
    (changed,) = await adapter.describe({}, orjson.dumps(data))
    assert changed.delivery_id != event.delivery_id
    assert changed.resolved == (data["alerts"][0]["fingerprint"],)
    with pytest.raises(InvalidPayload):
        await adapter.describe({}, b'{"status": "firing"}')


async def test_grafana_body_with_signature() -> None:
    adapter = build_adapter("gr", config(type="grafana", secret=GRAFANA))
    body = orjson.dumps(payload("grafana_alert.json"))
    signature = hmac.new(GRAFANA.encode(), body, hashlib.sha256).hexdigest()
    await adapter.verify({"x-grafana-alerting-signature": signature}, body)
    with pytest.raises(InvalidSignature):
        await adapter.verify({"x-grafana-alerting-signature": "0" * 64}, body)
    (event,) = await adapter.describe({}, body)
    assert event.firing == ("4c1e0b6a2f9d8e7c",)
    assert event.payload["title"].startswith("[FIRING:1]")


async def test_cloudevents_structured_batch_and_binary_modes() -> None:
    adapter = build_adapter(
        "ce",
        config(type="cloudevents", token=TOKEN, group_key="{data.device.site}/{data.device.id}"),
    )
    structured = payload("cloudevent_structured.json")
    (one,) = await adapter.describe(
        {"content-type": "application/cloudevents+json; charset=utf-8"}, orjson.dumps(structured)
    )
    assert (one.type, one.group_key, one.batch_index) == (
        "com.acme.sensor.reading",
        "lyon/th-0042",
        None,
    )
    assert one.delivery_id == f"{structured['source']}\n{structured['id']}"
    batch = await adapter.describe(
        {"content-type": "application/cloudevents-batch+json"},
        orjson.dumps(payload("cloudevents_batch.json")),
    )
    assert [(e.group_key, e.batch_index) for e in batch] == [
        ("lyon/th-0042", 0),
        ("lyon/th-0043", 1),
    ]
    headers = {
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": "evt-9",
        "ce-source": "/plants/lyon",
        "ce-type": "com.acme.sensor.reading",
        "ce-subject": "devices%2Fth-0042",
    }
    (binary,) = await adapter.describe(headers, orjson.dumps(structured["data"]))
    assert binary.payload["data"] == structured["data"]
    assert binary.payload["subject"] == "devices/th-0042"  # percent-decoded
    assert binary.group_key == "lyon/th-0042"
    with pytest.raises(InvalidPayload, match="missing required"):
        await adapter.describe(
            {"content-type": "application/cloudevents+json"},
            orjson.dumps({"specversion": "1.0", "id": "x", "type": "t"}),
        )
    with pytest.raises(InvalidPayload, match="not a CloudEvent"):
        await adapter.describe({"content-type": "application/json"}, b"{}")


async def test_cloudevents_hmac_auth() -> None:
    adapter = build_adapter("ce", config(type="cloudevents", secret=CE_SECRET))
    body = orjson.dumps(payload("cloudevent_structured.json"))
    good = hmac.new(CE_SECRET.encode(), body, hashlib.sha256).hexdigest()
    await adapter.verify({"x-signature": good}, body)
    with pytest.raises(InvalidSignature):
        await adapter.verify({"authorization": f"Bearer {CE_SECRET}"}, body)


async def test_iot_readings_split_into_one_event_each() -> None:
    adapter = build_adapter(
        "iot",
        config(type="token", token=TOKEN, split=True, group_key="device.id", event_type="status"),
    )
    body = orjson.dumps(payload("iot_readings.json"))
    events = await adapter.describe({"content-type": "application/json"}, body)
    assert [(e.group_key, e.type, e.batch_index) for e in events] == [
        ("th-0042", "ALARM", 0),
        ("th-0043", "OK", 1),
        ("th-0042", "ALARM", 2),
    ]
    # A retried batch describes the same ids; different readings differ.
    again = await adapter.describe({}, body)
    assert [e.delivery_id for e in again] == [e.delivery_id for e in events]
    assert len({e.delivery_id for e in events}) == 3
    unsplit = build_adapter("iot", config(type="token", token=TOKEN, group_key="0.device.id"))
    (whole,) = await unsplit.describe({}, body)
    assert (whole.group_key, whole.batch_index, len(whole.payload)) == ("th-0042", None, 3)


async def test_standard_webhooks_split_ids_follow_webhook_id() -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    adapter = build_adapter(
        "sw", config(type="standard-webhooks", secret=secret, split=True, group_key="device.id")
    )
    body = orjson.dumps(payload("iot_readings.json"))
    ts = str(int(time.time()))
    mac = hmac.new(b"k" * 24, f"msg_7.{ts}.".encode() + body, hashlib.sha256).digest()
    headers = {
        "webhook-id": "msg_7",
        "webhook-timestamp": ts,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }
    await adapter.verify(headers, body)
    events = await adapter.describe(headers, body)
    assert [e.delivery_id for e in events] == ["msg_7#0", "msg_7#1", "msg_7#2"]


def test_group_key_templates_need_every_part() -> None:
    data = {"device": {"site": "lyon", "id": 7}}
    assert resolve_key(data, "{device.site}/{device.id}") == "lyon/7"
    assert resolve_key(data, "{device.site}/{device.serial}") is None
    assert resolve_key(data, "device.id") == "7"
    assert resolve_key(data, "device") is None  # an object is not a key


async def test_cloudevents_binary_mode_keeps_non_text_data_as_data_base64() -> None:
    adapter = build_adapter("ce", config(type="cloudevents", token=TOKEN))
    raw = bytes(range(256))
    headers = {
        "content-type": "application/octet-stream",
        "ce-specversion": "1.0",
        "ce-id": "blob-1",
        "ce-source": "/cameras/gate",
        "ce-type": "com.acme.snapshot",
    }
    (event,) = await adapter.describe(headers, raw)
    # The structured form of the same event (what structured mode would have carried).
    assert event.payload["data_base64"] == base64.b64encode(raw).decode()
    assert "data" not in event.payload
    assert event.payload["datacontenttype"] == "application/octet-stream"
    text = await adapter.describe(headers | {"content-type": "text/plain"}, b"hello")
    assert text[0].payload["data"] == "hello"


async def test_cloudevents_binary_mode_keeps_a_form_body_as_text() -> None:
    """A form body is text (ASCII, percent-encoded): ``data`` as a string, so filters,
    Claude and the redaction of its fields read it like any text body."""
    adapter = build_adapter("ce", config(type="cloudevents", token=TOKEN))
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "ce-specversion": "1.0",
        "ce-id": "form-1",
        "ce-source": "/deploy-hook",
        "ce-type": "deploy.requested",
    }
    (event,) = await adapter.describe(headers, b"user=deployer&ref=main")
    assert event.payload["data"] == "user=deployer&ref=main"
    assert "data_base64" not in event.payload

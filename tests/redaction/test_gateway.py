"""A real gateway in-process (uvicorn thread, Redis, the database, the fake Claude over HTTP):
secrets in a signed GitHub webhook never reach the stored payload, Claude's prompt, the audit
log in any text mode, the admin API or the log; with redaction off the payload is as sent."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import structlog
from redis import Redis
from sqlalchemy import select

from app.config import parse_config
from app.ingest import service as ingest_service
from app.main import create_app
from app.queue.streams import unpack_entry
from app.settings import Settings
from app.store.db import create_engine, session_factory
from app.store.models import EventRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer, default_answer
from tests.support import ServerThread, gateway_config, github_request, issue_payload

GITHUB_SECRET = "redaction-github-secret"
ADMIN_TOKEN = "redaction-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

PASSWORD = "pw-Qx7Lm2Vz9"
CLIENT_SECRET = "cs-Hb4Kd8Wn1"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz"
BASIC = base64.b64encode(b"deployer:basic-Zt5Yr3").decode()
CARD = "4111 1111 1111 1111"
ESCAPED = "esc-Np6Gj0Sa4"
SECRETS = (PASSWORD, CLIENT_SECRET, AWS_SECRET, BASIC, CARD, CARD.replace(" ", ""), ESCAPED)


def _payload() -> dict[str, Any]:
    payload = issue_payload("acme/redact", 1)
    payload["issue"]["body"] = (
        f"The deploy hook answered 401 for `curl -H 'X-Upstream: Basic {BASIC}'`; "
        f"the customer paid with {CARD}."
    )
    payload["deployment"] = {
        "environment": "prod",
        "password": PASSWORD,
        "client_secret": CLIENT_SECRET,
        "aws_secret_access_key": AWS_SECRET,
    }
    payload["hook_body"] = orjson.dumps({"service": {"name": "api", "password": ESCAPED}}).decode()
    return payload


def _echo(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Claude repeats the prompt back, so the response text would carry whatever it saw."""
    prompt = str(request["messages"][0]["content"])
    return [{"type": "text", "text": f"I read: {prompt}"}, *default_answer(request)[1:]]


async def _stored_payload(database_url: str, event_id: str) -> Any:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            row = (await session.scalars(select(EventRow).where(EventRow.id == event_id))).one()
            return row.payload
    finally:
        await engine.dispose()


def _run(
    make_settings: Callable[..., Settings], fake: FakeAnthropicServer, **overrides: Any
) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Send the webhook; return its event id, the admin API's event and audit page, and the
    fake Claude's request (once the worker stored the decision)."""
    fake.behaviour.responder = _echo
    settings = make_settings(admin_token=ADMIN_TOKEN, partitions=2, **overrides)
    app = create_app(settings, parse_config(gateway_config(None, secret=GITHUB_SECRET)))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        body, headers = github_request(GITHUB_SECRET, _payload())
        reply = client.post("/v1/webhooks/github", content=body, headers=headers)
        assert reply.status_code == 202, reply.text
        event_id: str = reply.json()["event_id"]
        deadline = time.monotonic() + 20
        while True:
            event = client.get(f"/v1/events/{event_id}", headers=AUTH).json()
            if event.get("llm_calls") and event.get("tool_calls"):
                break
            assert time.monotonic() < deadline, event
            time.sleep(0.1)
        calls = client.get("/v1/llm-calls", params={"event_id": event_id}, headers=AUTH).json()
    structlog.reset_defaults()  # the gateway logged onto this test's captured stderr
    assert len(fake.behaviour.requests) == 1
    return event_id, event, calls, fake.behaviour.requests[0]


@pytest.mark.parametrize("audit_text", ["full", "redacted", "none"])
def test_no_secret_leaves_the_gateway(
    audit_text: str,
    make_settings: Callable[..., Settings],
    fake_claude: FakeAnthropicServer,
    database_url: str,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At debug: every line the gateway can write about this webhook is read for secrets (a
    # new ingest logger: one keeps the level of its first use, maybe earlier in this process).
    monkeypatch.setattr(ingest_service, "log", structlog.get_logger(ingest_service.__name__))
    event_id, event, calls, request = _run(
        make_settings, fake_claude, llm_audit_text=audit_text, log_level="debug"
    )
    stored = asyncio.run(_stored_payload(database_url, event_id))
    logs = capfd.readouterr()
    assert calls["total"] == 1
    if audit_text != "none":
        assert calls["items"][0]["prompt_text"] and calls["items"][0]["response_text"]
    places = {
        "stored payload": orjson.dumps(stored).decode(),
        "prompt": orjson.dumps(request).decode(),
        "GET /v1/events/{id}": orjson.dumps(event).decode(),
        "GET /v1/llm-calls": orjson.dumps(calls).decode(),
        "log": logs.out + logs.err,
    }
    for secret in SECRETS:
        for place, text in places.items():
            assert secret not in text, f"{secret} in the {place}"
    # The payload keeps its shape and everything that is not a secret.
    sent = _payload()
    assert stored["deployment"] == {
        "environment": "prod",
        "password": "[REDACTED:password]",
        "client_secret": "[REDACTED:secret]",
        "aws_secret_access_key": "[REDACTED:access_key]",
    }
    assert orjson.loads(stored["hook_body"]) == {
        "service": {"name": "api", "password": "[REDACTED:password]"}
    }
    assert stored["issue"]["body"] == (
        "The deploy hook answered 401 for `curl -H 'X-Upstream: Basic [REDACTED:basic_auth]'`; "
        "the customer paid with [REDACTED:card]."
    )
    assert {k: v for k, v in stored.items() if k not in ("deployment", "hook_body", "issue")} == {
        k: v for k, v in sent.items() if k not in ("deployment", "hook_body", "issue")
    }
    assert "[REDACTED:password]" in request["messages"][0]["content"]
    assert "webhook_queued" in logs.err  # the log was captured


def test_redaction_off_keeps_the_payload_as_sent(
    make_settings: Callable[..., Settings],
    fake_claude: FakeAnthropicServer,
    database_url: str,
) -> None:
    event_id, _, _, request = _run(
        make_settings, fake_claude, llm_audit_text="full", payload_redaction="off"
    )
    assert asyncio.run(_stored_payload(database_url, event_id)) == _payload()
    assert PASSWORD in request["messages"][0]["content"]


def _nested(levels: int) -> tuple[bytes, dict[str, str]]:
    """A signed webhook whose JSON is ``levels`` deep (orjson cannot write 255 levels)."""
    inner = b"[" * (levels - 1) + b'"Bearer abcdefghijklmnop"' + b"]" * (levels - 1)
    body = b'{"action":"opened","repository":{"full_name":"acme/deep"},"deep":' + inner + b"}"
    _, headers = github_request(GITHUB_SECRET, {})
    signature = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return body, {**headers, "X-Hub-Signature-256": f"sha256={signature}"}


@pytest.mark.parametrize("redaction", ["on", "off"])
def test_depth_254_is_queued_and_255_refused(
    redaction: str, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(payload_redaction=redaction)
    app = create_app(settings, parse_config(gateway_config(None, secret=GITHUB_SECRET)), role="api")
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        body, headers = _nested(254)
        ok = client.post("/v1/webhooks/github", content=body, headers=headers)
        body, headers = _nested(255)
        refused = client.post("/v1/webhooks/github", content=body, headers=headers)
    structlog.reset_defaults()
    assert ok.status_code == 202, ok.text
    assert refused.status_code == 400
    assert refused.json() == {
        "error": "InvalidPayload",
        "detail": "JSON is nested deeper than 254 levels",
    }


def test_filters_and_the_group_key_read_the_payload_as_sent(
    make_settings: Callable[..., Settings], redis_url: str
) -> None:
    """Redaction comes after them: a filter on a secret field and a group key taken from one
    see the value the sender sent; only what is queued is redacted."""
    if redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis to read the stream from outside the process")
    config = f"""
sources:
  github:
    type: github
    secret: {GITHUB_SECRET}
    pipeline: triage
    group_keys: {{issues: "{{deployment.token}}"}}
    filters: {{drop: [{{path: deployment.password, equals: drop-me}}]}}
pipelines:
  triage: {{model: claude-sonnet-4-6, system: s, tools: [publishAlert]}}
tools:
  publishAlert: {{description: d, input_schema: {{type: object}}}}
"""
    settings = make_settings(partitions=1)
    app = create_app(settings, parse_config(config), role="api")
    answers = []
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        for password in ("drop-me", "keep-me"):
            payload = {**issue_payload("acme/f", 1), "deployment": {"password": password}}
            payload["deployment"]["token"] = "tenant-7"
            body, headers = github_request(GITHUB_SECRET, payload)
            answers.append(client.post("/v1/webhooks/github", content=body, headers=headers))
    structlog.reset_defaults()
    assert answers[0].json()["status"] == "filtered"
    assert answers[1].status_code == 202
    stream = Redis.from_url(redis_url)
    try:
        entries = stream.xrange(f"{settings.redis_prefix}:{{p0}}:stream")
    finally:
        stream.close()
    queued = [orjson.loads(unpack_entry(fields[b"e"])) for _, fields in entries]  # type: ignore[index,union-attr,arg-type]
    assert [e["group_key"] for e in queued] == ["tenant-7"]
    assert queued[0]["payload"]["deployment"] == {
        "password": "[REDACTED:password]",
        "token": "[REDACTED:token]",
    }


def test_an_integer_beyond_64_bits_is_queued_as_the_nearest_double(
    make_settings: Callable[..., Settings], redis_url: str
) -> None:
    """What docs/sources.md says of "exactly as sent": JSON numbers are 64-bit integers or
    doubles, whatever the redaction setting (the limit of the JSON parser)."""
    if redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis to read the stream from outside the process")
    settings = make_settings(partitions=1, payload_redaction="off")
    app = create_app(settings, parse_config(gateway_config(None, secret=GITHUB_SECRET)), role="api")
    payload = {**issue_payload("acme/big", 1), "ids": [2**64 - 1, 0]}
    body, headers = github_request(GITHUB_SECRET, payload)
    body = body.replace(b",0]", b",123456789012345678901234567890]", 1)
    signature = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers["X-Hub-Signature-256"] = f"sha256={signature}"
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.post("/v1/webhooks/github", content=body, headers=headers).status_code == 202
    structlog.reset_defaults()
    stream = Redis.from_url(redis_url)
    try:
        entries = stream.xrange(f"{settings.redis_prefix}:{{p0}}:stream")
    finally:
        stream.close()
    queued = orjson.loads(unpack_entry(entries[0][1][b"e"]))  # type: ignore[index,arg-type]
    assert queued["payload"]["ids"] == [2**64 - 1, 1.2345678901234568e29]

"""Bad input gets a clear JSON answer, never a 5xx with a traceback.

- JSON nested deeper than the event can be serialised: 400, and nothing of the request queued;
- an admin ``cursor`` decoding to an id past the database's 64-bit integers: 400;
- a client that hangs up in the middle of its body: one quiet log line, no traceback;
- an unexpected exception, in the webhook path or anywhere else: JSON 500 ``InternalError``,
  logged once with its traceback but without the request body;
- SQL errors never print their bound parameters (the payload) into a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest
import structlog
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.admin.pagination import encode
from app.config import parse_config
from app.main import create_app
from app.settings import Settings
from app.sources.base import AdapterDeps
from app.store.db import create_engine
from tests.sources_support import CERT_URL, SnsSigner, payload
from tests.support import ServerThread, free_port, github_request

GITHUB_SECRET = "bad-input-github-secret"
TOKEN = "bad-input-token-0123456789"
ADMIN_TOKEN = "bad-input-admin-token-0123"
MARKER = "body-marker-5e1f0c"
CONFIG = f"""
sources:
  github: {{type: github, secret: {GITHUB_SECRET}, pipeline: p}}
  readings:
    type: token
    token: {TOKEN}
    split: true
    delivery_id: id
    group_key: device
    pipeline: p
  aws:
    type: aws-sns
    topic_arns: ["arn:aws:sns:eu-west-1:123456789012:ops-alarms"]
    pipeline: p
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""


class ExplodingSnsHttp:
    """An SNS edge with a bug in it: anything unexpected must still be answered in JSON."""

    async def fetch_certificate(self, url: str) -> bytes:
        raise RuntimeError("an unexpected bug in the certificate fetcher")

    async def confirm_subscription(self, url: str) -> None:
        raise RuntimeError("an unexpected bug")


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.fixture
def gateway(make_settings: Callable[..., Settings]) -> Iterator[ServerThread]:
    settings = make_settings(admin_token=ADMIN_TOKEN)
    deps = AdapterDeps(sns_http=ExplodingSnsHttp())
    app = create_app(settings, parse_config(CONFIG, env={}), role="api", adapter_deps=deps)
    with ServerThread(app) as server:
        yield server


def _nested(depth: int) -> str:
    """JSON text (orjson itself would refuse to write it)."""
    return "[" * depth + f'"{MARKER}"' + "]" * depth


def test_json_nested_too_deep_is_a_400_and_nothing_is_queued(gateway: ServerThread) -> None:
    _, headers = github_request(GITHUB_SECRET, {})
    body = ('{"action": "opened", "deep": ' + _nested(300) + "}").encode()
    headers["X-Hub-Signature-256"] = (
        "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    )
    reply = httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == "InvalidPayload"
    assert "nested deeper than 254 levels" in reply.json()["detail"]

    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    shallow = {"id": "r1", "device": "d1", "v": 1}
    batch = b"[" + orjson.dumps(shallow) + b', {"id": "r2", "device": "d1", "v": '
    batch += _nested(260).encode() + b"}]"
    reply = httpx.post(f"{gateway.url}/v1/webhooks/readings", content=batch, headers=auth)
    assert (reply.status_code, reply.json()["error"]) == (400, "InvalidPayload")
    # The first reading of the refused batch was not queued: sent alone it is new.
    alone = httpx.post(
        f"{gateway.url}/v1/webhooks/readings", content=orjson.dumps([shallow]), headers=auth
    )
    assert alone.status_code == 202
    assert alone.json()["events"][0]["status"] == "queued"


@pytest.mark.parametrize(("lists", "status"), [(253, 202), (254, 400)])
def test_a_payload_nests_at_most_254_levels(gateway: ServerThread, lists: int, status: int) -> None:
    """The body object is one level, each list one more."""
    _, headers = github_request(GITHUB_SECRET, {})
    body = ('{"action": "opened", "deep": ' + _nested(lists) + "}").encode()
    headers["X-Hub-Signature-256"] = (
        "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    )
    reply = httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == status, reply.text


def test_a_cursor_past_64_bit_ids_is_a_400(gateway: ServerThread) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for value in (2**63, 2**64 - 1, -1):
        reply = httpx.get(
            f"{gateway.url}/v1/dead-letters", params={"cursor": encode([value])}, headers=auth
        )
        assert (reply.status_code, reply.json()["error"]) == (400, "InvalidCursor"), value
    fine = httpx.get(
        f"{gateway.url}/v1/dead-letters", params={"cursor": encode([2**63 - 1])}, headers=auth
    )
    assert fine.status_code == 200


def test_a_client_hanging_up_mid_body_is_one_quiet_line(
    gateway: ServerThread, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(
                b"POST /v1/webhooks/readings HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {TOKEN}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                + b'[{"id": "x", "device": '
            )
            time.sleep(0.2)
    deadline = time.monotonic() + 5
    lines: list[str] = []
    while time.monotonic() < deadline and len(lines) < 3:
        time.sleep(0.1)
        lines += capfd.readouterr().err.splitlines()
    time.sleep(0.3)
    lines += capfd.readouterr().err.splitlines()
    text_out = "\n".join(lines)
    assert "Traceback" not in text_out, text_out
    gone = [orjson.loads(line) for line in lines if "webhook_client_disconnected" in line]
    assert len(gone) == 3, text_out
    assert {g["source"] for g in gone} == {"readings"}
    assert all(g["level"] == "info" for g in gone)


def test_an_unexpected_error_in_the_webhook_path_is_json_and_logged_once(
    gateway: ServerThread, capfd: pytest.CaptureFixture[str]
) -> None:
    message = payload("sns_cloudwatch_alarm.json") | {"Message": MARKER}
    body = orjson.dumps(SnsSigner().sign(message, cert_url=CERT_URL))
    capfd.readouterr()
    reply = httpx.post(
        f"{gateway.url}/v1/webhooks/aws", content=body, headers={"Content-Type": "text/plain"}
    )
    assert reply.status_code == 500
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["error"] == "InternalError"
    assert "bug" not in reply.json()["detail"]  # internals stay in the log
    time.sleep(0.2)
    err = capfd.readouterr().err
    assert err.count("Traceback") == 1, err
    assert '"event":"webhook_failed"' in err
    assert "an unexpected bug in the certificate fetcher" in err
    assert MARKER not in err


def test_an_unexpected_error_elsewhere_is_json_and_logged_once(
    make_settings: Callable[..., Settings], capfd: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens on this port: every database call fails the way a bug would.
    gone = f"postgresql+asyncpg://nobody@127.0.0.1:{free_port()}/none"
    settings = make_settings(admin_token=ADMIN_TOKEN, database_url=gone)
    with ServerThread(create_app(settings, parse_config(CONFIG, env={}), role="api")) as server:
        capfd.readouterr()
        reply = httpx.get(
            f"{server.url}/v1/dead-letters", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        time.sleep(0.2)
        err = capfd.readouterr().err
    assert reply.status_code == 500
    assert reply.json()["error"] == "InternalError"
    assert err.count("Traceback") == 1, err
    assert '"event":"request_failed"' in err


async def test_sql_errors_do_not_print_their_parameters(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        async with engine.connect() as connection:
            with pytest.raises(DBAPIError) as info:
                # Not-null columns left out: the statement fails with its parameters bound.
                await connection.execute(
                    text("INSERT INTO events (id, payload) VALUES (:id, :payload)"),
                    {"id": "evt_x", "payload": orjson.dumps({"secret": MARKER}).decode()},
                )
    finally:
        await engine.dispose()
    assert MARKER not in str(info.value)
    assert "hidden" in str(info.value)

"""Rejected deliveries are logged: source, error, status and remote address, one warning line
per source and error every 10 s with the number of lines held back since the last one, and
never a signature or token."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
import structlog

from app.config import parse_config
from app.ingest.rejections import RejectionLog
from app.main import create_app
from app.settings import Settings
from tests.support import ServerThread, github_request, issue_payload

TOKEN = "rejections-am-token-0123456789"
WRONG_TOKEN = "some-other-systems-token-9876543210"
GITHUB_SECRET = "rejections-github-secret"
CONFIG = f"""
sources:
  alerts: {{type: alertmanager, token: {TOKEN}, pipeline: p}}
  github: {{type: github, secret: {GITHUB_SECRET}, pipeline: p}}
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_source_and_error_per_interval_with_the_count_held_back() -> None:
    clock = Clock()
    rejections = RejectionLog(interval_seconds=10, clock=clock)

    def record(source: str = "alerts", error: str = "InvalidSignature") -> int | None:
        return rejections.record(
            source=source, error=error, status=401, remote="10.0.0.9", detail="d"
        )

    assert record() == 0  # logged, nothing held back
    assert [record() for _ in range(5)] == [None] * 5  # held back
    assert record(error="InvalidPayload") == 0  # another error: its own line
    assert record(source="github") == 0  # another source: its own line
    clock.now += 9.9
    assert record() is None
    clock.now += 0.1
    assert record() == 6  # the six held back since the last line
    assert record() is None
    clock.now += 10
    assert record() == 1


@pytest.fixture
def gateway(make_settings: Callable[..., Settings]) -> Iterator[ServerThread]:
    settings = make_settings(max_body_bytes=4096)
    with ServerThread(create_app(settings, parse_config(CONFIG, env={}), role="api")) as server:
        yield server
    structlog.reset_defaults()


def _rejected(err: str) -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    return [line for line in lines if line["event"] == "webhook_rejected"]


def test_bad_requests_are_logged_rate_limited_and_without_credentials(
    gateway: ServerThread, capfd: pytest.CaptureFixture[str]
) -> None:
    capfd.readouterr()
    body = b'{"status": "firing", "alerts": []}'
    for _ in range(20):
        reply = httpx.post(
            f"{gateway.url}/v1/webhooks/alerts",
            content=body,
            headers={"Authorization": f"Bearer {WRONG_TOKEN}", "Content-Type": "application/json"},
        )
        assert reply.status_code == 401
    signed, headers = github_request(GITHUB_SECRET, issue_payload("acme/api", 1))
    forged = headers | {"X-Hub-Signature-256": "sha256=" + "ab" * 32}
    assert httpx.post(f"{gateway.url}/v1/webhooks/github", content=signed, headers=forged).is_error
    too_big = httpx.post(
        f"{gateway.url}/v1/webhooks/alerts",
        content=b"x" * 5000,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert too_big.status_code == 413
    assert httpx.post(f"{gateway.url}/v1/webhooks/nope", content=b"{}").status_code == 404
    time.sleep(0.2)
    err = capfd.readouterr().err

    lines = _rejected(err)
    by_key = {(line["source"], line["error"]): line for line in lines}
    assert len(lines) == len(by_key) == 4, lines  # 20 bad tokens: one line
    bad_token = by_key[("alerts", "InvalidSignature")]
    assert bad_token["level"] == "warning"
    assert bad_token["status"] == 401
    assert bad_token["remote"] == "127.0.0.1"
    assert bad_token["suppressed"] == 0
    assert by_key[("github", "InvalidSignature")]["detail"] == "signature does not match the body"
    assert by_key[("alerts", "PayloadTooLarge")]["status"] == 413
    unknown = by_key[("(unknown source)", "UnknownSource")]
    assert unknown["requested"] == "nope"
    for secret in (TOKEN, WRONG_TOKEN, GITHUB_SECRET, "ab" * 32):
        assert secret not in err

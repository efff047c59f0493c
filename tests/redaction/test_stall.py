"""Redaction runs on the event loop: a hostile payload or request must not stop the process.

A GitHub issue body (65,536 characters, anyone can write one on a public repository, and
GitHub signs the delivery) once cost some 12 s of redaction as "password" + 60,000 spaces +
"bearer": the assignment rule's key and separator both took spaces, and Python's ``re`` tried
every split. An unknown source name in the URL (up to the 64 KiB head) went through the same
rules in the rejection log line. Each rule is linear now and a log value is cut to
``LOG_VALUE_CHARS`` before it is read; ``python -m bench.redaction`` measures the hostile
shapes against plain text of the same size. These tests only hold the process to answering
``/healthz`` meanwhile, with a margin that timing noise cannot reach.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.observability.logging import LOG_VALUE_CHARS
from tests.support import GatewayProcess, github_request, issue_payload

GITHUB_SECRET = "stall-github-secret-0123456789"
CONFIG = f"""
sources:
  github: {{type: github, secret: {GITHUB_SECRET}, pipeline: p}}
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""
# What a GitHub user can write into an issue body (65,536 characters at most).
HOSTILE_BODY = "password" + " " * 60_000 + "bearer"


@pytest.fixture
def gateway(tmp_path: Path, redis_prefix: str) -> Iterator[GatewayProcess]:
    config = tmp_path / "eventgate.yaml"
    config.write_text(CONFIG)
    process = GatewayProcess(
        role="api",
        log_path=tmp_path / "gateway.log",
        env={
            "EVENTGATE_CONFIG": str(config),
            "EVENTGATE_REDIS_URL": "memory://",
            "EVENTGATE_REDIS_PREFIX": redis_prefix,
            "EVENTGATE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'eventgate.db'}",
        },
    )
    try:
        yield process.wait_ready(path="/healthz")
    finally:
        process.stop()


def _health_while(gateway: GatewayProcess, send: httpx.Request) -> tuple[float, list[int]]:
    """Seconds ``/healthz`` took while ``send`` was being handled, and ``send``'s status."""
    answers: list[int] = []

    def deliver() -> None:
        with httpx.Client(timeout=120) as client:
            answers.append(client.send(send).status_code)

    sender = threading.Thread(target=deliver, daemon=True)
    sender.start()
    time.sleep(0.3)  # the request is being handled now
    started = time.monotonic()
    health = httpx.get(f"{gateway.url}/healthz", timeout=120)
    waited = time.monotonic() - started
    sender.join(timeout=120)
    assert health.status_code == 200
    return waited, answers


def test_a_github_issue_body_does_not_stall_the_process(gateway: GatewayProcess) -> None:
    payload = issue_payload("acme/api", 1)
    payload["issue"]["body"] = HOSTILE_BODY
    body, headers = github_request(GITHUB_SECRET, payload)
    send = httpx.Request("POST", f"{gateway.url}/v1/webhooks/github", content=body, headers=headers)
    waited, answers = _health_while(gateway, send)
    assert answers == [202]
    assert waited < 2.0, f"/healthz waited {waited:.1f} s behind one webhook's redaction"


def test_an_unknown_source_name_does_not_stall_the_process(gateway: GatewayProcess) -> None:
    """No credential at all: the source name in the URL goes into the ``webhook_rejected``
    line's ``detail``, which the log processor cuts before its rules read it."""
    name = "password" + "%20" * 21_000 + "bearer"
    send = httpx.Request("POST", f"{gateway.url}/v1/webhooks/{name}", content=b"{}")
    waited, answers = _health_while(gateway, send)
    assert answers == [404]
    assert waited < 0.5, f"/healthz waited {waited:.1f} s behind one rejected request's log line"
    (rejected,) = [e for e in gateway.log_events() if e.get("event") == "webhook_rejected"]
    assert "characters cut]…" in rejected["detail"]
    assert len(rejected["detail"]) < LOG_VALUE_CHARS + 64

"""Payload redaction: what it adds to building an event at ingest, per payload, in µs.

The same steps as ``IngestService._event``, timed on one core:
- before: the event serialised as it was before redaction existed (``Event.to_bytes()``);
- off: ``EVENTGATE_PAYLOAD_REDACTION=off``: the payload's JSON (with the depth check) embedded
  into the event's bytes;
- on: the default: the scan over the payload's JSON, the walk when it matched, the event's
  bytes;
- walk: the structural walk alone, without the scan in front (what every payload would cost
  without it);
- scan: the scan alone (Rust regex, through pydantic-core), and the same pattern run by
  Python's ``re`` (why the scan does not use it).

Payloads: the GitHub and Alertmanager fixtures (tests/fixtures/payloads/) and a GitHub
pull_request payload carrying secrets of every kind. Best of 5 runs.

    python -m bench.redaction [--number 2000]
"""

from __future__ import annotations

import argparse
import base64
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from app.events import Event
from app.redaction import may_hold_secret, payload_to_json, redact_payload, redact_to_json
from app.redaction.text import SCAN_PATTERN
from bench.common import report, table

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "payloads"
NAMES = [
    "github_push.json",
    "github_issues_opened.json",
    "github_pull_request_opened.json",
    "github_workflow_run_completed.json",
    "alertmanager_v4.json",
]


def with_secrets() -> dict[str, Any]:
    payload: dict[str, Any] = orjson.loads(
        (FIXTURES / "github_pull_request_opened.json").read_bytes()
    )
    basic = base64.b64encode(b"deploy:hunter2").decode()
    payload["pull_request"]["body"] = (
        f"CI log: Authorization: Basic {basic}\nDATABASE_URL=postgres://app:pw-123@db/app\n"
        "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG\ncard 4111 1111 1111 1111"
    )
    payload["deployment"] = {
        "password": "pw-456",
        "client_secret": "cs-789",
        "api_key": "sk-ant-api03-abcdefghijklmnopqrstuv",
        "hook": orjson.dumps({"config": {"token": "ghp_0123456789abcdefghijkl"}}).decode(),
        "form": "user=bot&password=pw-000&remember=1",
    }
    return payload


def _event(payload: Any) -> Event:
    return Event(
        id="evt_bench",
        source="github",
        type="pull_request.opened",
        group_key="acme/api",
        delivery_id="d-1",
        pipeline="triage",
        received_at=datetime(2026, 11, 29, tzinfo=UTC),
        payload=payload,
        source_type="github",
    )


def before(payload: Any) -> bytes:
    return _event(payload).to_bytes()


def off(payload: Any) -> bytes:
    return _event(payload).to_bytes(payload_json=payload_to_json(payload))


def on(payload: Any) -> bytes:
    redacted, data = redact_to_json(payload)
    return _event(redacted).to_bytes(payload_json=data)


def best_us(step: Callable[[Any], object], payload: Any, number: int) -> float:
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(number):
            step(payload)
        runs.append((time.perf_counter() - start) / number)
    return min(runs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    python_scan = re.compile(SCAN_PATTERN)
    payloads = [(n.removesuffix(".json"), orjson.loads((FIXTURES / n).read_bytes())) for n in NAMES]
    payloads.append(("pull_request with secrets", with_secrets()))
    rows = []
    for label, payload in payloads:
        text = orjson.dumps(payload).decode()
        before_us, off_us, on_us = (
            best_us(step, payload, args.number) for step in (before, off, on)
        )
        rows.append(
            (
                label,
                len(text),
                "yes" if may_hold_secret(text) else "no",
                f"{before_us:.1f}",
                f"{off_us:.1f}",
                f"{on_us:.1f}",
                f"{on_us - before_us:+.1f}",
                f"{best_us(redact_payload, payload, max(args.number // 10, 20)):.1f}",
                f"{best_us(may_hold_secret, text, args.number):.1f}",
                f"{best_us(python_scan.search, text.lower(), 10):.0f}",
            )
        )
    header = ("payload", "bytes", "walked", "before", "off", "on", "on - before", "walk")
    report(
        "Payload redaction at ingest (µs per event built)",
        "python -m bench.redaction",
        [
            "µs per event built and serialised as at ingest: `before` redaction existed, "
            "`off` (`EVENTGATE_PAYLOAD_REDACTION=off`), `on` (the default: one scan over the "
            "payload's JSON, the walk only when it matched); `walk`: the structural walk "
            "without the scan; `scan`: the scan alone (Rust regex via pydantic-core), and the "
            "same pattern with Python's `re`. Best of 5 runs, one core.",
            "",
            *table((*header, "scan", "scan with re"), rows),
        ],
    )


if __name__ == "__main__":
    main()

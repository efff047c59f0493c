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

A second table holds every rule to linear time: hostile shapes (long runs of what a pattern
repeats, the kind that made Python's ``re`` backtrack quadratically) in a payload's string,
beside plain prose of the same size, at 1,000, 10,000 and 60,000 characters (GitHub allows
65,536 in an issue body). Plain prose costs the scan alone; a shape costs the scan, the
walk and the rules, so its ratio to plain is the rules' constant factor, and that ratio
staying put from 1,000 to 60,000 characters is what linear means (a quadratic shape's ratio
grows 60 times).

    python -m bench.redaction [--number 2000]
"""

from __future__ import annotations

import argparse
import base64
import random
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


SIZES = (1_000, 10_000, 60_000)


def hostile_shapes(size: int) -> dict[str, str]:
    """Strings of ``size`` characters (about): plain prose first, then the shapes."""
    prose = ("hello world " * (size // 12 + 1))[:size]
    digits = random.Random(size)
    return {
        "plain prose": prose,
        "prose with one secret": "password=x " + prose[11:],
        "password + spaces + bearer": "password" + " " * size + "bearer",
        "cookie + spaces + bearer": "cookie" + " " * size + "bearer",
        "password= repeated": ("password=" * (size // 9 + 1))[:size],
        "BEGIN PRIVATE KEY repeated": "-----BEGIN PRIVATE KEY-----" * (size // 27),
        "digit groups 4 4 4": "4 " * (size // 2) + "a",
        "card-like groups": " ".join(f"{digits.randrange(10_000):04d}" for _ in range(size // 5)),
        "basic + base64 run": "basic " + "A" * size + "===",
        "eyJ- repeated": "eyJ-" * (size // 4),
        "a.a.a + :// + bearer": "a." * (size // 2) + "://x bearer",
        "password: + words": "password: " + "a " * (size // 2),
        "-a -a -a + bearer": "-a " * (size // 3) + "bearer",
    }


def hostile_rows(number: int) -> tuple[list[tuple[object, ...]], str]:
    """One row per shape (µs and ratio to plain prose at each size), and the verdict."""
    costs: dict[str, list[float]] = {}
    for size in SIZES:
        repeat = max(number * 1_000 // size, 3)
        for name, text in hostile_shapes(size).items():
            costs.setdefault(name, []).append(best_us(redact_to_json, {"body": text}, repeat))
    plain = costs["plain prose"]
    rows: list[tuple[object, ...]] = []
    growth = 0.0
    for name, us in costs.items():
        ratios = [cost / base for cost, base in zip(us, plain, strict=True)]
        growth = max(growth, ratios[-1] / ratios[0])
        cells = [f"{cost:,.0f} ({ratio:.1f}x)" for cost, ratio in zip(us, ratios, strict=True)]
        rows.append((name, *cells))
    worst = max(cost / base for us in costs.values() for cost, base in zip(us, plain, strict=True))
    verdict = (
        f"verdict: the costliest shape took {worst:.3f}x plain prose of its size; the largest "
        f"growth of a shape's ratio from {SIZES[0]:,} to {SIZES[-1]:,} characters was "
        f"{growth:.3f}x (1 is linear, {SIZES[-1] // SIZES[0]} would be quadratic)"
    )
    return rows, verdict


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
    hostile, verdict = hostile_rows(args.number)
    report(
        "Payload redaction of hostile shapes (µs per payload, x plain prose of the same size)",
        "python -m bench.redaction",
        [
            "µs of `redact_to_json` (what ingest runs) for a payload holding one string of "
            "the shape, and its ratio to plain prose of the same size (which costs the scan "
            "alone). Best of 5 runs, one core.",
            "",
            *table(("shape", *(f"{size:,} chars" for size in SIZES)), hostile),
            "",
            verdict,
        ],
    )


if __name__ == "__main__":
    main()

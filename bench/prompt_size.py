"""Prompt size: what Claude is sent (the rendered user turn) against the raw webhook body,
for real-shaped GitHub and Alertmanager payloads (tests/fixtures/payloads/).

Tokens are estimated, not counted (no network here): one token per word-like run or per
punctuation character, which tracks Claude's tokenizer on JSON far better than chars/4.
Run: ``python -m bench.prompt_size`` (appends its table to docs/benchmarks.md).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import orjson

from app.decide.prompts import DEFAULT_BUDGET_CHARS, render_event
from app.events import Event

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "payloads"
REPORT = ROOT / "docs" / "benchmarks.md"
_TOKEN = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")
CASES = [
    ("github push", "github", "push", "github_push.json"),
    (
        "github pull_request.opened",
        "github",
        "pull_request.opened",
        "github_pull_request_opened.json",
    ),
    ("github issues.opened", "github", "issues.opened", "github_issues_opened.json"),
    (
        "github workflow_run.completed",
        "github",
        "workflow_run.completed",
        "github_workflow_run_completed.json",
    ),
    ("alertmanager v4 (3 alerts)", "alertmanager", "alert.firing", "alertmanager_v4.json"),
    ("grafana (1 alert)", "grafana", "alert.firing", "grafana_alert.json"),
]


def estimate_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def measure() -> list[tuple[str, int, int, int, int]]:
    rows = []
    for label, source_type, event_type, name in CASES:
        raw = (FIXTURES / name).read_bytes()
        event = Event(
            id="evt_bench",
            source=source_type,
            type=event_type,
            group_key="bench",
            delivery_id="bench",
            pipeline="bench",
            received_at=datetime(2025, 11, 28, tzinfo=UTC),
            payload=orjson.loads(raw),
            source_type=source_type,
        )
        prompt = render_event(event)
        text = raw.decode()
        rows.append((label, len(text), estimate_tokens(text), len(prompt), estimate_tokens(prompt)))
    return rows


def table(rows: list[tuple[str, int, int, int, int]]) -> str:
    lines = [
        "| payload | raw chars | raw tokens (est.) | prompt chars | prompt tokens (est.) | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, raw_chars, raw_tokens, chars, tokens in rows:
        ratio = tokens / raw_tokens
        lines.append(f"| {label} | {raw_chars} | {raw_tokens} | {chars} | {tokens} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    rendered = table(measure())
    print(rendered)
    REPORT.parent.mkdir(exist_ok=True)
    if not REPORT.exists():
        REPORT.write_text("# Benchmarks\n\nNumbers printed by the scripts in `bench/`.\n")
    with REPORT.open("a") as report:
        report.write(
            f"\n## Prompt size vs raw payload ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)\n\n"
            f"`python -m bench.prompt_size`: the user turn rendered by `render_event` (summary "
            f"+ payload trimmed to the default budget of {DEFAULT_BUDGET_CHARS} chars) against "
            f"the raw body. Tokens estimated (word runs + punctuation), not counted.\n\n"
            f"{rendered}\n"
        )


if __name__ == "__main__":
    main()

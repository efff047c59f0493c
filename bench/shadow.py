"""Shadow candidates against live throughput: the same workload through `eventgate serve`
without a candidate and with one at sample 1.0 (its own concurrency limit), interleaved, with
the fake Messages API answering after L and the SNS stand-in counting what is published.

    python -m bench.shadow [--events 600] [--latency 0.2] [--concurrency 32] [--repeat 2]

Live throughput: events from the first webhook sent to the last live message at SNS. The
target: with the candidate, at least 0.9 of the throughput without it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.capacity import _metric_sum, private_redis
from bench.common import PYTHON, Server, database, free_port, gateway_env, redis_prefix, report
from bench.pipeline import _requests, _send_all

TARGET = 0.9
TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:shadow-bench.fifo"
CANDIDATE_CONCURRENCY = 8


def _config(directory: Path, *, shadow: bool) -> Path:
    sample = os.environ.get("BENCH_SHADOW_SAMPLE", "1.0")
    candidate = f"    shadow: [{{pipeline: triage-v2, sample: {sample}}}]\n" if shadow else ""
    path = directory / f"eventgate-{'shadow' if shadow else 'live'}.yaml"
    path.write_text(
        f"""
sources:
  github: {{type: github, secret: "${{BENCH_GITHUB_SECRET}}", pipeline: triage}}
pipelines:
  triage:
    model: claude-sonnet-4-6
    system: You triage GitHub events for the on-call team.
    tools: [publishAlert]
{candidate}  triage-v2:
    model: claude-haiku-4-5
    system: You triage GitHub events for the on-call team, the second way.
    tools: [publishAlert]
    max_concurrency: {CANDIDATE_CONCURRENCY}
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties: {{severity: {{type: string, enum: [high, low]}}, title: {{type: string}}}}
      required: [severity, title]
    topic_arn: {TOPIC_ARN}
"""
    )
    return path


def run_once(args: argparse.Namespace, *, shadow: bool) -> tuple[float, float, float]:
    """(live events/s, shadow decisions made, skipped) for one run."""
    keys = args.events // 6
    with (
        private_redis() as (redis_url, _),
        database("shadow") as db,
        tempfile.TemporaryDirectory() as tmp,
    ):
        sns_port, claude_port, port = free_port(), free_port(), free_port()
        env = dict(os.environ)
        sns = Server(
            [PYTHON, "-m", "bench.fake_sns", "--port", str(sns_port)],
            env=env,
            port=sns_port,
            ready_path="/_stats",
        )
        claude = Server(
            [
                PYTHON,
                "-m",
                "eventgate_dev.fake_anthropic",
                "--port",
                str(claude_port),
                "--latency",
                str(args.latency),
            ],
            env=env,
            port=claude_port,
            ready_path="/_fake/stats",
        )
        with sns, claude:
            gateway_env_ = gateway_env(
                prefix=redis_prefix("shadow"),
                database_url=db,
                config=_config(Path(tmp), shadow=shadow),
                extra={
                    "EVENTGATE_REDIS_URL": redis_url,
                    "EVENTGATE_LLM_MAX_CONCURRENCY": str(args.concurrency),
                    "ANTHROPIC_BASE_URL": claude.url,
                    "ANTHROPIC_API_KEY": "sk-ant-bench-not-real",
                    "AWS_ENDPOINT_URL_SNS": sns.url,
                    "EVENTGATE_RELAY_POLL_SECONDS": "0.2",
                },
            )
            argv = [PYTHON, "-m", "app", "serve", "--port", str(port)]
            with Server(argv, env=gateway_env_, port=port, ready_path="/readyz") as gateway:
                asyncio.run(_send_all(gateway.url, _requests(8, 1, "warm/repo")))
                _wait_published(sns.url, 8)
                started = time.perf_counter()
                asyncio.run(_send_all(gateway.url, _requests(keys, 6)))
                _wait_published(sns.url, 8 + keys * 6)
                rate = keys * 6 / (time.perf_counter() - started)
                metrics = httpx.get(gateway.url + "/metrics", timeout=10).text
    made = _metric_sum(metrics, "eventgate_shadow_decisions_total") - _metric_sum(
        metrics, "eventgate_shadow_decisions_total", agreement="skipped"
    )
    skipped = _metric_sum(metrics, "eventgate_shadow_decisions_total", agreement="skipped")
    return rate, made, skipped


def _wait_published(url: str, count: int) -> None:
    deadline = time.monotonic() + 600
    while httpx.get(url + "/_stats", timeout=10).json()["messages"] < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} messages published in 600 s")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description="live throughput with a shadow candidate")
    parser.add_argument("--events", type=int, default=600)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    live: list[float] = []
    shadowed: list[tuple[float, float, float]] = []
    for _ in range(args.repeat):  # interleaved: the machine's speed drifts
        live.append(run_once(args, shadow=False)[0])
        shadowed.append(run_once(args, shadow=True))
    base = statistics.median(live)
    with_candidate = statistics.median(rate for rate, _, _ in shadowed)
    ratio = with_candidate / base
    verdict = "met" if ratio >= TARGET else "NOT met"
    limit = args.concurrency / args.latency
    report(
        "Shadow candidate at sample 1.0 against live throughput",
        f"python -m bench.shadow --events {args.events} --latency {args.latency} "
        f"--concurrency {args.concurrency} --repeat {args.repeat}",
        [
            f"- workload: {args.events} signed GitHub webhooks ({args.events // 6} keys x 6), "
            f"Claude (fake) answers after L = {args.latency} s, C = {args.concurrency} live "
            f"slots (C/L = {limit:.0f} events/s), SNS stand-in; runs interleaved",
            f"- live throughput without a candidate: "
            f"{' / '.join(f'{r:.1f}' for r in live)} events/s (median {base:.1f})",
            "- with a candidate at sample 1.0 (its own limit, "
            f"{CANDIDATE_CONCURRENCY} calls at once): "
            f"{' / '.join(f'{r:.1f}' for r, _, _ in shadowed)} events/s "
            f"(median {with_candidate:.1f}); candidate decisions made during the run "
            f"{' / '.join(f'{m:.0f}' for _, m, _ in shadowed)}, skipped (its queue full) "
            f"{' / '.join(f'{s:.0f}' for _, _, s in shadowed)}",
            f"- **{ratio:.3f}x** the live throughput without it (target ≥ {TARGET}: {verdict})",
        ],
    )


if __name__ == "__main__":
    main()

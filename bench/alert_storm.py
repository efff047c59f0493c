"""What an alert storm costs in Claude calls and USD with each pipeline option, against one
call per event: the recorded storm of ``bench.storm`` (500 Alertmanager deliveries over 50
groups, 39% of them unchanged re-sends every repeat_interval, 9 of the 50 groups critical)
sent to `eventgate serve` once per variant, each on a fresh Redis and database.

    python -m bench.alert_storm [--tick-seconds 1.2] [--latency 0.05] [--only cache ...]

Every variant gets the same deliveries in the same order, one group_interval tick at a time
(``--tick-seconds`` of wall time each). The source's dedup window is 1 s: shorter than the
storm's repeat_interval, as ``dedup_window_seconds: 900`` would be against
``repeat_interval: 30m``, so an unchanged re-send becomes an event again; two variants keep
the default window (24 h): what the ingest dedup does on its own, and the cache behind it
(the exact re-sends, the ones the cache would answer, never reach the pipeline then).

Claude is the fake Messages API (``eventgate_dev.fake_anthropic``); its usage figures depend
on the prompt's size, so the tokens are the gateway's real prompts. The triage model
(claude-haiku-4-5) calls ``escalate`` for exactly the notifications with a critical alert in
them (a persona with ``when:severity=critical``). USD is the gateway's own pricing
(``app/llm/pricing.py``), summed from the audit log (``llm_calls.cost_usd``); calls, cache
hits and tokens come from the same rows, messages from the SNS stand-in. A variant whose
events did not all end ``published`` or ``no_action`` is flagged: dropping work is not cheap.

A variant is one entry of ``VARIANTS``: a name and the config it adds (pipeline keys,
source keys, other pipelines). ``window`` decides a group's notifications of 30 storm
minutes (six ticks) in one call; ``batch`` sends every call through the Message Batches API
(the fake's batch endpoints) at half the price. An event taken into a window ends
``windowed`` and the window's own event (source ``window``) is the one that publishes, so
those variants publish one message per window, and their events count as ended once every
window is decided.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg
import httpx
import orjson

from bench.capacity import private_redis
from bench.common import (
    PYTHON,
    Server,
    Skip,
    database,
    free_port,
    gateway_env,
    redis_prefix,
    report,
    table,
)
from bench.storm import Delivery, alert_storm

TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:alert-storm.fifo"
TOKEN = "bench-alertmanager-token-0123456789"
BIG_MODEL = "claude-sonnet-4-6"
SMALL_MODEL = "claude-haiku-4-5"
TRIAGE_PERSONA = f"{SMALL_MODEL}=tool:escalate,when:severity=critical"
ENDED = frozenset({"published", "no_action", "windowed"})


@dataclass(frozen=True, slots=True)
class Variant:
    """What one run adds to the base config: ``pipeline`` lines under the ``oncall``
    pipeline, ``source`` keys of the alertmanager source, other ``pipelines`` (YAML at the
    pipelines' indent) and the pipeline the source feeds (``entry``).
    ``dedup_window_seconds`` None is the gateway's default (24 h)."""

    name: str
    pipeline: str = ""
    source: str = ""
    pipelines: str = ""
    entry: str = "oncall"
    dedup_window_seconds: int | None = 1


TRIAGE = f"""  triage:
    model: {SMALL_MODEL}
    system: Sort alert notifications; escalate the ones that need a closer look.
    tools: [publishAlert, escalate]
    escalate: {{to: oncall, when_tool: escalate}}
"""
CACHE = "cache: {ttl_seconds: 3600}"
COLLAPSE = "collapse: {window_seconds: 3600}"
WINDOW = "window: {seconds: 7.2, max_events: 100}"  # six ticks: 30 minutes of the storm
BATCH = "mode: batch\n    batch: {wait_seconds: 2, max_requests: 1000, poll_seconds: 0.5}"
VARIANTS = [
    Variant("baseline"),
    Variant("cache", pipeline=CACHE),
    Variant("triage", entry="triage", pipelines=TRIAGE),
    Variant("collapse", source=COLLAPSE),
    Variant("triage + collapse", entry="triage", pipelines=TRIAGE, source=COLLAPSE),
    Variant("window", pipeline=WINDOW),
    Variant("batch", pipeline=BATCH),
    Variant("window + batch", pipeline=f"{WINDOW}\n    {BATCH}"),
    Variant("baseline, default dedup window", dedup_window_seconds=None),
    Variant("cache, default dedup window", pipeline=CACHE, dedup_window_seconds=None),
]


def config_text(variant: Variant) -> str:
    source = [f'type: alertmanager, token: "${{BENCH_AM_TOKEN}}", pipeline: {variant.entry}']
    if variant.dedup_window_seconds is not None:
        source.append(f"dedup_window_seconds: {variant.dedup_window_seconds}")
    if variant.source:
        source.append(variant.source)
    pipeline = f"    {variant.pipeline}\n" if variant.pipeline else ""
    return f"""
sources:
  alertmanager: {{{", ".join(source)}}}
pipelines:
  oncall:
    model: {BIG_MODEL}
    system: You are the on-call assistant. Raise an alert for each notification.
    tools: [publishAlert]
{pipeline}{variant.pipelines}tools:
  publishAlert:
    description: Raise an alert to the on-call team.
    input_schema:
      type: object
      properties: {{severity: {{type: string, enum: [page, ticket]}}, title: {{type: string}}}}
      required: [severity, title]
    topic_arn: {TOPIC_ARN}
  escalate:
    description: Hand the notification to a closer look.
    input_schema: {{type: object, properties: {{reason: {{type: string}}}}}}
"""


@dataclass
class Outcome:
    variant: str
    deliveries: int
    answers: Counter[str]  # ingest's status word per delivery
    statuses: Counter[str]  # the events' final statuses
    calls: int  # Claude calls in the audit log (cache hits not counted)
    fake_requests: int  # what the fake Messages API received (batch requests included)
    cache_hits: int
    input_tokens: int  # uncached + cache writes + cache reads
    output_tokens: int
    usd: float
    by_model: dict[str, tuple[int, float]]  # model -> (calls, USD)
    messages: int  # published to the SNS stand-in

    @property
    def events(self) -> int:
        return sum(self.statuses.values())

    @property
    def ended(self) -> bool:
        return set(self.statuses) <= ENDED and self.events == self.answers["queued"]


def _by_tick(storm: list[Delivery]) -> list[list[bytes]]:
    ticks: dict[int, list[bytes]] = defaultdict(list)
    for delivery in storm:
        ticks[delivery.tick].append(orjson.dumps(delivery.payload))
    return [ticks.get(tick, []) for tick in range(max(ticks) + 1)]


async def _send(url: str, ticks: list[list[bytes]], tick_seconds: float) -> Counter[str]:
    """Each tick's deliveries at once (one per group), then wait for the next tick."""
    answers: Counter[str] = Counter()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(base_url=url, headers=headers) as client:

        async def one(body: bytes) -> None:
            async with client.post("/v1/webhooks/alertmanager", data=body) as reply:
                reply.raise_for_status()
                answers[(await reply.json())["status"]] += 1

        started = time.monotonic()
        for number, bodies in enumerate(ticks):
            await asyncio.gather(*(one(body) for body in bodies))
            await asyncio.sleep(max(0.0, started + (number + 1) * tick_seconds - time.monotonic()))
    return answers


async def _statuses(dsn: str) -> tuple[Counter[str], int]:
    """The delivered events' statuses, and how many windows are not decided yet."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT status, count(*) AS n FROM events WHERE source <> 'window' GROUP BY status"
        )
        undecided = await conn.fetchval(
            "SELECT (SELECT count(*) FROM windows WHERE status <> 'enqueued')"
            " + (SELECT count(*) FROM events WHERE source = 'window'"
            " AND status NOT IN ('published', 'no_action', 'dead_lettered', 'held'))"
        )
    finally:
        await conn.close()
    return Counter({str(r["status"]): int(r["n"]) for r in rows}), int(undecided or 0)


async def _audit(dsn: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(
            await conn.fetch(
                "SELECT model, count(*) FILTER (WHERE NOT cache_hit) AS calls, "
                "count(*) FILTER (WHERE cache_hit) AS hits, "
                "coalesce(sum(input_tokens + cache_creation_input_tokens "
                "+ cache_read_input_tokens), 0) AS input, "
                "coalesce(sum(output_tokens), 0) AS output, "
                "coalesce(sum(cost_usd), 0) AS usd FROM llm_calls GROUP BY model"
            )
        )
    finally:
        await conn.close()


def _wait_ended(dsn: str, queued: int, *, timeout: float = 300) -> Counter[str]:
    deadline = time.monotonic() + timeout
    while True:
        statuses, undecided = asyncio.run(_statuses(dsn))
        final = sum(n for s, n in statuses.items() if s in (*ENDED, "dead_lettered", "held"))
        if (final >= queued and not undecided) or time.monotonic() > deadline:
            return statuses
        time.sleep(0.5)


def run_variant(variant: Variant, args: argparse.Namespace, storm: list[Delivery]) -> Outcome:
    with (
        private_redis() as (redis_url, _),
        database("storm") as db,
        tempfile.TemporaryDirectory() as tmp,
    ):
        if not db.startswith("postgresql"):
            raise Skip("no PostgreSQL on 127.0.0.1:5432: the totals are read from it")
        dsn = db.replace("postgresql+asyncpg://", "postgresql://")
        config = Path(tmp) / "eventgate.yaml"
        config.write_text(config_text(variant))
        sns_port, claude_port, port = free_port(), free_port(), free_port()
        env = dict(os.environ)
        sns = Server(
            [PYTHON, "-m", "bench.fake_sns", "--port", str(sns_port)],
            env=env,
            port=sns_port,
            ready_path="/_stats",
        )
        claude_argv = [PYTHON, "-m", "eventgate_dev.fake_anthropic", "--port", str(claude_port)]
        claude_argv += ["--latency", str(args.latency), "--persona", TRIAGE_PERSONA]
        claude = Server(claude_argv, env=env, port=claude_port, ready_path="/_fake/stats")
        with sns, claude:
            gateway = gateway_env(
                prefix=redis_prefix("storm"),
                database_url=db,
                config=config,
                extra={
                    "BENCH_AM_TOKEN": TOKEN,
                    "EVENTGATE_REDIS_URL": redis_url,
                    "ANTHROPIC_BASE_URL": claude.url,
                    "ANTHROPIC_API_KEY": "sk-ant-bench-not-real",
                    "AWS_ENDPOINT_URL_SNS": sns.url,
                    "EVENTGATE_RELAY_POLL_SECONDS": "0.2",
                },
            )
            argv = [PYTHON, "-m", "app", "serve", "--port", str(port)]
            with Server(argv, env=gateway, port=port, ready_path="/readyz") as server:
                answers = asyncio.run(_send(server.url, _by_tick(storm), args.tick_seconds))
                statuses = _wait_ended(dsn, answers["queued"])
                time.sleep(1.0)  # the relay's last poll reaches the stand-in
                messages = int(httpx.get(sns.url + "/_stats", timeout=10).json()["messages"])
                seen = httpx.get(claude.url + "/_fake/stats", timeout=10).json()
                fake = int(seen["requests"]) + int(seen.get("batch_requests", 0))
        rows = asyncio.run(_audit(dsn))
    return Outcome(
        variant=variant.name,
        deliveries=len(storm),
        answers=answers,
        statuses=statuses,
        calls=sum(int(r["calls"]) for r in rows),
        fake_requests=fake,
        cache_hits=sum(int(r["hits"]) for r in rows),
        input_tokens=sum(int(r["input"]) for r in rows),
        output_tokens=sum(int(r["output"]) for r in rows),
        usd=sum(float(r["usd"]) for r in rows),
        by_model={str(r["model"]): (int(r["calls"]), float(r["usd"])) for r in rows},
        messages=messages,
    )


def render(outcomes: list[Outcome], storm: list[Delivery], args: argparse.Namespace) -> list[str]:
    base = outcomes[0].usd or 1.0
    rows = []
    for o in outcomes:
        dropped = o.answers["duplicate"] + o.answers["collapsed"]
        rows.append(
            [
                o.variant,
                o.deliveries,
                f"{o.events} ({dropped} dropped at ingest)",
                o.calls,
                f"{o.calls / o.events:.3f}" if o.events else "-",
                o.cache_hits,
                f"{o.input_tokens:,} / {o.output_tokens:,}",
                f"{o.usd:.4f}",
                f"**{o.usd / base:.3f}x**",
                o.messages,
                "yes" if o.ended else f"NO: {dict(o.statuses)}",
            ]
        )
    repeats = sum(d.repeat for d in storm)
    critical = {d.group_key for d in storm if d.severity == "critical"}
    lines = [
        f"- storm: {len(storm)} Alertmanager deliveries over {len({d.group_key for d in storm})}"
        f" groups (bench/storm.py, seed fixed), {repeats} of them unchanged re-sends, "
        f"{len(critical)} groups critical; one 5-minute tick per {args.tick_seconds} s; source "
        "dedup window 1 s (shorter than the 30-minute repeat_interval) unless said",
        f"- models: {BIG_MODEL} decides (one call per event in the baseline); triage asks "
        f"{SMALL_MODEL} first, which escalates the notifications with a critical alert; "
        f"prices from app/llm/pricing.py; fake Claude answers after {args.latency} s",
        "",
        *table(
            [
                "variant",
                "deliveries",
                "events",
                "Claude calls",
                "calls per event",
                "cache hits",
                "input / output tokens",
                "USD",
                "USD vs baseline",
                "messages published",
                "every event ended",
            ],
            rows,
        ),
        "",
    ]
    for o in outcomes:
        models = ", ".join(
            f"{m} {n} calls ${usd:.4f}" for m, (n, usd) in sorted(o.by_model.items())
        )
        check = "" if o.fake_requests == o.calls else f" (fake Claude saw {o.fake_requests})"
        lines.append(f"- {o.variant}: {models or 'no calls'}{check}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description="Claude cost of an alert storm per option")
    parser.add_argument("--tick-seconds", type=float, default=1.2)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--only", nargs="*", default=None, help="variant names (baseline first)")
    args = parser.parse_args()
    chosen = [v for v in VARIANTS if args.only is None or v.name in args.only]
    storm = alert_storm()
    outcomes = []
    for variant in chosen:
        print(f"-- {variant.name}", flush=True)
        outcomes.append(run_variant(variant, args, storm))
    report(
        "Alert storm: Claude calls and USD per pipeline option",
        "python -m bench.alert_storm"
        + (f" --tick-seconds {args.tick_seconds}" if args.tick_seconds != 1.2 else "")
        + (f" --latency {args.latency}" if args.latency != 0.05 else ""),
        render(outcomes, storm, args),
    )


if __name__ == "__main__":
    main()

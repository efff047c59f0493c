"""Capacity model: what one event costs each part, measured through the whole path with 1 and
2 gateway processes, and what 1k, 10k and 100k events/s would need. Writes docs/capacity.md
(overwritten: it is generated) and appends the measurement to docs/benchmarks.md.

    python -m bench.capacity [--events 1200] [--claude-rpm 4000] [--claude-itpm 2000000]

Each part is measured where it runs: gateway CPU from /proc, Redis (a private server started
here, AOF everysec, so nothing else's commands are counted) from INFO commandstats, stats and
cpu, PostgreSQL from pg_stat_database and its backends' CPU (one fresh database), SQL
statements as the gateway sends them (``bench.counted_gateway``), SNS calls at a stand-in
(``bench.fake_sns``), Claude calls at the fake Messages API and tokens from the audit log.
What the gateway's loops cost while idle is measured first and taken off: the per-event
figures are what one more event adds.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

import asyncpg
import httpx
import redis

from bench.common import (
    PG_ADMIN_URL,
    PYTHON,
    ROOT,
    Server,
    Skip,
    database,
    fake_sns_and_claude,
    free_port,
    gateway_env,
    machine,
    redis_prefix,
    report,
    table,
    write_config,
)
from bench.pipeline import _requests, _send_all

CAPACITY = ROOT / "docs" / "capacity.md"
TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:capacity.fifo"
# PostgreSQL's statistics reach pg_stat_database when a backend goes idle, at the latest
# 10 s later (PGSTAT_IDLE_INTERVAL); wait past it before reading them.
PG_STATS_LAG = 11.0
IDLE_SECONDS = 6.0
# A process, a Redis shard: planned at this share of the one core each runs on.
PLANNED_LOAD = 0.7
RATES = (1_000, 10_000, 100_000)
# AWS's documented SNS FIFO publish quotas (docs.aws.amazon.com/general/latest/gr/sns.html and
# docs.aws.amazon.com/sns/latest/dg/fifo-high-throughput.html, read 2026-12-02): a topic with
# FifoThroughputScope=Topic takes 3,000 messages/s; with MessageGroup scope the account's
# regional quota applies (30,000/s in us-east-1; 9,000/s in us-west-2 and eu-west-1); one
# message group takes 300 messages/s.
SNS_TOPIC_SCOPE = 3_000
SNS_ACCOUNT_US_EAST_1 = 30_000
SNS_PER_GROUP = 300
# EVENTGATE_PARTITIONS's maximum: no more processes can work, nor Redis shards hold streams.
MAX_PARTITIONS = 1024


@dataclass
class Sample:
    """Counters at one moment; differences of two samples are what happened between them."""

    at: float = 0.0
    gateway_cpu: float = 0.0
    redis_commands: float = 0.0
    redis_in: float = 0.0
    redis_out: float = 0.0
    redis_cpu: float = 0.0
    sql_statements: float = 0.0
    pg_transactions: float = 0.0
    pg_rows_written: float = 0.0
    pg_bytes: float = 0.0
    pg_cpu: float = 0.0
    sns_calls: float = 0.0
    sns_messages: float = 0.0
    claude_calls: float = 0.0

    def __sub__(self, other: Sample) -> Sample:
        return Sample(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def scaled(self, factor: float) -> Sample:
        return Sample(*(getattr(self, f.name) * factor for f in fields(self)))


@dataclass
class Run:
    processes: int
    events: int
    seconds: float
    per_event: Sample
    idle_per_second: Sample
    input_tokens: float
    output_tokens: float


@contextmanager
def private_redis() -> Iterator[tuple[str, redis.Redis]]:
    """A redis-server of this benchmark's own (AOF everysec, as in production)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp]
        argv += ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        except FileNotFoundError:
            raise Skip("no redis-server on PATH to start a private Redis") from None
        client = redis.Redis(port=port)
        try:
            for _ in range(100):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0", client
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _proc_cpu(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def _metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _pg(db_name: str) -> tuple[float, float, float, float]:
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        row = await conn.fetchrow(
            "SELECT xact_commit + xact_rollback AS xacts, "
            "tup_inserted + tup_updated + tup_deleted AS written, pg_database_size($1) AS size "
            "FROM pg_stat_database WHERE datname = $1",
            db_name,
        )
        pids = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", db_name)
    finally:
        await conn.close()
    assert row is not None
    cpu = sum(_proc_cpu(int(p["pid"])) for p in pids)
    return float(row["xacts"]), float(row["written"]), float(row["size"]), cpu


class Probe:
    """Takes samples of every part of one deployment."""

    def __init__(
        self, servers: list[Server], redis_client: redis.Redis, db_name: str, fakes: dict[str, str]
    ) -> None:
        self.servers, self.redis, self.db_name, self.fakes = servers, redis_client, db_name, fakes
        self.pg_cpu_seen: dict[int, float] = {}

    def sample(self) -> Sample:
        stats = self.redis.info("commandstats")
        commands = sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info",))
        net, cpu = self.redis.info("stats"), self.redis.info("cpu")
        metrics = "".join(httpx.get(s.url + "/metrics", timeout=10).text for s in self.servers)
        xacts, written, size, pg_cpu = asyncio.run(_pg(self.db_name))
        sns = httpx.get(self.fakes["sns"] + "/_stats", timeout=10).json()
        claude = httpx.get(self.fakes["claude"] + "/_fake/stats", timeout=10).json()
        return Sample(
            at=time.monotonic(),
            gateway_cpu=sum(s.cpu_seconds() for s in self.servers),
            redis_commands=float(commands),
            redis_in=float(net["total_net_input_bytes"]),
            redis_out=float(net["total_net_output_bytes"]),
            redis_cpu=float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            sql_statements=_metric_sum(metrics, "bench_db_statements_total"),
            pg_transactions=xacts,
            pg_rows_written=written,
            pg_bytes=size,
            pg_cpu=pg_cpu,
            sns_calls=float(sns["calls"]),
            sns_messages=float(sns["messages"]),
            claude_calls=float(claude["requests"]),
        )

    def published(self) -> float:
        texts = [httpx.get(s.url + "/metrics", timeout=10).text for s in self.servers]
        return sum(_metric_sum(t, "eventgate_published_total", outcome="published") for t in texts)


async def _tokens(database_url: str) -> tuple[float, float]:
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        row = await conn.fetchrow(
            "SELECT coalesce(sum(input_tokens + cache_creation_input_tokens), 0) AS i, "
            "coalesce(sum(output_tokens), 0) AS o FROM llm_calls"
        )
    finally:
        await conn.close()
    assert row is not None
    return float(row["i"]), float(row["o"])


def measure(processes: int, events: int) -> Run:
    keys = max(processes, events // 6)
    total = keys * 6
    requests = _requests(keys, 6)
    with ExitStack() as stack:
        redis_url, client = stack.enter_context(private_redis())
        db_url = stack.enter_context(database("capacity"))
        if not db_url.startswith("postgresql"):
            raise Skip("no PostgreSQL on 127.0.0.1:5432: the model needs its statistics")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        sns, claude = fake_sns_and_claude(stack)
        env = gateway_env(
            prefix=redis_prefix("capacity"),
            database_url=db_url,
            config=write_config(tmp, TOPIC_ARN),
            extra={
                "EVENTGATE_REDIS_URL": redis_url,
                "EVENTGATE_LLM_MAX_CONCURRENCY": "64",
                "ANTHROPIC_BASE_URL": claude.url,
                "ANTHROPIC_API_KEY": "sk-ant-bench-not-real",
                "AWS_ENDPOINT_URL_SNS": sns.url,
                "EVENTGATE_RELAY_POLL_SECONDS": "0.2",
            },
        )
        servers = []
        for _ in range(processes):
            port = free_port()
            argv = [PYTHON, "-m", "bench.counted_gateway", "serve", "--port", str(port)]
            servers.append(
                stack.enter_context(Server(argv, env=env, port=port, ready_path="/readyz"))
            )
        probe = Probe(
            servers, client, db_url.rsplit("/", 1)[1], {"sns": sns.url, "claude": claude.url}
        )
        time.sleep(PG_STATS_LAG)  # the start-up's statistics land before the first sample
        idle_start = probe.sample()
        time.sleep(IDLE_SECONDS)
        idle_end = probe.sample()
        idle = (idle_end - idle_start).scaled(1 / (idle_end.at - idle_start.at))

        names = list(requests)
        shares = [{k: requests[k] for k in names[i::processes]} for i in range(processes)]

        async def send() -> None:
            await asyncio.gather(
                *(_send_all(s.url, share) for s, share in zip(servers, shares, strict=True))
            )

        start = probe.sample()
        asyncio.run(send())
        deadline = time.monotonic() + 600
        while probe.published() < total and time.monotonic() < deadline:
            time.sleep(0.2)
        seconds = time.monotonic() - start.at
        if probe.published() < total:
            raise RuntimeError(f"only {probe.published():.0f} of {total} published in 600 s")
        time.sleep(PG_STATS_LAG)
        end = probe.sample()
        spent = end - start
        marginal = spent - idle.scaled(end.at - start.at)
        input_tokens, output_tokens = asyncio.run(_tokens(db_url))
    return Run(
        processes=processes,
        events=total,
        seconds=seconds,
        per_event=marginal.scaled(1 / total),
        idle_per_second=idle.scaled(1 / processes),
        input_tokens=input_tokens / total,
        output_tokens=output_tokens / total,
    )


@dataclass
class Limits:
    claude_rpm: float
    claude_itpm: float
    claude_otpm: float


def _mean(runs: list[Run]) -> Run:
    n = len(runs)
    summed = runs[0].per_event
    for run in runs[1:]:
        summed = Sample(
            *(getattr(summed, f.name) + getattr(run.per_event, f.name) for f in fields(summed))
        )
    return Run(
        processes=0,
        events=sum(r.events for r in runs),
        seconds=sum(r.seconds for r in runs),
        per_event=summed.scaled(1 / n),
        idle_per_second=runs[0].idle_per_second,
        input_tokens=sum(r.input_tokens for r in runs) / n,
        output_tokens=sum(r.output_tokens for r in runs) / n,
    )


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def cost_rows(runs: list[Run]) -> list[str]:
    def row(label: str, get: object, digits: int = 1) -> list[object]:
        assert callable(get)
        return [label, *(_n(get(r), digits) for r in runs)]

    header = [
        "per event",
        *(f"{r.processes} process{'es' if r.processes > 1 else ''}" for r in runs),
    ]
    return table(
        header,
        [
            row("gateway CPU, ms", lambda r: r.per_event.gateway_cpu * 1000, 2),
            row("Redis commands", lambda r: r.per_event.redis_commands),
            row("Redis bytes in (to Redis)", lambda r: r.per_event.redis_in, 0),
            row("Redis bytes out (from Redis)", lambda r: r.per_event.redis_out, 0),
            row("Redis CPU, ms", lambda r: r.per_event.redis_cpu * 1000, 3),
            row("SQL statements sent", lambda r: r.per_event.sql_statements),
            row("PostgreSQL transactions", lambda r: r.per_event.pg_transactions),
            row(
                "PostgreSQL rows written (inserted + updated + deleted)",
                lambda r: r.per_event.pg_rows_written,
            ),
            row("PostgreSQL database growth, bytes", lambda r: r.per_event.pg_bytes, 0),
            row("PostgreSQL backend CPU, ms", lambda r: r.per_event.pg_cpu * 1000, 3),
            row("SNS calls (PublishBatch)", lambda r: r.per_event.sns_calls, 3),
            row("SNS messages", lambda r: r.per_event.sns_messages, 2),
            row("Claude calls", lambda r: r.per_event.claude_calls, 2),
            row("Claude input tokens (uncached + cache writes)", lambda r: r.input_tokens, 0),
            row("Claude output tokens", lambda r: r.output_tokens, 0),
            [
                "events, seconds to publish them all",
                *(f"{r.events:,}, {r.seconds:.1f} s" for r in runs),
            ],
        ],
    )


def needs(model: Run, limits: Limits) -> list[str]:
    e = model.per_event
    rows: list[list[object]] = []
    for rate in RATES:
        processes = math.ceil(rate * e.gateway_cpu / PLANNED_LOAD)
        shards = math.ceil(rate * e.redis_cpu / PLANNED_LOAD)
        partitions = max(processes, shards)
        over = " (over the maximum, 1024)" if partitions > MAX_PARTITIONS else ""
        redis_mib = rate * (e.redis_in + e.redis_out) / 2**20
        rows.append(
            [
                f"{rate:,}/s",
                processes,
                f"{partitions:,}{over}",
                f"{shards} ({_n(rate * e.redis_commands / 1000)}k commands/s, "
                f"{_n(redis_mib, 1)} MiB/s)",
                f"{_n(rate * e.sql_statements / 1000, 1)}k statements/s, "
                f"{_n(rate * e.pg_transactions / 1000, 1)}k transactions/s, "
                f"{_n(rate * e.pg_rows_written / 1000, 1)}k rows/s, "
                f"{_n(rate * e.pg_bytes * 86400 / 1e9)} GB/day, {_n(rate * e.pg_cpu, 1)} cores",
                f"{_n(rate * e.sns_calls)} calls/s, {_n(rate * e.sns_messages)} messages/s: "
                f"{math.ceil(rate * e.sns_messages / SNS_TOPIC_SCOPE)} topic(s) at topic scope, "
                f"{rate * e.sns_messages / SNS_ACCOUNT_US_EAST_1:.0%} of us-east-1's quota",
                f"{_n(rate * 60 * e.claude_calls / 1000)}k RPM, "
                f"{_n(rate * 60 * model.input_tokens / 1e6, 1)}M ITPM, "
                f"{_n(rate * 60 * model.output_tokens / 1e6, 1)}M OTPM "
                f"({rate * 60 * e.claude_calls / limits.claude_rpm:,.0f}x the example RPM)",
            ]
        )
    header = ["events/s", "gateway processes", "partitions", "Redis shards (commands, traffic)"]
    header += ["PostgreSQL (one primary)", "SNS FIFO", "Claude"]
    return table(header, rows)


def ceilings(model: Run, limits: Limits) -> list[tuple[str, float]]:
    e = model.per_event
    found = [
        ("one gateway process (one core at 70%)", PLANNED_LOAD / e.gateway_cpu),
        ("one Redis shard (its one command thread at 70%)", PLANNED_LOAD / e.redis_cpu),
        ("one PostgreSQL core (backend CPU only)", 1 / e.pg_cpu),
        (
            f"one SNS FIFO topic at topic scope ({SNS_TOPIC_SCOPE:,} messages/s)",
            SNS_TOPIC_SCOPE / e.sns_messages,
        ),
        (
            f"the account's SNS FIFO quota in us-east-1 ({SNS_ACCOUNT_US_EAST_1:,} messages/s)",
            SNS_ACCOUNT_US_EAST_1 / e.sns_messages,
        ),
        (
            f"Claude requests at {limits.claude_rpm:,.0f} RPM",
            limits.claude_rpm / 60 / e.claude_calls,
        ),
        (
            f"Claude input tokens at {limits.claude_itpm:,.0f} ITPM",
            limits.claude_itpm / 60 / model.input_tokens,
        ),
        (
            f"Claude output tokens at {limits.claude_otpm:,.0f} OTPM",
            limits.claude_otpm / 60 / model.output_tokens,
        ),
    ]
    return sorted(found, key=lambda item: item[1])


def render(runs: list[Run], limits: Limits, command: str) -> str:
    model = _mean(runs)
    ranked = ceilings(model, limits)
    idle = runs[0].idle_per_second
    first, first_rate = ranked[0]
    lines = [
        "# Capacity",
        "",
        "Generated by `python -m bench.capacity` (part of `make bench`); do not edit by hand.",
        f"Measured on: {machine()}. Command: `{command}`.",
        "",
        "## What one event costs",
        "",
        "Each event is a signed GitHub webhook that goes the whole path: verified, queued in",
        "Redis, decided by one call to a fake Messages API answering at once with one tool call,",
        "audited and written to the outbox in PostgreSQL, published to an SNS stand-in. Each",
        "figure is what one more event adds: the cost of the gateway's loops while idle is",
        f"measured first and taken off (idle, one process costs {idle.gateway_cpu * 1000:.1f} ms",
        f"of CPU, {idle.redis_commands:.0f} Redis commands and {idle.sql_statements:.1f} SQL",
        "statements a second). Gateway, Redis and PostgreSQL share this machine's 2 cores with",
        "the load sender and the stand-ins, so the CPU figures are higher than on machines of",
        "their own; the counts (commands, statements, rows, calls) do not depend on the machine.",
        "",
        *cost_rows(runs),
        "",
        "The two columns are the same deployment with 1 and 2 gateway processes sharing Redis",
        "and PostgreSQL: the costs per event do not grow with processes, and the model below",
        "takes their mean. Token figures are the fake's count for the benchmark's small GitHub",
        "issue payload; scale them by your own prompts' size (`python -m bench.prompt_size`).",
        "",
        "## What 1k, 10k and 100k events/s need",
        "",
        "Linear in the per-event costs above; processes and Redis shards planned at",
        f"{PLANNED_LOAD:.0%} of a core. A process works only on partitions it holds, and a",
        "partition's stream lives on one Redis shard, so `EVENTGATE_PARTITIONS` must be at least",
        "the larger of the two counts. GB/day is what the database grows before retention",
        "deletes finished events (`EVENTGATE_RETENTION_SECONDS`, 30 days by default), so the",
        "table holds about that many days of it. Claude is compared with an example",
        "organisation limit of",
        f"{limits.claude_rpm:,.0f} requests, {limits.claude_itpm:,.0f} input and",
        f"{limits.claude_otpm:,.0f} output tokens a minute; yours are in the Claude Console",
        "under Limits (pass them with `--claude-rpm`, `--claude-itpm`, `--claude-otpm`).",
        "",
        *needs(model, limits),
        "",
        "SNS FIFO quotas as AWS documents them (read 2026-12-02:",
        "[SNS endpoints and quotas](https://docs.aws.amazon.com/general/latest/gr/sns.html),",
        "[high-throughput FIFO topics]"
        "(https://docs.aws.amazon.com/sns/latest/dg/fifo-high-throughput.html)):",
        f"{SNS_TOPIC_SCOPE:,} messages/s per topic with `FifoThroughputScope=Topic`; with",
        "`MessageGroup` scope the account's regional quota (30,000 messages/s in us-east-1,",
        f"9,000 in us-west-2 and eu-west-1); {SNS_PER_GROUP} messages/s per message group",
        "whatever the scope, so one key (one group) never goes faster than that. Check your",
        "account's Service Quotas: they can be raised.",
        "",
        "## What saturates first",
        "",
        "Events/s that one unit of each part carries, lowest first:",
        "",
        *table(["part", "events/s"], [[name, _n(value)] for name, value in ranked]),
        "",
        f"With one of each, **{first}** is the limit, at {_n(first_rate)} events/s.",
        "Gateway processes scale out; PostgreSQL has one primary for all writes, so its write",
        "rate is a ceiling that no process count lifts; Claude's and SNS's limits are the",
        "account's.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Capacity model from measured costs")
    parser.add_argument("--events", type=int, default=1200)
    parser.add_argument("--claude-rpm", type=float, default=4_000)
    parser.add_argument("--claude-itpm", type=float, default=2_000_000)
    parser.add_argument("--claude-otpm", type=float, default=400_000)
    args = parser.parse_args()
    limits = Limits(args.claude_rpm, args.claude_itpm, args.claude_otpm)
    command = f"python -m bench.capacity --events {args.events}"
    runs = [measure(processes, args.events) for processes in (1, 2)]
    page = render(runs, limits, command)
    CAPACITY.write_text(page)
    report(
        "Capacity: costs per event with 1 and 2 processes (docs/capacity.md)",
        command,
        cost_rows(runs),
    )


if __name__ == "__main__":
    main()

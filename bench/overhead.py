"""Overhead: gateway CPU time per event through the whole path with zero LLM latency, and the
gateway's RSS with a 100 000-event backlog (the backlog must live in Redis, not in the process).

    python -m bench.overhead [--events 1200] [--backlog 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import (
    PYTHON,
    Server,
    database,
    drop_prefix,
    free_port,
    gateway_env,
    redis_prefix,
    report,
    require_redis,
    stream_depth,
    write_config,
)
from bench.pipeline import _requests, _send_all
from bench.wrk import require_wrk, run_wrk, write_script
from tests.support import SnsFixture

TARGET_RSS_MB = 250
IDLE_SECONDS = 3.0


def _services(latency: float) -> tuple[Server, Server]:
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    moto_port, fake_port = free_port(), free_port()
    moto = Server([PYTHON, "-m", "moto.server", "-p", str(moto_port)], env=env, port=moto_port)
    moto.ready_path = "/moto-api/"
    fake_argv = [PYTHON, "-m", "eventgate_dev.fake_anthropic", "--port", str(fake_port)]
    fake = Server([*fake_argv, "--latency", str(latency)], env=env, port=fake_port)
    fake.ready_path = "/_fake/stats"
    return moto, fake


def _gateway(tmp: Path, database_url: str, *, moto: str, fake: str) -> tuple[Server, str]:
    prefix = redis_prefix("overhead")
    sns = SnsFixture(moto, f"ovh{prefix[-8:]}", count_all=False)
    env = gateway_env(
        prefix=prefix,
        database_url=database_url,
        config=write_config(tmp, sns.topic_arn),
        extra={
            "EVENTGATE_LLM_MAX_CONCURRENCY": "64",
            "ANTHROPIC_BASE_URL": fake,
            "ANTHROPIC_API_KEY": "sk-ant-bench-not-real",
            "AWS_ENDPOINT_URL_SNS": moto,
            "EVENTGATE_RELAY_POLL_SECONDS": "0.2",
            # As in bench.pipeline: moto answers concurrent PublishBatch calls slower.
            "EVENTGATE_RELAY_BATCH_CONCURRENCY": "1",
        },
    )
    port = free_port()
    argv = [PYTHON, "-m", "app", "serve", "--port", str(port)]
    server = Server(argv, env=env, port=port, ready_path="/readyz")
    server.sns = sns  # type: ignore[attr-defined]
    return server, prefix


def cpu_per_event(events: int) -> list[str]:
    keys = max(1, events // 6)
    client = require_redis()
    moto, fake = _services(latency=0.0)
    with moto, fake, tempfile.TemporaryDirectory() as tmp, database("overhead") as db:
        server, prefix = _gateway(Path(tmp), db, moto=moto.url, fake=fake.url)
        try:
            with server, ThreadPoolExecutor(1) as subscriber:
                idle_before = server.cpu_seconds()
                time.sleep(IDLE_SECONDS)  # the polling loops' CPU, to tell apart below
                idle_rate = (server.cpu_seconds() - idle_before) / IDLE_SECONDS
                requests = _requests(keys, 6)
                cpu_before = server.cpu_seconds()
                started = time.perf_counter()
                # Drained while the webhooks go in: moto scans a queue's every message on each
                # send, so an undrained queue makes SNS (not eventgate) the slow part.
                receiving = subscriber.submit(
                    server.sns.receive,  # type: ignore[attr-defined]
                    server.sns.fifo_url,  # type: ignore[attr-defined]
                    expected=keys * 6,
                    timeout=300,
                )
                asyncio.run(_send_all(server.url, requests))
                got = receiving.result()
                elapsed = time.perf_counter() - started
                cpu = server.cpu_seconds() - cpu_before
        finally:
            drop_prefix(client, prefix)
    idle = idle_rate * elapsed
    return [
        f"- CPU per event, whole path (verify, enqueue, worker, Claude call, audit + outbox "
        f"transaction, SNS publish), zero LLM latency: **{cpu / len(got) * 1000:.2f} ms** "
        f"of gateway CPU ({len(got)} of {keys * 6} events published in {elapsed:.1f} s, "
        f"{cpu:.1f} s CPU; idle, its polling loops use {idle_rate:.1%} of a core, so "
        f"{idle / len(got) * 1000:.2f} ms per event of that is the time the run lasted)"
    ]


def backlog_rss(backlog: int) -> list[str]:
    require_wrk()
    client = require_redis()
    # Claude answers after 10 minutes: the worker holds its in-flight and buffered events only.
    moto, fake = _services(latency=600.0)
    with moto, fake, tempfile.TemporaryDirectory() as tmp, database("backlog") as db:
        server, prefix = _gateway(Path(tmp), db, moto=moto.url, fake=fake.url)
        redis_before = int(client.info("memory")["used_memory"])
        try:
            with server:
                idle_rss = server.memory_mb()
                # wrk's thread:stop() ends sending but not the run: send in 10 s rounds.
                depth, accepted, p99 = 0, 0, 0.0
                while depth < backlog:
                    quota = (backlog - depth) // 2 + 1  # per wrk thread
                    script = write_script(Path(tmp), quota=quota)
                    result = run_wrk(server.url, script, seconds=10, connections=32)
                    accepted += result.requests
                    p99 = max(p99, result.p99_ms)
                    depth = stream_depth(client, prefix)
                rss, peak = server.memory_mb(), server.memory_mb("VmHWM")
                redis_mb = (int(client.info("memory")["used_memory"]) - redis_before) / 2**20
        finally:
            drop_prefix(client, prefix)
    verdict = "met" if peak <= TARGET_RSS_MB else "NOT met"
    return [
        f"- backlog: {accepted:,} webhooks accepted by `eventgate serve` "
        f"(worst p99 of the rounds {p99:.0f} ms) while Claude never answers; "
        f"{depth:,} entries left on the Redis streams ({redis_mb:.0f} MB of Redis memory)",
        f"- gateway RSS: {idle_rss:.0f} MB idle → **{rss:.0f} MB** with the backlog, peak "
        f"{peak:.0f} MB (target ≤ {TARGET_RSS_MB} MB: {verdict})",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description="CPU per event and RSS with a backlog")
    parser.add_argument("--events", type=int, default=1200)
    parser.add_argument("--backlog", type=int, default=100_000)
    args = parser.parse_args()
    lines = cpu_per_event(args.events) + backlog_rss(args.backlog)
    report(
        "Overhead: CPU per event and memory with a backlog (eventgate serve)",
        f"python -m bench.overhead --events {args.events} --backlog {args.backlog}",
        lines,
    )


if __name__ == "__main__":
    main()

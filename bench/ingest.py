"""Ingest: signed GitHub deliveries/s through ``eventgate api`` (real Redis) vs a bare FastAPI
endpoint that reads the body and answers 202 — same loop and HTTP parser, same wrk, same run.

With 1 or 2 processes, each a server of its own on its own port (``eventgate api`` as
shipped, with its GC tuning and bounded HTTP protocol), each loaded by a wrk of its own, as
behind a load balancer. The gateway runs twice per process count: with
``EVENTGATE_INGEST_BATCHING=false`` (one Lua call per request: before) and with the default
batcher (after). Every run checks that the number of entries on the Redis streams equals the
number of requests wrk counted. Besides the servers' CPU per request, Redis's and wrk's are
measured: on a machine they all share, their sum is what bounds the requests per second.

    python -m bench.ingest [--seconds 10] [--connections 32]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    table,
    write_config,
)
from bench.wrk import require_wrk, run_wrk, write_script

TARGET_RATIO = 0.8  # issue 17: at least 0.8x the bare endpoint
TARGET_P99_MS = 25.0


@dataclass(frozen=True)
class Scenario:
    name: str
    processes: int
    gateway: bool
    batching: bool = True


SCENARIOS = [
    Scenario("bare FastAPI (reads body, 202)", 1, gateway=False),
    Scenario("eventgate api, Lua call per request (before)", 1, gateway=True, batching=False),
    Scenario("eventgate api, batched enqueue (after)", 1, gateway=True),
    Scenario("bare FastAPI (reads body, 202)", 2, gateway=False),
    Scenario("eventgate api, Lua call per request (before)", 2, gateway=True, batching=False),
    Scenario("eventgate api, batched enqueue (after)", 2, gateway=True),
]


def _argv(scenario: Scenario, port: int) -> list[str]:
    """One process: ``eventgate api`` as shipped (its GC tuning and bounded HTTP protocol
    included), or the bare app under uvicorn with the same loop and parser."""
    if scenario.gateway:
        return [PYTHON, "-m", "app", "api", "--port", str(port)]
    return [
        *(PYTHON, "-m", "uvicorn", "bench.apps:bare_app", "--factory", "--host", "127.0.0.1"),
        *("--port", str(port), "--log-level", "warning", "--no-access-log"),
    ]


@dataclass(frozen=True)
class Load:
    """What the processes' wrk runs counted together, and the CPU every party used."""

    requests: int
    rps: float
    p50_ms: float  # the highest of the processes'
    p99_ms: float  # the highest of the processes'
    errors: str
    server_cpu: float  # seconds, all server processes
    redis_cpu: float  # seconds, the Redis server (INFO cpu)
    wrk_cpu: float  # seconds, the wrk processes


def _redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _load(servers: list[Server], tmp: Path, *, seconds: int, connections: int) -> Load:
    """wrk against each process at once (its own script, so every request stays a new
    delivery), the connections and wrk's two threads split between them: a load balancer in
    front of separate processes."""
    client = require_redis()
    per = max(1, connections // len(servers))
    threads = max(1, 2 // len(servers))
    cpu_before, redis_before = sum(s.cpu_seconds() for s in servers), _redis_cpu(client)
    wrk_before = _children_cpu()
    with ThreadPoolExecutor(len(servers)) as pool:
        results = list(
            pool.map(
                lambda server: run_wrk(
                    server.url,
                    write_script(tmp),
                    seconds=seconds,
                    connections=per,
                    threads=threads,
                ),
                servers,
            )
        )
    errors = sum(r.status_errors for r in results), sum(r.socket_errors for r in results)
    return Load(
        requests=sum(r.requests for r in results),
        rps=sum(r.rps for r in results),
        p50_ms=max(r.p50_ms for r in results),
        p99_ms=max(r.p99_ms for r in results),
        errors=f"{errors[0]} non-2xx, {errors[1]} socket errors" if any(errors) else "",
        server_cpu=sum(s.cpu_seconds() for s in servers) - cpu_before,
        redis_cpu=_redis_cpu(client) - redis_before,
        wrk_cpu=_children_cpu() - wrk_before,
    )


def _run(
    scenario: Scenario, *, tmp: Path, database_url: str, seconds: int, connections: int
) -> tuple[Load, str]:
    client = require_redis()
    prefix = redis_prefix("ingest")
    env = gateway_env(
        prefix=prefix,
        database_url=database_url,
        config=write_config(tmp),
        extra={
            "EVENTGATE_AUTO_MIGRATE": "false",
            "EVENTGATE_INGEST_BATCHING": str(scenario.batching).lower(),
            # Nothing consumes here: at 9k requests/s two processes pass the default backlog
            # limit (100,000) within a run and the rest would be 503s, not ingest.
            "EVENTGATE_BACKLOG_MAX_DEPTH": "0",
        },
    )
    try:
        with ExitStack() as stack:
            servers = []
            for _ in range(scenario.processes):
                port = free_port()
                servers.append(
                    stack.enter_context(Server(_argv(scenario, port), env=env, port=port))
                )
            _load(servers, tmp, seconds=2, connections=connections)  # warm-up
            before_depth = stream_depth(client, prefix)
            load = _load(servers, tmp, seconds=seconds, connections=connections)
            check = "n/a"
            if scenario.gateway:
                queued = stream_depth(client, prefix) - before_depth
                # wrk counts answered requests; the warm-up and the run each leave one per
                # connection in flight at their end.
                in_range = load.requests <= queued <= load.requests + 2 * connections
                check = "ok" if in_range else f"{queued} queued for {load.requests}"
            if load.errors:
                check += f", {load.errors}"
    finally:
        drop_prefix(client, prefix)
    return load, check


def main() -> None:
    parser = argparse.ArgumentParser(description="ingest throughput vs a bare endpoint")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2, help="best of this many runs each")
    args = parser.parse_args()
    require_wrk()
    require_redis()
    rows: list[list[object]] = []
    bare: dict[int, Load] = {}
    ratios: dict[int, float] = {}
    shares: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp, database("ingest") as database_url:
        migrate_env = gateway_env(
            prefix="unused", database_url=database_url, config=write_config(Path(tmp))
        )
        subprocess.run([PYTHON, "-m", "app", "migrate"], env=migrate_env, check=True)
        for scenario in SCENARIOS:
            # Best of --repeat runs, bare and gateway alike: other tenants of a shared
            # machine slow single runs down by up to a third.
            runs = [
                _run(
                    scenario,
                    tmp=Path(tmp),
                    database_url=database_url,
                    seconds=args.seconds,
                    connections=args.connections,
                )
                for _ in range(args.repeat)
            ]
            load = max((run[0] for run in runs), key=lambda load: load.rps)
            check = "; ".join(sorted({run[1] for run in runs}))  # every run's check counts
            if not scenario.gateway:
                bare[scenario.processes] = load
            ratio = load.rps / bare[scenario.processes].rps
            if scenario.gateway and scenario.batching:
                ratios[scenario.processes] = ratio
                shares[scenario.processes] = _all_cpu(load) / _all_cpu(bare[scenario.processes])
            rows.append(
                [
                    scenario.name,
                    scenario.processes,
                    f"{load.rps:,.0f}",
                    f"{load.p50_ms:.1f}",
                    f"{load.p99_ms:.1f}",
                    f"{ratio:.2f}",
                    f"{load.server_cpu / load.requests * 1000:.3f}",
                    f"{load.redis_cpu / load.requests * 1000:.3f}",
                    f"{load.wrk_cpu / load.requests * 1000:.3f}",
                    f"{_all_cpu(load):.3f}",
                    check,
                ]
            )
            print(rows[-1], flush=True)
    verdicts = [
        f"{n} process{'es' if n > 1 else ''}: {ratio:.2f}x "
        f"({'met' if ratio >= TARGET_RATIO else 'NOT met'})"
        for n, ratio in sorted(ratios.items())
    ]
    cpu_lines = [
        f"{n} process{'es' if n > 1 else ''}: a request takes {share:.2f}x the bare "
        f"endpoint's CPU, server, Redis and wrk counted (while the machine's cores are all "
        f"busy, the ratio can be at most 1 / {share:.2f} = {1 / share:.2f})"
        for n, share in sorted(shares.items())
    ]
    report(
        "Ingest: signed GitHub deliveries/s, eventgate api vs bare FastAPI",
        f"python -m bench.ingest --seconds {args.seconds} --connections {args.connections} "
        f"--repeat {args.repeat}",
        [
            f"wrk, {args.connections} connections and 2 threads for {args.seconds} s (after a "
            f"2 s warm-up; best of {args.repeat} runs per row), signed "
            "GitHub `issues` deliveries (≈1 KB), unique `X-GitHub-Delivery` each; real Redis. "
            "Each process is a server of its own on its own port, `eventgate api` as shipped "
            "or the bare app under uvicorn (uvloop + httptools); with 2 processes each gets "
            "its own wrk with half the connections and one thread, as behind a load "
            "balancer. wrk and Redis run on the same machine. Ratio = rps / bare rps with "
            "the same process count. CPU per request: the server processes', the Redis "
            "server's (`INFO cpu`) and wrk's, and all three. Check: stream entries added = "
            "requests answered (+ ≤ 1 in flight per connection at the end of the warm-up "
            "and of the run).",
            "",
            *table(
                [
                    "server",
                    "procs",
                    "req/s",
                    "p50 ms",
                    "p99 ms",
                    "ratio",
                    "server CPU ms/req",
                    "Redis CPU ms/req",
                    "wrk CPU ms/req",
                    "all CPU ms/req",
                    "check",
                ],
                rows,
            ),
            "",
            f"- target ratio ≥ {TARGET_RATIO} with batched enqueue: " + "; ".join(verdicts),
            *(f"- {line}" for line in cpu_lines),
            f"- p99 target ≤ {TARGET_P99_MS:.0f} ms.",
        ],
    )


def _all_cpu(load: Load) -> float:
    """ms of CPU per request, server, Redis and wrk together."""
    return (load.server_cpu + load.redis_cpu + load.wrk_cpu) / load.requests * 1000


if __name__ == "__main__":
    main()

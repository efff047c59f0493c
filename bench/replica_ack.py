"""What a stronger 202 costs: signed GitHub deliveries/s through ``eventgate api`` with
``EVENTGATE_REDIS_ACK_REPLICAS=0`` (answered once the primary has the event) against ``1``
(after ``WAIT 1`` on every enqueue round trip), on a private primary with one replica on the
same machine, interleaved in the same run (0, 1, 0, 1 ...).

Both settings run against the same primary with the same replica attached, so the
replication itself costs the same in both; the difference is the wait. Every run checks that
the stream entries added on the primary equal the requests wrk counted, and that none was
answered 503.

    python -m bench.replica_ack [--seconds 10] [--connections 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import (
    PYTHON,
    Server,
    Skip,
    database,
    free_port,
    gateway_env,
    redis_prefix,
    report,
    stream_depth,
    table,
    write_config,
)
from bench.wrk import WrkResult, require_wrk, run_wrk, write_script
from tests.hardening.faults import ReplicatedRedis

SETTINGS = (0, 1)


@dataclass(frozen=True)
class Run:
    replicas: int
    result: WrkResult
    cpu_ms: float  # gateway CPU per request
    redis_us: float  # primary's CPU per request
    per_round_trip: float  # requests per enqueue round trip (EVALSHA calls)
    check: str


def _redis_counters(client: redis.Redis) -> tuple[float, int, int]:
    """The primary's CPU seconds, and its EVALSHA and WAIT calls so far."""
    cpu, stats = client.info("cpu"), client.info("commandstats")
    calls = [int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "wait")]
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls[0], calls[1]


def _run(
    replicas: int,
    *,
    pair: ReplicatedRedis,
    tmp: Path,
    database_url: str,
    seconds: int,
    connections: int,
) -> Run:
    client = redis.Redis(port=pair.primary_port)
    prefix = redis_prefix("ack")
    env = gateway_env(
        prefix=prefix,
        database_url=database_url,
        config=write_config(tmp),
        extra={
            "EVENTGATE_AUTO_MIGRATE": "false",
            "EVENTGATE_REDIS_URL": pair.url,
            "EVENTGATE_REDIS_ACK_REPLICAS": str(replicas),
        },
    )
    port = free_port()
    argv = [PYTHON, "-m", "app", "api", "--port", str(port)]
    with Server(argv, env=env, port=port) as server:
        run_wrk(server.url, write_script(tmp), seconds=2, connections=connections)  # warm-up
        depth = stream_depth(client, prefix)
        cpu, (redis_cpu, evals, waits) = server.cpu_seconds(), _redis_counters(client)
        result = run_wrk(server.url, write_script(tmp), seconds=seconds, connections=connections)
        cpu = server.cpu_seconds() - cpu
        redis_after, evals_after, waits_after = _redis_counters(client)
        queued = stream_depth(client, prefix) - depth
    # Each run's keys go with its prefix; the private Redis goes with the benchmark.
    in_range = result.requests <= queued <= result.requests + 2 * connections
    check = "ok" if in_range else f"{queued} queued for {result.requests}"
    round_trips = max(evals_after - evals, 1)
    if (waits_after - waits > 0) != (replicas > 0):
        check += f", {waits_after - waits} WAITs"
    if result.status_errors or result.socket_errors:
        check += f", {result.status_errors} non-2xx, {result.socket_errors} socket errors"
    per = max(result.requests, 1)
    return Run(
        replicas,
        result,
        cpu / per * 1000,
        (redis_after - redis_cpu) / per * 1e6,
        result.requests / round_trips,
        check,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="ingest with and without WAIT for a replica")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per setting")
    args = parser.parse_args()
    require_wrk()
    if shutil.which("redis-server") is None:
        raise Skip("redis-server is not installed (a private primary and replica are started)")
    runs: list[Run] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        database("replica_ack") as database_url,
    ):
        pair = ReplicatedRedis(Path(tmp)).start()
        try:
            migrate_env = gateway_env(
                prefix="unused", database_url=database_url, config=write_config(Path(tmp))
            )
            subprocess.run([PYTHON, "-m", "app", "migrate"], env=migrate_env, check=True)
            for _ in range(args.repeat):
                for replicas in SETTINGS:
                    run = _run(
                        replicas,
                        pair=pair,
                        tmp=Path(tmp),
                        database_url=database_url,
                        seconds=args.seconds,
                        connections=args.connections,
                    )
                    runs.append(run)
                    print(
                        f"replicas={replicas}: {run.result.rps:,.0f} req/s, p99 "
                        f"{run.result.p99_ms:.1f} ms, {run.cpu_ms:.3f} CPU ms/req, {run.check}",
                        flush=True,
                    )
        finally:
            pair.close()
    rows: list[list[object]] = []
    median_rps: dict[int, float] = {}
    for replicas in SETTINGS:
        mine = [run for run in runs if run.replicas == replicas]
        median_rps[replicas] = statistics.median(run.result.rps for run in mine)
        rows.append(
            [
                replicas,
                " / ".join(f"{run.result.rps:,.0f}" for run in mine),
                f"{median_rps[replicas]:,.0f}",
                f"{statistics.median(run.result.p50_ms for run in mine):.1f}",
                f"{statistics.median(run.result.p99_ms for run in mine):.1f}",
                f"{statistics.median(run.cpu_ms for run in mine):.3f}",
                f"{statistics.median(run.redis_us for run in mine):.1f}",
                f"{statistics.median(run.per_round_trip for run in mine):.1f}",
                "; ".join(sorted({run.check for run in mine})),
            ]
        )
    ratio = median_rps[1] / median_rps[0]
    report(
        "Ingest with a replica acknowledgement: EVENTGATE_REDIS_ACK_REPLICAS 0 vs 1",
        f"python -m bench.replica_ack --seconds {args.seconds} --connections "
        f"{args.connections} --repeat {args.repeat}",
        [
            f"wrk -t2 -c{args.connections} -d{args.seconds}s (after a 2 s warm-up), signed "
            "GitHub `issues` deliveries, unique each; one `eventgate api` process (batched "
            "enqueue); a private `redis-server` primary (no persistence) with one replica on "
            "the same machine, attached in both settings; runs interleaved "
            f"({args.repeat} per setting, in order). CPU = gateway CPU per request; Redis = "
            "the primary's CPU per request; req/round trip = requests per enqueue round trip "
            "(the primary's EVALSHA calls), each round trip ending with one WAIT with acks on. "
            "Check: stream entries added = requests answered "
            "(+ ≤ 1 in flight per connection at the end of the warm-up and of the run), WAITs "
            "only with acks on, no non-2xx.",
            "",
            *table(
                [
                    "ack replicas",
                    "req/s (each run)",
                    "median req/s",
                    "p50 ms",
                    "p99 ms",
                    "CPU ms/req",
                    "Redis µs/req",
                    "req/round trip",
                    "check",
                ],
                rows,
            ),
            "",
            f"Verdict: with `EVENTGATE_REDIS_ACK_REPLICAS=1` ingest runs at {ratio:.3f}x the "
            "requests/s of the default (medians).",
        ],
    )


if __name__ == "__main__":
    main()

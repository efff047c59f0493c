"""Cost per event: the gateway's CPU per event against ``bench.minimal``'s, in the same run.

Both servers take the same signed webhooks (zero Claude latency, moto for SNS, the subscriber
draining while they go in), one after the other and in alternation, so the ratio compares
rows of one hour on this shared machine. The gateway's figure includes its polling loops over
the run; their idle rate is measured and shown apart.

    python -m bench.cost_per_event [--events 1200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    PYTHON,
    Server,
    database,
    drop_prefix,
    free_port,
    report,
    require_redis,
    table,
)
from bench.overhead import _gateway, _services
from bench.pipeline import _requests, _send_all
from tests.support import SnsFixture

CONCURRENCY = 64
TARGET_MS = 2.0
# The figures: 3.9 ms against 1.2 ms for the minimal pipeline, to be brought to 2 ms.
# On this shared machine the minimal pipeline alone reads 1.1-2.0 ms from hour to hour, so
# the target is checked as the ratio it implies, against the minimal pipeline of the same
# round (its run is the one next to the gateway's in time).
TARGET_RATIO = TARGET_MS / 1.2
IDLE_SECONDS = 3.0


@dataclass
class Run:
    events: int
    seconds: float
    cpu: float
    idle_rate: float  # CPU seconds per second while idle, before the run

    @property
    def ms_per_event(self) -> float:
        return self.cpu / self.events * 1000

    @property
    def idle_ms_per_event(self) -> float:
        return self.idle_rate * self.seconds / self.events * 1000


def _timed(server: Server, sns: SnsFixture, events: int) -> Run:
    """A warm-up through the whole path, the idle rate, then ``events`` webhooks over
    ``events // 6`` keys with the subscriber draining as they go in."""
    asyncio.run(_send_all(server.url, _requests(CONCURRENCY, 1, "warm/repo")))
    sns.receive(sns.fifo_url, expected=CONCURRENCY, timeout=60)
    idle_before = server.cpu_seconds()
    time.sleep(IDLE_SECONDS)
    idle_rate = (server.cpu_seconds() - idle_before) / IDLE_SECONDS
    keys = max(1, events // 6)
    with ThreadPoolExecutor(1) as subscriber:
        cpu_before, started = server.cpu_seconds(), time.perf_counter()
        receiving = subscriber.submit(sns.receive, sns.fifo_url, expected=keys * 6, timeout=300)
        asyncio.run(_send_all(server.url, _requests(keys, 6)))
        got = receiving.result()
        seconds, cpu = time.perf_counter() - started, server.cpu_seconds() - cpu_before
    if len(got) != keys * 6:
        raise RuntimeError(f"{len(got)} of {keys * 6} messages arrived")
    return Run(len(got), seconds, cpu, idle_rate)


def gateway_run(events: int, moto: str, fake: str) -> Run:
    client = require_redis()
    with tempfile.TemporaryDirectory() as tmp, database("cost") as db:
        server, prefix = _gateway(Path(tmp), db, moto=moto, fake=fake)
        # As shipped: the relay polls once a second (the worker wakes it on new rows).
        server.env.pop("EVENTGATE_RELAY_POLL_SECONDS", None)
        try:
            with server:
                return _timed(server, server.sns, events)  # type: ignore[attr-defined]
        finally:
            drop_prefix(client, prefix)


def minimal_run(events: int, moto: str, fake: str) -> Run:
    sns = SnsFixture(moto, f"mincost{os.getpid()}x{time.monotonic_ns() % 10**6}", count_all=False)
    env = {
        **os.environ,
        "MINIMAL_TOPIC_ARN": sns.topic_arn,
        "MINIMAL_CONCURRENCY": str(CONCURRENCY),
        "ANTHROPIC_BASE_URL": fake,
        "AWS_ENDPOINT_URL_SNS": moto,
    }
    port = free_port()
    argv = [PYTHON, "-m", "uvicorn", "bench.minimal:minimal_app", "--factory"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    with Server(argv, env=env, port=port) as server:
        return _timed(server, sns, events)


def measure(events: int, rounds: int) -> list[str]:
    moto, fake = _services(latency=0.0)
    gateway: list[Run] = []
    minimal: list[Run] = []
    with moto, fake:
        for n in range(rounds):
            # Alternate which goes first, so a slower minute does not always fall on one side.
            order = [gateway, minimal] if n % 2 == 0 else [minimal, gateway]
            for runs in order:
                run = (gateway_run if runs is gateway else minimal_run)(events, moto.url, fake.url)
                runs.append(run)
                who = "gateway" if runs is gateway else "minimal"
                print(f"round {n + 1}: {who} {run.ms_per_event:.2f} ms/event", flush=True)
    gw = statistics.median(r.ms_per_event for r in gateway)
    mini = statistics.median(r.ms_per_event for r in minimal)
    idle = statistics.median(r.idle_ms_per_event for r in gateway)
    ratios = [g.ms_per_event / m.ms_per_event for g, m in zip(gateway, minimal, strict=True)]
    ratio = statistics.median(ratios)
    rows = [
        [
            n + 1,
            f"{g.ms_per_event:.2f}",
            f"{g.idle_ms_per_event:.2f}",
            f"{g.seconds:.1f}",
            f"{m.ms_per_event:.2f}",
            f"{m.seconds:.1f}",
            f"{g.ms_per_event / m.ms_per_event:.2f}",
        ]
        for n, (g, m) in enumerate(zip(gateway, minimal, strict=True))
    ]
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    return [
        f"{events} signed GitHub webhooks over {events // 6} keys per run, fake Claude with "
        f"zero latency, moto for SNS with an SQS FIFO subscriber draining; `eventgate serve` "
        f"(its defaults, PostgreSQL when reachable, C = {CONCURRENCY}) and `bench.minimal` "
        f"(per-key order and C only) alternate. CPU = the server process's CPU time over the "
        f"run, divided by the events published; the gateway's includes its polling loops "
        f"(idle rate times run time, shown apart).",
        "",
        *table(
            [
                "round",
                "gateway ms/event",
                "of it idle loops",
                "gateway s",
                "minimal ms/event",
                "minimal s",
                "ratio",
            ],
            rows,
        ),
        "",
        f"- median: gateway **{gw:.2f} ms** per event (polling loops {idle:.2f} ms of it), "
        f"minimal pipeline **{mini:.2f} ms**; median of the rounds' ratios **{ratio:.2f}** "
        f"(range {min(ratios):.2f}-{max(ratios):.2f})",
        f"- target: {TARGET_MS:.1f} ms where the minimal pipeline took 1.2 ms, so a ratio ≤ "
        f"{TARGET_RATIO:.2f}: {verdict} (the gateway's median alone is "
        f"{'within' if gw <= TARGET_MS else 'above'} {TARGET_MS:.1f} ms this run)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description="gateway CPU per event against bench.minimal")
    parser.add_argument("--events", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    report(
        "Cost per event: eventgate serve against the minimal pipeline, same run",
        f"python -m bench.cost_per_event --events {args.events} --rounds {args.rounds}",
        measure(args.events, args.rounds),
    )


if __name__ == "__main__":
    main()

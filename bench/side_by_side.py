"""Two revisions of the gateway side by side: CPU per event of each, under the same load at
the same time.

This machine's speed changes from minute to minute (the same code measured 3.5 to 5.7 ms per
event in one hour), so runs one after the other cannot resolve a change of a tenth. Here
both revisions run at once, each `eventgate serve` with its own Redis prefix and PostgreSQL
database, against one fake Claude (zero latency) and one fake SNS, and every round sends the
same signed webhooks to both; which one is sent to first alternates. CPU = each server
process's CPU time over the round, less its idle rate over the round, per event published.

    python -m bench.side_by_side BASE NEW [--rounds 4] [--events 1200] [--idle-seconds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.capacity import TOPIC_ARN
from bench.common import (
    PYTHON,
    ROOT,
    Server,
    database,
    drop_prefix,
    fake_sns_and_claude,
    free_port,
    gateway_env,
    redis_prefix,
    report,
    require_redis,
    table,
    write_config,
)
from bench.pipeline import _requests, _send_all

IDLE_SECONDS = 2.0
_PUBLISHED = re.compile(
    r'^eventgate_published_total\{[^}]*outcome="published"[^}]*\} ([0-9.e+]+)$', re.M
)


def _published(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(float(found) for found in _PUBLISHED.findall(text))


def _checkout(stack: ExitStack, revision: str) -> Path:
    """A detached worktree of ``revision``, removed on the way out."""
    where = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(where), revision],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    stack.callback(
        subprocess.run,
        ["git", "worktree", "remove", "--force", str(where)],
        cwd=ROOT,
        check=False,
        capture_output=True,
    )
    return where


def _round(
    servers: list[Server], events: int, number: int, idle_seconds: float = IDLE_SECONDS
) -> list[tuple[float, float, float]]:
    """(ms of CPU per event, seconds to publish all, idle CPU in ms per second) of each
    server for one round."""
    requests = _requests(events // 6, 6, f"round{number}/repo")
    before = [_published(s) for s in servers]
    idle_from, idle_at = [s.cpu_seconds() for s in servers], time.monotonic()
    time.sleep(idle_seconds)
    took = time.monotonic() - idle_at
    idle = [(s.cpu_seconds() - c) / took for s, c in zip(servers, idle_from, strict=True)]
    start, started = [s.cpu_seconds() for s in servers], time.monotonic()
    order = servers if number % 2 == 0 else servers[::-1]

    async def send() -> None:
        await asyncio.gather(*(_send_all(s.url, requests) for s in order))

    asyncio.run(send())
    done: list[tuple[float, float, float] | None] = [None] * len(servers)
    deadline = started + 600
    while any(d is None for d in done) and time.monotonic() < deadline:
        for k, server in enumerate(servers):
            if done[k] is None and _published(server) >= before[k] + events:
                seconds = time.monotonic() - started
                spent = server.cpu_seconds() - start[k] - idle[k] * seconds
                done[k] = (spent / events * 1000, seconds, idle[k] * 1000)
        time.sleep(0.1)
    if any(d is None for d in done):
        raise RuntimeError("a gateway did not publish every event in 600 s")
    return [d for d in done if d is not None]


def measure(
    base: str, new: str, rounds: int, events: int, idle_seconds: float = IDLE_SECONDS
) -> list[str]:
    client = require_redis()
    with ExitStack() as stack:
        trees = [_checkout(stack, base), _checkout(stack, new)]
        sns, claude = fake_sns_and_claude(stack)
        servers = []
        for n, tree in enumerate(trees):
            prefix = redis_prefix(f"side{n}")
            stack.callback(drop_prefix, client, prefix)
            db = stack.enter_context(database(f"side{n}"))
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            config = write_config(tmp, TOPIC_ARN)
            env = gateway_env(
                prefix=prefix,
                database_url=db,
                config=config,
                extra={
                    "EVENTGATE_LLM_MAX_CONCURRENCY": "64",
                    "ANTHROPIC_BASE_URL": claude.url,
                    "ANTHROPIC_API_KEY": "sk-ant-bench-not-real",
                    "AWS_ENDPOINT_URL_SNS": sns.url,
                },
            )
            port = free_port()
            argv = [PYTHON, "-m", "app", "serve", "--port", str(port)]
            server = Server(argv, env=env, port=port, ready_path="/readyz", cwd=tree)
            servers.append(stack.enter_context(server))
        warm = _requests(64, 1, "warm/repo")

        async def warm_up() -> None:
            await asyncio.gather(*(_send_all(s.url, warm) for s in servers))

        asyncio.run(warm_up())
        while any(_published(s) < 64 for s in servers):
            time.sleep(0.2)
        runs = [_round(servers, events, n, idle_seconds) for n in range(rounds)]
    rows = [
        [n + 1, f"{b[0]:.2f}", f"{b[1]:.1f}", f"{v[0]:.2f}", f"{v[1]:.1f}", f"{v[0] / b[0]:.2f}"]
        for n, (b, v) in enumerate(runs)
    ]
    ratios = [v[0] / b[0] for b, v in runs]
    base_ms = statistics.median(b[0] for b, _ in runs)
    new_ms = statistics.median(v[0] for _, v in runs)
    base_idle = statistics.median(b[2] for b, _ in runs)
    new_idle = statistics.median(v[2] for _, v in runs)
    return [
        f"{events} signed GitHub webhooks over {events // 6} keys per round to both "
        f"revisions at once (`eventgate serve` each, PostgreSQL, C = 64, fake Claude at zero "
        f"latency, fake SNS); base = {base}, new = {new}. Before each round both idle "
        f"{idle_seconds:.0f} s: that CPU (its polling loops) is measured apart and taken off "
        f"the round's.",
        "",
        *table(["round", "base ms/event", "base s", "new ms/event", "new s", "new / base"], rows),
        "",
        f"- new / base CPU per event: median **{statistics.median(ratios):.2f}** "
        f"({min(ratios):.2f}-{max(ratios):.2f}); base {base_ms:.2f} ms, new {new_ms:.2f} ms "
        f"(both share the 2 cores)",
        f"- idle, median of the rounds: base {base_idle:.1f} ms of CPU a second, new "
        f"{new_idle:.1f} ms (the CPU time's resolution is 10 ms per idle period)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description="two revisions' CPU per event, side by side")
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--events", type=int, default=1200)
    parser.add_argument("--idle-seconds", type=float, default=IDLE_SECONDS)
    args = parser.parse_args()
    report(
        "Side by side: CPU per event of two revisions under the same load at once",
        f"python -m bench.side_by_side {args.base} {args.new} --rounds {args.rounds} "
        f"--events {args.events} --idle-seconds {args.idle_seconds:g}",
        measure(args.base, args.new, args.rounds, args.events, args.idle_seconds),
    )


if __name__ == "__main__":
    main()

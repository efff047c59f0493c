"""Claude client: CPU per call of the anthropic SDK over its default transport (httpx2) and
over its aiohttp transport (``DefaultAioHttpClient``, what the gateway uses), C calls in
flight against the fake Messages API running as its own process. Alternating runs, best of
``--repeat`` per transport, so both see the same machine.

    python -m bench.claude_client [--calls 1000] [--concurrency 64] [--latency 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import uvloop
from anthropic import AsyncAnthropic, DefaultAioHttpClient

from bench.common import ALERT_TOOL, PYTHON, Server, free_port, report, table


async def timed_calls(
    transport: str, url: str, calls: int, concurrency: int
) -> tuple[float, float]:
    """(CPU ms per call in this process, wall seconds) for ``calls`` calls."""
    extra: dict[str, Any] = {}
    if transport == "aiohttp":
        extra["http_client"] = DefaultAioHttpClient()
    client = AsyncAnthropic(base_url=url, api_key="sk-bench-not-real", max_retries=0, **extra)
    slots = asyncio.Semaphore(concurrency)

    async def one(number: int) -> None:
        async with slots:
            raw = await client.messages.with_raw_response.create(
                model="claude-sonnet-4-6",
                max_tokens=512,
                system=[{"type": "text", "text": "You triage GitHub events."}],
                tools=[ALERT_TOOL],  # type: ignore[list-item]
                messages=[{"role": "user", "content": f"event {number} " + "x" * 1500}],
            )
            message = await raw.parse()
            assert message.stop_reason == "tool_use"

    try:
        await asyncio.gather(*(one(n) for n in range(concurrency)))  # connections and imports
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(calls)))
        return (time.process_time() - cpu) / calls * 1000, time.perf_counter() - wall
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="anthropic SDK CPU per call by transport")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    argv = [PYTHON, "-m", "app.testing.fake_anthropic", "--port", str(port)]
    argv += ["--latency", str(args.latency)]
    best: dict[str, tuple[float, float]] = {}
    with Server(argv, env=dict(os.environ), port=port, ready_path="/_fake/stats") as fake:
        for _ in range(args.repeat):
            for transport in ("httpx2", "aiohttp"):
                cpu, wall = uvloop.run(
                    timed_calls(transport, fake.url, args.calls, args.concurrency)
                )
                if transport not in best or cpu < best[transport][0]:
                    best[transport] = (cpu, wall)
    ideal = args.calls / args.concurrency * args.latency
    rows = [
        [
            f"SDK over {name}" + (" (gateway)" if name == "aiohttp" else ""),
            f"{cpu:.2f}",
            f"{wall:.2f}",
            f"{ideal / wall:.2f}",
        ]
        for name, (cpu, wall) in best.items()
    ]
    ratio = best["aiohttp"][0] / best["httpx2"][0]
    lines = [
        f"{args.calls} `messages.create` calls (tool use, ≈1.6 KB prompt), {args.concurrency} in "
        f"flight, fake Claude as a process with latency {args.latency} s; uvloop; best of "
        f"{args.repeat} alternating runs per transport. CPU = this process's CPU time per call.",
        "",
        *table(["client", "CPU ms/call", "wall s", "ideal / wall"], rows),
        "",
        f"aiohttp / httpx2 CPU per call: **{ratio:.2f}**",
    ]
    report(
        "Claude client: anthropic SDK CPU per call by transport",
        f"python -m bench.claude_client --calls {args.calls} --concurrency {args.concurrency} "
        f"--latency {args.latency} --repeat {args.repeat}",
        lines,
    )


if __name__ == "__main__":
    main()

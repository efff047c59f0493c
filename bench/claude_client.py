"""Claude client: CPU per call of the anthropic SDK over its default transport (httpx2), over
its aiohttp transport (``DefaultAioHttpClient``), and over that with the SDK's OpenTelemetry
spans off (``open_telemetry=False``: what the gateway builds), C calls in flight against the
fake Messages API running as its own process. Alternating runs, best of ``--repeat`` per
client, so all see the same machine.

    python -m bench.claude_client [--calls 1000] [--concurrency 64] [--latency 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import uvloop
from anthropic import AsyncAnthropic, DefaultAioHttpClient

from bench.common import ALERT_TOOL, PYTHON, Server, free_port, report, table

REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 512,
    "system": [{"type": "text", "text": "You triage GitHub events."}],
    "tools": [ALERT_TOOL],
}


GATEWAY = "aiohttp, spans off"


def _prompt(number: int) -> Any:  # the SDK wants its own TypedDicts
    return [{"role": "user", "content": f"event {number} " + "x" * 1500}]


async def _in_flight(
    one: Callable[[int], Awaitable[None]], calls: int, concurrency: int
) -> tuple[float, float]:
    """(CPU ms per call in this process, wall seconds) for ``calls`` calls of ``one``, at most
    ``concurrency`` at once, after a first round that opens connections and imports."""
    slots = asyncio.Semaphore(concurrency)

    async def limited(number: int) -> None:
        async with slots:
            await one(number)

    await asyncio.gather(*(limited(n) for n in range(concurrency)))
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(limited(n) for n in range(calls)))
    return (time.process_time() - cpu) / calls * 1000, time.perf_counter() - wall


async def timed_calls(
    transport: str, url: str, calls: int, concurrency: int
) -> tuple[float, float]:
    """``_in_flight`` for the anthropic SDK over ``transport`` (httpx2, aiohttp, or
    aiohttp with the SDK's spans off: ``GATEWAY``)."""
    extra: dict[str, Any] = {}
    if transport in ("aiohttp", GATEWAY):
        extra["http_client"] = DefaultAioHttpClient()
    if transport == GATEWAY:
        extra["open_telemetry"] = False
    client = AsyncAnthropic(base_url=url, api_key="sk-bench-not-real", max_retries=0, **extra)

    async def one(number: int) -> None:
        raw = await client.messages.with_raw_response.create(**REQUEST, messages=_prompt(number))
        message = await raw.parse()
        assert message.stop_reason == "tool_use"

    try:
        return await _in_flight(one, calls, concurrency)
    finally:
        await client.close()


async def plain_calls(url: str, calls: int, concurrency: int) -> tuple[float, float]:
    """``_in_flight`` for the same requests as plain aiohttp POSTs, without the SDK."""
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base_url=url, connector=connector) as client:

        async def one(number: int) -> None:
            body = orjson.dumps({**REQUEST, "messages": _prompt(number)})
            async with client.post("/v1/messages", data=body, headers=headers) as reply:
                assert orjson.loads(await reply.read())["stop_reason"] == "tool_use"

        return await _in_flight(one, calls, concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description="anthropic SDK CPU per call by transport")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    argv = [PYTHON, "-m", "eventgate_dev.fake_anthropic", "--port", str(port)]
    argv += ["--latency", str(args.latency)]
    best: dict[str, tuple[float, float]] = {}
    with Server(argv, env=dict(os.environ), port=port, ready_path="/_fake/stats") as fake:
        for _ in range(args.repeat):
            for transport in ("httpx2", "aiohttp", GATEWAY):
                cpu, wall = uvloop.run(
                    timed_calls(transport, fake.url, args.calls, args.concurrency)
                )
                if transport not in best or cpu < best[transport][0]:
                    best[transport] = (cpu, wall)
    ideal = args.calls / args.concurrency * args.latency
    rows = [
        [
            f"SDK over {name}" + (" (gateway)" if name == GATEWAY else ""),
            f"{cpu:.2f}",
            f"{wall:.2f}",
            f"{ideal / wall:.2f}",
        ]
        for name, (cpu, wall) in best.items()
    ]
    ratio = best["aiohttp"][0] / best["httpx2"][0]
    spans = best[GATEWAY][0] / best["aiohttp"][0]
    lines = [
        f"{args.calls} `messages.create` calls (tool use, ≈1.6 KB prompt), {args.concurrency} in "
        f"flight, fake Claude as a process with latency {args.latency} s; uvloop; best of "
        f"{args.repeat} alternating runs per transport. CPU = this process's CPU time per call.",
        "",
        *table(["client", "CPU ms/call", "wall s", "ideal / wall"], rows),
        "",
        f"aiohttp / httpx2 CPU per call: **{ratio:.2f}**; spans off / on over aiohttp: "
        f"**{spans:.2f}**",
    ]
    report(
        "Claude client: anthropic SDK CPU per call by transport",
        f"python -m bench.claude_client --calls {args.calls} --concurrency {args.concurrency} "
        f"--latency {args.latency} --repeat {args.repeat}",
        lines,
    )


if __name__ == "__main__":
    main()

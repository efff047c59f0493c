"""Pipeline: events/s from the first webhook to the last SNS publish, against the limit C/L and
against a sequential consume → call Claude → publish loop, with per-key order checked.

``eventgate serve``, the fake Claude (latency L) and moto (SNS FIFO → SQS FIFO, raw
delivery) each run as a process (real Redis, PostgreSQL when reachable), so this process only
sends webhooks and reads the queue. The end time is the SQS ``SentTimestamp`` of the last
message, i.e. when SNS delivered it. A warm-up of C events of other keys goes first.

Baselines measured in the same run, with the same stand-ins: the workload's own ceiling
(ceil(events / C) rounds of L); the fake Claude alone (the SDK with C calls in flight, no
pipeline); moto alone (the messages published at C/L); ``bench.minimal``, a pipeline that keeps
per-key order and C and nothing else; and the sequential loop.

    python -m bench.pipeline [--latency 0.5] [--concurrency 64] [--keys 100] [--per-key 6]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aioboto3
import aiohttp
import anthropic
import httpx
import orjson
import redis.asyncio as aioredis
import uvloop
from sqlalchemy import func, select

from app.store.db import create_engine, session_factory
from app.store.models import OutboxRow
from bench.claude_client import plain_calls, timed_calls
from bench.common import (
    ALERT_TOOL,
    GITHUB_SECRET,
    PYTHON,
    REDIS_URL,
    Server,
    database,
    drop_prefix,
    free_port,
    gateway_env,
    redis_prefix,
    report,
    require_redis,
    write_config,
)
from tests.support import SnsFixture, github_request, issue_payload

Requests = dict[str, list[tuple[bytes, dict[str, str]]]]
TARGET = 0.9  # x C/L


def _requests(keys: int, per_key: int, prefix: str = "bench/repo") -> Requests:
    """Signed GitHub deliveries per key, built before the clock starts: this process shares
    the 2 cores with the gateway, and signing is not part of what is measured."""
    return {
        f"{prefix}-{k}": [
            github_request(GITHUB_SECRET, issue_payload(f"{prefix}-{k}", number))
            for number in range(per_key)
        ]
        for k in range(keys)
    }


async def _send_all(url: str, requests: Requests) -> dict[str, list[str]]:
    """Each key's deliveries in order (one after the other), all keys at once.

    aiohttp, not httpx: with 100 concurrent connections httpx was the bottleneck here
    (600 requests took 6 s; aiohttp sends them in under 0.5 s).
    """
    sent: dict[str, list[str]] = {}
    connector = aiohttp.TCPConnector(limit=len(requests))
    async with aiohttp.ClientSession(base_url=url, connector=connector) as client:

        async def one_key(key: str) -> None:
            for body, headers in requests[key]:
                async with client.post("/v1/webhooks/github", data=body, headers=headers) as r:
                    r.raise_for_status()
                    sent.setdefault(key, []).append((await r.json())["event_id"])

        await asyncio.gather(*(one_key(key) for key in requests))
    return sent


async def _last_stored(database_url: str) -> float:
    engine = create_engine(database_url)
    async with session_factory(engine)() as session:
        latest = await session.scalar(select(func.max(OutboxRow.created_at)))
    await engine.dispose()
    assert latest is not None
    return float(latest.timestamp())


def _check_order(messages: list[dict[str, Any]], sent: dict[str, list[str]]) -> str:
    received: dict[str, list[str]] = {}
    for message in messages:
        body = orjson.loads(message["Body"])
        received.setdefault(message["Attributes"]["MessageGroupId"], []).append(body["event"]["id"])
    if received == sent:
        return "ok: every key in arrival order, each event once"
    wrong = [key for key in sent if received.get(key) != sent[key]]
    return f"FAILED for {len(wrong)} keys (e.g. {wrong[:3]})"


def _delivered_at(messages: list[dict[str, Any]]) -> float:
    """When SNS delivered the last of ``messages``: its SQS ``SentTimestamp``."""
    return max(int(m["Attributes"]["SentTimestamp"]) for m in messages) / 1000


@dataclass
class Timed:
    started: float
    ingest_done: float
    sent: dict[str, list[str]]
    messages: list[dict[str, Any]]
    cpu: float  # the server's CPU seconds over the timed part

    @property
    def elapsed(self) -> float:
        """First webhook sent → last message delivered."""
        return _delivered_at(self.messages) - self.started

    @property
    def rate(self) -> float:
        return len(self.messages) / self.elapsed


def _timed(server: Server, sns: SnsFixture, args: argparse.Namespace) -> Timed:
    """A warm-up of C events of other keys through the whole path, so pools, connections and
    lazy imports are in place as in a server that has been running; then the timed run."""
    asyncio.run(_send_all(server.url, _requests(args.concurrency, 1, "warm/repo")))
    sns.receive(sns.fifo_url, expected=args.concurrency, timeout=60)
    total = args.keys * args.per_key
    requests = _requests(args.keys, args.per_key)
    cpu_before = server.cpu_seconds()
    started = time.time()
    sent = asyncio.run(_send_all(server.url, requests))
    ingest_done = time.time()
    messages = sns.receive(sns.fifo_url, expected=total, timeout=120 + total)
    return Timed(started, ingest_done, sent, messages, server.cpu_seconds() - cpu_before)


def run_gateway(
    args: argparse.Namespace, latency: float, moto: str, fake: str
) -> tuple[list[str], Timed]:
    """The report lines, and the run's figures."""
    client = require_redis()
    prefix = redis_prefix("pipeline")
    sns = SnsFixture(moto, f"bench{prefix[-8:]}", count_all=False)
    total = args.keys * args.per_key
    with tempfile.TemporaryDirectory() as tmp, database("pipeline") as database_url:
        env = gateway_env(
            prefix=prefix,
            database_url=database_url,
            config=write_config(Path(tmp), sns.topic_arn),
            extra={
                "EVENTGATE_LLM_MAX_CONCURRENCY": str(args.concurrency),
                "ANTHROPIC_BASE_URL": fake,
                "ANTHROPIC_API_KEY": "sk-ant-bench-not-real",
                "AWS_ENDPOINT_URL_SNS": moto,
                "EVENTGATE_RELAY_POLL_SECONDS": "0.2",
                # moto answers concurrent PublishBatch calls slower than sequential ones
                # (about 41 vs 115 messages/s here); real SNS does not.
                "EVENTGATE_RELAY_BATCH_CONCURRENCY": "1",
            },
        )
        port = free_port()
        argv = [PYTHON, "-m", "app", "serve", "--port", str(port)]
        try:
            with Server(argv, env=env, port=port, ready_path="/readyz") as server:
                run = _timed(server, sns, args)
            stored = asyncio.run(_last_stored(database_url))
        finally:
            drop_prefix(client, prefix)
    stats = httpx.get(f"{fake}/_fake/stats", params={"since": run.started}).json()
    limit = args.concurrency / latency
    ratio = run.rate / limit
    # Every call takes L and a key's events go one at a time: total calls on C slots need at
    # least ceil(total / C) rounds of L, whatever the gateway does.
    rounds = math.ceil(total / args.concurrency)
    ceiling = total / (rounds * latency) / limit
    verdict = "met" if ratio >= TARGET else "missed"
    decided = stored - run.started
    return [
        f"**L = {latency} s**, C = {args.concurrency}, {total} events ({args.keys} keys x "
        f"{args.per_key}): {len(run.messages)} published in {run.elapsed:.2f} s (webhooks sent "
        f"in {run.ingest_done - run.started:.2f} s)",
        f"- eventgate: **{run.rate:.1f} events/s** = **{ratio:.3f} x C/L** "
        f"(C/L = {limit:.0f}/s; target ≥ {TARGET} x C/L: {verdict}); "
        f"Claude requests in flight at most {stats['max_in_flight']}",
        f"- ceiling of this workload: {total} calls of L on {args.concurrency} slots take at "
        f"least {rounds} x L = {rounds * latency:g} s, at most {ceiling:.3f} x C/L; eventgate "
        f"reached {ratio / ceiling:.1%} of it",
        f"- per-key order: {_check_order(run.messages, run.sent)}",
        f"- stages: first Claude request at {stats['first_at'] - run.started:.2f} s, last at "
        f"{stats['last_at'] - run.started:.2f} s; last Claude result stored (outbox row) at "
        f"{decided:.2f} s (decisions: {total / decided:.1f} events/s = "
        f"{total / decided / limit:.2f} x C/L), last SNS delivery at {run.elapsed:.2f} s",
        f"- gateway CPU: {run.cpu / total * 1000:.1f} ms per event, "
        f"{run.cpu / run.elapsed:.0%} of one core over the run",
    ], run


def run_minimal(args: argparse.Namespace, latency: float, moto: str, fake: str) -> Timed:
    """``bench.minimal`` through the same warm-up, sender, stand-ins and subscriber."""
    sns = SnsFixture(moto, f"minimal{os.getpid()}x{int(latency * 1000)}", count_all=False)
    env = {
        **os.environ,
        "MINIMAL_TOPIC_ARN": sns.topic_arn,
        "MINIMAL_CONCURRENCY": str(args.concurrency),
        "ANTHROPIC_BASE_URL": fake,
        "AWS_ENDPOINT_URL_SNS": moto,
    }
    port = free_port()
    argv = [PYTHON, "-m", "uvicorn", "bench.minimal:minimal_app", "--factory"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    with Server(argv, env=env, port=port) as server:
        return _timed(server, sns, args)


def _claude_alone(args: argparse.Namespace, fake: str, latency: float) -> str:
    """Can the Claude stand-in itself answer at C/L here? The same number of calls, C in
    flight, from the SDK over the gateway's transport, and as plain HTTP requests: no
    webhooks, queue or SNS."""
    total = args.keys * args.per_key
    limit = args.concurrency / latency
    _, sdk = uvloop.run(timed_calls("aiohttp", fake, total, args.concurrency))
    _, raw = uvloop.run(plain_calls(fake, total, args.concurrency))
    return (
        f"the fake Claude alone, no eventgate: {total} calls with {args.concurrency} in flight "
        f"took {sdk:.2f} s from the SDK (aiohttp transport, as the gateway) = "
        f"**{total / sdk / limit:.3f} x C/L**, and {raw:.2f} s as plain aiohttp requests = "
        f"{total / raw / limit:.3f} x C/L"
    )


def _moto_alone(args: argparse.Namespace, moto: Server, rate: float) -> str:
    """Can the SNS stand-in itself deliver ``rate`` messages/s here? The same number of
    messages (same groups, bodies of about 1 KB) published at that pace in PublishBatch calls
    of 10, one at a time as the relay does here, with the same subscriber draining."""
    sns = SnsFixture(moto.url, f"alone{os.getpid()}", count_all=False)
    total = args.keys * args.per_key
    got: list[dict[str, Any]] = []
    drain = threading.Thread(
        target=lambda: got.extend(sns.receive(sns.fifo_url, expected=total, timeout=120 + total))
    )
    cpu = moto.cpu_seconds()
    started = time.time()
    drain.start()
    for first in range(0, total, 10):
        time.sleep(max(0.0, started + first / rate - time.time()))
        sns.sns.publish_batch(
            TopicArn=sns.topic_arn,
            PublishBatchRequestEntries=[
                {
                    "Id": str(n),
                    "Message": orjson.dumps({"n": n, "pad": "x" * 900}).decode(),
                    "MessageGroupId": f"bench/repo-{n % args.keys}",
                    "MessageDeduplicationId": f"alone-{n}",
                }
                for n in range(first, min(first + 10, total))
            ],
        )
    drain.join()
    delivered = len(got) / (_delivered_at(got) - started)
    per_message = (moto.cpu_seconds() - cpu) / total * 1000
    return (
        f"moto alone, no eventgate: {total} messages published at C/L = {rate:.0f}/s (PublishBatch "
        f"calls of 10, one at a time, the same subscriber draining) were delivered at "
        f"**{delivered:.1f} messages/s = {delivered / rate:.2f} x C/L**, {per_message:.1f} ms of "
        "moto CPU per message"
    )


async def _sequential(args: argparse.Namespace, moto: str, fake: str) -> float:
    """The common hand-written loop: BRPOP an event, call Claude, publish, next."""
    sns_fixture = SnsFixture(moto, f"seq{os.getpid()}", count_all=False)
    key = f"{redis_prefix('sequential')}:list"
    client = aioredis.Redis.from_url(REDIS_URL)
    claude = anthropic.AsyncAnthropic(base_url=fake, api_key="sk-bench", max_retries=0)
    events = [issue_payload(f"bench/repo-{n % 10}", n) for n in range(args.sequential_events)]
    await client.lpush(key, *[orjson.dumps(event) for event in events])
    try:
        async with aioboto3.Session().client(
            "sns", endpoint_url=moto, region_name="us-east-1"
        ) as sns:
            started = time.perf_counter()
            for n in range(len(events)):
                popped = await client.brpop([key], timeout=5)
                assert popped is not None
                event = orjson.loads(popped[1])
                reply = await claude.messages.create(
                    model="claude-sonnet-4-6",
                    max_tokens=1024,
                    system="You triage GitHub events.",
                    tools=[ALERT_TOOL],  # type: ignore[list-item]
                    messages=[{"role": "user", "content": orjson.dumps(event).decode()}],
                )
                for block in reply.content:
                    if block.type == "tool_use":
                        await sns.publish(
                            TopicArn=sns_fixture.topic_arn,
                            Message=orjson.dumps(block.input).decode(),
                            MessageGroupId=event["repository"]["full_name"],
                            MessageDeduplicationId=f"seq-{n}",
                        )
            return len(events) / (time.perf_counter() - started)
    finally:
        await client.delete(key)
        await client.aclose()
        await claude.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="pipeline throughput vs C/L and a loop")
    parser.add_argument(
        "--latency", type=float, nargs="+", default=[0.5, 2.0], help="one run per latency"
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--per-key", type=int, default=6)
    parser.add_argument("--sequential-events", type=int, default=20)
    args = parser.parse_args()
    require_redis()
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    lines: list[str] = []
    for latency in args.latency:
        moto_port, fake_port = free_port(), free_port()
        moto_argv = [PYTHON, "-m", "moto.server", "-p", str(moto_port)]
        fake_argv = [PYTHON, "-m", "eventgate_dev.fake_anthropic", "--port", str(fake_port)]
        fake_argv += ["--latency", str(latency)]
        with (
            Server(moto_argv, env=env, port=moto_port, ready_path="/moto-api/") as moto,
            Server(fake_argv, env=env, port=fake_port, ready_path="/_fake/stats") as fake,
        ):
            others = moto.cpu_seconds(), fake.cpu_seconds()
            run, timed = run_gateway(args, latency, moto.url, fake.url)
            total = args.keys * args.per_key
            gateway_cpu = timed.cpu / total
            moto_cpu = (moto.cpu_seconds() - others[0]) / total
            fake_cpu = (fake.cpu_seconds() - others[1]) / total
            limit = args.concurrency / latency
            minimal = run_minimal(args, latency, moto.url, fake.url)
            run.append(
                f"- minimal pipeline, same run (`bench.minimal`: per-key order and C only, no "
                f"signature check, Redis, database, dedup, limits or breaker; same SDK, fake "
                f"Claude, moto, sender and subscriber): **{minimal.rate:.1f} events/s = "
                f"{minimal.rate / limit:.3f} x C/L**, per-key order "
                f"{_check_order(minimal.messages, minimal.sent)}, "
                f"{minimal.cpu / total * 1000:.1f} ms of CPU per event; eventgate reached "
                f"**{timed.rate / minimal.rate:.1%}** of it"
            )
            cores = (gateway_cpu + moto_cpu + fake_cpu) * limit
            run.append(
                f"- the other processes: moto (SNS → SQS FIFO, and the subscriber's receives) "
                f"{moto_cpu * 1000:.1f} ms of CPU per event, the fake Claude "
                f"{fake_cpu * 1000:.1f} ms; at C/L = {limit:.0f} events/s gateway + moto + "
                f"fake would need **{cores:.1f} cores** ({os.cpu_count()} here), and the one "
                f"gateway process alone could do at most {1 / gateway_cpu:.0f} events/s "
                f"(= {1 / gateway_cpu / limit:.2f} x C/L) on a core of its own"
            )
            print("\n".join(run), flush=True)
            lines += [*run, ""]
            if latency == args.latency[0]:
                alone = [
                    _claude_alone(args, fake.url, latency),
                    _moto_alone(args, moto, args.concurrency / latency),
                ]
                print("\n".join(alone), flush=True)
                lines += [alone[0], "", alone[1], ""]
                sequential = asyncio.run(_sequential(args, moto.url, fake.url))
                lines += [
                    f"Sequential consume → call → publish loop at L = {latency} s (same fake "
                    f"Claude and moto, {args.sequential_events} events): **{sequential:.2f} "
                    f"events/s**; eventgate is {timed.rate / sequential:.0f}x faster",
                    "",
                ]
    report(
        "Pipeline: webhook → Claude (fake, latency L) → SNS FIFO, eventgate serve",
        "python -m bench.pipeline --latency "
        + " ".join(str(x) for x in args.latency)
        + f" --concurrency {args.concurrency} --keys {args.keys} --per-key {args.per_key}",
        [
            "`eventgate serve` (one process), the fake Claude (fixed latency L, no jitter) and "
            "moto run as separate processes on the same 2 cores, real Redis and PostgreSQL. "
            "Each run starts after a warm-up of C events of other keys through the whole path "
            "(pools and connections open, as in a gateway that has been running). "
            "Events/s count from the first webhook to the last SNS delivery (the SQS "
            "`SentTimestamp` of the last message). Same-run baselines: the workload's ceiling, "
            "the fake Claude alone, moto alone, a minimal pipeline (`bench.minimal`: per-key "
            "order and C only) and a sequential loop.",
            "",
            *lines,
        ],
    )


if __name__ == "__main__":
    main()

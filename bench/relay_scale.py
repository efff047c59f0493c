"""Publish throughput with 1 and 2 relay processes: the outbox split by relay shards.

A fake SNS endpoint (aiohttp, in this process) answers Publish / PublishBatch after a fixed
latency per call (20 ms), as a real SNS far away would; moto cannot stand in here, its cost
grows with what its queues hold. 12,000 tool calls in 1,200 message groups (10 events each,
one call per event) are written to the outbox at once, with the relays already running and
their shards split; the clock runs from that commit to the last message reaching the fake
SNS. Each relay is an ``eventgate worker`` process (no Claude configured: it only publishes)
with its own port on the fake SNS, so the figures say how much each process sent. The fake
SNS checks each group's order and counts every deduplication id it got twice.

    python -m bench.relay_scale [--groups 1200] [--per-group 10] [--latency 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import orjson
import redis
from aiohttp import web
from sqlalchemy import insert

from app.leases import relay_shard_key
from app.store.db import create_engine
from app.store.migrate import upgrade_head
from app.store.models import EventRow, OutboxRow, OutboxStatus
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
    table,
    write_config,
)

TARGET = 1.7
SHARDS = 8
TOPIC = "arn:aws:sns:us-east-1:123456789012:relay-scale.fifo"
_XMLNS = 'xmlns="http://sns.amazonaws.com/doc/2010-03-31/"'


@dataclass
class Received:
    """What the fake SNS got: per port (one per relay process), per group, the clock."""

    by_port: dict[int, int] = field(default_factory=dict)
    groups: dict[str, list[int]] = field(default_factory=dict)
    dedup_ids: dict[str, int] = field(default_factory=dict)  # → the port that sent it first
    # (port of the first send, port of the second): the same port is one relay sending again
    second_sends: dict[tuple[int, int], int] = field(default_factory=dict)
    duplicates: int = 0
    calls: int = 0
    last_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, port: int, entries: Sequence[dict[str, str]]) -> None:
        with self.lock:
            self.calls += 1
            self.by_port[port] = self.by_port.get(port, 0) + len(entries)
            for entry in entries:
                first = self.dedup_ids.get(entry["MessageDeduplicationId"])
                if first is not None:
                    self.duplicates += 1
                    pair = (first, port)
                    self.second_sends[pair] = self.second_sends.get(pair, 0) + 1
                    continue
                self.dedup_ids[entry["MessageDeduplicationId"]] = port
                number = int(orjson.loads(entry["Message"])["event"]["id"].rsplit("_", 1)[1])
                self.groups.setdefault(entry["MessageGroupId"], []).append(number)
            self.last_at = time.monotonic()


class FakeSns:
    """Publish and PublishBatch on each of ``ports``, answered after ``latency`` seconds."""

    def __init__(self, ports: Sequence[int], latency: float) -> None:
        self.ports, self.latency = list(ports), latency
        self.received = Received()
        self._loop = asyncio.new_event_loop()
        self._runners: list[web.AppRunner] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        form = await request.post()
        action = str(form.get("Action"))
        await asyncio.sleep(self.latency)
        port = request.url.port or 0
        if action == "Publish":
            entry = {
                k: str(form[k]) for k in ("Message", "MessageGroupId", "MessageDeduplicationId")
            }
            self.received.add(port, [entry])
            body = (
                f"<PublishResponse {_XMLNS}><PublishResult><MessageId>{uuid.uuid4()}</MessageId>"
                "<SequenceNumber>1</SequenceNumber></PublishResult><ResponseMetadata>"
                "<RequestId>fake</RequestId></ResponseMetadata></PublishResponse>"
            )
            return web.Response(text=body, content_type="text/xml")
        if action == "PublishBatch":
            entries: list[dict[str, str]] = []
            for n in range(1, 11):
                key = f"PublishBatchRequestEntries.member.{n}."
                if key + "Id" not in form:
                    break
                entries.append(
                    {
                        name: str(form[key + name])
                        for name in ("Id", "Message", "MessageGroupId", "MessageDeduplicationId")
                    }
                )
            self.received.add(port, entries)
            members = "".join(
                f"<member><Id>{e['Id']}</Id><MessageId>{uuid.uuid4()}</MessageId>"
                "<SequenceNumber>1</SequenceNumber></member>"
                for e in entries
            )
            body = (
                f"<PublishBatchResponse {_XMLNS}><PublishBatchResult><Successful>{members}"
                "</Successful><Failed></Failed></PublishBatchResult><ResponseMetadata>"
                "<RequestId>fake</RequestId></ResponseMetadata></PublishBatchResponse>"
            )
            return web.Response(text=body, content_type="text/xml")
        error = (
            "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidAction</Code>"
            f"<Message>{action} is not faked</Message></Error><RequestId>fake</RequestId>"
            "</ErrorResponse>"
        )
        return web.Response(status=400, text=error, content_type="text/xml")

    async def _start(self) -> None:
        for port in self.ports:
            app = web.Application()
            app.router.add_post("/", self._handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self._runners.append(runner)

    async def _stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def __enter__(self) -> FakeSns:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def fill(url: str, *, groups: int, per_group: int) -> float:
    """Write every event and tool call in one transaction; the monotonic time of its commit."""
    engine = create_engine(url)
    now = datetime.now(UTC)
    numbers = [(g, k) for k in range(per_group) for g in range(groups)]  # ids: k order per g
    events = [
        {
            "id": f"evt_{g}_{k}",
            "source": "github",
            "type": "issues.opened",
            "group_key": f"acme/repo-{g}",
            "delivery_id": f"d{g}_{k}",
            "pipeline": "triage",
            "status": "processing",
            "payload": {},
            "received_at": now,
            "deliveries": 1,
        }
        for g, k in numbers
    ]
    rows = [
        {
            "event_id": f"evt_{g}_{k}",
            "source": "github",
            "seq": 0,
            "llm_call_id": f"llm_{g}_{k}",
            "tool": "publishAlert",
            "topic_arn": TOPIC,
            "group_id": f"acme/repo-{g}",
            "dedup_id": f"dedup-{g}-{k}",
            "body": orjson.dumps(
                {
                    "tool": "publishAlert",
                    "input": {"severity": "high", "title": "x" * 200},
                    "event": {"id": f"evt_{g}_{k}", "group_key": f"acme/repo-{g}"},
                    "sequence": 0,
                }
            ).decode(),
            "status": OutboxStatus.PENDING,
        }
        for g, k in numbers
    ]
    async with engine.begin() as connection:
        for start in range(0, len(events), 2000):
            await connection.execute(insert(EventRow), events[start : start + 2000])
            await connection.execute(insert(OutboxRow), rows[start : start + 2000])
    committed = time.monotonic()
    await engine.dispose()
    return committed


def wait_for_split(client: redis.Redis, prefix: str, processes: int, timeout: float = 60) -> None:
    """Until every shard is held and each process holds its share."""
    deadline = time.monotonic() + timeout
    keys = [relay_shard_key(prefix, shard) for shard in range(SHARDS)]
    while time.monotonic() < deadline:
        owners = client.mget(keys)
        if all(owners):
            counts = [owners.count(o) for o in set(owners)]
            if len(counts) == processes and max(counts) - min(counts) <= 1:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the shards were not split between {processes} relays in {timeout} s")


@dataclass
class Run:
    processes: int
    elapsed: float
    received: Received
    cpu: float
    warnings: dict[str, int]

    @property
    def rate(self) -> float:
        return len(self.received.dedup_ids) / self.elapsed


def run(args: argparse.Namespace, processes: int) -> Run:
    client = require_redis()
    prefix = redis_prefix("relay-scale")
    total = args.groups * args.per_group
    ports = [free_port() for _ in range(processes)]
    with (
        database(f"relay_scale_{processes}") as url,
        tempfile.TemporaryDirectory() as tmp,
        FakeSns(ports, args.latency) as sns,
        ExitStack() as stack,
    ):
        # Last, after the relays stopped: deleting their leases under them would hand every
        # shard to whichever relay looks first, and it would send again what another relay
        # had sent but not yet marked (the published memory goes with the prefix too).
        stack.callback(drop_prefix, client, prefix)
        upgrade_head(url)
        config = write_config(Path(tmp), TOPIC)
        servers = []
        for port in ports:
            env = gateway_env(
                prefix=prefix,
                database_url=url,
                config=config,
                extra={
                    "AWS_ENDPOINT_URL_SNS": f"http://127.0.0.1:{port}",
                    "EVENTGATE_AUTO_MIGRATE": "false",
                    "EVENTGATE_LOG_LEVEL": "warning",
                    # Both runs find the rows within 50 ms of their commit.
                    "EVENTGATE_RELAY_POLL_SECONDS": "0.05",
                    "EVENTGATE_RELAY_SHARDS": str(SHARDS),
                },
            )
            http = free_port()
            argv = [PYTHON, "-m", "app", "worker", "--port", str(http)]
            servers.append(stack.enter_context(Server(argv, env=env, port=http)))
        wait_for_split(client, prefix, processes)
        cpu_before = sum(s.cpu_seconds() for s in servers)
        committed = asyncio.run(fill(url, groups=args.groups, per_group=args.per_group))
        deadline = time.monotonic() + args.timeout
        while len(sns.received.dedup_ids) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu = sum(s.cpu_seconds() for s in servers) - cpu_before
        if len(sns.received.dedup_ids) < total:
            raise RuntimeError(
                f"{len(sns.received.dedup_ids)} of {total} published in {args.timeout} s:\n"
                + servers[0].output()
            )
        finished = sns.received.last_at
        time.sleep(1)  # second sends that were still on their way
        with sns.received.lock:  # what the stopping relays send is not the run's
            received = copy.deepcopy({k: v for k, v in vars(sns.received).items() if k != "lock"})
        return Run(
            processes,
            finished - committed,
            Received(**received),
            cpu,
            _warnings(servers),
        )


def _warnings(servers: Sequence[Server]) -> dict[str, int]:
    """How often the relays logged each warning or error event (publish retries, shards
    lost ...)."""
    found: dict[str, int] = {}
    for server in servers:
        server.log.flush()
        for line in Path(server.log.name).read_text(errors="replace").splitlines():
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(entry, dict) and entry.get("level") in ("warning", "error"):
                name = f"{entry.get('event')} {entry.get('code') or ''}".strip()
                found[name] = found.get(name, 0) + 1
    return found


def _order(received: Received, per_group: int) -> str:
    wrong = [g for g, numbers in received.groups.items() if numbers != list(range(per_group))]
    return "every group in order" if not wrong else f"{len(wrong)} groups out of order"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1_200)
    parser.add_argument("--per-group", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved 1- and 2-process runs")
    args = parser.parse_args()
    runs: list[Run] = []
    for _ in range(args.rounds):  # interleaved: a busy moment of the machine hits both
        for processes in (1, 2):
            runs.append(run(args, processes))
            last = runs[-1]
            print(
                f"{processes} process(es): {last.rate:.0f}/s, relay warnings "
                f"{last.warnings or 'none'}, second sends (first port, second port) "
                f"{last.received.second_sends or 'none'}",
                flush=True,
            )
    rates = {n: sorted(r.rate for r in runs if r.processes == n) for n in (1, 2)}
    ratio = statistics.median(rates[2]) / statistics.median(rates[1])
    rows = [
        [
            r.processes,
            f"{r.elapsed:.2f} s",
            f"**{r.rate:.0f}/s**",
            " + ".join(str(n) for n in r.received.by_port.values()),
            r.received.calls,
            r.received.duplicates,
            _order(r.received, args.per_group),
            f"{r.cpu:.1f} s",
        ]
        for r in runs
    ]
    total = args.groups * args.per_group
    verdict = "met" if ratio >= TARGET else "missed"
    report(
        "Relay scale: publish throughput with 1 and 2 relay processes",
        "python -m bench.relay_scale "
        f"--groups {args.groups} --per-group {args.per_group} --latency {args.latency}",
        [
            f"{total} tool calls in {args.groups} groups, a fake SNS answering each call after "
            f"{args.latency * 1000:g} ms, {SHARDS} relay shards, default relay settings "
            "(4 PublishBatch calls in flight per process) but a 50 ms poll:",
            "",
            *table(
                [
                    "relay processes",
                    "all published in",
                    "messages/s",
                    "sent per process",
                    "SNS calls",
                    "sent twice",
                    "per-group order",
                    "relays' CPU",
                ],
                rows,
            ),
            "",
            f"- 2 processes / 1 process, medians of {args.rounds} interleaved runs each: "
            f"**{ratio:.3f}x** (target ≥ {TARGET}x: {verdict}); per-round ratios "
            + ", ".join(
                f"{two.rate / one.rate:.2f}x"
                for one, two in zip(runs[::2], runs[1::2], strict=True)
            ),
            f"- ceiling of one process: 4 calls of 10 in flight per {args.latency * 1000:g} ms "
            f"= {4 * 10 / args.latency:.0f} messages/s",
        ],
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

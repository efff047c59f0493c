"""A chaos run: several ``eventgate serve`` processes on one Redis (AOF) and one PostgreSQL take
a stream of webhooks over many keys while, every few seconds, one process is SIGKILLed and
restarted or frozen past its lease TTL (SIGSTOP, then SIGCONT), Redis is killed and restarted
once, and Claude fails a share of calls and is down for a while.

What a subscriber of the SNS FIFO topic received is then checked: every accepted event
exactly once (counted by ``MessageDeduplicationId``: moto forgets a dedup id once its message
is deleted, real SNS FIFO would drop the re-publish), in arrival order per key; nothing
dead-lettered; and every Claude call has an audit row: at least as many rows as requests
Claude received, and every request Claude answered is named by a row, or is one of the rows
that cannot name theirs (status ``unknown``: the process was killed mid-call; or a timeout:
the process was frozen past its call's timeout).

Used by ``tests/hardening/test_chaos.py`` (a short run, in CI) and ``bench/chaos.py``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from sqlalchemy import func, select

from app.store.db import create_engine, session_factory
from app.store.models import DeadLetterRow, EventRow, LlmCallRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.hardening.faults import PrivateRedis
from tests.support import (
    GatewayProcess,
    SnsFixture,
    gateway_config,
    gateway_env,
    github_request,
    issue_payload,
)

SECRET = "chaos-github-secret-000001"


@dataclass
class ChaosPlan:
    events: int = 1000
    keys: int = 50
    processes: int = 3
    lease_ttl_ms: int = 3000
    freeze_seconds: float = 6.0
    every: tuple[float, float] = (6.0, 10.0)  # seconds between two faults
    claude_fail_ratio: float = 0.16
    claude_down_seconds: float = 15.0
    claude_latency: float = 0.05
    restart_redis: bool = True
    # Each key's events are spread over about this long, so the faults hit a stream in flow.
    send_seconds: float = 90.0
    # Faults go on after the last webhook (hitting the events still in processing) until
    # at least this many were made: how many fit in the sending time depends on how fast
    # a killed process is back, which a loaded machine stretches.
    min_faults: int = 0
    settle_timeout: float = 240.0
    seed: int = 7


@dataclass
class ChaosReport:
    accepted: int = 0
    received_dedup_ids: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order_keys: int = 0
    dead_lettered: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    claude_requests: int = 0
    audit_rows: int = 0
    unknown_rows: int = 0
    # Rows that cannot name their request: outcome unknown (the process died mid-call), or
    # a timeout or lost connection (a frozen process wakes up past its call's timeout).
    rows_without_request_id: int = 0
    unaudited: int = 0
    faults: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.out_of_order_keys == 0
            and self.dead_lettered == 0
            and self.audit_rows >= self.claude_requests
            and self.unaudited <= self.rows_without_request_id
        )

    def line(self) -> str:
        return (
            f"chaos: events={self.accepted} received={self.received_dedup_ids} lost={self.lost} "
            f"duplicated={self.duplicated} out_of_order_keys={self.out_of_order_keys} "
            f"dead_lettered={self.dead_lettered} claude_requests={self.claude_requests} "
            f"audit_rows={self.audit_rows} unknown_rows={self.unknown_rows} "
            f"rows_without_request_id={self.rows_without_request_id} "
            f"answered_without_row={self.unaudited} faults={len(self.faults)} "
            f"seconds={self.seconds:.0f} statuses={self.statuses}"
        )


class ChaosRun:
    def __init__(
        self,
        *,
        plan: ChaosPlan,
        workdir: Path,
        sns: SnsFixture,
        fake_claude: FakeAnthropicServer,
        database_url: str,
        redis_prefix: str,
        moto_endpoint: str,
    ) -> None:
        self.plan = plan
        self.workdir = workdir
        self.sns = sns
        self.fake = fake_claude
        self.database_url = database_url
        self.prefix = redis_prefix
        self.moto = moto_endpoint
        self.random = random.Random(plan.seed)
        self.redis = PrivateRedis(workdir, aof=True)
        self.config = workdir / "chaos.yaml"
        self.config.write_text(gateway_config(sns.topic_arn, secret=SECRET))
        self.gateways: list[GatewayProcess] = []
        self.frozen: set[int] = set()
        self.report = ChaosReport()
        self.received: list[dict[str, Any]] = []
        self._draining = threading.Event()
        self._starts = 0

    def run(self) -> ChaosReport:
        started = time.monotonic()
        self.redis.start()
        drainer = threading.Thread(target=self._drain, daemon=True)
        try:
            self.gateways = [self._start() for _ in range(self.plan.processes)]
            for gateway in self.gateways:
                gateway.wait_ready()
            drainer.start()
            accepted = asyncio.run(self._send_with_chaos())
            for index in self.frozen:
                os.kill(self.gateways[index].proc.pid, signal.SIGCONT)
            self.frozen.clear()
            asyncio.run(self._settle(accepted))
            time.sleep(3)  # the last deliveries reach the queue
        finally:
            self._draining.set()
            drainer.join(30)
            for gateway in self.gateways:
                if gateway.proc.poll() is None:
                    os.kill(gateway.proc.pid, signal.SIGCONT)
                gateway.stop()
            self.redis.kill()
        self._check(accepted)
        asyncio.run(self._check_store())
        self.report.seconds = time.monotonic() - started
        return self.report

    def _start(self) -> GatewayProcess:
        self._starts += 1
        return GatewayProcess(
            log_path=self.workdir / f"gw{self._starts}.log",
            env=gateway_env(
                config=self.config,
                redis_url=self.redis.url,
                redis_prefix=self.prefix,
                database_url=self.database_url,
                claude_url=self.fake.base_url,
                sns_endpoint=self.moto,
                EVENTGATE_LEASE_TTL_MS=str(self.plan.lease_ttl_ms),
                EVENTGATE_LLM_MAX_CONCURRENCY="8",
                EVENTGATE_LLM_TIMEOUT_SECONDS="5",
                EVENTGATE_SHUTDOWN_GRACE_SECONDS="3",
                EVENTGATE_RELAY_POLL_SECONDS="0.5",
            ),
        )

    async def _send_with_chaos(self) -> dict[str, list[str]]:
        behaviour = self.fake.behaviour
        behaviour.latency = self.plan.claude_latency
        behaviour.fail_ratio = self.plan.claude_fail_ratio
        sending = asyncio.create_task(self._send_all())
        faults = asyncio.create_task(self._faults())
        try:
            sent = await sending
            deadline = time.monotonic() + 120
            while len(self.report.faults) < self.plan.min_faults and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            return sent
        finally:
            faults.cancel()
            await asyncio.gather(faults, return_exceptions=True)

    async def _faults(self) -> None:
        """One fault every few seconds, in a fixed order: kill, freeze, Claude down, Redis."""
        kinds = ["kill", "freeze", "claude", "kill", "redis", "freeze"]
        if not self.plan.restart_redis:
            kinds.remove("redis")
        step = 0
        while True:
            await asyncio.sleep(self.random.uniform(*self.plan.every))
            kind = (
                kinds[step % len(kinds)]
                if step < len(kinds)
                else self.random.choice(["kill", "freeze"])
            )
            step += 1
            await self._fault(kind)

    async def _fault(self, kind: str) -> None:
        candidates = [i for i in range(len(self.gateways)) if i not in self.frozen]
        index = self.random.choice(candidates)
        gateway = self.gateways[index]
        self.report.faults.append(f"{time.monotonic():.1f} {kind} gw#{index}")
        if kind == "kill":
            gateway.kill()
            self.gateways[index] = self._start()
            await asyncio.to_thread(self.gateways[index].wait_ready, 60, "/healthz")
        elif kind == "freeze":
            os.kill(gateway.proc.pid, signal.SIGSTOP)
            self.frozen.add(index)
            await asyncio.sleep(self.plan.freeze_seconds)
            os.kill(gateway.proc.pid, signal.SIGCONT)
            self.frozen.discard(index)
        elif kind == "claude":
            self.fake.behaviour.down_until = time.monotonic() + self.plan.claude_down_seconds
        elif kind == "redis":
            self.redis.kill()
            await asyncio.sleep(1)
            self.redis.start()

    def _live_urls(self) -> list[str]:
        return [
            g.url
            for i, g in enumerate(self.gateways)
            if i not in self.frozen and g.proc.poll() is None
        ]

    async def _send_all(self) -> dict[str, list[str]]:
        """Each key's events one after another (its arrival order), keys in parallel; a
        failed or unanswered request is sent again, same delivery id, to another process."""
        accepted: dict[str, list[str]] = {}
        per_key = self.plan.events // self.plan.keys
        pause = self.plan.send_seconds / per_key

        async def one_key(session: aiohttp.ClientSession, k: int) -> None:
            repo = f"acme/chaos-{k:03d}"
            accepted[repo] = []
            for n in range(per_key):
                body, headers = github_request(
                    SECRET, issue_payload(repo, n), delivery=f"{repo}#{n}"
                )
                for attempt in range(400):
                    urls = self._live_urls()
                    if not urls:
                        await asyncio.sleep(0.2)
                        continue
                    url = urls[(k + attempt) % len(urls)]
                    try:
                        async with session.post(
                            f"{url}/v1/webhooks/github", data=body, headers=headers
                        ) as reply:
                            if reply.status in (200, 202):
                                event_id = (await reply.json())["event_id"]
                                if event_id not in accepted[repo]:
                                    accepted[repo].append(event_id)
                                break
                    except (aiohttp.ClientError, TimeoutError):
                        pass
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError(f"{repo} #{n} was never accepted")
                await asyncio.sleep(self.random.uniform(0, 2 * pause))

        timeout = aiohttp.ClientTimeout(total=3)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(one_key(session, k) for k in range(self.plan.keys)))
        self.report.accepted = sum(len(ids) for ids in accepted.values())
        return accepted

    async def _settle(self, accepted: dict[str, list[str]]) -> None:
        total = sum(len(ids) for ids in accepted.values())
        engine = create_engine(self.database_url)
        try:
            deadline = time.monotonic() + self.plan.settle_timeout
            while time.monotonic() < deadline:
                async with session_factory(engine)() as session:
                    done = await session.scalar(
                        select(func.count())
                        .select_from(EventRow)
                        .where(EventRow.status.in_(("published", "dead_lettered")))
                    )
                if done == total:
                    return
                await asyncio.sleep(1)
        finally:
            await engine.dispose()

    def _drain(self) -> None:
        """Read the subscriber's queue while the run goes on (moto slows down with what it
        holds), until told to stop and a quiet second has passed."""
        while True:
            got = self.sns.receive(self.sns.fifo_url, expected=10_000, timeout=1)
            self.received += got
            if not got and self._draining.is_set():
                return

    def _check(self, accepted: dict[str, list[str]]) -> None:
        first_seen: dict[str, list[str]] = {}
        dedup_ids_per_event: dict[str, set[str]] = {}
        for message in self.received:
            body = orjson.loads(message["Body"])
            event_id = body["event"]["id"]
            dedup = message["Attributes"]["MessageDeduplicationId"]
            dedup_ids_per_event.setdefault(event_id, set()).add(dedup)
            ids = first_seen.setdefault(body["event"]["group_key"], [])
            if event_id not in ids:
                ids.append(event_id)
        all_accepted = {i for ids in accepted.values() for i in ids}
        self.report.received_dedup_ids = sum(len(d) for d in dedup_ids_per_event.values())
        self.report.lost = len(all_accepted - set(dedup_ids_per_event))
        self.report.duplicated = sum(len(d) - 1 for d in dedup_ids_per_event.values())
        self.report.out_of_order_keys = sum(
            1 for key, ids in accepted.items() if first_seen.get(key, []) != ids
        )

    async def _check_store(self) -> None:
        engine = create_engine(self.database_url)
        try:
            async with session_factory(engine)() as session:
                statuses = (
                    await session.execute(
                        select(EventRow.status, func.count()).group_by(EventRow.status)
                    )
                ).all()
                self.report.statuses = {status: count for status, count in statuses}
                self.report.dead_lettered = int(
                    await session.scalar(select(func.count()).select_from(DeadLetterRow)) or 0
                )
                rows = (
                    await session.execute(select(LlmCallRow.status, LlmCallRow.request_id))
                ).all()
        finally:
            await engine.dispose()
        self.report.audit_rows = len(rows)
        self.report.unknown_rows = sum(1 for status, _ in rows if status == "unknown")
        self.report.rows_without_request_id = sum(1 for _, request_id in rows if not request_id)
        audited = {request_id for _, request_id in rows if request_id}
        answered = self.fake.behaviour.answered
        self.report.claude_requests = len(self.fake.behaviour.requests)
        self.report.unaudited = sum(1 for request_id in answered if request_id not in audited)

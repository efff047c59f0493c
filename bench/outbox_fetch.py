"""One relay fetch against a large outbox: ``OutboxRepository.pending`` with 100 000 pending
rows in 1 000 groups (10 000 events of 10 tool calls each), on PostgreSQL when reachable.
Prints the query plan (EXPLAIN ANALYZE) and the time and this process's CPU of one fetch,
through a session and (on PostgreSQL) on the driver's connections as the relay runs it,
beside a same-run baseline: the 500 oldest pending rows by id alone, an index range scan
that ignores groups (loaded as ORM objects).

    python -m bench.outbox_fetch [--rows 100000] [--groups 1000] [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import event, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.publish.relay import ROWS_PER_GROUP
from app.store.db import create_engine, session_factory
from app.store.driver import DriverPool
from app.store.migrate import upgrade_head
from app.store.models import EventRow, OutboxRow, OutboxStatus
from app.store.repository import OutboxRepository, pending_on_driver
from bench.common import database

FETCH_SIZE = 500
TOOL_CALLS = 10


async def fill(sessions: async_sessionmaker[AsyncSession], *, rows: int, groups: int) -> None:
    events = rows // TOOL_CALLS
    now = datetime.now(UTC)
    async with sessions() as session:
        for start in range(0, events, 1000):
            ids = range(start, min(start + 1000, events))
            await session.execute(
                insert(EventRow),
                [
                    {
                        "id": f"evt_{n}",
                        "source": "github",
                        "type": "issues.opened",
                        "group_key": f"acme/repo-{n % groups}",
                        "delivery_id": f"d{n}",
                        "pipeline": "triage",
                        "status": "processing",
                        "payload": {},
                        "received_at": now,
                        "deliveries": 1,
                    }
                    for n in ids
                ],
            )
            await session.execute(
                insert(OutboxRow),
                [
                    {
                        "event_id": f"evt_{n}",
                        "source": "github",
                        "seq": seq,
                        "llm_call_id": f"llm_{n}",
                        "tool": "publishAlert",
                        "topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts.fifo",
                        "group_id": f"acme/repo-{n % groups}",
                        "dedup_id": f"{n}-{seq}",
                        "body": orjson.dumps(
                            {"tool": "publishAlert", "input": {"title": "x" * 200}, "n": n}
                        ).decode(),
                        "status": OutboxStatus.PENDING,
                    }
                    for n in ids
                    for seq in range(TOOL_CALLS)
                ],
            )
        await session.commit()
        await session.execute(text("ANALYZE"))  # the planner's statistics, as in production
        await session.commit()


async def timed(runs: int, fetch: Callable[[], Awaitable[int]]) -> tuple[float, float, float, int]:
    """Median and slowest of ``runs`` fetches, in ms, the median of this process's CPU per
    fetch, in ms, and the rows the last one returned."""
    took: list[float] = []
    cpu: list[float] = []
    count = 0
    for _ in range(runs):
        started, cpu_started = time.perf_counter(), time.process_time()
        count = await fetch()
        took.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
    return statistics.median(took), max(took), statistics.median(cpu), count


async def measure(url: str, *, rows: int, groups: int, runs: int) -> None:
    engine = create_engine(url)
    sessions = session_factory(engine)
    await fill(sessions, rows=rows, groups=groups)
    backoff = [f"acme/repo-{n}" for n in range(0, groups, 2)]  # half the groups waiting

    async def grouped(skip: list[str]) -> int:
        async with sessions() as session:
            found = await OutboxRepository(session).pending(
                limit=FETCH_SIZE, per_group=ROWS_PER_GROUP, skip_groups=skip
            )
        return len(found)

    driver = (
        await DriverPool.open(engine.url, engine.dialect, size=1)
        if engine.dialect.name == "postgresql"
        else None
    )

    async def on_driver(skip: list[str]) -> int:
        assert driver is not None
        found = await pending_on_driver(
            driver, limit=FETCH_SIZE, per_group=ROWS_PER_GROUP, skip_groups=skip
        )
        return len(found)

    async def oldest() -> int:
        async with sessions() as session:
            found = await session.scalars(
                select(OutboxRow)
                .where(OutboxRow.status == OutboxStatus.PENDING, OutboxRow.topic_arn.is_not(None))
                .order_by(OutboxRow.id)
                .limit(FETCH_SIZE)
            )
        return len(found.all())

    captured: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        captured.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", capture)
    await grouped(backoff)
    event.remove(engine.sync_engine, "before_cursor_execute", capture)
    statement, parameters = captured[-1]
    explain = (
        "EXPLAIN (ANALYZE, BUFFERS) "
        if engine.dialect.name == "postgresql"
        else ("EXPLAIN QUERY PLAN ")
    )
    async with engine.connect() as conn:
        plan = await conn.exec_driver_sql(explain + statement, parameters)
        print(f"plan ({engine.dialect.name}, {len(backoff)} groups skipped):")
        for line in plan:
            shown = " | ".join(str(part) for part in line)
            # The skipped groups' ids make one line thousands of characters long.
            print("   ", shown if len(shown) < 200 else shown[:200] + " ...")

    print(
        f"\n{rows} pending rows in {groups} groups, fetch size {FETCH_SIZE}, "
        f"{ROWS_PER_GROUP} rows per group, {runs} runs each:"
    )
    fetches: list[tuple[str, Callable[[], Awaitable[int]]]] = [
        ("per-group heads, nothing in backoff", lambda: grouped([])),
        (f"per-group heads, {len(backoff)} groups in backoff", lambda: grouped(backoff)),
    ]
    if driver is not None:  # what the relay runs on PostgreSQL
        fetches += [
            ("on the driver, nothing in backoff", lambda: on_driver([])),
            (f"on the driver, {len(backoff)} groups in backoff", lambda: on_driver(backoff)),
        ]
    fetches.append(("baseline: the 500 oldest rows by id", oldest))
    for name, fetch in fetches:
        median, slowest, cpu, count = await timed(runs, fetch)
        print(
            f"  {name:<45} median {median:7.1f} ms   max {slowest:7.1f} ms   "
            f"CPU {cpu:6.2f} ms   rows {count}"
        )
    if driver is not None:
        await driver.close()
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with database("outbox_fetch") as url:
        upgrade_head(url)
        asyncio.run(measure(url, rows=args.rows, groups=args.groups, runs=args.runs))


if __name__ == "__main__":
    main()

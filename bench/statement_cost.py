"""Statement cost: the gateway CPU of the worker's per-event upsert (``start_delivery``) and a
decision with two outbox rows, through SQLAlchemy's asyncio engine (an autocommit connection
per statement, as the worker ran them) against the same SQL straight on asyncpg connections
(``app/store/driver.py``, as the worker runs them now on PostgreSQL), in alternation, in one
process, 16 statements in flight.

CPU is this process's (user + system) over the round, divided by the statements; the
database's own work is not in it.

A second table isolates how the driver lends its connections: the upsert's SQL, each
statement on a connection taken and given back, through asyncpg's ``Pool`` (an acquire
timeout, as the driver used it) against ``ConnectionLender`` (``app/store/connections.py``).

    python -m bench.statement_cost [--statements 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import uvloop
from sqlalchemy.ext.asyncio import AsyncEngine

from app.events import EventStatus
from app.store.connections import ConnectionLender
from app.store.db import create_engine
from app.store.decisions import Decision, DecisionStore
from app.store.driver import DriverPool
from app.store.migrate import upgrade_head
from app.store.models import LlmCallStatus, OutboxRow
from app.store.repository import START_DELIVERY, start_delivery
from bench.common import Skip, database, report, table

IN_FLIGHT = 16
PAYLOAD = {"action": "opened", "issue": {"number": 7, "title": "It broke"}, "repository": {}}
OUTCOME: dict[str, Any] = {
    "model": "claude-sonnet-4-6",
    "status": LlmCallStatus.OK,
    "request_id": "req_1",
    "latency_ms": 12.5,
    "input_tokens": 167,
    "output_tokens": 40,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "stop_reason": "tool_use",
    "tool_calls": [{"name": "publishAlert", "input": {"severity": "high"}}],
    "error_type": None,
    "error": None,
    "cost_usd": 0.0011,
    "response_text": None,
}
Statement = Callable[[str], Awaitable[None]]


def _fields(event_id: str) -> dict[str, Any]:
    return {
        "id": event_id,
        "source": "github",
        "type": "issues.opened",
        "group_key": "acme/api",
        "delivery_id": event_id,
        "pipeline": "github",
        "payload": PAYLOAD,
        "received_at": datetime.now(UTC),
    }


def _decision(event_id: str) -> Decision:
    rows = [
        OutboxRow(
            event_id=event_id,
            source="github",
            seq=seq,
            generation=0,
            llm_call_id=f"llm_{event_id}",
            tool="publishAlert",
            topic_arn="arn:aws:sns:us-east-1:123456789012:alerts.fifo",
            group_id="acme/api",
            dedup_id=f"{event_id}-{seq}",
            body='{"tool": "publishAlert"}',
        )
        for seq in range(2)
    ]
    return Decision(
        event_id=event_id,
        status=EventStatus.PROCESSING,
        error=None,
        epoch=1,
        call_id=f"llm_{event_id}",
        outcome=OUTCOME,
        rows=rows,
    )


def _ways(engine: AsyncEngine, driver: DriverPool) -> dict[str, tuple[Statement, Statement]]:
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    by_engine, by_driver = DecisionStore(engine), DecisionStore(engine, driver=driver)

    async def upsert_engine(event_id: str) -> None:
        async with autocommit.connect() as connection:
            await start_delivery(connection, fields=_fields(event_id), epoch=1)

    async def upsert_driver(event_id: str) -> None:
        await start_delivery(driver, fields=_fields(event_id), epoch=1)

    async def decide_engine(event_id: str) -> None:
        await by_engine.store(_decision(event_id))

    async def decide_driver(event_id: str) -> None:
        await by_driver.store(_decision(event_id))

    return {
        "SQLAlchemy engine": (upsert_engine, decide_engine),
        "driver (driver.py)": (upsert_driver, decide_driver),
    }


async def _round(statement: Statement, ids: list[str]) -> float:
    """CPU microseconds per statement, ``IN_FLIGHT`` at a time."""
    room = asyncio.Semaphore(IN_FLIGHT)

    async def one(event_id: str) -> None:
        async with room:
            await statement(event_id)

    started = time.process_time()
    await asyncio.gather(*(one(event_id) for event_id in ids))
    return (time.process_time() - started) / len(ids) * 1e6


async def _measure(url: str, statements: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    engine = create_engine(url)
    driver = await DriverPool.open(engine.url, engine.dialect, size=IN_FLIGHT)
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        ways = _ways(engine, driver)
        for n in range(rounds + 1):  # the first round warms both up and is not counted
            order = list(ways.items()) if n % 2 == 0 else list(reversed(ways.items()))
            for name, (upsert, decide) in order:
                ids = [f"evt_{uuid.uuid4().hex}" for _ in range(statements)]
                upsert_us = await _round(upsert, ids)
                decide_us = await _round(decide, ids)
                if n:
                    results.setdefault(name, []).append((upsert_us, decide_us))
    finally:
        await driver.close()
        await engine.dispose()
    return results


async def _lending(url: str, statements: int, rounds: int) -> dict[str, list[float]]:
    """CPU µs per upsert, its connection lent by asyncpg's Pool or by the lender."""
    engine = create_engine(url)
    driver = await DriverPool.open(engine.url, engine.dialect, size=IN_FLIGHT)
    upsert = driver.compiled(START_DELIVERY["postgresql"])
    args, kwargs = engine.dialect.create_connect_args(engine.url)

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(*args, **kwargs)

    async def no_reset(_: asyncpg.Connection) -> None:
        """As the driver ran asyncpg's Pool: no RESET ALL round trip per release."""

    pool = await asyncpg.create_pool(
        *args, **kwargs, min_size=0, max_size=IN_FLIGHT, reset=no_reset
    )
    lender = ConnectionLender(connect, size=IN_FLIGHT)

    def arguments(event_id: str) -> list[Any]:
        return upsert.arguments(
            {**_fields(event_id), "epoch": 1, "now": datetime.now(UTC), "count": 1}
        )

    async def by_pool(event_id: str) -> None:
        async with pool.acquire(timeout=30.0) as connection:
            await connection.fetchrow(upsert.sql, *arguments(event_id))

    async def by_lender(event_id: str) -> None:
        connection = await lender.take()
        try:
            await connection.fetchrow(upsert.sql, *arguments(event_id))
        finally:
            lender.give_back(connection, usable=True)

    ways: dict[str, Statement] = {"asyncpg Pool": by_pool, "ConnectionLender": by_lender}
    results: dict[str, list[float]] = {}
    try:
        for n in range(rounds + 1):
            order = list(ways.items()) if n % 2 == 0 else list(reversed(ways.items()))
            for name, way in order:
                cpu = await _round(way, [f"evt_{uuid.uuid4().hex}" for _ in range(statements)])
                if n:
                    results.setdefault(name, []).append(cpu)
    finally:
        await pool.close()
        await lender.close()
        await driver.close()
        await engine.dispose()
    return results


def measure(statements: int, rounds: int) -> list[str]:
    with database("statements") as url:
        if not url.startswith("postgresql"):
            raise Skip("PostgreSQL is not reachable (the driver's pool is PostgreSQL's)")
        upgrade_head(url)
        results = uvloop.run(_measure(url, statements, rounds))
        lending = uvloop.run(_lending(url, statements, rounds))
    rows = []
    medians = {}
    for name, runs in results.items():
        upsert = statistics.median(u for u, _ in runs)
        decide = statistics.median(d for _, d in runs)
        medians[name] = upsert + decide
        each = ", ".join(f"{u:.0f} / {d:.0f}" for u, d in runs)
        rows.append([name, f"{upsert:.0f}", f"{decide:.0f}", each])
    engine_us, driver_us = medians["SQLAlchemy engine"], medians["driver (driver.py)"]
    return [
        f"{statements} events per round: the upsert of each, then its decision (two outbox "
        f"rows), {IN_FLIGHT} in flight, PostgreSQL; the two ways alternate, {rounds} rounds "
        f"each after a warm-up round. CPU = this process's per statement, in µs.",
        "",
        *table(["way", "upsert µs", "decision µs", "each round (upsert / decision)"], rows),
        "",
        f"- the two statements of an event: **{engine_us:.0f} µs** through the engine, "
        f"**{driver_us:.0f} µs** on the driver's pool ({driver_us / engine_us:.2f}x), "
        f"**{(engine_us - driver_us) / 1000:.2f} ms** less gateway CPU per event",
        "",
        f"How the driver lends connections: the upsert alone, {statements} per round, "
        f"{IN_FLIGHT} in flight, each on a connection taken and given back; CPU µs per "
        f"statement.",
        "",
        *table(
            ["lent by", "µs per upsert", "each round"],
            [
                [name, f"{statistics.median(runs):.0f}", ", ".join(f"{r:.0f}" for r in runs)]
                for name, runs in lending.items()
            ],
        ),
        "",
        f"- asyncpg's Pool **{statistics.median(lending['asyncpg Pool']):.0f} µs**, the "
        f"lender **{statistics.median(lending['ConnectionLender']):.0f} µs** per upsert",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description="CPU per statement: SQLAlchemy vs asyncpg")
    parser.add_argument("--statements", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    report(
        "Statement cost: the worker's two per-event statements, engine against driver; "
        "connections lent by asyncpg's Pool against the lender",
        f"python -m bench.statement_cost --statements {args.statements} --rounds {args.rounds}",
        measure(args.statements, args.rounds),
    )


if __name__ == "__main__":
    main()

"""The decision write, on SQLite (in steps) and on PostgreSQL (one statement, when reachable):
all of it or nothing, fenced by the lease epoch, rows in publish order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.events import EventStatus
from app.store.db import create_engine
from app.store.decisions import Decision, DecisionStore
from app.store.driver import DriverPool
from app.store.models import EventRow, LlmCallRow, LlmCallStatus, OutboxRow, OutboxStatus
from app.store.repository import OUTBOX, LlmCallRepository, start_delivery
from tests.store.rows import event_fields


@pytest.fixture
async def engine(url: str) -> AsyncIterator[AsyncEngine]:
    made = create_engine(url)
    yield made
    await made.dispose()


@pytest.fixture(params=["engine", "driver"])
async def store(
    request: pytest.FixtureRequest, engine: AsyncEngine
) -> AsyncIterator[DecisionStore]:
    """Through SQLAlchemy, and on PostgreSQL also straight on the driver's pool (as the
    worker of ``serve`` stores its decisions there)."""
    if request.param == "engine":
        yield DecisionStore(engine)
        return
    if engine.dialect.name != "postgresql":
        pytest.skip("the driver's pool is PostgreSQL's")
    driver = await DriverPool.open(engine.url, engine.dialect, size=2)
    try:
        yield DecisionStore(engine, driver=driver)
    finally:
        await driver.close()


def _outcome(**changed: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "status": LlmCallStatus.OK,
        "request_id": "req_1",
        "latency_ms": 12.5,
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "stop_reason": "tool_use",
        "tool_calls": [{"name": "publishAlert", "input": {"severity": "high"}}],
        "error_type": None,
        "error": None,
        "cost_usd": 0.001,
        "response_text": "reply with a \x00 in it",
    } | changed


def _row(event_id: str, seq: int, *, dedup: str | None = None) -> OutboxRow:
    return OutboxRow(
        event_id=event_id,
        source="github",
        seq=seq,
        generation=0,
        llm_call_id="llm_1",
        tool="publishAlert",
        topic_arn="arn:aws:sns:us-east-1:123456789012:alerts.fifo",
        group_id="acme/api",
        dedup_id=dedup or f"{event_id}-{seq}",
        body=f'{{"sequence": {seq}}}',
    )


async def _started(engine: AsyncEngine, event_id: str, *, epoch: int) -> None:
    """The event as the worker leaves it before the call: started under ``epoch``, with the
    attempt's row written, outcome unknown."""
    fields = event_fields(event_id, payload={}, received_at=datetime(2026, 12, 1, tzinfo=UTC))
    async with engine.begin() as connection:
        await start_delivery(connection, fields=fields, epoch=epoch)
        await LlmCallRepository(connection).add(
            LlmCallRow(
                id=f"llm_{event_id}",
                event_id=event_id,
                pipeline="triage",
                model="claude-sonnet-4-5",
                attempt=1,
                status=LlmCallStatus.UNKNOWN,
                latency_ms=0.0,
                tool_calls=[],
                cost_usd=0.0,
            )
        )


def _decision(event_id: str, rows: list[OutboxRow], *, epoch: int = 3) -> Decision:
    return Decision(
        event_id=event_id,
        status=EventStatus.PROCESSING if rows else EventStatus.NO_ACTION,
        error=None,
        epoch=epoch,
        call_id=f"llm_{event_id}",
        outcome=_outcome(),
        rows=rows,
    )


async def _state(engine: AsyncEngine, event_id: str) -> tuple[str, str, list[Any]]:
    async with engine.connect() as connection:
        status = (
            await connection.execute(select(EventRow.status).where(EventRow.id == event_id))
        ).scalar_one()
        call = (
            await connection.execute(
                select(LlmCallRow.status).where(LlmCallRow.id == f"llm_{event_id}")
            )
        ).scalar_one()
        rows = (
            await connection.execute(
                select(OUTBOX).where(OUTBOX.c.event_id == event_id).order_by(OUTBOX.c.id)
            )
        ).all()
    return status, call, list(rows)


async def test_a_decision_is_stored_whole_with_its_rows_in_publish_order(
    engine: AsyncEngine, store: DecisionStore
) -> None:
    await _started(engine, "evt_1", epoch=3)
    rows = [_row("evt_1", seq) for seq in range(4)]
    assert await store.store(_decision("evt_1", rows)) is True
    status, call, stored = await _state(engine, "evt_1")
    assert (status, call) == (EventStatus.PROCESSING, LlmCallStatus.OK)
    assert [row.seq for row in stored] == [0, 1, 2, 3]  # ascending ids: the publish order
    assert {(row.status, row.attempts, row.dedup_id) for row in stored} == {
        (OutboxStatus.PENDING, 0, f"evt_1-{seq}") for seq in range(4)
    }
    assert all(row.created_at is not None for row in stored)
    async with engine.connect() as connection:
        kept = (
            await connection.execute(select(LlmCallRow).where(LlmCallRow.id == "llm_evt_1"))
        ).one()
    # Every outcome column is written, through the column's own type (NUL kept as text).
    assert (kept.input_tokens, kept.stop_reason, kept.request_id) == (100, "tool_use", "req_1")
    assert kept.tool_calls == [{"name": "publishAlert", "input": {"severity": "high"}}]
    assert kept.response_text == "reply with a \\u0000 in it"


async def test_a_decision_without_tool_calls_sets_no_action(
    engine: AsyncEngine, store: DecisionStore
) -> None:
    await _started(engine, "evt_2", epoch=3)
    assert await store.store(_decision("evt_2", [])) is True
    assert await _state(engine, "evt_2") == (EventStatus.NO_ACTION, LlmCallStatus.OK, [])


async def test_a_stale_tenure_stores_nothing(engine: AsyncEngine, store: DecisionStore) -> None:
    await _started(engine, "evt_3", epoch=5)  # a later tenure started the event
    stored = await store.store(_decision("evt_3", [_row("evt_3", 0)], epoch=4))
    assert stored is False
    assert await _state(engine, "evt_3") == (
        EventStatus.PROCESSING,
        LlmCallStatus.UNKNOWN,
        [],
    )


async def test_a_refused_row_stores_nothing_of_the_decision(
    engine: AsyncEngine, store: DecisionStore
) -> None:
    await _started(engine, "evt_4", epoch=3)
    await _started(engine, "evt_5", epoch=3)
    async with engine.begin() as connection:
        await connection.execute(
            OUTBOX.insert(),
            [
                {"event_id": "evt_5", "source": "github", "seq": 0, "llm_call_id": "x"}
                | {"tool": "t", "group_id": "g", "dedup_id": "taken", "body": "{}"}
            ],
        )
    rows = [_row("evt_4", 0), _row("evt_4", 1, dedup="taken")]
    with pytest.raises(IntegrityError):
        await store.store(_decision("evt_4", rows))
    assert await _state(engine, "evt_4") == (
        EventStatus.PROCESSING,
        LlmCallStatus.UNKNOWN,
        [],
    )

"""Rows asked for in one turn of the event loop go in with one statement
(``app/store/row_batcher.py``), on SQLite and on PostgreSQL when reachable, through the
engine and (PostgreSQL) straight on the driver's pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import create_engine
from app.store.driver import DriverPool
from app.store.models import LlmCallRow
from app.store.repository import LLM_CALLS
from app.store.row_batcher import RowBatcher
from tests.store.rows import call_fields


@pytest.fixture
async def engine(url: str) -> AsyncIterator[AsyncEngine]:
    made = create_engine(url)
    yield made
    await made.dispose()


@pytest.fixture(params=["engine", "driver"])
async def batcher(request: pytest.FixtureRequest, engine: AsyncEngine) -> AsyncIterator[RowBatcher]:
    if request.param == "engine":
        yield RowBatcher(engine, LLM_CALLS)
        return
    if engine.dialect.name != "postgresql":
        pytest.skip("the driver's pool is PostgreSQL's")
    driver = await DriverPool.open(engine.url, engine.dialect, size=2)
    try:
        yield RowBatcher(engine, LLM_CALLS, driver=driver)
    finally:
        await driver.close()


def _row(call_id: str, **more: Any) -> dict[str, Any]:
    return call_fields(call_id, tool_calls=[], cost_usd=0.0, **more)


def _count_statements(engine: AsyncEngine, batcher: RowBatcher) -> list[Any]:
    """The INSERT statements the batcher sends, through the engine or on the driver."""
    seen: list[Any] = []
    driver = batcher.driver
    if driver is None:

        @sa_event.listens_for(engine.sync_engine, "before_cursor_execute")
        def count(_: Any, __: Any, statement: str, *___: Any) -> None:
            if statement.lstrip().upper().startswith("INSERT"):
                seen.append(statement)

        return seen
    insert_many = driver.insert_many

    async def counted(table: Any, rows: Any) -> None:
        seen.append(rows)
        await insert_many(table, rows)

    driver.insert_many = counted  # type: ignore[method-assign]
    return seen


async def _ids(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        return set((await connection.scalars(select(LlmCallRow.id))).all())


async def test_rows_of_one_turn_share_a_statement_and_each_caller_waits_for_it(
    engine: AsyncEngine, batcher: RowBatcher
) -> None:
    inserts = _count_statements(engine, batcher)
    await asyncio.gather(*(batcher.insert(_row(f"llm_{n}")) for n in range(5)))
    assert len(inserts) == 1
    assert await _ids(engine) == {f"llm_{n}" for n in range(5)}  # committed when they return
    await batcher.insert(_row("llm_alone"))  # a later turn: a statement of its own
    assert len(inserts) == 2
    # Rows naming other columns go in with a statement of their own, in the same turn.
    await asyncio.gather(
        batcher.insert(_row("llm_a")), batcher.insert(_row("llm_b", retry_reason="429"))
    )
    assert len(inserts) == 4
    async with engine.connect() as connection:
        reason = await connection.scalar(
            select(LlmCallRow.retry_reason).where(LlmCallRow.id == "llm_b")
        )
    assert reason == "429"


async def test_a_refused_row_fails_every_row_of_its_statement_and_no_other(
    engine: AsyncEngine, batcher: RowBatcher
) -> None:
    await batcher.insert(_row("llm_taken"))
    outcomes = await asyncio.gather(
        batcher.insert(_row("llm_new")),
        batcher.insert(_row("llm_taken")),  # the database refuses it: the id is taken
        return_exceptions=True,
    )
    assert all(isinstance(outcome, IntegrityError) for outcome in outcomes)
    assert await _ids(engine) == {"llm_taken"}  # one statement: none of its rows stands
    await batcher.insert(_row("llm_new"))  # asked again, alone, it goes in
    assert await _ids(engine) == {"llm_taken", "llm_new"}


async def test_a_caller_that_stops_waiting_does_not_take_the_others_rows_with_it(
    engine: AsyncEngine, batcher: RowBatcher
) -> None:
    first = asyncio.ensure_future(batcher.insert(_row("llm_gone")))
    second = asyncio.ensure_future(batcher.insert(_row("llm_stays")))
    await asyncio.sleep(0)
    first.cancel()
    await second
    assert "llm_stays" in await _ids(engine)
    with pytest.raises(asyncio.CancelledError):
        await first

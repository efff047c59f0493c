"""The worker's per-event statements straight on asyncpg's pool (PostgreSQL only): the same
rows as through SQLAlchemy, and failures classified as SQLAlchemy's would be (a refused
value is the event's, a lost or refused connection is the database being unavailable)."""

from __future__ import annotations

import asyncio
import itertools
import traceback
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    DateTime,
    Integer,
    MetaData,
    Table,
    bindparam,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy import exc as sa_errors
from sqlalchemy.ext.asyncio import AsyncEngine

from app.faults import data_refused, dependency_unavailable
from app.store.driver import MAX_COMPILED, DriverPool, DriverStatement, python_default
from app.store.models import EventRow
from app.store.repository import EVENTS, LLM_CALLS, Delivery, start_delivery
from tests.store.rows import call_fields, event_fields

PAYLOAD = {"action": "opened", "issue": {"title": "héllo \u2028 \\u0000", "n": 2**40}}


@pytest.fixture
def engine(pg_engine: AsyncEngine) -> AsyncEngine:
    return pg_engine


@pytest.fixture
async def driver(engine: AsyncEngine) -> AsyncIterator[DriverPool]:
    pool = await DriverPool.open(engine.url, engine.dialect, size=2)
    yield pool
    await pool.close()


def _fields(event_id: str, **changed: Any) -> dict[str, Any]:
    return event_fields(event_id, payload=PAYLOAD) | changed


async def _deliveries(
    engine: AsyncEngine, target: AsyncEngine | DriverPool, event_id: str
) -> tuple[list[Delivery], Any]:
    """First delivery, a second one, one under a later epoch, a retry in place (not
    counted) and one under an older epoch: what ``start_delivery`` answered, and the row."""
    steps = [(1, True), (1, True), (4, True), (4, False), (2, True)]
    answers = []
    for epoch, count in steps:
        if isinstance(target, DriverPool):
            answer = await start_delivery(
                target, fields=_fields(event_id), epoch=epoch, count=count
            )
        else:
            async with target.begin() as connection:
                answer = await start_delivery(
                    connection, fields=_fields(event_id), epoch=epoch, count=count
                )
        answers.append(answer)
    async with engine.connect() as connection:
        row = (await connection.execute(select(EventRow).where(EventRow.id == event_id))).one()
    return answers, row


async def test_start_delivery_answers_and_stores_the_same_as_through_sqlalchemy(
    engine: AsyncEngine, driver: DriverPool
) -> None:
    by_engine, engine_row = await _deliveries(engine, engine, "evt_engine")
    by_driver, driver_row = await _deliveries(engine, driver, "evt_driver")
    assert by_driver == by_engine
    assert [(d.deliveries, d.fence, d.first) for d in by_driver] == [
        (1, 1, True),
        (2, 1, False),
        (3, 4, False),
        (3, 4, False),
        (4, 4, False),
    ]
    columns = ("source", "type", "group_key", "pipeline", "status", "payload", "received_at")
    for column in (*columns, "deliveries", "replays", "fence"):
        assert getattr(driver_row, column) == getattr(engine_row, column), column
    assert driver_row.payload == PAYLOAD
    # The JSON text itself is the same: serialized by the column's type either way.
    async with engine.connect() as connection:
        texts = (
            await connection.execute(
                text("SELECT payload::text FROM events WHERE id IN ('evt_engine', 'evt_driver')")
            )
        ).scalars()
        assert len(set(texts)) == 1


async def test_a_value_the_database_refuses_is_the_events_own_failure(
    driver: DriverPool,
) -> None:
    # events.id is VARCHAR(64): the server refuses the value (SQLSTATE 22001).
    with pytest.raises(sa_errors.DataError) as refused:
        await start_delivery(driver, fields=_fields("e" * 65), epoch=1)
    assert data_refused(refused.value) and not dependency_unavailable(refused.value)
    assert "eeeeeeeeee" not in str(refused.value)  # the parameters are not in the message
    # A value asyncpg cannot even encode for the column's type (client side): its message
    # quotes the value, which is not kept.
    with pytest.raises(sa_errors.DataError) as unencodable:
        await start_delivery(driver, fields=_fields("evt_x", received_at="secret-not-a-time"))
    assert data_refused(unencodable.value)
    assert "secret" not in str(unencodable.value) and "query argument $" in str(unencodable.value)
    rows = [call_fields(f"llm_bad_{n}") for n in range(2)]
    rows[1]["attempt"] = "secret-not-a-number"
    with pytest.raises(sa_errors.DataError) as in_many:
        await driver.insert_many(LLM_CALLS, rows)
    assert "secret" not in str(in_many.value) and "element #1" in str(in_many.value)


async def test_terminated_connections_are_the_database_unavailable_then_replaced(
    engine: AsyncEngine, driver: DriverPool
) -> None:
    """Each round terminates the pool's connections (an operator, a failover) and runs the
    statement again at once: a failure it meets (asyncpg raises several kinds, depending on
    when the termination arrives) is the database being unavailable, never the event's, and
    the next statement gets a working connection."""
    failures: list[BaseException] = []
    for round_ in range(6):
        await start_delivery(driver, fields=_fields(f"evt_{round_}_a"), epoch=1)
        async with engine.connect() as connection:
            await connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        try:
            await start_delivery(driver, fields=_fields(f"evt_{round_}_b"), epoch=1)
        except sa_errors.DBAPIError as exc:
            failures.append(exc)
        assert (await start_delivery(driver, fields=_fields(f"evt_{round_}_c"), epoch=1)).first
    assert all(dependency_unavailable(f) and not data_refused(f) for f in failures), failures


async def test_the_engines_url_arguments_reach_the_driver_and_its_own_stay_behind(
    engine: AsyncEngine,
) -> None:
    """A URL the engine takes (with SQLAlchemy's own ``prepared_statement_cache_size`` and
    asyncpg's ``command_timeout`` in its query) opens the driver's pool too."""
    url = engine.url.update_query_dict(
        {"prepared_statement_cache_size": "50", "command_timeout": "30"}
    )
    pool = await DriverPool.open(url, engine.dialect, size=1)
    try:
        assert (await start_delivery(pool, fields=_fields("evt_url"), epoch=1)).first
    finally:
        await pool.close()


async def test_an_unreachable_database_is_unavailable(engine: AsyncEngine) -> None:
    closed = engine.url.set(port=1)
    pool = await DriverPool.open(closed, engine.dialect, size=1)
    try:
        with pytest.raises(OSError, match="1") as failed:
            await start_delivery(pool, fields=_fields("evt_u"), epoch=1)
        assert dependency_unavailable(failed.value)
    finally:
        await pool.close()


def test_a_statement_is_compiled_with_its_own_values_and_without_an_in_list(
    engine: AsyncEngine,
) -> None:
    """A value bound in the statement itself, None included, is sent as bound; a parameter
    without one must be given; an IN list (rendered by SQLAlchemy at execution) is refused
    at compile time rather than sent as a placeholder PostgreSQL cannot read."""
    statement = DriverStatement(
        update(EVENTS)
        .where(EVENTS.c.id == bindparam("event_id"))
        .values(error=None, status="queued"),
        engine.dialect,
    )
    arguments = dict(zip(statement.names, statement.arguments({"event_id": "evt_1"}), strict=True))
    assert arguments == {"error": None, "status": "queued", "event_id": "evt_1"}
    with pytest.raises(KeyError):
        statement.arguments({})
    with pytest.raises(ValueError, match="expanding"):
        DriverStatement(select(EVENTS.c.id).where(EVENTS.c.id.in_(["a", "b"])), engine.dialect)
    # What SQLAlchemy computes per execution: a parameter's callable, a column's default.
    counter = itertools.count()
    with pytest.raises(ValueError, match="callable"):
        DriverStatement(select(bindparam("n", callable_=lambda: next(counter))), engine.dialect)
    with pytest.raises(ValueError, match="column defaults"):
        DriverStatement(
            insert(LLM_CALLS).values(id=bindparam("call_id"), event_id="e", pipeline="p"),
            engine.dialect,
        )


async def test_the_compiled_statements_are_bounded(driver: DriverPool) -> None:
    """A decision's statement is built per number of outbox rows (up to 100, rebuilt when
    its builder's cache lets it go): the driver keeps the most recently used ones only."""
    first = select(EVENTS.c.id).where(EVENTS.c.fence == -1)
    kept = driver.compiled(first)
    assert driver.compiled(first) is kept
    others = [select(EVENTS.c.id).where(EVENTS.c.fence == n) for n in range(MAX_COMPILED)]
    recent = [driver.compiled(statement) for statement in others]
    assert driver.compiled(first) is not kept  # the least recently used one went
    assert driver.compiled(others[-1]) is recent[-1]


async def test_a_refused_row_is_not_quoted_in_the_error(
    engine: AsyncEngine, driver: DriverPool
) -> None:
    """asyncpg's error text holds the server's DETAIL, which for a NOT NULL or CHECK
    violation quotes the whole row ("Failing row contains (...)", the payload among its
    values); error texts reach the ``event_gave_up`` log line and the dead letter's reason.
    As through SQLAlchemy, only the message is kept, and asyncpg's exception is not chained
    (a logged traceback would print it)."""
    fields = _fields("evt_secret", delivery_id=None, payload={"token": "s3cret-token-value"})
    async with engine.connect() as connection:
        with pytest.raises(sa_errors.IntegrityError) as through_engine:
            await start_delivery(connection, fields=fields, epoch=1)
    assert "s3cret" not in str(through_engine.value)
    with pytest.raises(sa_errors.IntegrityError) as on_driver:
        await start_delivery(driver, fields=fields, epoch=1)
    refused = on_driver.value
    assert "s3cret" not in str(refused) and "not-null" in str(refused)
    assert refused.__cause__ is None and refused.__suppress_context__
    assert getattr(refused.orig, "sqlstate", None) == "23502"
    assert "s3cret" not in "".join(traceback.format_exception(refused))


async def test_every_connection_busy_is_the_database_unavailable(engine: AsyncEngine) -> None:
    """A statement that waits longer than the acquire timeout for a connection fails as
    the database being unavailable (retried in place), as the engine's pool does."""
    pool = await DriverPool.open(engine.url, engine.dialect, size=1, acquire_timeout=0.2)
    try:
        held = await pool.connections.take()  # the only connection
        with pytest.raises(TimeoutError) as waited:
            await start_delivery(pool, fields=_fields("evt_busy"), epoch=1)
        assert dependency_unavailable(waited.value)
        pool.connections.give_back(held, usable=True)
        assert (await start_delivery(pool, fields=_fields("evt_busy"), epoch=1)).first
    finally:
        await pool.close()


async def test_the_pool_opens_no_more_connections_than_its_size(engine: AsyncEngine) -> None:
    """docs/reference.md: a worker's driver pool holds up to EVENTGATE_DATABASE_POOL_SIZE
    connections, whatever the number of events in flight (they wait for one)."""
    pool = await DriverPool.open(engine.url, engine.dialect, size=2)
    try:
        answers = await asyncio.gather(
            *(start_delivery(pool, fields=_fields(f"evt_many_{n}"), epoch=1) for n in range(16))
        )
        assert all(answer.first for answer in answers)
        assert pool.connections.open_count <= 2
    finally:
        await pool.close()


async def test_rows_inserted_on_the_driver_get_the_same_defaults_as_through_sqlalchemy(
    engine: AsyncEngine, driver: DriverPool
) -> None:
    """A column the rows leave out gets its Python-side default (a scalar, a callable's
    value now) or the database's, as through SQLAlchemy; the rows go in together."""
    async with engine.begin() as connection:
        await connection.execute(insert(LLM_CALLS), [call_fields("llm_engine")])
    await driver.insert_many(LLM_CALLS, [call_fields(f"llm_driver_{n}") for n in range(3)])
    async with engine.connect() as connection:
        rows = {
            row.id: row._asdict()
            for row in await connection.execute(select(LLM_CALLS).order_by(LLM_CALLS.c.id))
        }
    assert set(rows) == {"llm_engine", "llm_driver_0", "llm_driver_1", "llm_driver_2"}
    by_engine = rows.pop("llm_engine")
    for row in rows.values():
        assert row["created_at"] is not None and row["created_at"] >= by_engine["created_at"]
        differ = {"id", "created_at"}
        assert {k: v for k, v in row.items() if k not in differ} == {
            k: v for k, v in by_engine.items() if k not in differ
        }
    assert by_engine["tool_calls"] == [] and by_engine["provider"] == "anthropic"


def test_a_default_the_driver_cannot_compute_is_refused() -> None:
    """A default that reads SQLAlchemy's execution context, or is SQL, is not guessed."""
    metadata = MetaData()
    table = Table(
        "t",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("seen", Integer, default=lambda context: context.get_current_parameters()["id"]),
        Column("at", DateTime, default=func.now()),
    )
    with pytest.raises(ValueError, match="seen"):
        python_default(table.c.seen)
    with pytest.raises(ValueError, match="at"):
        python_default(table.c.at)


async def test_a_cancelled_statement_is_cancelled_on_the_server_and_its_connection_kept(
    engine: AsyncEngine, driver: DriverPool
) -> None:
    """A statement cancelled while it waits (on a row lock, here) is cancelled on the
    server too: it does not run once the lock goes, and no connection is opened beside it
    (a terminated connection left it running on the server: all three ran)."""
    await start_delivery(driver, fields=_fields("evt_locked"), epoch=1)
    bump = (
        update(EVENTS)
        .where(EVENTS.c.id == bindparam("event_id"))
        .values(replays=EVENTS.c.replays + 1)
    )
    async with engine.connect() as holder:
        await holder.execute(bump, {"event_id": "evt_locked"})  # holds the row lock
        for _ in range(3):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await driver.fetchrow(bump, {"event_id": "evt_locked"})
        assert driver.connections.open_count == 1
        await asyncio.sleep(0.5)  # a cancel request reaches the server on its own connection
        await holder.rollback()
    await driver.fetchrow(bump, {"event_id": "evt_locked"})  # on the same connection
    async with engine.connect() as connection:
        replays = await connection.scalar(
            select(EVENTS.c.replays).where(EVENTS.c.id == "evt_locked")
        )
    assert replays == 1 and driver.connections.open_count == 1

"""A bad hour for the worker's per-event statements on the driver's pool: PostgreSQL cuts
every connection again and again while events are decided. A cut is the database being
unavailable, never the event's fault: no event is dead-lettered or counted for it, and each
ends with its one decision stored once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from redis.asyncio import Redis
from sqlalchemy import event as sa_event
from sqlalchemy import text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import NullPool

from app.events import Event
from app.faults import dependency_unavailable
from app.store.driver import DriverPool
from tests.llm.harness import BASE, build, make_event, reply, tool_use

EVENTS = 40


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(base_url=BASE, using="httpcore2", assert_all_called=False) as router:
        yield router


async def test_connections_cut_again_and_again_count_nothing_against_the_events(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
    database_url: str,
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("the driver's pool is PostgreSQL's")
    admin = create_async_engine(database_url)
    cutter = create_async_engine(database_url, poolclass=NullPool)
    driver = await DriverPool.open(admin.url, admin.dialect, size=4)
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, driver=driver)
    api.post("/v1/messages").mock(return_value=reply(tool_use()))
    events: list[Event] = []
    counted: list[list[BaseException]] = []
    cuts = 0

    async def flap() -> None:
        """Every 30 ms, on a connection of its own (the pooled ones are what it cuts)."""
        nonlocal cuts
        while True:
            await asyncio.sleep(0.03)
            async with cutter.connect() as connection:
                await connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
            cuts += 1

    async def deliver(event: object) -> list[BaseException]:
        """As the worker: again after each failure; an unavailable database is not counted."""
        counted: list[BaseException] = []
        for _ in range(200):
            try:
                await h.processor.process(event)  # type: ignore[arg-type]
                return counted
            except Exception as exc:  # noqa: BLE001 - classified below, as the worker does
                if not dependency_unavailable(exc):
                    counted.append(exc)
                await asyncio.sleep(0.01)
        raise AssertionError("never stored")

    flapping = asyncio.create_task(flap())
    try:
        # Rounds of 40 at once, until cuts have landed among them (a cutter that died is
        # re-raised below, not waited for).
        while cuts < 10 and not flapping.done():
            wave = [make_event(len(events) + n, group=f"acme/repo{n}") for n in range(EVENTS)]
            events.extend(wave)
            counted.extend(await asyncio.gather(*(deliver(event) for event in wave)))
    finally:
        flapping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flapping
        await driver.close()
        await admin.dispose()
        await cutter.dispose()
    assert flapping.cancelled()
    bound = sessions().bind
    assert isinstance(bound, AsyncEngine)
    await bound.dispose()  # its pooled connections were cut too: read on fresh ones
    assert counted == [[] for _ in events]
    for event in events:
        outcome = await h.rows(event.id)
        assert outcome.event.status == "held", outcome.event.error  # decided; no topic here
        assert outcome.event.deliveries == 1  # retries after a cut were not counted
        assert len(outcome.outbox) == 1 and not outcome.dead


async def test_a_connection_cut_while_sqlalchemy_sets_it_up_is_the_database_unavailable(
    database_url: str,
) -> None:
    """What the run above met now and then, made certain: a connection cut before
    SQLAlchemy's asyncpg dialect set it up (its JSON codecs) raises asyncpg's own
    InterfaceError, unwrapped. It was counted against the event."""
    if not database_url.startswith("postgresql"):
        pytest.skip("asyncpg is PostgreSQL's")
    engine = create_async_engine(database_url, poolclass=NullPool)

    @sa_event.listens_for(engine.sync_engine, "do_connect")
    def cut_at_once(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        connection = dialect.dbapi.connect(*cargs, **cparams)
        connection._connection.terminate()  # the server's cut, before the set-up
        return connection

    try:
        with pytest.raises(asyncpg.InterfaceError) as raised:
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
    assert dependency_unavailable(raised.value)


def test_asyncpgs_closed_connection_error_is_the_database_unavailable() -> None:
    """The rule behind it; other client errors stay the event's."""
    assert dependency_unavailable(asyncpg.InterfaceError("connection is closed"))
    busy = asyncpg.InterfaceError("cannot perform operation: another operation is in progress")
    assert not dependency_unavailable(busy)

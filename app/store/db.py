"""Engine and session factory. Only units of work (a request, a worker step) commit."""

from __future__ import annotations

import json
from typing import Any

import orjson
from sqlalchemy import event
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)


def dump_json(value: Any) -> str:
    """A JSON column's value as text: orjson, about a tenth of the standard library's CPU
    for an event's payload or a prompt (three per decided event), and the standard library
    for what orjson refuses (an integer beyond 64 bits, a key that is not a string): the
    same values, without the spaces."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


def create_engine(url: str, *, pool_size: int = 20) -> AsyncEngine:
    """SQL errors never carry their bound parameters (event payloads) into a log line."""
    if url.startswith("sqlite"):
        engine = create_async_engine(
            url, connect_args={"timeout": 30}, hide_parameters=True, json_serializer=dump_json
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(conn: Any, _: Any) -> None:
            cursor = conn.cursor()
            # WAL lets the API read while the worker writes; FKs are off by default in SQLite.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    # Sized for the worker's concurrent units of work: up to one and a half times
    # ``pool_size`` connections, opened as they are needed and kept (no overflow: SQLAlchemy
    # closes an overflow connection when it is returned, and under a steady load that meant
    # one connection opened and closed per few units of work, each costing more CPU than the
    # unit itself). A caller beyond that waits for a connection. No pre-ping (three round
    # trips per checkout with asyncpg): a connection found dead on use invalidates the whole
    # pool, so a database restart fails one unit of work, which is retried (worker, relay);
    # recycling replaces connections an idle timeout may cut.
    return create_async_engine(
        url,
        pool_size=pool_size + pool_size // 2,
        max_overflow=0,
        pool_recycle=300,
        hide_parameters=True,
        json_serializer=dump_json,
    )


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def read_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions on autocommit connections, for one read that needs no transaction around it:
    one round trip on PostgreSQL instead of BEGIN, the query and ROLLBACK. Never for writes
    that must stand or fall together."""
    return async_sessionmaker(
        engine.execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False
    )

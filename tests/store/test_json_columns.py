"""JSON columns are written with ``dump_json`` (orjson, the standard library for what orjson
refuses), through SQLAlchemy and through the worker's driver alike: a value either can
write is stored and read back the same."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import create_engine, dump_json
from app.store.driver import DriverPool
from app.store.models import EventRow
from app.store.repository import start_delivery
from tests.store.rows import event_fields

# orjson refuses both: an integer beyond 64 bits, a key that is not a string.
REFUSED_BY_ORJSON: dict[Any, Any] = {"count": 2**70, 7: "an int key", "nested": [{"n": -(2**65)}]}
AS_READ = {"count": 2**70, "7": "an int key", "nested": [{"n": -(2**65)}]}


@pytest.fixture
async def engine(url: str) -> AsyncIterator[AsyncEngine]:
    made = create_engine(url)
    yield made
    await made.dispose()


def test_dump_json_writes_what_orjson_refuses_as_the_standard_library_does() -> None:
    assert dump_json({"a": [1, "é", None]}) == '{"a":[1,"é",null]}'
    assert dump_json(REFUSED_BY_ORJSON) == (
        '{"count": 1180591620717411303424, "7": "an int key", '
        '"nested": [{"n": -36893488147419103232}]}'
    )


async def test_a_payload_orjson_refuses_is_stored_through_the_engine_and_the_driver(
    engine: AsyncEngine,
) -> None:
    async with engine.begin() as connection:
        await start_delivery(
            connection, fields=event_fields("evt_engine", payload=REFUSED_BY_ORJSON), epoch=1
        )
    ids = ["evt_engine"]
    if engine.dialect.name == "postgresql":
        driver = await DriverPool.open(engine.url, engine.dialect, size=1)
        try:
            await start_delivery(
                driver, fields=event_fields("evt_driver", payload=REFUSED_BY_ORJSON), epoch=1
            )
        finally:
            await driver.close()
        ids.append("evt_driver")
    async with engine.connect() as connection:
        query = select(EventRow.id, EventRow.payload).where(EventRow.id.in_(ids))
        payloads = {row[0]: row[1] for row in await connection.execute(query)}
    assert payloads == {event_id: AS_READ for event_id in ids}

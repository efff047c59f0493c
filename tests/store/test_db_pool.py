"""The PostgreSQL pool keeps the connections a burst opened: a steady load above
``pool_size`` does not open and close a connection per few units of work."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event, text

from app.store.db import create_engine


async def test_connections_opened_under_load_are_kept(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL is not reachable here (SQLite has no pool to size)")
    engine = create_engine(database_url, pool_size=4)
    opened = 0

    @event.listens_for(engine.sync_engine, "connect")
    def _count(*_: Any) -> None:
        nonlocal opened
        opened += 1

    async def unit(hold: asyncio.Event) -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
            await hold.wait()

    try:
        for _ in range(3):  # three bursts of six units at once, each above pool_size
            hold = asyncio.Event()
            units = [asyncio.create_task(unit(hold)) for _ in range(6)]
            while engine.pool.checkedout() < 6:  # type: ignore[attr-defined]
                await asyncio.sleep(0.01)
            hold.set()
            await asyncio.gather(*units)
        assert opened == 6  # the first burst's, kept for the next two
        # The ceiling holds: a seventh unit beyond one and a half times pool_size waits.
        hold = asyncio.Event()
        units = [asyncio.create_task(unit(hold)) for _ in range(7)]
        await asyncio.sleep(0.3)
        assert engine.pool.checkedout() == 6  # type: ignore[attr-defined]
        hold.set()
        await asyncio.gather(*units)
    finally:
        await engine.dispose()

"""Rows of one table asked for at about the same moment go in with one statement.

On the worker's path a statement costs about half a millisecond of gateway CPU, more than
the row it writes. The audit rows written just before Claude calls are many and
independent, and the events of one read reach their calls together: the rows asked for
during one turn of the event loop (``app/turns.py``) are inserted by one ``executemany``
(on PostgreSQL on an autocommit connection, or straight on the driver's pool when given,
``driver.py``: one round trip), and each caller goes on once that statement has committed,
as it would after its own. A failure fails every row of that statement, none of them
stands, and each caller sees the error, as alone; nothing is retried here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Table, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.driver import DriverPool
from app.turns import Turn

Row = dict[str, Any]


class RowBatcher:
    def __init__(
        self, engine: AsyncEngine, table: Table, *, driver: DriverPool | None = None
    ) -> None:
        # asyncpg's executemany is atomic on its own (one round trip); SQLite's writes row
        # by row, so there the rows go in inside a transaction, all or none.
        self.engine = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else engine
        )
        self.table = table
        self.statement = insert(table)
        self.driver = driver if engine.dialect.name == "postgresql" else None
        self.turn: Turn[Row, None] = Turn(self._flush)

    async def insert(self, row: Row) -> None:
        """Returns once ``row`` is committed; raises what its statement raised."""
        await self.turn.submit(row)

    async def _flush(self, batch: list[tuple[Row, asyncio.Future[None]]]) -> None:
        # One executemany per set of columns: its parameter sets must all name the same.
        groups: dict[frozenset[str], list[tuple[Row, asyncio.Future[None]]]] = {}
        for row, done in batch:
            groups.setdefault(frozenset(row), []).append((row, done))
        for group in groups.values():
            rows = [row for row, _ in group]
            try:
                await self._insert(rows)
            except Exception as exc:  # noqa: BLE001 - it is each caller's, raised there
                for _, done in group:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for _, done in group:
                if not done.done():
                    done.set_result(None)

    async def _insert(self, rows: list[Row]) -> None:
        if self.driver is not None:
            await self.driver.insert_many(self.table, rows)
            return
        async with self.engine.begin() as connection:
            # One row alone as one parameter set: a list of one is an executemany.
            await connection.execute(self.statement, rows if len(rows) > 1 else rows[0])

"""Rows of one table asked for at about the same moment go in with one statement.

On the worker's path a statement costs about half a millisecond of gateway CPU, more than
the row it writes. The audit rows written just before Claude calls are many and
independent, and the events of one read reach their calls together: the rows asked for
during one turn of the event loop are inserted by one ``executemany`` (on PostgreSQL on an
autocommit connection: one round trip), and each caller goes on once that statement has
committed, as it would after its own. A failure fails every row of that statement, none of
them stands, and each caller sees the error, as alone; nothing is retried here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Table, insert
from sqlalchemy.ext.asyncio import AsyncEngine

Row = dict[str, Any]


class RowBatcher:
    def __init__(self, engine: AsyncEngine, table: Table) -> None:
        # asyncpg's executemany is atomic on its own (one round trip); SQLite's writes row
        # by row, so there the rows go in inside a transaction, all or none.
        self.engine = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else engine
        )
        self.statement = insert(table)
        self._waiting: list[tuple[Row, asyncio.Future[None]]] = []
        self._flushes: set[asyncio.Task[None]] = set()

    async def insert(self, row: Row) -> None:
        """Returns once ``row`` is committed; raises what its statement raised."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        # Its error is the caller's; one that stopped waiting (cancelled) does not read it.
        done.add_done_callback(_retrieved)
        if not self._waiting:
            loop.call_soon(self._start_flush)
        self._waiting.append((row, done))
        await asyncio.shield(done)  # a caller cancelled does not cancel the others' rows

    def _start_flush(self) -> None:
        batch, self._waiting = self._waiting, []
        task = asyncio.get_running_loop().create_task(self._flush(batch))
        self._flushes.add(task)
        task.add_done_callback(lambda done: self._flushed(done, batch))

    def _flushed(
        self, task: asyncio.Task[None], batch: list[tuple[Row, asyncio.Future[None]]]
    ) -> None:
        """No caller is left waiting, whatever ended the flush."""
        self._flushes.discard(task)
        failure = None if task.cancelled() else task.exception()
        for _, done in batch:
            if done.done():
                continue
            if failure is None:
                done.cancel()
            else:
                done.set_exception(failure)

    async def _flush(self, batch: list[tuple[Row, asyncio.Future[None]]]) -> None:
        # One executemany per set of columns: its parameter sets must all name the same.
        groups: dict[frozenset[str], list[tuple[Row, asyncio.Future[None]]]] = {}
        for row, done in batch:
            groups.setdefault(frozenset(row), []).append((row, done))
        for group in groups.values():
            rows = [row for row, _ in group]
            try:
                async with self.engine.begin() as connection:
                    # One row alone as one parameter set: a list of one is an executemany.
                    await connection.execute(self.statement, rows if len(rows) > 1 else rows[0])
            except asyncio.CancelledError:
                for _, done in group:
                    done.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - it is each caller's, raised there
                for _, done in group:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for _, done in group:
                if not done.done():
                    done.set_result(None)


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()

"""asyncpg connections lent one statement at a time: the driver's pool (``driver.py``).

asyncpg's own ``Pool`` arms a timeout around every acquire and release, shields each release
in a task of its own and runs its reset housekeeping: about 35-50 µs of CPU per statement
here, against 30-50 µs for the statement itself (``SELECT 1``, 16 in flight). The driver's
statements need none of that: each is one statement (or one ``executemany``) on an
autocommit connection, with no session state, listener or open transaction to clean up.
So this lends connections from a list: no await, no timer, no task when one is idle.

- At most ``size`` connections, opened as they are needed (none at start).
- A statement that finds them all busy waits in turn for one (a connection given back is
  handed to the longest waiter). Waiting and opening a connection together take at most
  ``wait_seconds``, then ``TimeoutError``.
- A connection given back unusable (closed, in a transaction, or its statement failed on
  the connection itself) is terminated, not lent again. One whose statement was cancelled
  is lent again: asyncpg has asked the server to cancel the statement, and the next
  statement on it waits for that first (terminating it would leave the statement running
  on the server, and the next one opened beside it).
- A connection idle for ``idle_seconds`` is terminated when next taken, and another is
  used (a firewall may have dropped it meanwhile; SQLAlchemy's ``pool_recycle`` does the
  same). Idle connections are kept until then, as the engine's pool keeps its own.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

import asyncpg

CLOSE_SECONDS = 5.0


class ConnectionLender:
    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        *,
        size: int,
        wait_seconds: float = 30.0,
        idle_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connect = connect
        self.size = size
        self.wait_seconds = wait_seconds
        self.idle_seconds = idle_seconds
        self.clock = clock
        # Idle connections and when each came back, the most recent last (taken first).
        self._idle: list[tuple[asyncpg.Connection, float]] = []
        self._lent: set[asyncpg.Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[asyncpg.Connection | None]] = deque()
        self._closed = False

    @property
    def open_count(self) -> int:
        """Connections open (idle or lent) or being opened."""
        return len(self._idle) + len(self._lent) + self._opening

    async def take(self) -> asyncpg.Connection:
        if self._closed:
            raise asyncpg.InterfaceError("the connection pool is closed")
        while self._idle:
            connection, since = self._idle.pop()
            if connection.is_closed():
                continue
            if self.clock() - since >= self.idle_seconds:
                connection.terminate()  # no goodbye to wait for: the statement is waiting
                continue
            self._lent.add(connection)
            return connection
        deadline = asyncio.get_running_loop().time() + self.wait_seconds
        if self.open_count < self.size:
            self._opening += 1
            return await self._open_reserved(deadline)
        return await self._wait(deadline)

    def give_back(self, connection: asyncpg.Connection, *, usable: bool) -> None:
        """``usable``: the connection may run another statement: its statement ran to an
        answer (a refusal by the database included), or was cancelled (asyncpg has the
        server cancel it before the connection's next statement)."""
        self._lent.discard(connection)
        if (
            self._closed
            or not usable
            or connection.is_closed()
            or connection.is_in_transaction()  # never left by these statements: not lent so
        ):
            connection.terminate()
            self._hand_on(None)
            return
        if not self._hand_on(connection):
            self._idle.append((connection, self.clock()))

    async def close(self) -> None:
        """Close the idle connections with a goodbye; lent ones are terminated when they
        come back."""
        self._closed = True
        self._fail_waiters()
        idle, self._idle = self._idle, []
        await asyncio.gather(*(_close(connection) for connection, _ in idle))

    def terminate(self) -> None:
        """Close every connection at once, the lent ones too, without a goodbye."""
        self._closed = True
        self._fail_waiters()
        for connection, _ in self._idle:
            connection.terminate()
        for connection in self._lent:
            connection.terminate()
        self._idle = []

    def _fail_waiters(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(asyncpg.InterfaceError("the connection pool is closed"))

    def _hand_on(self, connection: asyncpg.Connection | None) -> bool:
        """Give the longest waiter ``connection``, or (None) the room to open one, kept
        for it; False when nobody waits."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                if connection is None:
                    self._opening += 1
                else:
                    self._lent.add(connection)
                waiter.set_result(connection)
                return True
        return False

    async def _open_reserved(self, deadline: float) -> asyncpg.Connection:
        """A new connection, in room already counted in ``_opening``."""
        try:
            async with asyncio.timeout_at(deadline):
                connection = await self.connect()
        except BaseException:
            self._opening -= 1
            self._hand_on(None)
            raise
        self._opening -= 1
        if self._closed:
            connection.terminate()
            raise asyncpg.InterfaceError("the connection pool is closed")
        self._lent.add(connection)
        return connection

    async def _wait(self, deadline: float) -> asyncpg.Connection:
        waiter: asyncio.Future[asyncpg.Connection | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                handed = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # Handed a connection (or room) as the wait ended: to the next in line.
                handed = waiter.result()
                if handed is None:
                    self._opening -= 1
                    self._hand_on(None)
                else:
                    self.give_back(handed, usable=True)
            else:
                waiter.cancel()
            raise
        if handed is None:
            return await self._open_reserved(deadline)
        return handed


async def _close(connection: asyncpg.Connection) -> None:
    try:
        await connection.close(timeout=CLOSE_SECONDS)
    except Exception:  # noqa: BLE001 - gone either way
        connection.terminate()

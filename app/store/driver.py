"""The gateway's most frequent statements on PostgreSQL, run straight on asyncpg connections.

Through SQLAlchemy's asyncio layer the upsert that starts an event cost about 240 µs of
gateway CPU here and the decision about 320 µs (a pool checkout with its events and greenlet
hops, the compiled-cache lookup, bind and result processing around a greenlet switch); the
same SQL on an asyncpg pool about 80 and 160 µs (``bench.statement_cost``). The worker runs
these two for every event, so they go this way, as do the audit rows written before Claude
calls and the relay's fetch and write each round; everything else keeps SQLAlchemy.

What does not change: the SQL (each ``DriverStatement`` is compiled once from the same Core
statement, for the engine's dialect), its parameters (each passes through its type's bind
processor, as SQLAlchemy would: JSON is serialized the same way), the database and its
credentials (the engine's connection arguments). Errors are raised as SQLAlchemy's
(``IntegrityError``, ``DataError``, ``OperationalError``, ``InterfaceError``,
``DBAPIError``; ``orig`` a ``DriverError`` with asyncpg's message and SQLSTATE), never with
the parameters or the refused row in their text, so callers and ``faults.py`` classify them
as before. A statement whose parameters SQLAlchemy works out per execution (IN lists,
callables, Python-side column defaults) is refused when it is compiled.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import asyncpg
from asyncpg.exceptions import _base as asyncpg_base
from sqlalchemy import Column, Table, bindparam, insert
from sqlalchemy import exc as sa_errors
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.schema import CallableColumnDefault, ScalarElementColumnDefault

from app.store.connections import ConnectionLender

_T = TypeVar("_T")
MAX_COMPILED = 256
# Connection arguments that are SQLAlchemy's own, not asyncpg's.
_ENGINE_ONLY = ("async_creator_fn", "prepared_statement_cache_size", "prepared_statement_name_func")


class DriverStatement:
    """A Core statement compiled once for ``dialect``, with what turns named parameters
    into its positional arguments."""

    def __init__(self, statement: Executable, dialect: Dialect) -> None:
        compiled = cast(SQLCompiler, cast(ClauseElement, statement).compile(dialect=dialect))
        self.sql = str(compiled)
        self.names: Sequence[str] = tuple(compiled.positiontup or ())
        binds = [(name, compiled.binds[name]) for name in self.names]
        # What SQLAlchemy works out per execution is refused: an IN list (rendered then),
        # a parameter's callable, a column default computed in Python (insert_prefetch).
        if any(bind.expanding or bind.literal_execute for _, bind in binds):
            raise ValueError("a statement with expanding parameters cannot run on the driver")
        if any(bind.callable is not None for _, bind in binds):
            raise ValueError("a statement with callable parameters cannot run on the driver")
        if compiled.insert_prefetch or compiled.update_prefetch:
            raise ValueError(
                "a statement with Python-side column defaults cannot run on the driver"
            )
        # Values bound in the statement itself (literals such as a status to set, None
        # included); a parameter without one must be given by the caller.
        self.defaults = {name: bind.effective_value for name, bind in binds if not bind.required}
        processors: dict[str, Callable[[Any], Any]] = {}
        for name, bind in binds:
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                processors[name] = processor
        self.processors = processors

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        values = {**self.defaults, **params}
        processors = self.processors
        return [
            processors[name](values[name]) if name in processors else values[name]
            for name in self.names
        ]


class DriverPool:
    """An asyncpg pool on the engine's database, running Core statements compiled once."""

    def __init__(self, connections: ConnectionLender, dialect: Dialect) -> None:
        self.connections = connections
        self.dialect = dialect
        # Statements compiled, most recently used last; bounded, as SQLAlchemy's cache is: a
        # decision's statement differs by its number of outbox rows (up to 100).
        self._compiled: OrderedDict[Executable, DriverStatement] = OrderedDict()
        # INSERTs built by ``insert_many``, per table and set of columns given.
        self._inserts: dict[
            tuple[Table, tuple[str, ...]], tuple[Executable, list[tuple[str, Callable[[], Any]]]]
        ] = {}

    @classmethod
    async def open(
        cls, url: URL, dialect: Dialect, *, size: int, acquire_timeout: float = 30.0
    ) -> DriverPool:
        """The engine's connection arguments (host or hosts, port, database, credentials,
        the URL's query such as ``ssl``), as its dialect gives them to ``asyncpg.connect``.
        Up to ``size`` connections, opened as they are needed (none at start); one idle for
        five minutes is replaced when next needed (``connections.py``). A statement that
        finds every connection busy for ``acquire_timeout`` seconds fails with
        ``TimeoutError``, as the engine's pool does after 30 s (the worker retries the event
        in place: the database is unavailable, not the event at fault)."""
        args, kwargs = dialect.create_connect_args(url)
        for engine_only in _ENGINE_ONLY:
            kwargs.pop(engine_only, None)

        async def connect() -> asyncpg.Connection:
            return await asyncpg.connect(*args, **kwargs)

        return cls(ConnectionLender(connect, size=size, wait_seconds=acquire_timeout), dialect)

    async def close(self) -> None:
        """Waits for the idle connections' goodbyes (five seconds at most); the lent ones are
        terminated as they come back."""
        await self.connections.close()

    def terminate(self) -> None:
        """Close every connection at once, without a goodbye."""
        self.connections.terminate()

    def compiled(self, statement: Executable) -> DriverStatement:
        """``statement`` compiled, once per statement object: callers pass statements they
        built once (module constants, cached builders)."""
        found = self._compiled.get(statement)
        if found is None:
            found = self._compiled[statement] = DriverStatement(statement, self.dialect)
            if len(self._compiled) > MAX_COMPILED:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(statement)
        return found

    async def fetchrow(self, core: Executable, params: Mapping[str, Any]) -> asyncpg.Record | None:
        statement = self.compiled(core)
        arguments = statement.arguments(params)
        return await self._run(
            statement.sql, lambda connection: connection.fetchrow(statement.sql, *arguments)
        )

    async def fetch(self, core: Executable, params: Mapping[str, Any]) -> list[asyncpg.Record]:
        statement = self.compiled(core)
        arguments = statement.arguments(params)
        return await self._run(
            statement.sql, lambda connection: connection.fetch(statement.sql, *arguments)
        )

    async def fetchrow_locked(
        self,
        lock: Executable,
        lock_params: Mapping[str, Any],
        core: Executable,
        params: Mapping[str, Any],
    ) -> asyncpg.Record | None:
        """``lock`` (a ``SELECT ... FOR UPDATE``), then ``core``, in one transaction: ``core``
        reads what was committed before the locks were granted (READ COMMITTED takes a
        snapshot per statement), which one statement taking both could not."""
        first, statement = self.compiled(lock), self.compiled(core)
        first_arguments = first.arguments(lock_params)
        arguments = statement.arguments(params)

        async def locked(connection: asyncpg.Connection) -> asyncpg.Record | None:
            async with connection.transaction():
                await connection.execute(first.sql, *first_arguments)
                return await connection.fetchrow(statement.sql, *arguments)

        return await self._run(statement.sql, locked)

    async def insert_many(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert ``rows`` (each naming the same columns) with one ``executemany``: one
        round trip, and atomic (asyncpg runs it in a transaction of its own), so a refused
        row refuses them all. A column a row leaves out gets its Python-side default, as
        SQLAlchemy gives it (a scalar, or a callable's value at this moment), else the
        database's."""
        if not rows:
            return
        columns = tuple(rows[0])
        core, defaults = self._insert_of(table, columns)
        statement = self.compiled(core)
        if defaults:
            rows = [{**{name: default() for name, default in defaults}, **row} for row in rows]
        arguments = [statement.arguments(row) for row in rows]
        await self._run(
            statement.sql, lambda connection: connection.executemany(statement.sql, arguments)
        )

    def _insert_of(
        self, table: Table, columns: tuple[str, ...]
    ) -> tuple[Executable, list[tuple[str, Callable[[], Any]]]]:
        """The INSERT naming ``columns`` and every column with a Python-side default (built
        once per set of columns), and those defaults."""
        key = (table, columns)
        found = self._inserts.get(key)
        if found is None:
            defaults = [
                (column.name, python_default(column))
                for column in table.columns
                if column.name not in columns and column.default is not None
            ]
            names = [*columns, *(name for name, _ in defaults)]
            core = insert(table).values(
                {name: bindparam(name, type_=table.c[name].type) for name in names}
            )
            found = self._inserts[key] = (core, defaults)
        return found

    async def _run(self, sql: str, work: Callable[[asyncpg.Connection], Awaitable[_T]]) -> _T:
        """``work`` on a connection of the pool, its failures as SQLAlchemy's. The connection
        is lent again only when the database answered (a refusal included)."""
        try:
            connection = await self.connections.take()
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise translated(exc, sql) from None  # refused at login, say
        usable = False
        try:
            answer = await work(connection)
            usable = True
            return answer
        except (asyncio.CancelledError, TimeoutError):
            # asyncpg cancels the statement on the server; the connection's next statement
            # waits for that (``connections.py``).
            usable = not connection.is_closed()
            raise
        except Exception as exc:
            if connection.is_closed():
                # Whatever asyncpg raised (a connection terminated under a statement can
                # surface as its InternalClientError or as the server's shutdown error), a
                # closed connection is a lost one, as SQLAlchemy's dialect decides.
                raise sa_errors.OperationalError(
                    sql,
                    None,
                    DriverError(exc),
                    hide_parameters=True,
                    connection_invalidated=True,
                ) from None
            if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError):
                usable = isinstance(exc, asyncpg.PostgresError)
                raise translated(exc, sql) from None
            raise
        finally:
            self.connections.give_back(connection, usable=usable)


def python_default(column: Column[Any]) -> Callable[[], Any]:
    """A column's Python-side default as a function of nothing: a scalar, or a callable that
    takes no execution context (SQLAlchemy wraps those to take one and ignore it). A SQL
    expression or a sequence is refused, as is a callable that reads its context."""
    default = column.default
    if isinstance(default, ScalarElementColumnDefault):
        value = default.arg
        return lambda: value
    # SQLAlchemy keeps a callable that takes a context as given, and wraps one that does not.
    if isinstance(default, CallableColumnDefault) and not default.compare_argument(default.arg):
        call = default.arg
        return lambda: call(None)  # type: ignore[arg-type]
    raise ValueError(f"the default of {column} cannot be computed on the driver")


# asyncpg's message for a value it could not encode, up to where it quotes the value.
_QUOTING_ARGUMENT = re.compile(
    r"(invalid input for query argument \$\d+(?: in element #\d+ of executemany\(\) sequence)?):"
)


class DriverError(Exception):
    """asyncpg's error as its message and SQLSTATE only: its text also holds the server's
    DETAIL, which quotes the refused row's values ("Failing row contains (...)", the
    event's payload among them), and error texts reach logs and dead letters. SQLAlchemy's
    dialect keeps the message alone too. A value asyncpg could not encode is quoted in its
    message (``invalid input for query argument $3: 'the value...' (why)``): the message is
    cut before it."""

    def __init__(self, exc: BaseException) -> None:
        message = str(exc.args[0]) if exc.args else ""
        if (quoted := _QUOTING_ARGUMENT.match(message)) is not None:
            message = f"{quoted[1]}: a value of the wrong type or form"
        super().__init__(f"{type(exc).__name__}: {message}")
        self.sqlstate: str | None = getattr(exc, "sqlstate", None)


def translated(exc: Exception, sql: str) -> sa_errors.DBAPIError:
    """asyncpg's error as the SQLAlchemy error its dialect would raise, without the
    parameters, the row or asyncpg's exception itself (raise it ``from None``)."""
    kind: type[sa_errors.DBAPIError]
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        kind = sa_errors.IntegrityError
    elif sqlstate.startswith("22") or isinstance(exc, asyncpg_base.DataError):
        # a value the server refused, or one asyncpg could not even encode
        kind = sa_errors.DataError
    elif isinstance(exc, asyncpg.PostgresConnectionError):
        kind = sa_errors.OperationalError
    elif isinstance(exc, asyncpg.InterfaceError):
        kind = sa_errors.InterfaceError
    else:
        kind = sa_errors.DBAPIError
    return kind(sql, None, DriverError(exc), hide_parameters=True)

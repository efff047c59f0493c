"""Which failures are a dependency being unavailable, and which are the event's own.

The worker retries an event in place when processing fails. A failure that says Redis or the
database cannot be reached (or is overloaded, shutting down, or lost the connection) is not the
event's fault: it is retried with backoff and never counts towards dead-lettering, so an hour of
database outage dead-letters nothing. Any other failure (a row the database refuses, a bug hit
by this event's data) counts, and the event is dead-lettered after ``EVENTGATE_MAX_DELIVERIES``.
"""

from __future__ import annotations

from typing import Protocol

import asyncpg
from redis import exceptions as redis_errors
from sqlalchemy import exc as sa_errors


class LeaseLost(Exception):
    """The lease this work was started under moved to another process: stop, store nothing,
    do not ack (the new owner has the entry). Never the event's fault."""


class Fence(Protocol):
    """The lease a piece of work runs under (implemented by the queue's ``LeaseGuard``)."""

    @property
    def epoch(self) -> int:
        """Later tenures of a partition have larger epochs; the store refuses older ones."""
        ...

    async def check(self) -> None:
        """Raise ``LeaseLost`` unless the tenure still holds."""
        ...


# What a failed Redis call can raise: the cluster client's own errors (no node reachable, a
# slot without a node) are not RedisError subclasses, and a refused socket is an OSError.
REDIS_ERRORS: tuple[type[Exception], ...] = (
    redis_errors.RedisError,
    redis_errors.RedisClusterException,
    OSError,
)


def raised_in_redis_client(exc: BaseException) -> bool:
    """An AttributeError, TypeError or RuntimeError raised on its way through redis-py's
    code: its cluster client fails so on a connection another task closed under it while
    the slots were being read again (a master going away: ``'NoneType' object has no
    attribute 'writelines'``, uvloop's ``the handler is closed``, both seen in
    ``tests/queue/test_cluster.py``). A Redis failure, like ``REDIS_ERRORS``, not a bug of
    the caller's."""
    if not isinstance(exc, AttributeError | TypeError | RuntimeError):
        return False
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if isinstance(module, str) and module.startswith("redis."):
            return True
        tb = tb.tb_next
    return False


_REDIS_UNAVAILABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    redis_errors.ReadOnlyError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.MasterDownError,
    redis_errors.ClusterError,  # the cluster client's retries on a failing node ran out
    redis_errors.SlotNotCoveredError,  # a slot without a master (one went away)
)
_SQL_UNAVAILABLE = (
    sa_errors.OperationalError,
    sa_errors.InterfaceError,
    sa_errors.DisconnectionError,
    sa_errors.TimeoutError,  # the connection pool had no connection to give
)
_UNAVAILABLE = (OSError, TimeoutError, *_REDIS_UNAVAILABLE, *_SQL_UNAVAILABLE)
# SQLSTATE classes of a server that cannot serve now: 08 connection exception, 53 insufficient
# resources (too many connections, disk full), 57 operator intervention (shutdown, cannot
# connect now), 58 system error; and 40001/40P01, a serialization failure or deadlock to retry.
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57", "58")
_RETRY_SQLSTATES = frozenset({"40001", "40P01"})


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it: SQLAlchemy's ``orig``, else ``__cause__``."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return chain


# SQLSTATE class 22: data exception (a value too long, NUL in text, out of range).
_DATA_SQLSTATE_CLASS = "22"


def data_refused(exc: BaseException) -> bool:
    """True when the database refused a value itself: it will refuse it every time.

    asyncpg's server errors carry the SQLSTATE (SQLAlchemy wraps them as a plain
    ``DBAPIError``); values asyncpg cannot even encode are its client-side ``DataError``."""
    for current in _chain(exc):
        if isinstance(current, sa_errors.DataError):
            return True
        sqlstate = getattr(current, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate[:2] == _DATA_SQLSTATE_CLASS:
            return True
        if type(current).__module__.startswith("asyncpg") and isinstance(current, ValueError):
            return True  # asyncpg's client-side DataError: "invalid input for query argument"
    return False


def dependency_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says a dependency could not serve the request."""
    for current in _chain(exc):
        if isinstance(current, _UNAVAILABLE) or raised_in_redis_client(current):
            return True
        if isinstance(current, sa_errors.DBAPIError) and current.connection_invalidated:
            return True
        if _connection_closed(current):
            return True
        sqlstate = getattr(current, "sqlstate", None)
        if isinstance(sqlstate, str) and (
            sqlstate[:2] in _UNAVAILABLE_SQLSTATE_CLASSES or sqlstate in _RETRY_SQLSTATES
        ):
            return True
    return False


def _connection_closed(exc: BaseException) -> bool:
    """asyncpg's own error for a connection that is gone, as SQLAlchemy's asyncpg dialect
    recognises it (``is_disconnect``). SQLAlchemy lets it through unwrapped when the cut
    comes while a new pooled connection is being set up (its JSON codec), and then it was
    counted against the event (``tests/llm/test_driver_flapping.py``)."""
    return isinstance(exc, asyncpg.InterfaceError) and "connection is closed" in str(exc)

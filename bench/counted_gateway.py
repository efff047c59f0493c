"""``eventgate`` with each SQL statement it sends counted, for the capacity model: the count
is ``bench_db_statements_total{verb}`` on the gateway's own ``/metrics``. Statements go
through SQLAlchemy's engine (counted by its event) or, the worker's per-event ones on
PostgreSQL, straight on the driver's pool (counted around ``DriverPool.fetchrow``).

    python -m bench.counted_gateway serve --port 8080
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.store.driver import DriverPool

STATEMENTS = Counter("bench_db_statements", "SQL statements sent to the database", ["verb"])


@event.listens_for(Engine, "before_cursor_execute")
def _count(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
    STATEMENTS.labels(verb=_verb(statement)).inc()


def _verb(statement: str) -> str:
    return statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"


_fetchrow = DriverPool.fetchrow


async def _counted_fetchrow(pool: DriverPool, core: Any, params: Any) -> Any:
    STATEMENTS.labels(verb=_verb(pool.compiled(core).sql)).inc()
    return await _fetchrow(pool, core, params)


DriverPool.fetchrow = _counted_fetchrow  # type: ignore[method-assign,assignment]


if __name__ == "__main__":
    from app.cli import app

    app(prog_name="eventgate")

"""``eventgate`` with each SQL statement it sends counted, for the capacity model: the count
is ``bench_db_statements_total{verb}`` on the gateway's own ``/metrics``.

    python -m bench.counted_gateway serve --port 8080
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter
from sqlalchemy import event
from sqlalchemy.engine import Engine

STATEMENTS = Counter("bench_db_statements", "SQL statements sent to the database", ["verb"])


@event.listens_for(Engine, "before_cursor_execute")
def _count(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
    verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
    STATEMENTS.labels(verb=verb).inc()


if __name__ == "__main__":
    from app.cli import app

    app(prog_name="eventgate")

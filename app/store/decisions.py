"""The worker's decision write: the attempt's outcome, the event's new status and its outbox
rows, stored together and only while no lease tenure later than the worker's has started
the event (the fence).

On PostgreSQL it is one statement (straight on the driver's pool when the worker has one,
``driver.py``, else on an autocommit connection), one round trip: data-modifying
CTEs, the event's fenced UPDATE first, and the audit UPDATE and the outbox INSERT only when it
returned a row. A transaction of the same three statements took five round trips (BEGIN,
three statements, COMMIT), and the database's round trips are most of a decided event's
gateway CPU. Elsewhere (SQLite, in process) it is those statements in one transaction.

Either way nothing is stored when the fence refuses (``store`` returns False), and nothing
when a row is refused (an outbox dedup id stored already raises ``IntegrityError``): the
caller then completes the audit row on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Executable,
    bindparam,
    exists,
    func,
    insert,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.store.driver import DriverPool
from app.store.models import OutboxRow, OutboxStatus, utcnow
from app.store.repository import (
    EVENTS,
    LLM_CALLS,
    OUTBOX,
    OUTCOME_FIELDS,
    SET_STATUS_FENCED,
    LlmCallRepository,
)

# The columns of an outbox row the decision sets; the database (or the relay) fills the rest.
OUTBOX_FIELDS = (
    "event_id",
    "source",
    "seq",
    "generation",
    "llm_call_id",
    "tool",
    "topic_arn",
    "group_id",
    "relay_slot",
    "dedup_id",
    "body",
)
# ... and the ones it sets to the same value on every row (named after their parameters).
OUTBOX_CONSTANTS = {"status": "pending", "attempts": "no_attempts", "created_at": "d_now"}


@dataclass(frozen=True, slots=True)
class Decision:
    event_id: str
    status: str  # once stored: processing (rows to publish), held (none has a topic), no_action
    error: str | None
    epoch: int  # the lease tenure of the worker that decided it
    call_id: str  # the attempt whose outcome this is
    outcome: dict[str, Any]  # every one of OUTCOME_FIELDS
    rows: Sequence[OutboxRow]  # in publish order


class DecisionStore:
    def __init__(self, engine: AsyncEngine, *, driver: DriverPool | None = None) -> None:
        self.engine = engine
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.one_statement = engine.dialect.name == "postgresql"
        self.driver = driver if self.one_statement else None

    async def store(self, decision: Decision) -> bool:
        """Store the decision; False when a later lease tenure started the event (nothing
        stored)."""
        if self.driver is not None:
            row = await self.driver.fetchrow(_statement(len(decision.rows)), _parameters(decision))
            return row is not None and bool(row[0])
        if self.one_statement:
            async with self.autocommit.connect() as connection:
                result = await connection.execute(
                    _statement(len(decision.rows)), _parameters(decision)
                )
                return bool(result.scalar_one())
        async with self.engine.connect() as connection:
            stored = await _in_steps(connection, decision)
            await (connection.commit() if stored else connection.rollback())
            return stored


async def _in_steps(connection: AsyncConnection, decision: Decision) -> bool:
    result = await connection.execute(
        SET_STATUS_FENCED,
        {
            "event_id": decision.event_id,
            "status": decision.status,
            "error": decision.error,
            "now": utcnow(),
            "epoch": decision.epoch,
        },
    )
    if not getattr(result, "rowcount", 0):
        return False
    await LlmCallRepository(connection).complete(decision.call_id, decision.outcome)
    if decision.rows:
        await connection.execute(
            insert(OUTBOX),
            [
                {name: getattr(row, name) for name in OUTBOX_FIELDS}
                | {"status": OutboxStatus.PENDING, "attempts": 0, "created_at": utcnow()}
                for row in decision.rows
            ],
        )
    return True


def _parameters(decision: Decision) -> dict[str, Any]:
    """Named apart from every column: an UPDATE takes a parameter named like one of its
    table's columns as a value to SET."""
    now = utcnow()
    params: dict[str, Any] = {
        "d_event": decision.event_id,
        "d_status": decision.status,
        "d_error": decision.error,
        "d_now": now,
        "d_epoch": decision.epoch,
        "d_call": decision.call_id,
        "pending": OutboxStatus.PENDING,
        "no_attempts": 0,
    }
    params |= {f"v_{name}": decision.outcome[name] for name in OUTCOME_FIELDS}
    for index, row in enumerate(decision.rows):
        params |= {f"r{index}_{name}": getattr(row, name) for name in OUTBOX_FIELDS}
    return params


@lru_cache(maxsize=128)  # every row count a pipeline allows (max_tool_calls ≤ 100)
def _statement(rows: int) -> Executable:
    """The one-statement write for a decision with ``rows`` outbox rows, built once per row
    count (a statement built per call would make SQLAlchemy derive its cache key each time)."""
    fenced = (
        update(EVENTS)
        .where(EVENTS.c.id == bindparam("d_event"), EVENTS.c.fence <= bindparam("d_epoch"))
        .values(
            status=bindparam("d_status"), error=bindparam("d_error"), updated_at=bindparam("d_now")
        )
        .returning(EVENTS.c.id)
        .cte("fenced")
    )
    allowed = exists(select(fenced.c.id))
    completed = (
        update(LLM_CALLS)
        .where(LLM_CALLS.c.id == bindparam("d_call"), allowed)
        .values({name: bindparam(f"v_{name}") for name in OUTCOME_FIELDS})
        .returning(LLM_CALLS.c.id)
        .cte("completed")
    )
    statement = select(func.count()).select_from(fenced).add_cte(completed)
    if rows:
        statement = statement.add_cte(_outbox_insert(rows, allowed))
    return statement


def _outbox_insert(rows: int, allowed: Any) -> Any:
    """INSERT INTO outbox SELECT the rows' parameters WHERE the fence allowed it, in seq
    order (row ids are the relay's publish order)."""
    each = [
        select(
            *(
                bindparam(f"r{index}_{name}", type_=OUTBOX.c[name].type).label(name)
                for name in OUTBOX_FIELDS
            )
        ).where(allowed)
        for index in range(rows)
    ]
    given = (union_all(*each) if rows > 1 else each[0]).subquery("given")
    constants = [
        bindparam(parameter, type_=OUTBOX.c[name].type).label(name)
        for name, parameter in OUTBOX_CONSTANTS.items()
    ]
    chosen = select(*(given.c[name] for name in OUTBOX_FIELDS), *constants).order_by(given.c.seq)
    return (
        insert(OUTBOX)
        .from_select([*OUTBOX_FIELDS, *OUTBOX_CONSTANTS], chosen, include_defaults=False)
        .returning(OUTBOX.c.id)
        .cte("queued")
    )

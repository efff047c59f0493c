"""All SQL lives here. Repositories never commit; the caller's unit of work does."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    SmallInteger,
    String,
    Table,
    all_,
    any_,
    bindparam,
    case,
    func,
    insert,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.events import EventStatus
from app.store.driver import DriverPool
from app.store.models import (
    Base,
    CallPurpose,
    DeadLetterRow,
    EventRow,
    LlmCallRow,
    OutboxRow,
    OutboxStatus,
    PendingRow,
    slot_of,
    utcnow,
)

EVENTS = cast(Table, EventRow.__table__)
OUTBOX = cast(Table, OutboxRow.__table__)
LLM_CALLS = cast(Table, LlmCallRow.__table__)


def _column_values(row: Base) -> dict[str, Any]:
    """The columns set on a new, unsaved row object; Core fills in the others' defaults.

    Rows written on every event go in with a Core INSERT: the ORM's unit of work (identity
    map, flush bookkeeping, fetching ids back) cost more CPU than the statement.
    """
    return {
        attr.key: getattr(row, attr.key)
        for attr in sa_inspect(type(row)).column_attrs
        if attr.key in row.__dict__
    }


# The event's own columns, which ``start_delivery`` takes as ``fields``.
EVENT_FIELDS = (
    "id",
    "source",
    "type",
    "group_key",
    "delivery_id",
    "pipeline",
    "payload",
    "received_at",
)


def _start_delivery(insert: Any) -> Any:
    """The upsert of ``start_delivery`` for one dialect's ``insert``."""
    return (
        insert(EVENTS)
        .values(
            {name: bindparam(name) for name in EVENT_FIELDS}
            | {
                "status": EventStatus.PROCESSING,
                "deliveries": 1,
                "replays": 0,
                "fence": bindparam("epoch"),
                "updated_at": bindparam("now"),
            }
        )
        .on_conflict_do_update(
            index_elements=[EVENTS.c.id],
            set_={
                "deliveries": EVENTS.c.deliveries + bindparam("count"),
                "updated_at": bindparam("now"),
                "status": case(
                    (EVENTS.c.status == EventStatus.QUEUED, EventStatus.PROCESSING),
                    else_=EVENTS.c.status,
                ),
                "fence": case(
                    (EVENTS.c.fence > bindparam("epoch"), EVENTS.c.fence),
                    else_=bindparam("epoch"),
                ),
            },
        )
        .returning(EVENTS.c.status, EVENTS.c.deliveries, EVENTS.c.replays, EVENTS.c.fence)
    )


# The statements run for every event, built once with bound parameters: building one per
# call made SQLAlchemy derive a new cache key each time, which cost about as much CPU as
# running it (docs/benchmarks.md, the profile notes).
START_DELIVERY = {
    "postgresql": _start_delivery(postgresql.insert),
    "sqlite": _start_delivery(sqlite.insert),
}
SET_STATUS = (
    update(EVENTS)
    .where(EVENTS.c.id == bindparam("event_id"))
    .values(status=bindparam("status"), error=bindparam("error"), updated_at=bindparam("now"))
)
# The same, only while no later lease tenure than ``epoch`` has started the event.
SET_STATUS_FENCED = SET_STATUS.where(EVENTS.c.fence <= bindparam("epoch"))
# What an attempt's outcome fills in on its row (written before the call with status unknown).
OUTCOME_FIELDS = (
    "model",
    "status",
    "request_id",
    "latency_ms",
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "stop_reason",
    "tool_calls",
    "error_type",
    "error",
    "cost_usd",
    "response_text",
)


def _pending(*, skipping: bool, sliced: bool, arrays: bool = False) -> Any:
    """The relay's fetch (``OutboxRepository.pending``), built once: the relay runs it every
    poll, and building it per call cost more CPU than running it.

    It selects the table's columns, in its order (``PendingRow``). ``arrays``: the lists as
    PostgreSQL arrays (``<> ALL``, ``= ANY``) rather than IN lists that SQLAlchemy renders per
    call: the form the driver's pool runs (``pending_on_driver``)."""
    conditions = [OUTBOX.c.status == OutboxStatus.PENDING, OUTBOX.c.topic_arn.is_not(None)]
    if skipping:
        conditions.append(
            OUTBOX.c.group_id != all_(bindparam("skip_groups", type_=postgresql.ARRAY(String)))
            if arrays
            else OUTBOX.c.group_id.not_in(bindparam("skip_groups", expanding=True))
        )
    if sliced:
        conditions.append(
            (
                OUTBOX.c.relay_slot
                == any_(bindparam("slots", type_=postgresql.ARRAY(SmallInteger)))
                if arrays
                else OUTBOX.c.relay_slot.in_(bindparam("slots", expanding=True))
            )
            | OUTBOX.c.relay_slot.is_(None)
        )
    ranked = (
        select(
            OUTBOX.c.id,
            func.row_number()
            .over(partition_by=OUTBOX.c.group_id, order_by=OUTBOX.c.id)
            .label("rank"),
        )
        .where(*conditions)
        .subquery()
    )
    # Chosen by (rank, id) before the join, so only the chosen rows are read whole.
    chosen = (
        select(ranked.c.id, ranked.c.rank)
        .where(ranked.c.rank <= bindparam("per_group"))
        .order_by(ranked.c.rank, ranked.c.id)
        .limit(bindparam("limit"))
        .subquery()
    )
    return (
        select(*OUTBOX.c)
        .join_from(OUTBOX, chosen, OUTBOX.c.id == chosen.c.id)
        .order_by(chosen.c.rank, chosen.c.id)
    )


# (skipping groups, only some slots) → the statement
PENDING = {
    (skipping, sliced): _pending(skipping=skipping, sliced=sliced)
    for skipping in (False, True)
    for sliced in (False, True)
}
PENDING_ARRAYS = {
    (skipping, sliced): _pending(skipping=skipping, sliced=sliced, arrays=True)
    for skipping in (False, True)
    for sliced in (False, True)
}


def _pending_params(
    *, limit: int, per_group: int, skip_groups: Sequence[str], slots: Collection[int] | None
) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": limit, "per_group": per_group}
    if skip_groups:
        params["skip_groups"] = list(skip_groups)
    if slots is not None:
        params["slots"] = sorted(slots) or [-1]  # none: no slot matches
    return params


def _in_slots(rows: Sequence[PendingRow], slots: Collection[int] | None) -> list[PendingRow]:
    """A fetched row without a slot is kept when its group's computed slot is one of
    ``slots`` (the statement keeps every row without one)."""
    if slots is None:
        return list(rows)
    return [r for r in rows if r.relay_slot is not None or slot_of(r.group_id) in slots]


async def pending_on_driver(
    driver: DriverPool,
    *,
    limit: int,
    per_group: int,
    skip_groups: Sequence[str] = (),
    slots: Collection[int] | None = None,
) -> list[PendingRow]:
    """``OutboxRepository.pending`` on the driver's pool (PostgreSQL): the same rows in the
    same order, without a session (which cost more CPU than the statement, on every poll of
    an idle relay too)."""
    statement = PENDING_ARRAYS[(bool(skip_groups), slots is not None)]
    params = _pending_params(limit=limit, per_group=per_group, skip_groups=skip_groups, slots=slots)
    records = await driver.fetch(statement, params)
    return _in_slots([PendingRow(*record) for record in records], slots)


COMPLETE_LLM_CALL = (
    update(LLM_CALLS)
    .where(LLM_CALLS.c.id == bindparam("call_id"))
    .values({name: bindparam(f"v_{name}") for name in OUTCOME_FIELDS})
)
INSERT_LLM_CALL = insert(LLM_CALLS)


# What the relay may finish as ``published``: a held event too, should its calls be published.
UNPUBLISHED = (EventStatus.PROCESSING, EventStatus.HELD)


@dataclass(frozen=True, slots=True)
class Finished:
    """Events the relay's round finished: all published, or only held calls left."""

    published: list[str]
    held: list[str]


@dataclass(frozen=True, slots=True)
class Delivery:
    status: str
    deliveries: int  # of this generation (a replay starts counting again)
    replays: int
    fence: int  # the latest lease epoch that started the event (this one's, or a later one)

    @property
    def first(self) -> bool:
        """The event's very first delivery: nothing can be stored for it yet."""
        return self.deliveries == 1 and self.replays == 0


async def start_delivery(
    connection: AsyncConnection | DriverPool,
    *,
    fields: dict[str, Any],
    epoch: int = 0,
    count: bool = True,
) -> Delivery:
    """Insert the event on first delivery, count every delivery, raise its fence to the lease
    ``epoch`` of this delivery: one upsert.

    The upsert takes the row's write lock (SQLite) or row lock (PostgreSQL) and returns
    the latest committed status, so it sees a replay committed meanwhile (an operator
    replay holds that lock until its stream entry is added and its reset committed); a
    replayed event (``queued``) becomes ``processing`` again.

    One statement, so it is atomic on its own: the worker runs it on an autocommit
    connection, one round trip instead of BEGIN, upsert and COMMIT (or straight on the
    driver's pool, ``DriverPool``). ``count=False``: a retry in place after a dependency was
    unreachable, which is no new delivery.
    """
    params = {**fields, "epoch": epoch, "now": utcnow(), "count": 1 if count else 0}
    if isinstance(connection, DriverPool):
        row = await connection.fetchrow(START_DELIVERY["postgresql"], params)
        if row is None:
            raise RuntimeError("the delivery upsert returned no row")
        status, deliveries, replays, fence = row
    else:
        dialect = connection.dialect.name
        statement = START_DELIVERY["postgresql" if dialect == "postgresql" else "sqlite"]
        status, deliveries, replays, fence = (await connection.execute(statement, params)).one()
    return Delivery(status, deliveries, replays, fence)


class EventRepository:
    """Hot-path statements are Core (on the tables), not ORM-enabled: the worker runs them
    for every event, and the ORM's bulk-update bookkeeping cost more CPU than the SQL."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, event_id: str) -> EventRow | None:
        return await self.session.get(EventRow, event_id)

    async def set_status(self, event_id: str, status: str, *, error: str | None = None) -> None:
        await self.session.execute(
            SET_STATUS, {"event_id": event_id, "status": status, "error": error, "now": utcnow()}
        )

    async def set_status_fenced(
        self, event_id: str, status: str, *, epoch: int, error: str | None = None
    ) -> bool:
        """Set the status unless a lease tenure later than ``epoch`` has started the event;
        False when refused (the caller rolls back)."""
        result = await self.session.execute(
            SET_STATUS_FENCED,
            {
                "event_id": event_id,
                "status": status,
                "error": error,
                "now": utcnow(),
                "epoch": epoch,
            },
        )
        return bool(getattr(result, "rowcount", 0))

    async def finish_published(self, event_ids: Sequence[str]) -> list[datetime]:
        """``processing`` or ``held`` → ``published`` for these events; their ``received_at``
        times."""
        if not event_ids:
            return []
        result = await self.session.execute(
            update(EVENTS)
            .where(EVENTS.c.id.in_(event_ids), EVENTS.c.status.in_(UNPUBLISHED))
            .values(status=EventStatus.PUBLISHED, error=None, updated_at=utcnow())
            .returning(EVENTS.c.received_at)
        )
        return list(result.scalars())

    async def finish_held(self, event_ids: Sequence[str]) -> int:
        """``processing`` → ``held`` for these events; how many moved."""
        if not event_ids:
            return 0
        result = await self.session.execute(
            update(EVENTS)
            .where(EVENTS.c.id.in_(event_ids), EVENTS.c.status == EventStatus.PROCESSING)
            .values(status=EventStatus.HELD, updated_at=utcnow())
        )
        return int(getattr(result, "rowcount", 0))


class LlmCallRepository:
    """Takes a session (a unit of work) or an autocommit connection (one statement alone)."""

    def __init__(self, session: AsyncSession | AsyncConnection) -> None:
        self.session = session

    async def add(self, row: LlmCallRow) -> None:
        await self.insert(_column_values(row))

    async def insert(self, values: dict[str, Any]) -> None:
        """A new row from its column values (one dict: not the executemany path)."""
        await self.session.execute(INSERT_LLM_CALL, values)

    async def complete(self, call_id: str, outcome: dict[str, Any]) -> None:
        """Fill in the outcome (every one of ``OUTCOME_FIELDS``) of an attempt whose row was
        written before the call."""
        await self.session.execute(
            COMPLETE_LLM_CALL,
            {"call_id": call_id} | {f"v_{name}": outcome[name] for name in OUTCOME_FIELDS},
        )

    async def count_for_event(self, event_id: str) -> int:
        result = await self.session.scalar(
            select(func.count())
            .select_from(LlmCallRow)
            .where(LlmCallRow.event_id == event_id, LlmCallRow.purpose == CallPurpose.LIVE)
        )
        return int(result or 0)

    async def for_event(self, event_id: str) -> Sequence[LlmCallRow]:
        result = await self.session.scalars(
            select(LlmCallRow)
            .where(LlmCallRow.event_id == event_id)
            .order_by(LlmCallRow.created_at, LlmCallRow.attempt)
        )
        return result.all()


class OutboxRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def for_event(
        self, event_id: str, *, generation: int | None = None
    ) -> Sequence[OutboxRow]:
        """The event's tool calls: of one replay generation, or of all (oldest first)."""
        query = select(OutboxRow).where(OutboxRow.event_id == event_id)
        if generation is not None:
            query = query.where(OutboxRow.generation == generation)
        result = await self.session.scalars(query.order_by(OutboxRow.generation, OutboxRow.seq))
        return result.all()

    async def pending(
        self,
        *,
        limit: int,
        per_group: int,
        skip_groups: Sequence[str] = (),
        slots: Collection[int] | None = None,
    ) -> list[PendingRow]:
        """The first ``per_group`` pending rows of each group not in ``skip_groups``: every
        group's head (its oldest pending row) before any group's second row, oldest first,
        at most ``limit`` rows. Rows without a topic wait for configuration and are left out.
        With ``slots``, only rows of groups in those relay slots.

        Ranking only pending rows makes a group's rank-1 row its head whatever was published
        or dead-lettered before it, so a group busy with thousands of rows, or the groups in
        backoff the caller skips, never keep another group's head out of the result. The
        ranking reads (id, group_id) only, so its sort holds no message bodies.

        A row without a slot (written by a process older than migration 0010) is ranked with
        every group's rows and kept when its group's computed slot is one of ``slots``: a
        group's older rows then always come before its newer ones, whichever have a slot.
        """
        params = _pending_params(
            limit=limit, per_group=per_group, skip_groups=skip_groups, slots=slots
        )
        statement = PENDING[(bool(skip_groups), slots is not None)]
        rows = (await self.session.execute(statement, params)).all()
        return _in_slots([PendingRow(*row) for row in rows], slots)

    async def mark_published(self, published: Sequence[tuple[int, str, str | None]]) -> None:
        """(row id, SNS message id, sequence number) for each row: one executemany."""
        if not published:
            return
        await self.session.execute(
            update(OUTBOX)
            .where(OUTBOX.c.id == bindparam("row_id"))
            .values(
                status=OutboxStatus.PUBLISHED,
                sns_message_id=bindparam("message_id"),
                sns_sequence_number=bindparam("sequence_number"),
                published_at=utcnow(),
                attempts=OUTBOX.c.attempts + 1,
                last_error=None,
            ),
            [
                {"row_id": row_id, "message_id": message_id, "sequence_number": number}
                for row_id, message_id, number in published
            ],
        )

    async def mark_failed(self, row_id: int, *, error: str, dead: bool) -> None:
        values: dict[str, Any] = {"attempts": OutboxRow.attempts + 1, "last_error": error}
        if dead:
            values["status"] = OutboxStatus.DEAD
        # Only a pending row: a relay that lost its lease must not undo the holder's work.
        await self.session.execute(
            update(OutboxRow)
            .where(OutboxRow.id == row_id, OutboxRow.status == OutboxStatus.PENDING)
            .values(values)
        )

    async def finished(self, events: Sequence[tuple[str, int]]) -> Finished:
        """Of these (event id, generation) pairs, the events whose rows of that generation
        are all published, and those whose only unpublished rows are held (pending without
        a topic: the relay never sends them). Earlier generations are history."""
        if not events:
            return Finished(published=[], held=[])
        held_row = (OUTBOX.c.status == OutboxStatus.PENDING) & OUTBOX.c.topic_arn.is_(None)
        result = await self.session.execute(
            select(
                OUTBOX.c.event_id,
                OUTBOX.c.generation,
                func.max(case((held_row, 0), else_=1)).label("to_publish"),
            )
            .where(
                OUTBOX.c.event_id.in_({event_id for event_id, _ in events}),
                OUTBOX.c.status != OutboxStatus.PUBLISHED,
            )
            .group_by(OUTBOX.c.event_id, OUTBOX.c.generation)
        )
        unfinished = {(event_id, gen): bool(to_publish) for event_id, gen, to_publish in result}
        return Finished(
            published=[event_id for event_id, gen in events if (event_id, gen) not in unfinished],
            held=[event_id for event_id, gen in events if unfinished.get((event_id, gen)) is False],
        )


class DeadLetterRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    def add(self, *, event_id: str, stage: str, reason: str) -> None:
        self.session.add(DeadLetterRow(event_id=event_id, stage=stage, reason=reason))

    async def for_event(self, event_id: str) -> Sequence[DeadLetterRow]:
        result = await self.session.scalars(
            select(DeadLetterRow)
            .where(DeadLetterRow.event_id == event_id)
            .order_by(DeadLetterRow.id)
        )
        return result.all()

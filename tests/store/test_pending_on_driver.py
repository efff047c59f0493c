"""The relay's fetch on the driver's pool (``pending_on_driver``) returns what the session's
fetch (``OutboxRepository.pending``) returns: the same rows, every column, in the same
order, for every mix of limit, rows per group, groups skipped and relay slots, on an outbox
with published, dead and held rows and rows written without a slot; and each column's
value is the one the ORM reads from the table."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import fields
from typing import Any

from sqlalchemy import inspect, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import session_factory
from app.store.driver import DriverPool
from app.store.models import RELAY_SLOTS, OutboxRow, PendingRow, slot_of
from app.store.repository import OutboxRepository, pending_on_driver
from tests.publish.support import Sessions, add_event

TOPIC = "arn:aws:sns:us-east-1:123456789012:alerts.fifo"
GROUPS = [f"acme/repo-{n}" for n in range(6)]


def _columns(row: PendingRow) -> tuple[Any, ...]:
    return tuple(getattr(row, attr.key) for attr in inspect(OutboxRow).column_attrs)


def test_a_fetched_row_has_the_outbox_columns_in_the_tables_order() -> None:
    """Both fetches build ``PendingRow(*row)`` from the table's columns: a column added to
    the table, or moved, must be added or moved here too, else values would land in the
    wrong fields."""
    assert [f.name for f in fields(PendingRow)] == [c.name for c in OutboxRow.__table__.columns]


async def _outbox(sessions: Sessions) -> None:
    """Six groups of 1-7 rows over two events each; in the first group the head is
    published and the next dead; the second group's last event is held (no topic); the
    third group's rows are written without a slot (an old process)."""
    for n, group in enumerate(GROUPS):
        await add_event(sessions, f"evt_{n}_a", group, n + 1, TOPIC)
        await add_event(sessions, f"evt_{n}_b", group, 2, TOPIC, held_calls=int(n == 1))
    async with sessions() as session:
        first = OutboxRow.event_id == "evt_0_a"
        await session.execute(
            update(OutboxRow).where(first, OutboxRow.seq == 0).values(status="published")
        )
        await session.execute(
            update(OutboxRow).where(first, OutboxRow.seq == 1).values(status="dead")
        )
        await session.execute(
            update(OutboxRow).where(OutboxRow.event_id.like("evt_2_%")).values(relay_slot=None)
        )
        await session.commit()


async def test_the_driver_fetches_what_the_session_fetches(pg_engine: AsyncEngine) -> None:
    sessions = session_factory(pg_engine)
    await _outbox(sessions)
    async with sessions() as session:
        every = (await session.scalars(select(OutboxRow))).all()
    groups = sorted({row.group_id for row in every})
    assert len(groups) == len(GROUPS)
    unslotted = {row.group_id for row in every if row.relay_slot is None}
    assert len(unslotted) == 1
    # The slots of three groups, the one written without a slot among them; and the rest.
    some_slots = {slot_of(g) for g in [*unslotted, *groups[:2]]}
    other_slots = frozenset(range(RELAY_SLOTS)) - some_slots
    slot_choices: list[Collection[int] | None] = [None, some_slots, other_slots, frozenset()]
    skip_choices: list[Sequence[str]] = [[], [groups[1]], [groups[0], groups[2], "no/such"]]
    driver = await DriverPool.open(pg_engine.url, pg_engine.dialect, size=1)
    compared = 0
    try:
        for limit, per_group, skip, slots in itertools.product(
            [1, 4, 100], [1, 2, 10], skip_choices, slot_choices
        ):
            async with sessions() as session:
                expected = await OutboxRepository(session).pending(
                    limit=limit, per_group=per_group, skip_groups=skip, slots=slots
                )
            got = await pending_on_driver(
                driver, limit=limit, per_group=per_group, skip_groups=skip, slots=slots
            )
            assert [_columns(r) for r in got] == [_columns(r) for r in expected], (
                limit,
                per_group,
                skip,
                slots,
            )
            compared += bool(expected)
    finally:
        await driver.close()
    assert compared > 50  # most combinations fetch something: the comparison is not empty
    async with sessions() as session:
        fetched = await OutboxRepository(session).pending(limit=1000, per_group=100)
        stored = {row.id: row for row in every}
    assert len(fetched) == sum(
        row.status == "pending" and row.topic_arn is not None for row in every
    )
    assert [_columns(row) for row in fetched] == [
        tuple(getattr(stored[row.id], attr.key) for attr in inspect(OutboxRow).column_attrs)
        for row in fetched
    ]

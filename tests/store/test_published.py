"""The relay's write after a round as one statement on the driver's pool (PostgreSQL,
``app/store/published.py``) leaves the same rows and answers the same as the transaction of
statements through SQLAlchemy that the relay runs elsewhere."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.store.db import session_factory
from app.store.driver import DriverPool
from app.store.models import EventRow, OutboxRow
from app.store.published import mark_and_finish
from app.store.repository import EventRepository, OutboxRepository
from tests.publish.support import add_event
from tests.store.rows import event_fields

TOPIC = "arn:aws:sns:us-east-1:123456789012:alerts.fifo"
# Each event: its status, then its rows as (generation, seq, status, has a topic, in the
# round), the round marking those published.
EVENTS: dict[str, tuple[str, list[tuple[int, int, str, bool, bool]]]] = {
    "all": ("processing", [(0, 0, "pending", True, True), (0, 1, "pending", True, True)]),
    "half": ("processing", [(0, 0, "pending", True, True), (0, 1, "pending", True, False)]),
    "held": ("processing", [(0, 0, "pending", True, True), (0, 1, "pending", False, False)]),
    "was_held": ("held", [(0, 0, "pending", True, True)]),
    "done": ("published", [(0, 0, "published", True, True)]),
    "dead": ("processing", [(0, 0, "dead", True, False), (0, 1, "pending", True, True)]),
    "replayed": ("processing", [(0, 0, "pending", False, False), (1, 0, "pending", True, True)]),
    # Its generation 0 is left with a held row, its generation 1 with nothing: published.
    "both": (
        "processing",
        [
            (0, 0, "pending", True, True),
            (0, 1, "pending", False, False),
            (1, 0, "pending", True, True),
        ],
    ),
}
# The round's events, as the relay lists them: every generation a marked row belongs to.
ROUND_EVENTS = [
    (name, generation)
    for name, (_, rows) in EVENTS.items()
    for generation in sorted({g for g, _, _, _, marked in rows if marked})
]


@pytest.fixture
def engine(pg_engine: AsyncEngine) -> AsyncEngine:
    return pg_engine


async def _stored(sessions: async_sessionmaker[AsyncSession], prefix: str) -> dict[str, int]:
    """The events under ``prefix``; the ids of their rows by "name/generation/seq"."""
    received = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    rows: dict[str, OutboxRow] = {}
    async with sessions() as session:
        for n, (name, (status, outbox)) in enumerate(EVENTS.items()):
            event_id = f"{prefix}{name}"
            fields = event_fields(
                event_id, group_key=name, received_at=received + timedelta(minutes=n)
            )
            session.add(EventRow(**fields, status=status, deliveries=1))
            await session.flush()
            for generation, seq, row_status, topic, _ in outbox:
                row = OutboxRow(
                    event_id=event_id,
                    source="github",
                    seq=seq,
                    generation=generation,
                    llm_call_id="llm_x",
                    tool="publishAlert",
                    topic_arn=TOPIC if topic else None,
                    group_id=name,
                    dedup_id=f"{event_id}-{generation}-{seq}",
                    body="{}",
                    status=row_status,
                )
                session.add(row)
                rows[f"{name}/{generation}/{seq}"] = row
        await session.commit()
        return {key: row.id for key, row in rows.items()}


def _marks(ids: dict[str, int]) -> list[tuple[int, str, str | None]]:
    return [
        (ids[f"{name}/{generation}/{seq}"], f"mid-{name}-{generation}-{seq}", str(seq) or None)
        for name, (_, rows) in EVENTS.items()
        for generation, seq, _, _, marked in rows
        if marked
    ]


async def _state(engine: AsyncEngine, prefix: str) -> dict[str, Any]:
    async with engine.connect() as connection:
        events = {
            row.id.removeprefix(prefix): (row.status, row.error)
            for row in await connection.execute(
                select(EventRow.id, EventRow.status, EventRow.error).where(
                    EventRow.id.startswith(prefix)
                )
            )
        }
        rows = {
            f"{r.event_id.removeprefix(prefix)}/{r.generation}/{r.seq}": (
                r.status,
                r.sns_message_id,
                r.sns_sequence_number,
                r.attempts,
                r.published_at is not None,
            )
            for r in await connection.execute(
                select(OutboxRow).where(OutboxRow.event_id.startswith(prefix))
            )
        }
    return {"events": events, "rows": rows}


async def test_the_round_write_on_the_driver_is_the_transactions(engine: AsyncEngine) -> None:
    sessions = session_factory(engine)
    driver = await DriverPool.open(engine.url, engine.dialect, size=1)
    try:
        # Through SQLAlchemy, as the relay does without a driver.
        ids = await _stored(sessions, "tx_")
        async with sessions() as session:
            outbox = OutboxRepository(session)
            await outbox.mark_published(_marks(ids))
            done = await outbox.finished([(f"tx_{n}", g) for n, g in ROUND_EVENTS])
            events = EventRepository(session)
            finished_tx = await events.finish_published(done.published)
            held_tx = await events.finish_held(done.held)
            await session.commit()
        # One statement on the driver.
        ids = await _stored(sessions, "dr_")
        finished_dr, held_dr = await mark_and_finish(
            driver, _marks(ids), [(f"dr_{n}", g) for n, g in ROUND_EVENTS]
        )
    finally:
        await driver.close()
    assert sorted(finished_dr) == sorted(finished_tx) and held_dr == held_tx
    by_driver, by_transaction = await _state(engine, "dr_"), await _state(engine, "tx_")
    assert by_driver == by_transaction
    # What the scenarios are for: each ends as the relay's round must leave it.
    assert by_driver["events"] == {
        "all": ("published", None),
        "half": ("processing", None),
        "held": ("held", None),
        "was_held": ("published", None),
        "done": ("published", None),
        "dead": ("processing", None),
        "replayed": ("published", None),
        "both": ("published", None),
    }
    assert len(finished_dr) == 4 and held_dr == 1
    assert by_driver["rows"]["all/0/1"] == ("published", "mid-all-0-1", "1", 1, True)
    assert by_driver["rows"]["half/0/1"][0] == "pending"


async def test_two_relays_publishing_the_last_rows_of_one_event_finish_it(
    engine: AsyncEngine,
) -> None:
    """An event whose two tool calls went to groups of different relay slots (the write
    reads no group: the rows here share one): two relays mark its last rows at the same
    moment. Each one alone sees the other's row unpublished; the event must still end
    ``published`` (finished once), not stay ``processing``."""
    sessions = session_factory(engine)
    driver = await DriverPool.open(engine.url, engine.dialect, size=2)
    await add_event(sessions, "pair", "acme/pair", 2, TOPIC)
    async with sessions() as session:
        ids = list(await session.scalars(select(OutboxRow.id).order_by(OutboxRow.id)))
    try:
        # Someone holds the event's rows in the outbox (a worker storing a replay, say)
        # as both relays arrive: both statements start, then wait to mark their rows.
        async with engine.connect() as holder:
            await holder.execute(
                select(OutboxRow.id).where(OutboxRow.event_id == "pair").with_for_update()
            )
            relays = [
                asyncio.ensure_future(
                    mark_and_finish(driver, [(row_id, f"mid-{row_id}", None)], [("pair", 0)])
                )
                for row_id in ids
            ]
            await asyncio.sleep(0.3)
            await holder.rollback()
        answers = await asyncio.gather(*relays)
    finally:
        await driver.close()
    assert sorted(len(finished) for finished, _ in answers) == [0, 1]
    state = await _state(engine, "")
    assert state["events"]["pair"] == ("published", None)

"""The worker's and relay's hot-path statements, on SQLite and on PostgreSQL (when reachable)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.events import EventStatus
from app.store.db import create_engine, session_factory
from app.store.models import EventRow, OutboxRow, OutboxStatus
from app.store.repository import EventRepository, OutboxRepository, start_delivery
from tests.store.rows import event_fields


@pytest.fixture
async def db(url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(url)
    yield session_factory(engine)
    await engine.dispose()


def _fields(event_id: str) -> dict[str, Any]:
    return event_fields(event_id, received_at=datetime(2026, 11, 30, tzinfo=UTC))


async def _start(db: async_sessionmaker[AsyncSession], event_id: str) -> Any:
    async with db.kw["bind"].connect() as connection:
        delivery = await start_delivery(connection, fields=_fields(event_id))
        await connection.commit()
    return delivery


async def test_start_delivery_stands_alone_on_an_autocommit_connection(
    db: async_sessionmaker[AsyncSession],
) -> None:
    """How the worker runs it: one statement, no transaction around it, nothing to commit."""
    engine = db.kw["bind"]
    async with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        first = await start_delivery(connection, fields=_fields("evt_auto"))
    assert first.first
    async with db() as session:  # another connection sees it: it was committed by itself
        row = await session.get(EventRow, "evt_auto")
        assert row is not None and row.deliveries == 1
    assert not (await _start(db, "evt_auto")).first


async def test_start_delivery_inserts_then_counts_and_resumes_a_replay(
    db: async_sessionmaker[AsyncSession],
) -> None:
    first = await _start(db, "evt_1")
    assert (first.status, first.deliveries, first.first) == (EventStatus.PROCESSING, 1, True)
    second = await _start(db, "evt_1")
    assert (second.status, second.deliveries, second.first) == (EventStatus.PROCESSING, 2, False)

    async with db() as session:  # what an operator replay does to the row
        row = await session.get(EventRow, "evt_1")
        assert row is not None
        assert row.payload == {"action": "opened"}
        row.status, row.deliveries, row.replays = EventStatus.QUEUED, 0, 1
        await session.commit()
    replayed = await _start(db, "evt_1")
    assert (replayed.status, replayed.deliveries, replayed.replays) == ("processing", 1, 1)
    assert not replayed.first  # earlier generations' calls exist: they must be looked up

    async with db() as session:  # a finished event stays finished
        await EventRepository(session).set_status("evt_1", EventStatus.PUBLISHED)
        await session.commit()
    again = await _start(db, "evt_1")
    assert (again.status, again.deliveries) == (EventStatus.PUBLISHED, 2)


async def test_relay_marks_rows_and_finishes_only_fully_published_events(
    db: async_sessionmaker[AsyncSession],
) -> None:
    for event_id in ("evt_a", "evt_b"):
        await _start(db, event_id)
    async with db() as session:
        session.add_all(
            OutboxRow(
                event_id=event_id,
                source="github",
                seq=seq,
                generation=0,
                llm_call_id="call",
                tool="publishAlert",
                topic_arn="arn:aws:sns:us-east-1:123456789012:t.fifo",
                group_id="acme/api",
                dedup_id=f"{event_id}-{seq}",
                body="{}",
            )
            for event_id, seq in (("evt_a", 0), ("evt_a", 1), ("evt_b", 0))
        )
        await session.commit()
        ids = {(r.event_id, r.seq): r.id for r in (await session.scalars(select(OutboxRow)))}

    async with db() as session:
        outbox = OutboxRepository(session)
        # evt_a's second row is not published yet; evt_b's only row is.
        published = [(ids["evt_a", 0], "m-a0", "1"), (ids["evt_b", 0], "m-b0", "2")]
        await outbox.mark_published(published)
        done = await outbox.finished([("evt_a", 0), ("evt_b", 0)])
        assert (done.published, done.held) == (["evt_b"], [])
        received = await EventRepository(session).finish_published(done.published)
        assert [r.replace(tzinfo=UTC) for r in received] == [datetime(2026, 11, 30, tzinfo=UTC)]
        # Finishing twice does nothing: only `processing` (or `held`) events move on.
        assert await EventRepository(session).finish_published(done.published) == []
        await session.commit()

    async with db() as session:
        rows = {(r.event_id, r.seq): r for r in await session.scalars(select(OutboxRow))}
        assert rows["evt_a", 0].status == OutboxStatus.PUBLISHED
        assert rows["evt_a", 0].sns_message_id == "m-a0"
        assert rows["evt_a", 0].attempts == 1
        assert rows["evt_a", 1].status == OutboxStatus.PENDING
        assert rows["evt_b", 0].sns_sequence_number == "2"
        statuses = {e.id: e.status for e in await session.scalars(select(EventRow))}
        assert statuses == {"evt_a": EventStatus.PROCESSING, "evt_b": EventStatus.PUBLISHED}


def _call(event_id: str, seq: int, *, topic_arn: str | None) -> OutboxRow:
    return OutboxRow(
        event_id=event_id,
        source="github",
        seq=seq,
        generation=0,
        llm_call_id="call",
        tool="publishAlert",
        topic_arn=topic_arn,
        group_id="acme/api",
        dedup_id=f"{event_id}-{seq}",
        body="{}",
    )


async def test_an_event_left_with_only_held_calls_is_held_then_may_still_publish(
    db: async_sessionmaker[AsyncSession],
) -> None:
    """evt_mixed: one call with a topic (published here) and one without (held);
    evt_going: one call published and one with a topic still to go."""
    topic = "arn:aws:sns:us-east-1:123456789012:t.fifo"
    for event_id in ("evt_mixed", "evt_going"):
        await _start(db, event_id)
    async with db() as session:
        session.add_all(
            [
                _call("evt_mixed", 0, topic_arn=topic),
                _call("evt_mixed", 1, topic_arn=None),
                _call("evt_going", 0, topic_arn=topic),
                _call("evt_going", 1, topic_arn=topic),
            ]
        )
        await session.commit()
        ids = {(r.event_id, r.seq): r.id for r in (await session.scalars(select(OutboxRow)))}

    async with db() as session:
        outbox, events = OutboxRepository(session), EventRepository(session)
        await outbox.mark_published(
            [(ids["evt_mixed", 0], "m-0", None), (ids["evt_going", 0], "m-1", None)]
        )
        done = await outbox.finished([("evt_mixed", 0), ("evt_going", 0)])
        assert (done.published, done.held) == ([], ["evt_mixed"])
        assert await events.finish_held(done.held) == 1
        assert await events.finish_held(done.held) == 0  # only `processing` events are held
        await session.commit()
    async with db() as session:
        statuses = {e.id: e.status for e in await session.scalars(select(EventRow))}
    assert statuses == {"evt_mixed": EventStatus.HELD, "evt_going": EventStatus.PROCESSING}

    async with db() as session:  # should the held call be published after all
        outbox, events = OutboxRepository(session), EventRepository(session)
        await outbox.mark_published([(ids["evt_mixed", 1], "m-2", None)])
        done = await outbox.finished([("evt_mixed", 0)])
        assert (done.published, done.held) == (["evt_mixed"], [])
        assert len(await events.finish_published(done.published)) == 1
        await session.commit()
    async with db() as session:
        mixed = await session.get(EventRow, "evt_mixed")
    assert mixed is not None and mixed.status == EventStatus.PUBLISHED


async def test_a_nul_in_free_text_is_stored_escaped(db: async_sessionmaker[AsyncSession]) -> None:
    """PostgreSQL refuses NUL in text; errors and audit texts can quote what came from
    outside (Claude's reply, a sender's header)."""
    await _start(db, "evt_nul")
    async with db() as session:
        await EventRepository(session).set_status("evt_nul", "no_action", error="bad\x00name")
        await session.commit()
    async with db() as session:
        row = await session.get(EventRow, "evt_nul")
    assert row is not None and row.error == "bad\\u0000name"

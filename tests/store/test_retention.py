"""Retention deletes old audit rows and old finished events (with their tool calls and dead
letters), and keeps recent rows and events still in flight."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.models import (
    BatchRequestRow,
    DeadLetterRow,
    EventRow,
    LlmCallRow,
    OutboxRow,
    ShadowDecisionRow,
    WindowRow,
    WindowStatus,
)
from app.store.retention import RetentionJob

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=40)
RECENT = NOW - timedelta(days=1)


def _event(event_id: str, *, status: str, at: datetime) -> EventRow:
    return EventRow(
        id=event_id,
        source="github",
        type="issues.opened",
        group_key="acme/api",
        delivery_id=event_id,
        pipeline="triage",
        status=status,
        payload={},
        received_at=at,
        updated_at=at,
        deliveries=1,
    )


async def _seed(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as session:
        session.add_all(
            [
                _event("evt_old_published", status="published", at=OLD),
                _event("evt_old_dead", status="dead_lettered", at=OLD),
                _event("evt_old_processing", status="processing", at=OLD),
                _event("evt_recent", status="published", at=RECENT),
            ]
        )
        # Three old windows: one decided (its event published), one whose event is not on
        # the stream yet, one whose event is on it but not decided yet.
        for n, (status, decided_by) in enumerate(
            [
                (WindowStatus.ENQUEUED, "evt_old_published"),
                (WindowStatus.CLOSED, None),
                (WindowStatus.ENQUEUED, "evt_old_processing"),
            ],
            start=1,
        ):
            session.add(
                WindowRow(
                    id=n,
                    pipeline="incidents",
                    group_key=f"acme/w{n}",
                    status=status,
                    events=1,
                    opened_at=OLD,
                    closes_at=OLD,
                    closed_at=OLD,
                    event_id=decided_by,
                )
            )
            member = _event(f"evt_old_windowed_{n}", status="windowed", at=OLD)
            member.window_id, member.window_position = n, 1
            session.add(member)
        await session.flush()
        for n, (event_id, at) in enumerate(
            [("evt_old_published", OLD), ("evt_old_dead", OLD), ("evt_recent", RECENT)]
        ):
            session.add(
                LlmCallRow(
                    id=f"llm_{n}",
                    event_id=event_id,
                    pipeline="triage",
                    model="m",
                    attempt=1,
                    status="ok",
                    latency_ms=1.0,
                    tool_calls=[],
                    created_at=at,
                )
            )
            session.add(
                OutboxRow(
                    event_id=event_id,
                    source="github",
                    seq=0,
                    llm_call_id=f"llm_{n}",
                    tool="publishAlert",
                    group_id="acme/api",
                    dedup_id=f"d{n}",
                    body="{}",
                )
            )
        session.add(DeadLetterRow(event_id="evt_old_dead", stage="llm", reason="x", created_at=OLD))
        for n, at in enumerate([OLD, OLD, RECENT]):
            session.add(
                ShadowDecisionRow(
                    event_id=f"evt_shadowed_{n}",
                    baseline="triage",
                    candidate="triage-v2",
                    baseline_calls=[],
                    candidate_calls=[],
                    agreement="exact",
                    created_at=at,
                )
            )
        await session.commit()


async def _count(sessions: async_sessionmaker[AsyncSession], table: type) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(table)) or 0)


async def test_retention_deletes_old_finished_events_and_audit_rows(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await _seed(sessions)
    job = RetentionJob(
        sessions=sessions, max_age_seconds=30 * 86400, interval_seconds=60, batch_size=1
    )
    deleted = await job.run_once(now=NOW)
    assert deleted == {
        "llm_calls": 2,
        "shadow_decisions": 2,
        "windows": 1,
        "outbox": 2,
        "dead_letters": 1,
        "batch_requests": 0,
        "events": 3,
    }
    assert await _count(sessions, ShadowDecisionRow) == 1
    async with sessions() as session:
        left = set((await session.scalars(select(EventRow.id))).all())
        calls = set((await session.scalars(select(LlmCallRow.id))).all())
    # In flight, too recent, or in a window still to be decided.
    assert left == {
        "evt_old_processing",
        "evt_recent",
        "evt_old_windowed_2",
        "evt_old_windowed_3",
    }
    assert await _count(sessions, WindowRow) == 2
    assert calls == {"llm_2"}
    assert await _count(sessions, OutboxRow) == 1
    assert await _count(sessions, DeadLetterRow) == 0
    assert await job.run_once(now=NOW) == {
        "llm_calls": 0,
        "shadow_decisions": 0,
        "windows": 0,
        "outbox": 0,
        "dead_letters": 0,
        "batch_requests": 0,
        "events": 0,
    }


async def test_retention_deletes_a_finished_events_batch_request_with_it(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A batch request keeps the whole prompt (the payload): it goes with its event, and the
    request of an event still in flight stays."""
    async with sessions() as session:
        session.add_all(
            [
                _event("evt_old_batched", status="published", at=OLD),
                _event("evt_old_parked", status="processing", at=OLD),
            ]
        )
        for event_id, status in (("evt_old_batched", "done"), ("evt_old_parked", "pending")):
            session.add(
                BatchRequestRow(
                    event_id=event_id,
                    generation=0,
                    pipeline="nightly",
                    group_key="acme/api",
                    status=status,
                    attempts=1,
                    request={"messages": [{"role": "user", "content": "the payload"}]},
                    created_at=OLD,
                )
            )
        await session.commit()
    job = RetentionJob(sessions=sessions, max_age_seconds=30 * 86400, interval_seconds=60)
    await job.run_once(now=NOW)
    async with sessions() as session:
        left = (await session.scalars(select(BatchRequestRow.event_id))).all()
    assert left == ["evt_old_parked"]


async def test_a_window_and_its_members_stay_as_long_as_its_event(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A window's event dead-lettered yesterday, its members windowed 40 days ago: a replay
    of that event reads the members again, so they stay (with their window) until retention
    takes the event itself. A window whose event is not stored yet (still on the stream)
    stays too."""
    async with sessions() as session:
        session.add(_event("wn_recent_dead", status="dead_lettered", at=RECENT))
        for n, decided_by in ((1, "wn_recent_dead"), (2, "wn_not_delivered_yet")):
            session.add(
                WindowRow(
                    id=n,
                    pipeline="incidents",
                    group_key=f"acme/w{n}",
                    status=WindowStatus.ENQUEUED,
                    events=2,
                    opened_at=OLD,
                    closes_at=OLD,
                    closed_at=OLD,
                    event_id=decided_by,
                )
            )
            for position in (1, 2):
                member = _event(f"evt_member_{n}_{position}", status="windowed", at=OLD)
                member.window_id, member.window_position = n, position
                session.add(member)
        await session.commit()
    job = RetentionJob(sessions=sessions, max_age_seconds=30 * 86400, interval_seconds=60)
    await job.run_once(now=NOW)
    assert await _count(sessions, EventRow) == 5
    assert await _count(sessions, WindowRow) == 2
    # Once the event is old enough it goes, with its window; its members follow.
    later = NOW + timedelta(days=30)
    await job.run_once(now=later)
    await job.run_once(now=later)
    async with sessions() as session:
        left = set((await session.scalars(select(EventRow.id))).all())
        windows = set((await session.scalars(select(WindowRow.id))).all())
    assert left == {"evt_member_2_1", "evt_member_2_2"}
    assert windows == {2}

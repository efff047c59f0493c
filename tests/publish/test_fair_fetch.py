"""The relay fetches the ready heads of every group, a few rows each, oldest first: a group
in backoff (throttled) or a group with a long backlog never keeps other groups from being
fetched and published, and each group's rows still go out one at a time, in id order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import update

from app.publish.ids import deduplication_id
from app.store.db import create_engine, session_factory
from app.store.migrate import upgrade_head
from app.store.models import OutboxRow
from app.store.repository import OutboxRepository
from tests.conftest import HAVE_POSTGRES
from tests.publish.support import MemoryPublisher, Sessions, add_event, make_relay

TOPIC = "arn:aws:sns:us-east-1:123456789012:alerts.fifo"


def frozen() -> float:
    """A clock that never moves: a group put in backoff stays there for the whole test."""
    return 1000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def any_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same query on both databases the gateway supports."""
    if request.param == "postgresql":
        if not HAVE_POSTGRES:
            pytest.skip("no PostgreSQL reachable")
        return str(request.getfixturevalue("database_url"))
    url = f"sqlite+aiosqlite:///{tmp_path / 'fetch.db'}"
    upgrade_head(url)
    return url


@pytest.fixture
async def any_sessions(any_database_url: str) -> AsyncIterator[Sessions]:
    engine = create_engine(any_database_url)
    yield session_factory(engine)
    await engine.dispose()


async def _ids(
    sessions: Sessions, *, limit: int, per_group: int, skip_groups: list[str]
) -> list[tuple[str, int]]:
    """(event id, seq) of what ``pending`` returns, in its order."""
    async with sessions() as session:
        rows = await OutboxRepository(session).pending(
            limit=limit, per_group=per_group, skip_groups=skip_groups
        )
    return [(row.event_id, row.seq) for row in rows]


async def test_pending_is_the_first_rows_of_each_ready_group_heads_first(
    any_sessions: Sessions,
) -> None:
    await add_event(any_sessions, "a", "acme/a", 5, TOPIC)
    await add_event(any_sessions, "b", "acme/b", 2, TOPIC)
    await add_event(any_sessions, "c", "acme/c", 2, TOPIC)
    await add_event(any_sessions, "d", "acme/d", 3, TOPIC)
    async with any_sessions() as session:
        # a's first row is published (its head is now a/1); c's first row has no topic yet.
        await session.execute(
            update(OutboxRow)
            .where(OutboxRow.event_id == "a", OutboxRow.seq == 0)
            .values(status="published")
        )
        await session.execute(
            update(OutboxRow)
            .where(OutboxRow.event_id == "c", OutboxRow.seq == 0)
            .values(topic_arn=None)
        )
        await session.commit()

    assert await _ids(any_sessions, limit=100, per_group=2, skip_groups=["acme/d"]) == [
        ("a", 1),
        ("b", 0),
        ("c", 1),
        ("a", 2),
        ("b", 1),
    ]
    assert await _ids(any_sessions, limit=3, per_group=2, skip_groups=[]) == [
        ("a", 1),
        ("b", 0),
        ("c", 1),
    ]
    assert await _ids(any_sessions, limit=100, per_group=1, skip_groups=["acme/a", "acme/b"]) == [
        ("c", 1),
        ("d", 0),
    ]


async def test_a_throttled_group_of_600_rows_does_not_starve_another_group(
    sessions: Sessions,
) -> None:
    await add_event(sessions, "evt_hot", "acme/hot", 600, TOPIC)
    await add_event(sessions, "evt_cold", "acme/cold", 1, TOPIC)
    publisher = MemoryPublisher(throttled_groups={"acme/hot"})
    relay = make_relay(sessions, publisher, max_backoff=30.0, clock=frozen)
    assert await relay.publish_pending() == 1
    assert [m.dedup_id for m in publisher.sent] == [deduplication_id("evt_cold", 0)]
    # acme/hot is in backoff: the next rounds neither fetch nor retry it.
    assert await relay.publish_pending() == 0
    assert await relay.publish_pending() == 0
    hot_attempts = [m for batch in publisher.batches for m in batch if m.group_id == "acme/hot"]
    assert [m.dedup_id for m in hot_attempts] == [deduplication_id("evt_hot", 0)]


async def test_groups_in_backoff_do_not_fill_the_fetch(sessions: Sessions) -> None:
    throttled = [f"acme/t{n}" for n in range(6)]
    for n, group in enumerate(throttled):
        await add_event(sessions, f"evt_t{n}", group, 1, TOPIC)
    await add_event(sessions, "evt_ok", "acme/ok", 1, TOPIC)
    publisher = MemoryPublisher(throttled_groups=throttled)
    relay = make_relay(sessions, publisher, max_backoff=30.0, clock=frozen, fetch_size=5)
    assert await relay.publish_pending() == 0  # the five oldest heads, all throttled
    assert await relay.publish_pending() == 1  # those five wait; t5 and ok are fetched
    assert [m.group_id for m in publisher.sent] == ["acme/ok"]
    attempts = [m.group_id for batch in publisher.batches for m in batch]
    assert sorted(attempts) == sorted([*throttled, "acme/ok"])  # each group tried once


async def test_groups_in_backoff_are_not_retried_early_when_too_many_to_skip_in_sql(
    sessions: Sessions,
) -> None:
    throttled = [f"acme/t{n}" for n in range(6)]
    for n, group in enumerate(throttled):
        await add_event(sessions, f"evt_t{n}", group, 2, TOPIC)
    await add_event(sessions, "evt_ok", "acme/ok", 1, TOPIC)
    publisher = MemoryPublisher(throttled_groups=throttled)
    relay = make_relay(sessions, publisher, max_backoff=30.0, clock=frozen, max_skipped_groups=2)
    assert await relay.publish_pending() == 1
    for _ in range(3):
        assert await relay.publish_pending() == 0
    attempts = [m.group_id for batch in publisher.batches for m in batch]
    assert sorted(attempts) == sorted([*throttled, "acme/ok"])


async def test_a_long_healthy_backlog_does_not_hold_other_groups_back(
    sessions: Sessions,
) -> None:
    await add_event(sessions, "evt_big", "acme/big", 600, TOPIC)
    await add_event(sessions, "evt_small", "acme/small", 1, TOPIC)
    publisher = MemoryPublisher()
    relay = make_relay(sessions, publisher)
    settled = await relay.publish_pending()
    assert [m.group_id for m in publisher.batches[0]] == ["acme/big", "acme/small"]
    # A call ends after a few rows of the big group, so a group arriving now is fetched
    # by the next call, not after the 600.
    assert settled <= relay.rows_per_group + 1
    await add_event(sessions, "evt_late", "acme/late", 1, TOPIC)
    calls_before = len(publisher.batches)
    await relay.publish_pending()
    assert [m.group_id for m in publisher.batches[calls_before]] == ["acme/big", "acme/late"]
    while await relay.publish_pending():
        pass
    big = [m.dedup_id for m in publisher.sent if m.group_id == "acme/big"]
    assert big == [deduplication_id("evt_big", seq) for seq in range(600)]
    assert all(len({m.group_id for m in b}) == len(b) for b in publisher.batches)

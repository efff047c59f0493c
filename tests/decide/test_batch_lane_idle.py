"""The batch lane at rest: a round while every request is done (all of them, in a deployment
without a ``mode: batch`` pipeline) is one probe of the status index, not the five queries
of a round with work; any request not done yet makes the round do its work. The harness is
``test_batch_lane_races.py``'s."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.store.models import BatchRequestRow, BatchRequestStatus
from tests.decide.test_batch_lane_races import BATCH, NOW, RunningBatches, _lane, _park, answered
from tests.llm.harness import Harness, build, config_text


@pytest.fixture
def harness(sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str) -> Harness:
    return build(
        sessions=sessions, redis=redis, prefix=redis_prefix, text=config_text(BATCH, fallback=False)
    )


@contextmanager
def _statements(harness: Harness) -> Iterator[list[str]]:
    """The SQL statements the harness's engine runs while the block runs."""
    engine = harness.sessions.kw["bind"]
    assert isinstance(engine, AsyncEngine)
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


async def test_a_round_with_every_request_done_is_one_probe(harness: Harness) -> None:
    lane = _lane(harness, RunningBatches(answered))
    await _park(harness, lane, "acme/a")
    async with harness.sessions() as session:
        await session.execute(update(BatchRequestRow).values(status=BatchRequestStatus.DONE))
        await session.commit()
    lane._next_poll["msgbatch_gone"] = NOW  # remembered from a batch since read
    lane._alone.add(1)
    with _statements(harness) as seen:
        await lane.round()
    selects = [s for s in seen if s.lstrip().upper().startswith(("SELECT", "UPDATE"))]
    assert len(selects) == 1, seen
    assert lane._next_poll == {}
    assert lane._alone == set()


@pytest.mark.parametrize(
    "status",
    [
        BatchRequestStatus.PENDING,
        BatchRequestStatus.SUBMITTING,
        BatchRequestStatus.SUBMITTED,
        BatchRequestStatus.ANSWERED,
    ],
)
async def test_a_request_not_done_makes_the_round_do_its_work(
    harness: Harness, status: str
) -> None:
    lane = _lane(harness, RunningBatches(answered))
    await _park(harness, lane, "acme/a")
    async with harness.sessions() as session:
        await session.execute(
            update(BatchRequestRow).values(status=status, batch_id="msgbatch_1", attempts=1)
        )
        await session.commit()
    with _statements(harness) as seen:
        await lane.round()
    selects = [s for s in seen if s.lstrip().upper().startswith(("SELECT", "UPDATE"))]
    assert len(selects) > 1, seen

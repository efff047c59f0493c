"""Three processes running the batch lane's rounds at once over one scripted API that
yields at every call, fails some creations and some polls, and errors or leaves out some
answers; with and without clock skew (each process then sees the others' claims as stale
and takes them over mid-flight). Every event ends decided once, in per-key order, or
dead-lettered once; no request goes in more than MAX_ATTEMPTS batches; no audit row is
left unknown. (Written by the second attacker review.)"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.decide.batch_lane import MAX_ATTEMPTS, BatchLane
from app.llm.batches import BatchFailure, BatchStatus
from app.llm.client import ClaudeError, ClaudeRequest
from app.store.models import DeadLetterRow, LlmCallRow
from tests.decide.test_batch_lane_races import (
    BATCH,
    NOW,
    Result,
    ScriptedBatches,
    _park,
    _reply,
    _requests,
    _status,
)
from tests.llm.harness import Harness, build, config_text


@pytest.fixture
def harness(sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str) -> Harness:
    return build(
        sessions=sessions, redis=redis, prefix=redis_prefix, text=config_text(BATCH, fallback=False)
    )


class Jittery(ScriptedBatches):
    """Yields at every call; some submits fail (unreachable / refused); some status calls
    fail transiently."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        super().__init__(self.pick)
        self.canceled: list[str] = []
        self.sent: Counter[str] = Counter()  # row id -> batches created holding it

    def pick(self, custom: str) -> Result | None:
        r = self.rng.random()
        if r < 0.25:
            return BatchFailure("errored", "api_error: overloaded")
        if r < 0.35:
            return None
        return _reply()

    async def _yield(self) -> None:
        for _ in range(self.rng.randint(0, 4)):
            await asyncio.sleep(0)

    async def submit(self, requests: Sequence[tuple[str, ClaudeRequest]]) -> str:
        await self._yield()
        r = self.rng.random()
        if r < 0.1:
            raise ClaudeError("connection failed", error_type="APIConnectionError", retryable=True)
        batch_id = await super().submit(requests)
        for custom, _ in requests:
            self.sent[custom.split("-")[0]] += 1
        await self._yield()
        return batch_id

    async def status(self, batch_id: str) -> BatchStatus:
        await self._yield()
        if self.rng.random() < 0.1:
            raise ClaudeError(
                "overloaded", error_type="overloaded_error", retryable=True, status=529
            )
        return await super().status(batch_id)

    async def results(self, batch_id: str) -> dict[str, Result]:
        await self._yield()
        return await super().results(batch_id)

    async def cancel(self, batch_id: str) -> BatchStatus:
        self.canceled.append(batch_id)
        return await super().status(batch_id)


@pytest.mark.parametrize("skew", [0, 700])
@pytest.mark.parametrize("seed", range(6))
async def test_concurrent_lanes_decide_each_event_once(
    harness: Harness, seed: int, skew: int
) -> None:
    client = Jittery(seed)
    now = [NOW]

    def lane(k: int = 0) -> BatchLane:
        return BatchLane(
            config=harness.config,
            processor=harness.processor,
            client=client,
            sessions=harness.sessions,
            clock=lambda: now[0] + timedelta(seconds=k * skew),
            claim_timeout_seconds=600,
        )

    lanes = [lane(0), lane(1), lane(2)]
    events = [await _park(harness, lanes[0], f"acme/{i % 4}") for i in range(16)]
    for step in range(40):
        now[0] = NOW + timedelta(seconds=step)
        results = await asyncio.gather(*(x.round() for x in lanes), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
    rows = await _requests(harness)
    assert {r.status for r in rows} == {"done"}, Counter(r.status for r in rows)
    async with harness.sessions() as session:
        calls = (await session.scalars(select(LlmCallRow))).all()
        dead = (await session.scalars(select(DeadLetterRow))).all()
    assert [c.id for c in calls if c.status == "unknown"] == []
    per_event = Counter(d.event_id for d in dead)
    for event in events:
        outbox = (await harness.rows(event.id)).outbox
        status = await _status(harness, event.id)
        if status == "dead_lettered":
            assert per_event[event.id] == 1 and outbox == []
        else:
            assert len(outbox) == 1 and per_event[event.id] == 0, (status, outbox)
    for row in rows:
        assert client.sent[f"r{row.id}"] <= MAX_ATTEMPTS
        assert row.attempts <= MAX_ATTEMPTS
    for key in {event.group_key for event in events}:
        decided = [
            min(o.id for o in outbox)
            for event in events
            if event.group_key == key and (outbox := (await harness.rows(event.id)).outbox)
        ]
        assert decided == sorted(decided), key  # decided in the order they were parked

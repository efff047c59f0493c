"""The batch lane recovering from a bad moment without spending what was not at fault: a
failure before sending gives every untried claim back, an old generation's request given up
leaves the replayed event alone, one failed read past a batch's 24 hours does not throw its
answers away, and a batch recorded despite a lost commit reply is read, not canceled.
Found by the second attacker review; each test fails without its fix."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.decide.batch_lane import MAX_ATTEMPTS
from app.events import Event
from app.llm.batches import BatchFailure, BatchStatus
from app.llm.client import ClaudeError
from app.store import batches as batch_store
from app.store.models import BatchRequestRow, DeadLetterRow, EventRow
from tests.decide.test_batch_lane_races import (
    BATCH,
    NOW,
    Result,
    ScriptedBatches,
    _lane,
    _park,
    _reply,
    _requests,
    _status,
    answered,
)
from tests.llm.harness import Harness, build, config_text


@pytest.fixture
def harness(sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str) -> Harness:
    return build(
        sessions=sessions, redis=redis, prefix=redis_prefix, text=config_text(BATCH, fallback=False)
    )


# A DB failure before sending `together` leaves the `alone` rows of the same claim held:
#    they wait out the claim timeout and their release counts an attempt (never sent).
async def test_db_refusing_an_audit_row_gives_back_the_alone_rows_of_the_claim_too(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = ScriptedBatches(answered)
    lane = _lane(harness, client)
    first = await _park(harness, lane, "acme/one")
    second = await _park(harness, lane, "acme/two")
    rows = await _requests(harness)
    lane._alone.add(rows[0].id)  # first was in a batch the API refused (split last round)
    trail = harness.processor.trail
    begin = trail.begin
    begun = itertools.count(1)

    async def refusing(event: Event, attempt: Any, **kwargs: Any) -> str:
        if next(begun) == 1:  # `together` (second) goes first
            raise OperationalError("INSERT INTO llm_calls", {}, Exception("disk full"))
        return await begin(event, attempt, **kwargs)

    monkeypatch.setattr(trail, "begin", refusing)
    with pytest.raises(OperationalError):
        await lane._send("triage")
    got = {r.event_id: (r.status, r.attempts) for r in await _requests(harness)}
    # Documented: "Failing before anything was sent (the database refusing an audit row)
    # gives the claims back uncounted".
    assert got == {first.id: ("pending", 0), second.id: ("pending", 0)}


# The replay check covers only deciding: the old generation's request, given up, dead-
#    letters the event the new generation is deciding, and the new answer is then dropped.
async def test_an_old_generation_given_up_does_not_dead_letter_the_new_generation(
    harness: Harness,
) -> None:
    def old_fails(custom: str) -> Result | None:
        return None if custom.startswith(f"r{old_id[0]}-") else _reply()

    old_id: list[int] = []
    client = ScriptedBatches(old_fails)
    lane = _lane(harness, client)
    event = await _park(harness, lane, "acme/a")
    (old,) = await _requests(harness)
    old_id.append(old.id)
    async with harness.sessions() as session:  # on its last attempt
        await session.execute(
            update(BatchRequestRow)
            .where(BatchRequestRow.id == old.id)
            .values(attempts=MAX_ATTEMPTS - 1)
        )
        # The event was replayed meanwhile (a new generation), and its worker parked it.
        await session.execute(update(EventRow).where(EventRow.id == event.id).values(replays=1))
        await session.commit()
    await lane.park(
        event.model_copy(update={"generation": 1}), await harness.processor.request_for(event)
    )
    for _ in range(4):
        await lane.round()
    rows = await _requests(harness)
    assert [r.status for r in rows] == ["done", "done"]
    outcome = await harness.rows(event.id)
    print(await _status(harness, event.id), [r.error for r in rows])
    assert len(outcome.outbox) == 1, (await _status(harness, event.id), [r.error for r in rows])


# A batch that ended with its answers, first read past 25 h (the lane was down, or its
#    polls failed): one transient error (529, 429, 500) discards the paid answers, and on a
#    request's last attempt dead-letters it.
class OnceOverloaded(ScriptedBatches):
    def __init__(self) -> None:
        super().__init__(answered)
        self.failed = False

    async def status(self, batch_id: str) -> BatchStatus:
        if not self.failed:
            self.failed = True
            raise ClaudeError(
                "overloaded", error_type="overloaded_error", retryable=True, status=529
            )
        return await super().status(batch_id)


async def test_one_transient_error_past_25h_does_not_discard_an_ended_batchs_answers(
    harness: Harness,
) -> None:
    client = OnceOverloaded()
    lane = _lane(harness, client)
    event = await _park(harness, lane, "acme/a")
    async with harness.sessions() as session:
        await session.execute(update(BatchRequestRow).values(attempts=MAX_ATTEMPTS - 1))
        await session.commit()
    await lane._send("triage")  # attempt 3, created at NOW, ends within its 24 h
    late = _lane(harness, client)
    now = [NOW + timedelta(hours=26)]  # the first read after an outage
    late.clock = lambda: now[0]
    for _ in range(3):
        await late.round()
        now[0] += timedelta(minutes=1)
    assert await _status(harness, event.id) != "dead_lettered"
    assert len((await harness.rows(event.id)).outbox) == 1
    async with harness.sessions() as session:
        dead = await session.scalar(select(func.count()).select_from(DeadLetterRow))
    assert dead == 0


# The batch WAS recorded (the commit reached the database; its reply was lost): the lane
#    cancels a batch that is its own and whose requests are in it; on the last attempt the
#    canceled requests are given up and the event dead-lettered.
class CancelMeansCanceled(ScriptedBatches):
    def __init__(self) -> None:
        super().__init__(answered)
        self.canceled: list[str] = []

    async def cancel(self, batch_id: str) -> BatchStatus:
        self.canceled.append(batch_id)
        return await self.status(batch_id)

    async def results(self, batch_id: str) -> dict[str, Result]:
        if batch_id in self.canceled:
            return {c: BatchFailure("canceled", "canceled") for c in self.batches[batch_id]}
        return await super().results(batch_id)


async def test_a_batch_recorded_despite_a_failed_commit_reply_is_not_canceled(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:

    client = CancelMeansCanceled()
    lane = _lane(harness, client)
    event = await _park(harness, lane, "acme/a")
    async with harness.sessions() as session:
        await session.execute(update(BatchRequestRow).values(attempts=MAX_ATTEMPTS - 1))
        await session.commit()
    record = batch_store.mark_submitted

    async def committed_then_lost(*args: Any, **kwargs: Any) -> Any:
        await record(*args, **kwargs)
        raise OperationalError("COMMIT", {}, ConnectionResetError("reset after commit"))

    monkeypatch.setattr(batch_store, "mark_submitted", committed_then_lost)
    with pytest.raises(OperationalError):
        await lane._send("triage")
    monkeypatch.setattr(batch_store, "mark_submitted", record)
    (row,) = await _requests(harness)
    assert (row.status, row.batch_id) == ("submitted", "msgbatch_1")
    for _ in range(3):
        await lane.round()
    assert client.canceled == [], client.canceled
    assert await _status(harness, event.id) != "dead_lettered"

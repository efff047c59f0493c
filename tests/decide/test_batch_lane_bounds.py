"""The batch lane's bounds on a bad day: no request is sent more than ``MAX_ATTEMPTS`` times
however its processes die or stall, no batch is waited for past its 24 hours, and no audit
row is left ``unknown`` (or written over) by a process that lived on. The harness is
``test_batch_lane_races.py``'s."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.decide.batch_lane import MAX_ATTEMPTS, BatchLane
from app.llm.batches import BatchCounts, BatchFailure, BatchStatus
from app.llm.client import ClaudeError, ClaudeRequest
from app.store import batches as batch_store
from app.store.models import BatchRequestRow, BatchRequestStatus, EventRow, LlmCallStatus
from app.store.repository import LlmCallRepository
from tests.decide.test_batch_lane_races import (
    BATCH,
    NOW,
    Killed,
    Result,
    RunningBatches,
    ScriptedBatches,
    SlowBatches,
    _lane,
    _park,
    _reply,
    _requests,
    _stalling,
    _status,
    _take_over,
    answered,
)
from tests.llm.harness import Harness, build, config_text, tool_use


@pytest.fixture
def harness(sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str) -> Harness:
    return build(
        sessions=sessions, redis=redis, prefix=redis_prefix, text=config_text(BATCH, fallback=False)
    )


def _at(hours: int) -> Callable[[], datetime]:
    return lambda: NOW + timedelta(hours=hours)


async def _unknown_calls(harness: Harness, event_id: str) -> list[str]:
    calls = (await harness.rows(event_id)).calls
    return [c.id for c in calls if c.status == LlmCallStatus.UNKNOWN]


class DyingOnCreate(SlowBatches):
    """Creates the batch, then its process dies before recording it."""

    def __init__(self) -> None:
        super().__init__([])

    async def submit(self, requests: Sequence[tuple[str, ClaudeRequest]]) -> str:
        await super().submit(requests)
        raise Killed


async def test_a_request_whose_process_dies_creating_its_batch_is_sent_three_times_at_most(
    harness: Harness,
) -> None:
    """Every process that sends the request dies before recording its batch (a prompt that
    kills it, say): each next one takes the stale claim over, but the claim counts as an
    attempt, so after MAX_ATTEMPTS the event is dead-lettered instead of sent for ever."""
    client = DyingOnCreate()
    event = await _park(harness, _lane(harness, client), "acme/a")
    for hour in range(6):
        lane = _lane(harness, client)
        lane.clock = _at(hour)
        with contextlib.suppress(Killed):
            await lane.round()
    assert len(client.batches) == MAX_ATTEMPTS
    (row,) = await _requests(harness)
    assert row.status == BatchRequestStatus.DONE and "claimed" in (row.error or "")
    assert await _status(harness, event.id) == "dead_lettered"


async def test_a_request_whose_batch_creation_always_outlasts_its_claim_is_sent_three_times(
    harness: Harness,
) -> None:
    """No process dies, but each batch creation takes longer than the claim timeout and the
    next process takes the request over: three batches, each canceled by the process that
    created it too late, then the request is given up; no audit row is left unknown."""
    lanes: list[BatchLane] = []
    for hour in range(6):
        lane = _lane(harness, ScriptedBatches(answered))
        lane.clock = _at(hour)
        lanes.append(lane)

    def next_takes_over(k: int) -> Callable[[], Awaitable[None]]:
        async def during() -> None:
            await _take_over(lanes[k + 1])

        return during

    client = SlowBatches([next_takes_over(k) for k in range(len(lanes) - 1)])
    for lane in lanes:
        lane.client = client
    event = await _park(harness, lanes[0], "acme/slow")
    await lanes[0]._send("triage")
    assert len(client.batches) == MAX_ATTEMPTS
    assert sorted(client.canceled) == sorted(client.batches)
    assert await _status(harness, event.id) == "dead_lettered"
    assert await _unknown_calls(harness, event.id) == []


async def test_a_batch_the_database_will_not_record_is_canceled_and_its_audit_row_closed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch is created, then recording it fails (the database went away for a moment;
    the process lives on). Nobody would read that batch: it is canceled, its audit row says
    why, and after the claim timeout the request is sent again and decided once."""
    client = SlowBatches([])
    lane = _lane(harness, client)
    event = await _park(harness, lane, "acme/a")
    record = batch_store.mark_submitted
    failures = [OperationalError("UPDATE batch_requests", {}, Exception("connection reset"))]

    async def failing_once(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await record(*args, **kwargs)

    monkeypatch.setattr(batch_store, "mark_submitted", failing_once)
    with pytest.raises(OperationalError):
        await lane.round()
    assert client.canceled == ["msgbatch_1"]
    later = _lane(harness, client)
    later.clock = lambda: NOW + timedelta(hours=1)
    for _ in range(3):
        await later.round()
    outcome = await harness.rows(event.id)
    assert len(outcome.outbox) == 1
    assert sorted((c.status, c.error_type) for c in outcome.calls) == [
        ("ok", None),
        ("retry", "BatchNotRecorded"),
    ]


class UnreadableResults(ScriptedBatches):
    """Its batches end, but their results can never be read (a line that is not JSON every
    time, or a 500 to every results download)."""

    async def status(self, batch_id: str) -> BatchStatus:
        return BatchStatus(batch_id, "ended", BatchCounts(0, 1, 0, 0, 0), NOW + timedelta(days=1))

    async def results(self, batch_id: str) -> dict[str, Result]:
        raise ClaudeError(
            f"batch {batch_id}: results not readable (JSONDecodeError)",
            error_type="BatchResultsUnreadable",
            retryable=True,
        )


async def test_an_ended_batch_whose_results_cannot_be_read_is_not_waited_for_for_ever(
    harness: Harness,
) -> None:
    """Each batch is asked again every poll while it is young; past its 24 hours and the
    grace period its requests count as errored (sent again, then given up), so the key is
    not held for ever."""
    client = UnreadableResults(answered)
    now = [NOW]
    lane = _lane(harness, client)
    lane.clock = lambda: now[0]
    event = await _park(harness, lane, "acme/a")
    await lane.round()
    now[0] = NOW + timedelta(hours=2)
    await lane.round()
    (row,) = await _requests(harness)
    assert (row.status, row.attempts) == (BatchRequestStatus.SUBMITTED, 1)  # still waited for
    for hours in range(26, 24 * 10, 13):
        now[0] = NOW + timedelta(hours=hours)
        await lane.round()
    assert await _status(harness, event.id) == "dead_lettered"
    assert len(client.batches) == MAX_ATTEMPTS


async def test_a_process_stalling_after_storing_an_answer_leaves_the_verdict_on_its_audit_row(
    harness: Harness,
) -> None:
    """X records an answer and stalls; Y decides it (the tool input is invalid: the event is
    dead-lettered and the audit row says ``invalid_tool_input``); X wakes: the audit row still
    says what Y found, not ``ok``."""
    bad = dataclasses.replace(
        _reply(), content=[tool_use(value={"severity": "catastrophic", "title": "x"})]
    )
    client = ScriptedBatches(lambda _: bad)
    x, y = _lane(harness, client), _lane(harness, client)
    event = await _park(harness, x, "acme/a")
    await x._send("triage")

    async def y_decides() -> None:
        await y._decide()

    x.sessions = _stalling(harness, y_decides, after="commit")
    await x._read()
    assert await _status(harness, event.id) == "dead_lettered"
    calls = (await harness.rows(event.id)).calls
    assert [c.status for c in calls] == [LlmCallStatus.INVALID_TOOL_INPUT]


async def test_an_outcome_whose_audit_row_is_refused_is_recorded_again_with_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request errored in its batch, and completing its audit row fails once (the
    database refused the statement): the outcome is not half recorded; the next round
    records both, sends the request again and decides it, no audit row left unknown."""

    def first_attempt_errs(custom: str) -> Result:
        failed = BatchFailure("errored", "api_error: overloaded")
        return failed if custom.endswith("-a1") else _reply()

    lane = _lane(harness, ScriptedBatches(first_attempt_errs))
    event = await _park(harness, lane, "acme/a")
    await lane._send("triage")
    complete = LlmCallRepository.complete
    failures = [OperationalError("UPDATE llm_calls", {}, ConnectionResetError("reset"))]

    async def refused_once(self: LlmCallRepository, call_id: str, outcome: Any) -> None:
        if failures:
            raise failures.pop()
        await complete(self, call_id, outcome)

    monkeypatch.setattr(LlmCallRepository, "complete", refused_once)
    with pytest.raises(OperationalError):
        await lane.round()
    for _ in range(3):
        await lane.round()
    assert len((await harness.rows(event.id)).outbox) == 1
    assert await _unknown_calls(harness, event.id) == []


async def test_an_answer_for_an_event_replayed_since_decides_nothing(harness: Harness) -> None:
    """The event was replayed (a new generation) after its request was answered: the old
    generation's answer is not stored beside the new one's decision."""
    lane = _lane(harness, ScriptedBatches(answered))
    event = await _park(harness, lane, "acme/a")
    await lane._send("triage")
    await lane._read()
    async with harness.sessions() as session:
        await session.execute(update(EventRow).where(EventRow.id == event.id).values(replays=1))
        await session.commit()
    await lane._decide()
    (row,) = await _requests(harness)
    assert row.status == BatchRequestStatus.DONE and (row.error or "").startswith("replayed")
    assert (await harness.rows(event.id)).outbox == []


async def test_a_batch_another_process_read_is_no_longer_remembered(harness: Harness) -> None:
    """A process remembers when to poll each running batch; once another process has read
    the batch (no request of it is waiting any more), the entry goes: a long-lived process
    does not keep one per batch it ever saw."""
    lane = _lane(harness, RunningBatches(answered))
    await _park(harness, lane, "acme/a")
    await lane._send("triage")
    await lane._read()
    assert list(lane._next_poll) == ["msgbatch_1"]
    async with harness.sessions() as session:
        await session.execute(update(BatchRequestRow).values(status=BatchRequestStatus.DONE))
        await session.commit()
    await lane._read()
    assert lane._next_poll == {}

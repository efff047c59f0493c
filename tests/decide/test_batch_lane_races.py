"""The batch lane against a bad day, one round at a time over a scripted batch client:
another process holding a claim, a pipeline gone from the config, a process dying between a
request given up and its event dead-lettered."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from redis.asyncio import Redis
from sqlalchemy import event as sa_event
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import parse_config
from app.decide.batch_lane import MAX_ATTEMPTS, BatchLane, custom_id
from app.events import Event
from app.llm.batches import BatchClient, BatchCounts, BatchFailure, BatchStatus
from app.llm.client import ClaudeError, ClaudeReply, ClaudeRequest
from app.store import batches
from app.store.models import BatchRequestRow, BatchRequestStatus, DeadLetterRow, EventRow
from tests.llm.harness import BASE, Harness, build, config_text, make_event, tool_use

BATCH = "    mode: batch\n    batch: {wait_seconds: 0, max_requests: 100, poll_seconds: 0.1}\n"
NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
Result = ClaudeReply | BatchFailure
Sessions = async_sessionmaker[AsyncSession]


class ScriptedBatches(BatchClient):
    """Every batch it created ends at once (others never do); ``answer`` says what each
    custom id gets (None: left out of the results)."""

    def __init__(self, answer: Callable[[str], Result | None]) -> None:
        super().__init__(AsyncAnthropic(api_key="sk-ant-test", base_url=BASE, max_retries=0))
        self.answer = answer
        self.batches: dict[str, list[str]] = {}

    async def submit(self, requests: Sequence[tuple[str, ClaudeRequest]]) -> str:
        batch_id = f"msgbatch_{len(self.batches) + 1}"
        self.batches[batch_id] = [custom_id for custom_id, _ in requests]
        return batch_id

    async def status(self, batch_id: str) -> BatchStatus:
        ended = "ended" if batch_id in self.batches else "in_progress"
        return BatchStatus(batch_id, ended, BatchCounts(0, 0, 0, 0, 0), NOW)

    async def results(self, batch_id: str) -> dict[str, Result]:
        found = {c: self.answer(c) for c in self.batches[batch_id]}
        return {c: r for c, r in found.items() if r is not None}


def answered(_: str) -> Result:
    return _reply()


def _reply() -> ClaudeReply:
    return ClaudeReply(
        model="claude-sonnet-4-6",
        request_id=None,
        stop_reason="tool_use",
        content=[tool_use()],
        latency_ms=0.0,
        input_tokens=100,
        output_tokens=20,
    )


@pytest.fixture
def harness(sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str) -> Harness:
    return build(
        sessions=sessions, redis=redis, prefix=redis_prefix, text=config_text(BATCH, fallback=False)
    )


def _lane(harness: Harness, client: BatchClient, *, text: str | None = None) -> BatchLane:
    config = parse_config(text) if text is not None else harness.config
    return BatchLane(
        config=config,
        processor=harness.processor,
        client=client,
        sessions=harness.sessions,
        clock=lambda: NOW,
        claim_timeout_seconds=600,
    )


async def _park(harness: Harness, lane: BatchLane, group: str) -> Event:
    event = make_event(group=group)
    async with harness.sessions() as session:
        session.add(
            EventRow(
                id=event.id,
                source=event.source,
                type=event.type,
                group_key=event.group_key,
                delivery_id=event.delivery_id,
                pipeline=event.pipeline,
                status="processing",
                payload=event.payload,
                received_at=event.received_at,
            )
        )
        await session.commit()
    await lane.park(event, await harness.processor.request_for(event))
    return event


async def _requests(harness: Harness) -> list[BatchRequestRow]:
    async with harness.sessions() as session:
        rows = await session.scalars(select(BatchRequestRow).order_by(BatchRequestRow.id))
        return list(rows.all())


async def _status(harness: Harness, event_id: str) -> str:
    async with harness.sessions() as session:
        row = await session.get(EventRow, event_id)
        assert row is not None
        return row.status


async def test_a_request_another_process_is_deciding_holds_up_nothing(harness: Harness) -> None:
    """A live claim on an answered request (another process deciding it, or one that died
    deciding it, until its claim times out) is skipped: the round ends, and the other keys'
    answers are decided."""
    lane = _lane(harness, ScriptedBatches(answered))
    first = await _park(harness, lane, "acme/a")
    second = await _park(harness, lane, "acme/b")
    async with harness.sessions() as session:
        await session.execute(
            update(BatchRequestRow)
            .where(BatchRequestRow.event_id == first.id)
            .values(
                status=BatchRequestStatus.ANSWERED,
                attempts=1,
                claimed_at=NOW - timedelta(seconds=1),  # another process's claim
            )
        )
        await session.commit()
    await asyncio.wait_for(lane.round(), timeout=10)
    rows = {row.event_id: row for row in await _requests(harness)}
    assert rows[second.id].status == BatchRequestStatus.DONE
    assert rows[first.id].status == BatchRequestStatus.ANSWERED


async def _dead_letter_reason(harness: Harness, event_id: str) -> str | None:
    async with harness.sessions() as session:
        row = await session.get(EventRow, event_id)
        assert row is not None
        return row.error if row.status == "dead_lettered" else None


async def test_requests_of_a_pipeline_gone_from_the_config_are_dead_lettered(
    harness: Harness, redis: Redis, redis_prefix: str
) -> None:
    """The pipeline is renamed while one request is in a batch and another waits for one: a
    round neither fails (every round, for every pipeline) nor leaves them for ever: both
    events are dead-lettered, saying why (a replay decides them by today's config)."""
    client = ScriptedBatches(answered)
    lane = _lane(harness, client)
    sent = await _park(harness, lane, "acme/a")
    await lane._send("triage")
    waiting = await _park(harness, lane, "acme/b")
    renamed = config_text(BATCH, fallback=False).replace("triage", "review")
    later = build(sessions=harness.sessions, redis=redis, prefix=redis_prefix, text=renamed)
    await _lane(later, client).round()
    for event in (sent, waiting):
        reason = await _dead_letter_reason(harness, event.id)
        assert reason is not None and "'triage'" in reason
    assert {row.status for row in await _requests(harness)} == {BatchRequestStatus.DONE}


class Killed(BaseException):
    """The process died (nothing after this point ran)."""


def _dying(harness: Harness, *, at: int) -> async_sessionmaker[AsyncSession]:
    """Sessions of a process killed at its ``at``-th commit (which does not happen)."""
    commits = itertools.count(1)

    class Dying(AsyncSession):
        async def commit(self) -> None:
            if next(commits) == at:
                raise Killed
            await super().commit()

    engine = harness.sessions().bind
    assert isinstance(engine, AsyncEngine)
    return async_sessionmaker(engine, class_=Dying, expire_on_commit=False)


async def test_a_request_given_up_dead_letters_its_event_whenever_the_process_dies(
    harness: Harness,
) -> None:
    """A request on its last attempt, left out of its batch's results: the process dies at
    each of its commits in turn, another carries on (after the claim timeout), and the event
    ends dead-lettered once."""
    client = ScriptedBatches(lambda _: None)
    for at in range(1, 12):
        event = await _park(harness, _lane(harness, client), f"acme/{at}")
        async with harness.sessions() as session:
            await session.execute(
                update(BatchRequestRow)
                .where(BatchRequestRow.event_id == event.id)
                .values(attempts=MAX_ATTEMPTS - 1)
            )
            await session.commit()
        dying = _lane(harness, client)
        dying.sessions = _dying(harness, at=at)
        try:
            await dying.round()
        except Killed:
            pass
        else:
            break
        later = BatchLane(
            config=harness.config,
            processor=harness.processor,
            client=client,
            sessions=harness.sessions,
            clock=lambda: NOW + timedelta(hours=1),
        )
        for _ in range(3):
            await later.round()
        async with harness.sessions() as session:
            dead = await session.scalar(
                select(func.count())
                .select_from(DeadLetterRow)
                .where(DeadLetterRow.event_id == event.id)
            )
        assert (await _status(harness, event.id), dead) == ("dead_lettered", 1), at
    else:
        raise AssertionError("the round never finished")


async def test_a_stale_process_storing_an_answer_again_leaves_its_audit_row_as_it_was(
    harness: Harness,
) -> None:
    """A process that stalled past its claim on an answered request wakes after another one
    decided it and stores the same answer: nothing is stored twice, and the one audit row of
    the request's attempt (both processes' call id) still says ``ok``, not ``superseded``."""
    lane = _lane(harness, ScriptedBatches(answered))
    event = await _park(harness, lane, "acme/a")
    await lane.round()
    (row,) = await _requests(harness)
    assert row.status == BatchRequestStatus.DONE and row.llm_call_id is not None
    async with harness.sessions() as session:
        stored = await session.get(EventRow, event.id)
        assert stored is not None
        fence = stored.fence
    await harness.processor.store_batch_answer(
        event,
        reply=_reply(),
        call_id=row.llm_call_id,
        epoch=fence,
        request=await harness.processor.request_for(event),
    )
    outcome = await harness.rows(event.id)
    assert [(c.status, c.error) for c in outcome.calls] == [("ok", None)]
    assert len(outcome.outbox) == 1


class LostBatches(ScriptedBatches):
    """The API no longer knows the first batch (404 on every question about it)."""

    async def status(self, batch_id: str) -> BatchStatus:
        if batch_id == "msgbatch_1":
            raise ClaudeError(
                "not found", error_type="not_found_error", retryable=False, status=404
            )
        return await super().status(batch_id)


async def test_a_batch_the_api_cannot_read_holds_up_no_other_batch(harness: Harness) -> None:
    """Asking about one batch fails for good (404): the round still reads and decides the
    next batch, and the first batch's request is sent again (counted), not polled for ever."""
    lane = _lane(harness, LostBatches(answered))
    lost = await _park(harness, lane, "acme/a")
    await lane._send("triage")
    other = await _park(harness, lane, "acme/b")
    await asyncio.wait_for(lane.round(), timeout=10)
    rows = {row.event_id: row for row in await _requests(harness)}
    assert rows[other.id].status == BatchRequestStatus.DONE
    assert (rows[lost.id].status, rows[lost.id].attempts) == (BatchRequestStatus.PENDING, 1)
    assert "msgbatch_1" in (rows[lost.id].error or "")


class StuckBatches(ScriptedBatches):
    """Its batches never end, though their 24 hours ran out two hours ago."""

    canceled: list[str]

    async def status(self, batch_id: str) -> BatchStatus:
        expired = NOW - timedelta(hours=2)
        return BatchStatus(batch_id, "in_progress", BatchCounts(1, 0, 0, 0, 0), expired)

    async def cancel(self, batch_id: str) -> BatchStatus:
        self.canceled = [*getattr(self, "canceled", []), batch_id]
        return await self.status(batch_id)


async def test_a_batch_that_never_ends_is_given_up_after_its_expiry(harness: Harness) -> None:
    """Past its ``expires_at`` (and a grace period) a batch still in progress is canceled and
    its requests sent again, as if they expired: not polled for ever, holding the key."""
    client = StuckBatches(answered)
    lane = _lane(harness, client)
    event = await _park(harness, lane, "acme/a")
    await lane._send("triage")
    await lane.round()
    (row,) = await _requests(harness)
    assert row.event_id == event.id
    assert (row.status, row.attempts) == (BatchRequestStatus.PENDING, 1)
    assert "expired" in (row.error or "") and client.canceled == ["msgbatch_1"]


class RunningBatches(ScriptedBatches):
    """Its batches are still running (and well within their 24 hours)."""

    async def status(self, batch_id: str) -> BatchStatus:
        return BatchStatus(
            batch_id, "in_progress", BatchCounts(1, 0, 0, 0, 0), NOW + timedelta(hours=20)
        )


async def test_polling_a_running_batch_reads_none_of_its_requests(harness: Harness) -> None:
    """A batch of up to 10 000 requests is polled every ``poll_seconds`` until it ends: a
    poll must not load every request's stored prompt to learn the batch's pipeline."""
    lane = _lane(harness, RunningBatches(answered))
    await _park(harness, lane, "acme/a")
    await lane._send("triage")
    engine = harness.sessions().bind
    assert isinstance(engine, AsyncEngine)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    sa_event.listen(engine.sync_engine, "before_cursor_execute", seen)
    try:
        await lane._read()
    finally:
        sa_event.remove(engine.sync_engine, "before_cursor_execute", seen)
    assert statements, "the poll ran no query"
    assert not [s for s in statements if "batch_requests.request" in s]


def _stalling(
    harness: Harness, stall: Callable[[], Awaitable[None]], *, after: str = "close"
) -> Sessions:
    """Sessions of a process that stalls (``stall`` runs) once its first session closes, or
    (``after="commit"``) right after its first commit."""
    fired: list[bool] = []

    async def once() -> None:
        if not fired:
            fired.append(True)
            await stall()

    class Stalling(AsyncSession):
        async def close(self) -> None:
            await super().close()
            if after == "close":
                await once()

        async def commit(self) -> None:
            await super().commit()
            if after == "commit":
                await once()

    engine = harness.sessions().bind
    assert isinstance(engine, AsyncEngine)
    return async_sessionmaker(engine, class_=Stalling, expire_on_commit=False)


async def test_an_answer_decided_by_two_processes_is_charged_to_the_budget_once(
    harness: Harness,
) -> None:
    """Process A claims an answered request and checks it is undecided, then stalls past
    its claim; process B claims it (stale), decides it and charges it; A wakes and stores
    the answer again (refused). The pipeline's budget is charged for one answer."""
    lane = _lane(harness, ScriptedBatches(answered))
    await _park(harness, lane, "acme/a")
    await lane._send("triage")
    await lane._read()
    (row,) = await _requests(harness)
    assert row.status == BatchRequestStatus.ANSWERED
    later = _lane(harness, lane.client)
    later.clock = lambda: NOW + timedelta(hours=1)

    async def b_decides() -> None:
        await later._decide_one(row)

    stale = _lane(harness, lane.client)
    stale.sessions = _stalling(harness, b_decides)
    await stale._decide_one(row)
    spent = await harness.budgets.spent("triage")
    one = harness.processor.trail.recorder.cost_usd(_reply(), batch=True)
    assert spent.tokens == 120 and spent.cost_usd == pytest.approx(one)
    outcome = await harness.rows(row.event_id)
    assert [c.status for c in outcome.calls] == ["ok"] and len(outcome.outbox) == 1


async def test_an_answered_request_is_decided_once_whenever_the_process_dies(
    harness: Harness,
) -> None:
    """The process dies at each commit of a request's way (claimed, sent, answered, decided,
    done) in turn; another carries on after the claim timeout: the event is decided once
    (one set of tool calls), its answer charged once."""
    client = ScriptedBatches(answered)
    for at in range(1, 12):
        event = await _park(harness, _lane(harness, client), f"acme/{at}")
        dying = _lane(harness, client)
        dying.sessions = _dying(harness, at=at)
        try:
            await dying.round()
        except Killed:
            pass
        else:
            break
        later = _lane(harness, client)
        later.clock = lambda: NOW + timedelta(hours=1)
        for _ in range(3):
            await later.round()
        outcome = await harness.rows(event.id)
        assert len(outcome.outbox) == 1, at
        (row,) = [r for r in await _requests(harness) if r.event_id == event.id]
        assert row.status == BatchRequestStatus.DONE, at
    else:
        raise AssertionError("the round never finished")
    # Every event parked (one per round that died, and the last) charged for one answer.
    assert (await harness.budgets.spent("triage")).tokens == 120 * at


class RefusingBatches(ScriptedBatches):
    """The API refuses every batch (a 400: not worth sending as it is)."""

    async def submit(self, requests: Sequence[tuple[str, ClaudeRequest]]) -> str:
        raise ClaudeError(
            "invalid_request_error: bad", error_type="BadRequestError", retryable=False
        )


async def test_a_batch_the_api_keeps_refusing_is_given_up_not_sent_for_ever(
    harness: Harness,
) -> None:
    lane = _lane(harness, RefusingBatches(answered))
    event = await _park(harness, lane, "acme/refused")
    for _ in range(MAX_ATTEMPTS):
        await lane.round()
    (row,) = await _requests(harness)
    assert (row.status, row.attempts) == (BatchRequestStatus.DONE, MAX_ATTEMPTS)
    assert await _status(harness, event.id) == "dead_lettered"
    await lane.round()  # nothing more is claimed or sent
    (row,) = await _requests(harness)
    assert row.attempts == MAX_ATTEMPTS


async def test_a_batch_is_sent_when_max_requests_wait_or_the_oldest_waited_wait_seconds(
    harness: Harness,
) -> None:
    text = config_text(
        "    mode: batch\n    batch: {wait_seconds: 60, max_requests: 2, poll_seconds: 30}\n",
        fallback=False,
    )
    now = [NOW]
    client = ScriptedBatches(answered)
    lane = BatchLane(
        config=parse_config(text),
        processor=harness.processor,
        client=client,
        sessions=harness.sessions,
        clock=lambda: now[0],
    )
    await _park(harness, lane, "acme/one")
    await lane.round()
    assert client.batches == {}  # one waiting, for less than wait_seconds
    await _park(harness, lane, "acme/two")
    await lane.round()
    assert [len(ids) for ids in client.batches.values()] == [2]  # max_requests reached
    await _park(harness, lane, "acme/three")
    now[0] = NOW + timedelta(seconds=59)
    await lane.round()
    assert len(client.batches) == 1
    now[0] = NOW + timedelta(seconds=61)  # parked at NOW: it has waited wait_seconds
    await lane.round()
    assert [len(ids) for ids in client.batches.values()] == [2, 1]


class UnreachableBatches(ScriptedBatches):
    async def submit(self, requests: Sequence[tuple[str, ClaudeRequest]]) -> str:
        raise ClaudeError("connection failed", error_type="APIConnectionError", retryable=True)


async def test_a_batch_the_api_cannot_be_reached_for_waits_longer_each_time(
    harness: Harness,
) -> None:
    lane = _lane(harness, UnreachableBatches(answered))
    await _park(harness, lane, "acme/unreachable")
    pauses = []
    for _ in range(4):
        await lane.round()
        pauses.append(lane._backoff)
    assert pauses == [1.0, 2.0, 4.0, 8.0]
    (row,) = await _requests(harness)  # not counted against the request
    assert (row.status, row.attempts) == (BatchRequestStatus.PENDING, 0)


class CountedRunningBatches(ScriptedBatches):
    """Its batches never end; it counts how often it is asked."""

    def __init__(self) -> None:
        super().__init__(answered)
        self.asked = 0

    async def status(self, batch_id: str) -> BatchStatus:
        self.asked += 1
        return BatchStatus(
            batch_id, "in_progress", BatchCounts(1, 0, 0, 0, 0), NOW + timedelta(days=1)
        )


async def test_a_running_batch_is_asked_about_every_poll_seconds(harness: Harness) -> None:
    text = config_text(
        "    mode: batch\n    batch: {wait_seconds: 0, max_requests: 10, poll_seconds: 30}\n",
        fallback=False,
    )
    now = [NOW]
    client = CountedRunningBatches()
    lane = BatchLane(
        config=parse_config(text),
        processor=harness.processor,
        client=client,
        sessions=harness.sessions,
        clock=lambda: now[0],
    )
    await _park(harness, lane, "acme/slow")
    asked = []
    for seconds in (0, 10, 29, 31, 45, 62):
        now[0] = NOW + timedelta(seconds=seconds)
        await lane.round()
        asked.append(client.asked)
    assert asked == [1, 1, 1, 2, 2, 3]


class OneRequestRefused(ScriptedBatches):
    """The API refuses (400) any batch that holds the request of group ``acme/poison``."""

    async def submit(self, requests: Sequence[tuple[str, ClaudeRequest]]) -> str:
        if any("acme/poison" in str(request.messages) for _, request in requests):
            raise ClaudeError(
                "invalid_request_error: requests.1.params: bad",
                error_type="BadRequestError",
                retryable=False,
            )
        return await super().submit(requests)


async def test_one_request_the_api_refuses_does_not_spend_its_batch_mates_attempts(
    harness: Harness,
) -> None:
    """Three requests in one batch, one of which the API refuses: the batch is split, the two
    others are answered and decided, and only the refused one is given up, after its own
    MAX_ATTEMPTS refusals."""
    client = OneRequestRefused(answered)
    lane = _lane(harness, client)
    events = [await _park(harness, lane, f"acme/{name}") for name in ("one", "poison", "two")]
    for _ in range(MAX_ATTEMPTS + 2):
        await lane.round()
    statuses = [await _status(harness, event.id) for event in events]
    assert statuses[1] == "dead_lettered"
    assert statuses[0] == statuses[2] != "dead_lettered"
    for event in (events[0], events[2]):
        assert len((await harness.rows(event.id)).outbox) == 1
    rows = {row.event_id: row for row in await _requests(harness)}
    assert rows[events[1].id].attempts == MAX_ATTEMPTS
    assert [rows[e.id].attempts for e in (events[0], events[2])] == [1, 1]
    # Each of the two went out alone, once, after the refusal (no batch sent unrecorded).
    assert sorted(client.batches.values()) == [[custom_id(rows[e.id])] for e in events[::2]]


async def test_a_batch_answer_charges_its_cache_tokens_as_a_live_answer_would(
    harness: Harness,
) -> None:
    cached = dataclasses.replace(
        _reply(), cache_creation_input_tokens=30, cache_read_input_tokens=500
    )
    lane = _lane(harness, ScriptedBatches(lambda _: cached))
    await _park(harness, lane, "acme/cached")
    for _ in range(3):
        await lane.round()
    spent = await harness.budgets.spent("triage")
    assert spent.tokens == 100 + 20 + 30 + 500  # input, output, cache writes, cache reads


class SlowBatches(ScriptedBatches):
    """Each submit first runs the next of ``during``: what happens while it is in flight."""

    def __init__(self, during: list[Callable[[], Awaitable[None]]]) -> None:
        super().__init__(answered)
        self.during = during
        self.canceled: list[str] = []

    async def submit(self, requests: Sequence[tuple[str, ClaudeRequest]]) -> str:
        if self.during:
            await self.during.pop(0)()
        return await super().submit(requests)

    async def cancel(self, batch_id: str) -> BatchStatus:
        self.canceled.append(batch_id)
        return await self.status(batch_id)


def _taken_over(harness: Harness, client: SlowBatches) -> tuple[BatchLane, BatchLane]:
    """Process A (now) and process B (an hour later: A's claims look stale to it)."""
    late = _lane(harness, client)
    late.clock = lambda: NOW + timedelta(hours=1)
    return _lane(harness, client), late


async def _take_over(lane: BatchLane) -> None:
    """The start of ``lane``'s round: stale claims released, what is due sent."""
    async with lane.sessions() as session:
        await batches.release_stale_claims(session, before=lane.clock() - lane.claim_timeout)
    await lane._send("triage")


async def test_a_batch_created_after_its_claim_timed_out_takes_nothing_over(
    harness: Harness,
) -> None:
    """A's batch creation outlasts its claim: B releases the claim and sends the request
    itself, and A's creation returns while B's is still in flight. A records nothing (B's
    claim is B's), its audit row says why, its batch is canceled; B's batch is the one read,
    and the event is decided once, with no third batch."""
    in_flight, go_on = asyncio.Event(), asyncio.Event()
    b_sends: list[asyncio.Task[None]] = []

    async def a_stalls() -> None:
        b_sends.append(asyncio.create_task(_take_over(b)))
        await asyncio.wait_for(in_flight.wait(), timeout=10)

    async def b_waits() -> None:
        in_flight.set()
        await asyncio.wait_for(go_on.wait(), timeout=10)

    client = SlowBatches([a_stalls, b_waits])
    a, b = _taken_over(harness, client)
    event = await _park(harness, a, "acme/a")
    await asyncio.wait_for(a._send("triage"), timeout=10)
    go_on.set()
    await asyncio.wait_for(b_sends[0], timeout=10)
    (row,) = await _requests(harness)
    assert (row.status, row.batch_id, row.attempts) == ("submitted", "msgbatch_2", 2)
    assert client.canceled == ["msgbatch_1"]
    for _ in range(3):
        await b.round()
    outcome = await harness.rows(event.id)
    assert len(outcome.outbox) == 1 and sorted(client.batches) == ["msgbatch_1", "msgbatch_2"]
    assert sorted((c.status, c.error_type) for c in outcome.calls) == [
        ("ok", None),
        ("retry", "BatchClaimLost"),
    ]


async def test_a_stale_process_failing_to_create_its_batch_leaves_the_new_claim_alone(
    harness: Harness,
) -> None:
    """A's batch creation outlasts its claim and then fails (unreachable) while B, which took
    the request over, is creating its own: A gives back nothing, B's batch is recorded."""
    in_flight, go_on = asyncio.Event(), asyncio.Event()
    b_sends: list[asyncio.Task[None]] = []

    async def a_stalls_then_fails() -> None:
        b_sends.append(asyncio.create_task(_take_over(b)))
        await asyncio.wait_for(in_flight.wait(), timeout=10)
        raise ClaudeError("connection failed", error_type="APIConnectionError", retryable=True)

    async def b_waits() -> None:
        in_flight.set()
        await asyncio.wait_for(go_on.wait(), timeout=10)

    client = SlowBatches([a_stalls_then_fails, b_waits])
    a, b = _taken_over(harness, client)
    event = await _park(harness, a, "acme/a")
    await asyncio.wait_for(a._send("triage"), timeout=10)
    (row,) = await _requests(harness)
    assert (row.status, row.attempts) == ("submitting", 2)  # still B's claim
    go_on.set()
    await asyncio.wait_for(b_sends[0], timeout=10)
    (row,) = await _requests(harness)
    assert (row.status, row.batch_id) == ("submitted", "msgbatch_1")
    for _ in range(3):
        await b.round()
    assert len((await harness.rows(event.id)).outbox) == 1 and len(client.batches) == 1


async def test_a_database_refusing_an_audit_row_before_sending_spends_no_attempt(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second request's audit row is refused: no batch is created, both claims are given
    back uncounted (not left to time out as an attempt), the first audit row is completed;
    the next round sends both."""
    client = ScriptedBatches(answered)
    lane = _lane(harness, client)
    events = [await _park(harness, lane, f"acme/{name}") for name in ("one", "two")]
    trail = harness.processor.trail
    begin = trail.begin
    begun = itertools.count(1)

    async def refusing(event: Event, attempt: Any, **kwargs: Any) -> str:
        if next(begun) == 2:
            raise OperationalError("INSERT INTO llm_calls", {}, Exception("disk full"))
        return await begin(event, attempt, **kwargs)

    monkeypatch.setattr(trail, "begin", refusing)
    with pytest.raises(OperationalError):
        await lane._send("triage")
    rows = await _requests(harness)
    assert [(r.status, r.attempts) for r in rows] == [("pending", 0), ("pending", 0)]
    assert client.batches == {}
    (call,) = (await harness.rows(events[0].id)).calls
    assert (call.status, call.error_type) == ("retry", "BatchNotSent")
    for _ in range(3):
        await lane.round()
    assert [r.attempts for r in await _requests(harness)] == [1, 1]
    for event in events:
        assert len((await harness.rows(event.id)).outbox) == 1


async def test_a_process_reading_an_ended_batch_late_leaves_a_request_sent_again_alone(
    harness: Harness,
) -> None:
    """Two processes read the same ended batch, in which a request errored. B reads it first
    and sends the request again in a new batch; A, far behind in the batch's rows, reaches
    it only then: it must not put the request (now in B's batch) back to waiting."""

    def first_attempt_errs(custom: str) -> Result:
        failed = BatchFailure("errored", "api_error: overloaded")
        return failed if custom.endswith("-a1") else _reply()

    client = ScriptedBatches(first_attempt_errs)
    a, b = _lane(harness, client), _lane(harness, client)
    event = await _park(harness, a, "acme/a")
    await a._send("triage")
    async with harness.sessions() as session:
        (as_a_read_it,) = await batches.in_batch(session, "msgbatch_1")
    await b.round()  # errored: waits for the next batch
    await b._send("triage")
    await a._outcome(as_a_read_it, BatchFailure("errored", "api_error: overloaded"))
    (row,) = await _requests(harness)
    assert (row.status, row.batch_id, row.attempts) == ("submitted", "msgbatch_2", 2)
    for _ in range(2):
        await b.round()
    assert len((await harness.rows(event.id)).outbox) == 1 and len(client.batches) == 2

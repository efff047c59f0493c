"""The batch lane: a ``mode: batch`` pipeline's calls go through the Message Batches API, at
half the price, answered within 24 hours instead of seconds.

    pipelines:
      nightly-review:
        mode: batch
        batch: {wait_seconds: 300, max_requests: 1000, poll_seconds: 60}
        model: claude-sonnet-4-6
        ...

- The worker renders the event's request as for a live call and parks it (a row of
  ``batch_requests``, ``app/store/batches.py``); the event stays ``processing`` and its
  stream entry is acked. A response cache hit still decides it at once.
- Each round of this loop, per pipeline: once ``max_requests`` wait or the oldest has waited
  ``wait_seconds`` (and the pipeline's budget is not spent), the waiting requests are claimed,
  each gets its audit row (outcome unknown), one batch is created and the rows and audit
  rows get its id. Then every sent batch is asked whether it ended; an ended batch's replies
  are stored on their requests and their audit rows completed, priced at the batch rate.
- A request the batch did not answer (expired, errored, canceled; its batch unknown to the
  API; still running an hour past its 24 hours, or by then failing every read for an hour)
  is sent again in a later batch, up to ``MAX_ATTEMPTS`` in all; then, in one transaction,
  it is done and its event dead-lettered with the reason (not an event replayed since,
  which a newer generation decides). A request's outcome and its audit row's are written
  in one transaction. A request whose pipeline is gone from the config is given up the
  same way; one whose pipeline is no longer ``mode: batch`` is sent all the same.
  A batch of several requests that the API refuses (4xx) is split: its requests are sent one
  per batch from the next round on, and only a request refused on its own counts that as
  an attempt. Failing to reach the API counts for none, and the lane waits longer each time
  (up to ``MAX_BACKOFF_SECONDS``).
- Answers are decided in per-key order: a request is decided only when every earlier one of
  its pipeline and key is done (a retried request holds the key's later answers back), by
  the processor's own store (checked, outbox rows and status in one transaction; refused and
  unstorable answers dead-lettered), so publishing, ids and order are those of any event.
- A process that dies with a claim held leaves it for ``claim_timeout_seconds``; then the
  requests are sent again, the claim counted as an attempt (a batch it created but did not
  record is paid for twice, and its answers are never read: the decision is made once). A
  process whose batch creation outlasted its claim records nothing when it wakes (the
  attempt number fences the claim): its audit rows say the request was taken over, and its
  batch, if none of it is still its own, is canceled. Failing before anything was sent (the
  database refusing an audit row) gives the claims back uncounted; a batch created that
  the database would not record is canceled. A claim past ``MAX_ATTEMPTS`` (its processes
  kept dying or stalling) gives the request up instead of sending it. Every process runs the
  lane; claims and conditional updates keep two of them from sending or deciding a request
  twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import BatchLaneConfig, GatewayConfig
from app.decide.processor import EventProcessor
from app.decide.windows import member_event
from app.events import Event, EventStatus
from app.faults import LeaseLost, dependency_unavailable
from app.llm.attempts import Attempt, usage_of
from app.llm.batches import BatchClient, BatchFailure
from app.llm.breaker import BreakerState
from app.llm.client import ClaudeError, ClaudeReply, ClaudeRequest
from app.observability.metrics import BATCH_REQUESTS
from app.store import batches
from app.store.dead_letters import DeadLetters
from app.store.models import BatchRequestRow, BatchRequestStatus, EventRow, LlmCallStatus
from app.store.repository import LlmCallRepository, OutboxRepository
from app.store.windows import as_utc

log = structlog.get_logger(__name__)
MAX_ATTEMPTS = 3
MAX_BACKOFF_SECONDS = 300.0
ROUND_SECONDS = 1.0
# Where no pipeline is ``mode: batch``: only requests a former config parked are seen to.
IDLE_ROUND_SECONDS = 10.0
# A batch still not ended (or not readable) this long after its expires_at is not waited for
# any more. The API expires a batch 24 hours after its creation.
EXPIRY_GRACE = timedelta(hours=1)
BATCH_LIFETIME = timedelta(hours=24)
DEFAULTS = BatchLaneConfig()
# Requests parked by a former config whose pipeline is live now: nothing more will join them.
LEFT_BEHIND = BatchLaneConfig(wait_seconds=0)
UNDECIDED = frozenset({EventStatus.PROCESSING})


def custom_id(row: BatchRequestRow) -> str:
    """The request's id within its batch: the row and the attempt (each attempt is sent once)."""
    return f"r{row.id}-a{row.attempts}"


def _request(data: dict[str, Any]) -> ClaudeRequest:
    return ClaudeRequest(
        model=str(data["model"]),
        system=list(data["system"]),
        tools=list(data["tools"]),
        messages=list(data["messages"]),
        max_tokens=int(data["max_tokens"]),
    )


class BatchLane:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        processor: EventProcessor,
        client: BatchClient,
        sessions: async_sessionmaker[AsyncSession],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        claim_timeout_seconds: float = 600.0,
    ) -> None:
        self.config = config
        self.processor = processor
        self.client = client
        self.sessions = sessions
        self.clock = clock
        self.sleep = sleep
        self.claim_timeout = timedelta(seconds=claim_timeout_seconds)
        self.pipelines = {n: p for n, p in config.pipelines.items() if p.mode == "batch"}
        self._backoff = 0.0
        self._next_poll: dict[str, datetime] = {}
        # Requests of a batch the API refused, sent one per batch from then on: only the one
        # at fault is refused again and counts attempts (kept in memory: after a restart a
        # refused batch is split again).
        self._alone: set[int] = set()
        # When reading each batch began to fail (kept in memory, as the poll times).
        self._unreadable_since: dict[str, datetime] = {}
        self.round_seconds = ROUND_SECONDS if self.pipelines else IDLE_ROUND_SECONDS

    async def park(self, event: Event, request: ClaudeRequest) -> None:
        async with self.sessions() as session:
            await batches.park(
                session,
                event_id=event.id,
                generation=event.generation,
                pipeline=event.pipeline,
                group_key=event.group_key,
                request=request.as_api(),
                now=self.clock(),
            )

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception as exc:
                if not dependency_unavailable(exc):
                    raise  # the supervisor logs it and restarts the loop
                log.warning("batch_round_failed", error=type(exc).__name__)
            await self.sleep(self.round_seconds + self._backoff)

    async def round(self) -> None:
        """Send what is due, read what ended, decide what may be decided: nothing, after one
        probe, while every request is done (most rounds, and all of them in a deployment
        without a ``mode: batch`` pipeline)."""
        async with self.sessions() as session:
            if not await batches.any_unfinished(session):
                self._forget()
                return
            released = await batches.release_stale_claims(
                session, before=self.clock() - self.claim_timeout
            )
        if released:
            log.warning("batch_claims_released", requests=released)
        async with self.sessions() as session:
            orphans = await batches.pending_outside(session, list(self.config.pipelines))
            waiting = await batches.pending_pipelines(session)
        for row in orphans:
            await self._give_up(row, reason=f"pipeline {row.pipeline!r} is no longer configured")
        # A pipeline that left batch mode still has its parked requests sent (at once).
        left = [name for name in waiting if name in self.config.pipelines]
        for name in dict.fromkeys([*self.pipelines, *left]):
            await self._send(name)
        await self._read()
        await self._decide()

    def _forget(self) -> None:
        """What is kept in memory about batches and requests: none is unfinished any more."""
        self._next_poll.clear()
        self._unreadable_since.clear()
        self._alone.clear()

    def _settings(self, name: str) -> BatchLaneConfig:
        if name not in self.pipelines:
            return LEFT_BEHIND
        return self.pipelines[name].batch or DEFAULTS

    async def _send(self, name: str) -> None:
        settings, now = self._settings(name), self.clock()
        async with self.sessions() as session:
            waiting, oldest = await batches.pending_stats(session, name)
        if not waiting or (
            waiting < settings.max_requests
            and oldest is not None
            and now - as_utc(oldest) < timedelta(seconds=settings.wait_seconds)
        ):
            return
        budget = self.config.pipelines[name].budget
        if budget is not None:
            status = await self.processor.caller.budgets.status(name, budget)
            if status.exhausted:
                log.warning("batch_held_budget_exhausted", pipeline=name)
                return
        async with self.sessions() as session:
            rows = await batches.claim_pending(
                session, pipeline=name, limit=settings.max_requests, now=now
            )
        # A claim counts an attempt even when it timed out (its process died or stalled
        # while creating the batch): past the last one the request is given up, not sent.
        spent = [row for row in rows if row.attempts > MAX_ATTEMPTS]
        # Split before sending: a refusal of ``together`` gives its rows back unsent.
        alone = [row for row in rows if row.id in self._alone and row not in spent]
        together = [row for row in rows if row.id not in self._alone and row not in spent]
        groups = [group for group in [together, *([row] for row in alone)] if group]
        # On a failure the claims not tried yet go back uncounted (a batch that failed gave
        # its own back): a failure that was not theirs spends none of their attempts.
        try:
            for row in spent:
                await self._give_up(
                    row,
                    reason=f"claimed {row.attempts} times, never answered: its process died "
                    "or stalled while creating the batch",
                )
        except Exception:
            await self._give_back_quietly([row for rest in groups for row in rest])
            raise
        while groups:
            group = groups.pop(0)
            try:
                await self._create(name, group)
            except Exception:
                await self._give_back_quietly([row for rest in groups for row in rest])
                raise

    async def _give_back_quietly(self, rows: Sequence[BatchRequestRow]) -> None:
        """Claims given back uncounted, as far as the database lets; what it refuses waits
        for the claim timeout."""
        if not rows:
            return
        try:
            async with self.sessions() as session:
                await batches.give_back(session, rows, counted=False)
        except (SQLAlchemyError, OSError) as again:
            log.warning("batch_claims_kept", requests=len(rows), error=type(again).__name__)

    async def _create(self, name: str, rows: Sequence[BatchRequestRow]) -> None:
        trail = self.processor.trail
        call_ids: dict[int, str] = {}
        attempts: dict[int, Attempt] = {}
        requests: list[tuple[str, ClaudeRequest]] = []
        try:
            for row in rows:
                request = _request(row.request)
                attempt = Attempt(
                    row.attempts,
                    "anthropic",
                    request,
                    BreakerState.CLOSED,
                    "batch" if row.attempts == 1 else f"batch: sent again ({row.error})"[:200],
                )
                attempts[row.id] = attempt
                call_ids[row.id] = await trail.begin(_audit_event(row), attempt)
                requests.append((custom_id(row), request))
        except Exception as exc:
            # Nothing was sent: not an attempt (if the database takes the claims back now;
            # if not, they are released, counted, after the claim timeout).
            await self._unsent(rows, call_ids, attempts, exc)
            raise
        try:
            batch_id = await self.client.submit(requests)
        except ClaudeError as exc:
            refused = not exc.retryable
            # A refused batch of several is split, not counted against each of its requests:
            # one request the API will not take must not spend the others' attempts.
            split = refused and len(rows) > 1
            counted = refused and not split
            for row_id, call_id in call_ids.items():
                outcome = trail.recorder.failure_outcome(attempts[row_id], exc)
                await trail.complete(call_id, outcome | {"error": f"batch not created: {exc}"})
            if split:
                self._alone.update(row.id for row in rows)
                async with self.sessions() as session:
                    await batches.give_back(session, rows, counted=False)
                log.warning(
                    "batch_refused_split", pipeline=name, requests=len(rows), error=str(exc)
                )
                return
            # Refused (not unreachable) for the last allowed time: given up, not sent again.
            spent = [row for row in rows if counted and row.attempts >= MAX_ATTEMPTS]
            for row in spent:
                await self._give_up(
                    row, reason=f"the API refused its batch {row.attempts} times; last: {exc}"
                )
            async with self.sessions() as session:
                again = [row for row in rows if row not in spent]
                await batches.give_back(session, again, counted=counted)
            self._backoff = min(max(self._backoff * 2, 1.0), MAX_BACKOFF_SECONDS)
            log.warning("batch_not_created", pipeline=name, error=str(exc), retry_in=self._backoff)
            return
        self._backoff = 0.0
        self._alone.difference_update(row.id for row in rows)
        try:
            async with self.sessions() as session:
                recorded = await batches.mark_submitted(
                    session, rows, batch_id=batch_id, call_ids=call_ids, now=self.clock()
                )
        except (SQLAlchemyError, OSError) as exc:
            await self._unrecorded(batch_id, call_ids, attempts, exc)
            raise
        if len(recorded) < len(rows):
            await self._claims_lost(batch_id, rows, recorded, call_ids, attempts)
        BATCH_REQUESTS.labels(pipeline=name, outcome="submitted").inc(len(recorded))
        log.info("batch_created", pipeline=name, batch_id=batch_id, requests=len(recorded))

    async def _unsent(
        self,
        rows: Sequence[BatchRequestRow],
        call_ids: dict[int, str],
        attempts: dict[int, Attempt],
        exc: Exception,
    ) -> None:
        """The audit rows begun completed and the claims given back uncounted, as far as the
        database lets."""
        failure = ClaudeError(
            f"batch not created: {type(exc).__name__} before sending",
            error_type="BatchNotSent",
            retryable=True,
        )
        await self._fail_calls_quietly(call_ids, attempts, failure)
        await self._give_back_quietly(rows)

    async def _unrecorded(
        self,
        batch_id: str,
        call_ids: dict[int, str],
        attempts: dict[int, Attempt],
        exc: Exception,
    ) -> None:
        """The batch was created but recording it failed. If the database did record it
        (only the reply to its commit was lost), it is read as any other. Otherwise nobody
        will read it: it is canceled and its audit rows say so (as far as the database
        lets); the claims time out and the requests are sent again, each claim counted."""
        if await self._recorded(batch_id):
            log.warning("batch_recorded_despite_error", batch_id=batch_id)
            return
        log.error("batch_not_recorded", batch_id=batch_id, error=type(exc).__name__)
        try:
            await self.client.cancel(batch_id)
        except ClaudeError as failed:
            log.warning("batch_cancel_failed", batch_id=batch_id, error=failed.error_type)
        failure = ClaudeError(
            f"batch {batch_id} created but not recorded: {type(exc).__name__}",
            error_type="BatchNotRecorded",
            retryable=True,
        )
        await self._fail_calls_quietly(call_ids, attempts, failure)

    async def _fail_calls_quietly(
        self, call_ids: dict[int, str], attempts: dict[int, Attempt], failure: ClaudeError
    ) -> None:
        """The audit rows begun completed with ``failure``, as far as the database lets."""
        try:
            for row_id, call_id in call_ids.items():
                outcome = self.processor.trail.recorder.failure_outcome(attempts[row_id], failure)
                await self.processor.trail.complete(call_id, outcome)
        except (SQLAlchemyError, OSError) as again:
            log.warning(
                "batch_audit_unfinished", requests=len(call_ids), error=type(again).__name__
            )

    async def _recorded(self, batch_id: str) -> bool:
        """Whether a request holds the batch; False when the database cannot say either."""
        try:
            async with self.sessions() as session:
                return await batches.pipeline_of(session, batch_id) is not None
        except (SQLAlchemyError, OSError):
            return False

    async def _claims_lost(
        self,
        batch_id: str,
        rows: Sequence[BatchRequestRow],
        recorded: set[int],
        call_ids: dict[int, str],
        attempts: dict[int, Attempt],
    ) -> None:
        """Creating the batch outlasted the claim timeout: another process took these
        requests over (and sends them itself). This batch's answers to them are never read;
        their audit rows say so, and a batch none of whose requests is ours is canceled."""
        lost = [row for row in rows if row.id not in recorded]
        failure = ClaudeError(
            f"batch {batch_id} created after the claim timed out; the request was taken over",
            error_type="BatchClaimLost",
            retryable=True,
        )
        for row in lost:
            outcome = self.processor.trail.recorder.failure_outcome(attempts[row.id], failure)
            await self.processor.trail.complete(call_ids[row.id], outcome)
        log.error("batch_claims_lost", batch_id=batch_id, requests=len(lost))
        if recorded:
            return
        try:
            await self.client.cancel(batch_id)
        except ClaudeError as exc:
            log.warning("batch_cancel_failed", batch_id=batch_id, error=exc.error_type)

    async def _read(self) -> None:
        async with self.sessions() as session:
            sent = await batches.submitted_batches(session)
        now = self.clock()
        for done in self._next_poll.keys() - set(sent):  # read by another process
            del self._next_poll[done]
        for done in self._unreadable_since.keys() - set(sent):
            del self._unreadable_since[done]
        for batch_id in sent:
            if self._next_poll.get(batch_id, now) > now:
                continue
            try:
                await self._read_one(batch_id, now=now)
            except ClaudeError as exc:
                since = self._unreadable_since.setdefault(batch_id, now)
                if exc.status != 404 and not (
                    now - since >= EXPIRY_GRACE and await self._past_reading(batch_id, now=now)
                ):
                    # It could not answer now (or not us): ask again later.
                    log.warning("batch_unreadable", batch_id=batch_id, error=exc.error_type)
                    await self._poll_later(batch_id, now=now)
                    continue
                # The API will never tell (it does not know the batch, or past its 24 hours
                # and the grace period it has failed every read for an hour): no answers came.
                log.error("batch_lost", batch_id=batch_id, error=exc.error_type)
                failure = BatchFailure("errored", f"the API cannot read it: {exc.error_type}")
                await self._fail_all(batch_id, failure)
            else:
                self._unreadable_since.pop(batch_id, None)

    async def _read_one(self, batch_id: str, *, now: datetime) -> None:
        status = await self.client.status(batch_id)
        if not status.ended and now > status.expires_at + EXPIRY_GRACE:
            await self._abandon(batch_id)
            return
        if not status.ended:
            await self._poll_later(batch_id, now=now)
            return
        self._next_poll.pop(batch_id, None)
        results = await self.client.results(batch_id)
        async with self.sessions() as session:
            rows = await batches.in_batch(session, batch_id)
        for row in rows:
            await self._outcome(row, results.get(custom_id(row)))

    async def _past_reading(self, batch_id: str, *, now: datetime) -> bool:
        """Whether the batch was created more than its 24 hours and the grace period ago:
        whatever fails about it (its status, its results), it is not waited for any more."""
        async with self.sessions() as session:
            submitted = await batches.submitted_at(session, batch_id)
        return submitted is not None and now > as_utc(submitted) + BATCH_LIFETIME + EXPIRY_GRACE

    async def _abandon(self, batch_id: str) -> None:
        """The batch outlived its expiry: canceled (if the API still listens), its requests
        failed as expired (sent again or given up); answers it gives later are not read."""
        try:
            await self.client.cancel(batch_id)
        except ClaudeError as exc:
            log.warning("batch_cancel_failed", batch_id=batch_id, error=exc.error_type)
        log.error("batch_abandoned", batch_id=batch_id)
        failure = BatchFailure("expired", "the batch had not ended an hour after its expiry")
        await self._fail_all(batch_id, failure)

    async def _fail_all(self, batch_id: str, failure: BatchFailure) -> None:
        async with self.sessions() as session:
            rows = await batches.in_batch(session, batch_id)
        for row in rows:
            await self._outcome(row, failure)

    async def _poll_later(self, batch_id: str, *, now: datetime) -> None:
        async with self.sessions() as session:
            name = await batches.pipeline_of(session, batch_id)
        poll = (self.pipelines[name].batch or DEFAULTS) if name in self.pipelines else DEFAULTS
        self._next_poll[batch_id] = now + timedelta(seconds=poll.poll_seconds)

    async def _outcome(
        self, row: BatchRequestRow, result: ClaudeReply | BatchFailure | None
    ) -> None:
        """The request's outcome and its audit row's, in one transaction: a process that
        stalls or loses the database between the two leaves neither half done (the audit
        row ``unknown`` for ever, or written over a decider's verdict when it wakes)."""
        recorder = self.processor.trail.recorder
        if isinstance(result, ClaudeReply):
            outcome = recorder.reply_outcome(
                result, status=LlmCallStatus.OK, error=None, batch=True
            )
            async with self.sessions() as session:
                if not await batches.set_outcome(
                    session,
                    row,
                    status=BatchRequestStatus.ANSWERED,
                    reply=dataclasses.asdict(result),
                ):
                    return  # another process read the batch first
                await _complete_call(session, row, outcome)
                await session.commit()
            # Charged here, where one process records the answer once: any number of
            # processes may try to decide it.
            await self.processor.caller.budgets.charge(
                row.pipeline,
                tokens=usage_of(result).total,  # cache tokens too, as a live call
                cost_usd=float(outcome["cost_usd"]),
            )
            BATCH_REQUESTS.labels(pipeline=row.pipeline, outcome="succeeded").inc()
            return
        kind = result.kind if result is not None else "errored"
        detail = result.detail if result is not None else "the batch's results left it out"
        reason = f"batch {row.batch_id}: {kind}: {detail}"[:1000]
        again = row.attempts < MAX_ATTEMPTS
        failure = ClaudeError(reason, error_type=f"Batch{kind.title()}", retryable=again)
        attempt = Attempt(row.attempts, "anthropic", _request(row.request), BreakerState.CLOSED)
        audit = recorder.failure_outcome(attempt, failure)
        if again:
            async with self.sessions() as session:
                changed = await batches.set_outcome(
                    session, row, status=BatchRequestStatus.PENDING, error=reason
                )
                if changed:
                    await _complete_call(session, row, audit)
                await session.commit()
        else:
            changed = await self._give_up(
                row,
                reason=f"no answer after {row.attempts} batch attempts; last: {reason}",
                audit=audit,
            )
        if not changed:
            return
        BATCH_REQUESTS.labels(pipeline=row.pipeline, outcome=kind).inc()
        log.warning("batch_request_failed", event_id=row.event_id, reason=reason, again=again)

    async def _decide(self) -> None:
        while True:
            async with self.sessions() as session:
                stale = self.clock() - self.claim_timeout
                rows = await batches.decidable(session, limit=100, stale=stale)
            if not rows:
                return
            for row in rows:
                await self._decide_one(row)

    async def _decide_one(self, row: BatchRequestRow) -> None:
        now = self.clock()
        async with self.sessions() as session:
            if not await batches.claim_answered(
                session, row.id, now=now, stale=now - self.claim_timeout
            ):
                return  # another process is deciding it
            stored = await session.get(EventRow, row.event_id)
            replayed = stored is not None and stored.replays != row.generation
            decided = stored is not None and (
                stored.status not in UNDECIDED
                or await OutboxRepository(session).for_event(
                    row.event_id, generation=row.generation
                )
            )
        if row.pipeline not in self.config.pipelines:
            await self._give_up(row, reason=f"pipeline {row.pipeline!r} is no longer configured")
            return
        if stored is None or row.reply is None or row.llm_call_id is None or decided or replayed:
            # Decided already (by a process that died before it marked the request done), or
            # replayed since: a newer generation decides the event.
            error = "replayed: a newer generation decides it" if replayed else None
            async with self.sessions() as session:
                await batches.finish(
                    session, row.id, error=error if decided or replayed else "event gone"
                )
            return
        source = self.config.sources.get(stored.source)
        event = member_event(stored, source).model_copy(update={"generation": row.generation})
        reply = ClaudeReply(**row.reply)
        error = None
        try:
            await self.processor.store_batch_answer(
                event,
                reply=reply,
                call_id=row.llm_call_id,
                epoch=stored.fence,
                request=_request(row.request),
            )
        except LeaseLost as exc:
            error = f"superseded: {exc}"
        async with self.sessions() as session:
            await batches.finish(session, row.id, error=error)

    async def _give_up(
        self, row: BatchRequestRow, *, reason: str, audit: dict[str, Any] | None = None
    ) -> bool:
        """The request done and its event dead-lettered in one transaction: a process dying
        between the two would leave the event undecided for ever. False when another process
        moved the request first, or a worker started the event since (the next round tries
        again). ``audit``: the outcome of the request's audit row, written in the same
        transaction. A request of an older generation (the event was replayed since) is done
        without dead-lettering the event its newer generation is deciding."""
        self._alone.discard(row.id)
        epoch, generation = await self._fence(row)
        replayed = generation != row.generation
        async with self.sessions() as session:
            error = f"replayed since: {reason}" if replayed else reason
            if not await batches.give_up(session, row, error=error[:1000]):
                return False
            if audit is not None:
                await _complete_call(session, row, audit)
            if replayed:  # a newer generation decides the event: it is not dead-lettered
                await session.commit()
                return True
            try:
                await DeadLetters.add_in(
                    session, row.event_id, stage="llm", reason=reason, epoch=epoch
                )
            except LeaseLost:
                await session.rollback()
                return False
            await session.commit()
        DeadLetters.count(row.event_id, stage="llm", reason=reason)
        return True

    async def _fence(self, row: BatchRequestRow) -> tuple[int, int]:
        """The request's event's fence and its current generation."""
        async with self.sessions() as session:
            stored = await session.get(EventRow, row.event_id)
        return (stored.fence, stored.replays) if stored is not None else (0, row.generation)


async def _complete_call(
    session: AsyncSession, row: BatchRequestRow, outcome: dict[str, Any]
) -> None:
    """The audit row of the request's attempt (if it has one) completed in ``session``."""
    if row.llm_call_id is not None:
        await LlmCallRepository(session).complete(row.llm_call_id, outcome)


def _audit_event(row: BatchRequestRow) -> Event:
    """Enough of the event for its audit row (id and pipeline)."""
    return Event(
        id=row.event_id,
        source="",
        type="",
        group_key=row.group_key,
        delivery_id="",
        pipeline=row.pipeline,
        received_at=datetime.now(UTC),
        payload=None,
    )

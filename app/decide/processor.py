"""Process one event: Claude with the pipeline's tools → validated tool calls in the outbox.

Invariants:
- every attempt (success, API error, timeout, invalid tool input) has an audit row, written
  before the call and completed after it (see ``caller.py`` for retries, breaker and limits);
- an invalid tool input gets one repair turn; still invalid → dead-lettered with the reason;
- the successful attempt's outcome, the outbox rows and the event status are stored together
  (one statement on PostgreSQL, ``store/decisions.py``), and the caller acks the stream entry
  only after they are committed;
- the store is fenced by the lease: a worker whose tenure is older than the latest one that
  started the event is refused (``LeaseLost``, nothing stored but its audit row, marked
  ``superseded``), and it learns so before calling Claude wherever it can;
- once tool calls are stored, processing the event again never calls Claude again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from jsonschema import Draft202012Validator
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import GatewayConfig
from app.decide.audit import AuditTrail
from app.decide.cache import ResponseCache
from app.decide.history import earlier_events, history_block
from app.decide.prompts import render_event, system_blocks, tool_definitions
from app.decide.tools import ToolCheck, check_tool_uses, repair_request, shown
from app.decide.windows import member_event, render_window
from app.events import FINAL_STATUSES, WINDOW_SOURCE, Event, EventStatus
from app.faults import Fence, LeaseLost, data_refused, dependency_unavailable
from app.llm.attempts import Attempt, AttemptLog
from app.llm.breaker import BreakerState
from app.llm.caller import CallAbandoned, CallResult, GuardedCaller, run_together
from app.llm.client import ClaudeReply, ClaudeRequest
from app.observability.metrics import (
    DEDUP_HITS,
    ESCALATIONS,
    EVENTS_FINISHED,
    WINDOWS_CLOSED,
    labelled,
)
from app.publish.messages import outbox_row
from app.store import windows
from app.store.dead_letters import DeadLetters
from app.store.decisions import Decision, DecisionStore
from app.store.driver import DriverPool
from app.store.models import EventRow, LlmCallStatus, OutboxRow, utcnow
from app.store.repository import (
    EVENT_FIELDS,
    Delivery,
    LlmCallRepository,
    OutboxRepository,
    start_delivery,
)

log = structlog.get_logger(__name__)
# Events remembered as waiting for a dependency (their retry is not counted); the oldest are
# forgotten past this many (their retry then counts, as it did before).
MAX_WAITING = 10_000
NO_PUBLISH_STOPS = frozenset({"max_tokens", "refusal"})


class Answer(Protocol):
    """A reply that decides an event: a call's (``CallResult``) or the cache's."""

    @property
    def reply(self) -> ClaudeReply: ...
    @property
    def call_id(self) -> str: ...
    @property
    def cost_usd(self) -> float: ...


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    reply: ClaudeReply
    call_id: str
    cost_usd: float


# (event, its stored outbox rows in order, the answer that decided it)
AfterDecided = Callable[[Event, Sequence[OutboxRow], Answer], None]
# (pipeline, group key) of a window just closed: its event goes on the stream.
WindowClosed = Callable[[str, str], Awaitable[None]]


class BatchParking(Protocol):
    """Where a ``mode: batch`` pipeline's requests wait for a batch (``batch_lane.py``)."""

    async def park(self, event: Event, request: ClaudeRequest) -> None: ...


class EventProcessor:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        engine: AsyncEngine,
        sessions: async_sessionmaker[AsyncSession],
        caller: GuardedCaller,
        trail: AuditTrail,
        max_deliveries: int,
        on_stored: Callable[[], None] = lambda: None,
        after_decided: AfterDecided | None = None,
        cache: ResponseCache | None = None,
        window_closed: WindowClosed | None = None,
        driver: DriverPool | None = None,
    ) -> None:
        self.config = config
        self.sessions = sessions
        # start_delivery is one statement: on an autocommit connection it is one round trip
        # (no BEGIN, no COMMIT) and skips the ORM session, on every event's critical path;
        # on PostgreSQL it goes straight to the driver (``store/driver.py``).
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.driver = driver
        self.decisions = DecisionStore(engine, driver=driver)
        self.caller = caller
        self.trail = trail
        self.dead_letters = DeadLetters(sessions=sessions)
        self.max_deliveries = max_deliveries
        self.on_stored = on_stored
        # Told of each live decision once it is stored (shadow candidates): it must return at
        # once; whatever it raises is logged, never the live path's failure.
        self.after_decided = after_decided
        self.cache = cache  # the response cache, for pipelines that have one
        # Enqueues the events of a key's closed windows (without it, the closer's next
        # round does, within a second).
        self.window_closed = window_closed
        # The batch lane, when a pipeline has ``mode: batch`` (without it they are live).
        self.batch_lane: BatchParking | None = None
        # (event id, generation, lease epoch) whose last try met an unreachable dependency
        self._waiting: dict[tuple[str, int, int], bool] = {}
        self.source_types = {name: source.type for name, source in config.sources.items()}
        self.validators = {
            name: Draft202012Validator(tool.input_schema) for name, tool in config.tools.items()
        }

    async def process(self, event: Event, fence: Fence | None = None) -> None:
        """Return once the event's outcome is committed (then the entry may be acked).

        May wait a long time (open breaker, rate limit, exhausted ``wait`` budget): that
        holds only this event's key lane, and the event stays queued meanwhile.

        A failure because Redis or the database was unreachable is no delivery of the event:
        the worker retries it in place, and that retry does not count towards
        ``max_deliveries`` (a Redis that flapped used to dead-letter the events in flight
        without Claude ever being asked).
        """
        epoch = fence.epoch if fence is not None else 0
        key = (event.id, event.generation, epoch)
        counted = not self._waiting.pop(key, False)
        try:
            await self._deliver(event, fence, epoch=epoch, counted=counted)
        except Exception as exc:
            if dependency_unavailable(exc):
                self._waiting[key] = True
                while len(self._waiting) > MAX_WAITING:
                    self._waiting.pop(next(iter(self._waiting)))
            raise

    async def _deliver(
        self, event: Event, fence: Fence | None, *, epoch: int, counted: bool
    ) -> None:
        log_ = log.bind(event_id=event.id, source=event.source, group_key=event.group_key)
        stored: Sequence[OutboxRow] = ()
        attempts = 0
        delivery = await self._start_delivery(event, epoch=epoch, counted=counted)
        if delivery.fence > epoch:
            raise LeaseLost(f"a later lease tenure (epoch {delivery.fence}) started the event")
        status, deliveries = delivery.status, delivery.deliveries
        if not delivery.first or not counted:
            async with self.sessions() as session:
                stored = await OutboxRepository(session).for_event(
                    event.id, generation=event.generation
                )
                attempts = await LlmCallRepository(session).count_for_event(event.id)
        if status in FINAL_STATUSES or stored:
            DEDUP_HITS.labels(layer="processed").inc()
            log_.info("event_already_processed", status=status, stored_calls=len(stored))
            return
        if deliveries > self.max_deliveries:
            await self.dead_letters.add(
                event.id,
                stage="worker",
                reason=f"processing failed {deliveries - 1} times",
                epoch=epoch,
            )
            return
        window = self.config.pipelines[event.pipeline].window
        if window is not None and event.source != WINDOW_SOURCE:
            await self._join_window(event, epoch=epoch, log_=log_)
            return
        await self._decide(event, fence=fence, first_attempt=attempts + 1, log_=log_)

    async def _start_delivery(self, event: Event, *, epoch: int, counted: bool) -> Delivery:
        fields = _event_fields(event)
        if self.driver is not None:
            return await start_delivery(self.driver, fields=fields, epoch=epoch, count=counted)
        async with self.autocommit.connect() as connection:
            return await start_delivery(connection, fields=fields, epoch=epoch, count=counted)

    async def _join_window(self, event: Event, *, epoch: int, log_: Any) -> None:
        """Take the event into its key's open window (it ends ``windowed``); the window it
        filled, or found past its time, goes on the stream."""
        window = self.config.pipelines[event.pipeline].window
        assert window is not None
        async with self.sessions() as session:
            joined = await windows.join(
                session,
                event_id=event.id,
                pipeline=event.pipeline,
                group_key=event.group_key,
                seconds=window.seconds,
                max_events=window.max_events,
                epoch=epoch,
                now=utcnow(),
            )
            if joined is None:
                await session.rollback()
                row = await session.get(EventRow, event.id)
                if row is not None and row.fence > epoch:
                    raise LeaseLost(f"a later lease tenure (epoch {row.fence}) started the event")
                return  # in a window already: a redelivery
            await session.commit()
        EVENTS_FINISHED.labels(status=EventStatus.WINDOWED).inc()
        for closed, reason in ((joined.closed_earlier, "time"), (joined.closed, "count")):
            if closed:
                WINDOWS_CLOSED.labels(pipeline=event.pipeline, reason=reason).inc()
        log_.info("event_windowed", window=joined.window_id, position=joined.position)
        if (joined.closed or joined.closed_earlier) and self.window_closed is not None:
            await self.window_closed(event.pipeline, event.group_key)

    async def give_up(self, event: Event, reason: str) -> None:
        """Dead-letter an event whose processing keeps failing (the worker's poison path)."""
        await self.dead_letters.add_unprocessable(_event_fields(event), reason=reason)

    async def _decide(
        self, event: Event, *, fence: Fence | None, first_attempt: int, log_: Any
    ) -> None:
        epoch = fence.epoch if fence is not None else 0
        pipeline = self.config.pipelines[event.pipeline]
        request = await self.request_for(event)
        cached = pipeline.cache is not None and self.cache is not None
        # An operator's replay asks Claude again (the point of it); it may refresh the entry.
        fresh = event.generation > 0
        if (
            cached
            and not fresh
            and await self._from_cache(event, request, first_attempt, epoch, log_)
        ):
            return
        if pipeline.mode == "batch" and self.batch_lane is not None:
            await self.batch_lane.park(event, request)
            log_.info("event_parked_for_batch", pipeline=event.pipeline)
            return
        escalated = False
        try:
            result, check = await self.ask(
                event,
                record=self.trail.of(event),
                fence=fence,
                first_attempt=first_attempt,
                request=request,
            )
            escalate = pipeline.escalate
            if escalate is not None and _calls(check, escalate.when_tool):
                result, check = await self._escalate(event, result, check, fence, escalate.to)
                escalated = True
        except CallAbandoned as exc:
            await self.dead_letters.add(event.id, stage="llm", reason=str(exc), epoch=epoch)
            return
        # Side by side: the decision is stored even if Redis fails (the event is then retried,
        # finds it stored and does not call Claude again), and the store waits for no Redis.
        await run_together(
            self._store(event, result=result, check=check, epoch=epoch, log_=log_),
            self.caller.account(result),
        )
        keep = not (escalated or check.problems() or result.reply.stop_reason in NO_PUBLISH_STOPS)
        if cached and keep and self.cache is not None and pipeline.cache is not None:
            ttl = pipeline.cache.ttl_seconds
            await self.cache.put(event.pipeline, request, result.reply, ttl_seconds=ttl)

    async def _from_cache(
        self, event: Event, request: ClaudeRequest, first_attempt: int, epoch: int, log_: Any
    ) -> bool:
        """A cached reply to the same prompt decides the event (audited as a hit, no cost);
        False when there is none, or it no longer passes the tool checks (then Claude is
        asked)."""
        assert self.cache is not None
        reply = await self.cache.get(event.pipeline, request)
        if reply is None:
            return False
        check = self._check_reply(event, reply)
        if check.invalid:
            return False
        attempt = Attempt(first_attempt, "cache", request, BreakerState.CLOSED, "cache hit")
        call_id = await self.trail.begin(event, attempt, cache_hit=True)
        answer = CachedAnswer(reply=reply, call_id=call_id, cost_usd=0.0)
        await self._store(event, result=answer, check=check, epoch=epoch, log_=log_)
        return True

    async def _escalate(
        self,
        event: Event,
        triage: CallResult,
        check: ToolCheck,
        fence: Fence | None,
        to: str,
    ) -> tuple[CallResult, ToolCheck]:
        """The triage call asked for the escalation tool: its row is completed (priced, with
        what it asked) and nothing of it is stored; pipeline ``to`` decides the event."""
        outcome = self.trail.recorder.reply_outcome(
            triage.reply,
            status=LlmCallStatus.OK,
            error="; ".join([f"escalated to pipeline {to!r}: nothing published", *check.notes()]),
        )
        await run_together(
            self.trail.complete(triage.call_id, outcome), self.caller.account(triage)
        )
        ESCALATIONS.labels(pipeline=event.pipeline, to=to).inc()
        escalated = event.model_copy(update={"pipeline": to})
        return await self.ask(
            escalated,
            record=self.trail.of(escalated),
            fence=fence,
            first_attempt=triage.attempt.number + 1,
        )

    async def request_for(self, event: Event) -> ClaudeRequest:
        """What Claude is asked for ``event`` through its pipeline (``event.pipeline``)."""
        pipeline = self.config.pipelines[event.pipeline]
        if event.source == WINDOW_SOURCE:
            content = await self._window_content(event)
        else:
            content = render_event(event)
        if pipeline.history is not None and event.source != WINDOW_SOURCE:
            async with self.sessions() as session:
                earlier = await earlier_events(session, event, limit=pipeline.history.events)
            block = history_block(earlier, source_types=self.source_types, config=pipeline.history)
            content = f"{content}\n{block}" if block else content
        return ClaudeRequest(
            model=pipeline.model,
            system=system_blocks(pipeline.system),
            tools=tool_definitions(self.config, event.pipeline),
            messages=[{"role": "user", "content": content}],
            max_tokens=pipeline.max_tokens,
        )

    async def _window_content(self, event: Event) -> str:
        window_id = int(event.payload["window"]["id"])
        async with self.sessions() as session:
            rows = await windows.members(session, window_id)
        members = [member_event(row, self.config.sources.get(row.source)) for row in rows]
        return render_window(event, members)

    async def ask(
        self,
        event: Event,
        *,
        record: AttemptLog,
        fence: Fence | None,
        first_attempt: int,
        request: ClaudeRequest | None = None,
    ) -> tuple[CallResult, ToolCheck]:
        """Claude's checked answer for ``event`` through its pipeline (``event.pipeline``),
        with one repair turn for an invalid tool input; stores nothing but the audit rows.
        Raises ``CallAbandoned`` when the guarded caller gives up."""
        if request is None:
            request = await self.request_for(event)
        result = await self.caller.call(
            request,
            pipeline_name=event.pipeline,
            record=record,
            attempt=first_attempt,
            reason=None,
            fence=fence,
        )
        check = self._check(event, result)
        if check.invalid and result.reply.stop_reason not in NO_PUBLISH_STOPS:
            await run_together(self._record_invalid(result, check), self.caller.account(result))
            result = await self.caller.call(
                repair_request(result.attempt.request, result.reply, check),
                pipeline_name=event.pipeline,
                record=record,
                attempt=result.attempt.number + 1,
                reason="repair: invalid tool input",
                fence=fence,
            )
            check = self._check(event, result)
        return result, check

    def _check(self, event: Event, result: CallResult) -> ToolCheck:
        return self._check_reply(event, result.reply)

    def _check_reply(self, event: Event, reply: ClaudeReply) -> ToolCheck:
        pipeline = self.config.pipelines[event.pipeline]
        return check_tool_uses(
            reply,
            offered=pipeline.tools,
            validators=self.validators,
            max_calls=pipeline.max_tool_calls,
        )

    async def _record_invalid(self, result: CallResult, check: ToolCheck) -> None:
        error = "invalid tool input (repair requested): " + "; ".join(check.problems())
        outcome = self.trail.recorder.reply_outcome(
            result.reply, status=LlmCallStatus.INVALID_TOOL_INPUT, error=error
        )
        await self.trail.complete(result.call_id, outcome)

    async def store_batch_answer(
        self,
        event: Event,
        *,
        reply: ClaudeReply,
        call_id: str,
        epoch: int,
        request: ClaudeRequest,
    ) -> None:
        """A reply of the Message Batches API decides ``event`` as a call's would (checked,
        stored with its outbox rows, or refused), priced at the batch rate; no repair turn.
        A pipeline with a response cache keeps it for the same prompt."""
        check = self._check_reply(event, reply)
        cost = self.trail.recorder.cost_usd(reply, batch=True)
        answer = CachedAnswer(reply=reply, call_id=call_id, cost_usd=cost)
        log_ = log.bind(event_id=event.id, source=event.source, group_key=event.group_key)
        await self._store(event, result=answer, check=check, epoch=epoch, log_=log_, batch=True)
        pipeline = self.config.pipelines[event.pipeline]
        keep = not (check.problems() or reply.stop_reason in NO_PUBLISH_STOPS)
        if keep and pipeline.cache is not None and self.cache is not None:
            ttl = pipeline.cache.ttl_seconds
            await self.cache.put(event.pipeline, request, reply, ttl_seconds=ttl)

    async def _store(
        self,
        event: Event,
        *,
        result: Answer,
        check: ToolCheck,
        epoch: int,
        log_: Any,
        batch: bool = False,
    ) -> None:
        reply = result.reply
        accepted, problems, notes = check.accepted, check.problems(), check.notes()
        if reply.stop_reason in NO_PUBLISH_STOPS:
            notes.append(f"stop_reason {reply.stop_reason}: nothing published")
            accepted, problems = [], []
        status = LlmCallStatus.INVALID_TOOL_INPUT if problems else LlmCallStatus.OK
        outcome = self.trail.recorder.reply_outcome(
            reply, status=status, error="; ".join(problems + notes) or None, batch=batch
        )
        rows = [
            outbox_row(
                event=event,
                use=use,
                index=index,
                tool=self.config.tools[use["name"]],
                call_id=result.call_id,
                model=reply.model,
            )
            for index, use in enumerate(accepted)
        ]
        try:
            if problems:
                await self._refuse(event, result.call_id, outcome, problems, epoch=epoch)
                return
            decision = Decision(
                event_id=event.id,
                status=decided_status(rows),
                error="; ".join(notes) or None,
                epoch=epoch,
                call_id=result.call_id,
                outcome=outcome,
                rows=rows,
            )
            if not await self.decisions.store(decision):
                raise LeaseLost("a later lease tenure started the event: decision not stored")
        except (LeaseLost, IntegrityError) as exc:
            if batch and isinstance(exc, IntegrityError):
                # A batch answer's audit row is the request's, whichever process reads the
                # answer: the one that stored it first completed it, and it stays so.
                log_.warning("batch_answer_stored_already")
                return
            # Another worker stored (or is storing) this event's decision: this paid call
            # keeps its audit row, marked as the loser.
            lost = (
                f"superseded: {exc}"
                if isinstance(exc, LeaseLost)
                else "superseded: another worker stored this event's decision first"
            )
            superseded = {"status": LlmCallStatus.SUPERSEDED, "error": lost}
            await self.trail.complete(result.call_id, outcome | superseded)
            log_.warning("decision_superseded", reason=lost)
            if isinstance(exc, LeaseLost):
                raise
            return
        except Exception as exc:
            if not data_refused(exc):
                raise
            await self._unstorable(event, result, outcome, exc, epoch=epoch, log_=log_)
            return
        if decision.status == EventStatus.PROCESSING:
            self.on_stored()
        else:
            labelled(EVENTS_FINISHED, decision.status).inc()
        if self.after_decided is not None:
            try:
                self.after_decided(event, rows, result)
            except Exception:  # a shadow's trouble is never the live event's
                log_.exception("after_decided_failed")
        log_.info(
            "llm_decided",
            model=reply.model,
            tools=[row.tool for row in rows],
            refused=[shown(name) for name in check.refused] + list(check.over_limit.values()),
            stop_reason=reply.stop_reason,
            cost_usd=result.cost_usd,
        )

    async def _refuse(
        self,
        event: Event,
        call_id: str,
        outcome: dict[str, Any],
        problems: list[str],
        *,
        epoch: int,
    ) -> None:
        """Still invalid after the repair turn: the outcome and the dead letter together."""
        reason = "invalid tool input after repair: " + "; ".join(problems)
        async with self.sessions() as session:
            await LlmCallRepository(session).complete(call_id, outcome)
            await self.dead_letters.add_in(
                session, event.id, stage="llm", reason=reason, epoch=epoch
            )
            await session.commit()
        DeadLetters.count(event.id, stage="llm", reason=reason)

    async def _unstorable(
        self,
        event: Event,
        result: Answer,
        outcome: dict[str, Any],
        exc: Exception,
        *,
        epoch: int,
        log_: Any,
    ) -> None:
        """The database refused the decision itself (a value too long for its column, say):
        it will refuse it every time, so the event is dead-lettered now rather than retried
        (each retry would pay for another Claude call). The audit row keeps the counts and
        cost, without the reply's texts; the driver's message is not kept (it can quote
        values)."""
        refused = type(exc.orig if isinstance(exc, DBAPIError) else exc).__name__
        reason = f"the decision could not be stored: the database refused it ({refused})"
        scrubbed = outcome | {
            "status": LlmCallStatus.ERROR,
            "error": reason,
            "model": str(outcome.get("model") or "")[:100],
            "request_id": None,
            "stop_reason": None,
            "tool_calls": [],
            "response_text": None,
        }
        await self.trail.complete(result.call_id, scrubbed)
        await self.dead_letters.add(event.id, stage="worker", reason=reason, epoch=epoch)
        log_.error("decision_unstorable", error=refused)


def _calls(check: ToolCheck, tool: str) -> bool:
    return any(use.get("name") == tool for use in check.accepted)


def decided_status(rows: Sequence[OutboxRow]) -> str:
    """The event's status once its decision is stored: ``no_action`` without tool calls,
    ``held`` when none of them has a topic (the relay sends none of them), else
    ``processing`` until the relay has published the ones that have one."""
    if not rows:
        return EventStatus.NO_ACTION
    if all(row.topic_arn is None for row in rows):
        return EventStatus.HELD
    return EventStatus.PROCESSING


def _event_fields(event: Event) -> dict[str, Any]:
    return {name: getattr(event, name) for name in EVENT_FIELDS}

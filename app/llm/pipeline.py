"""Process one event: Claude with the pipeline's tools → validated tool calls in the outbox.

Invariants:
- every attempt (success, API error, timeout, invalid tool input) is an audit row; failed
  attempts are committed as they happen (see ``caller.py`` for retries, breaker and limits);
- an invalid tool input gets one repair turn; still invalid → dead-lettered with the reason;
- the successful attempt's audit row, the outbox rows and the event status are one
  transaction, and the caller acks the stream entry only after it has committed;
- once tool calls are stored, processing the event again never calls Claude again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
import structlog
from jsonschema import Draft202012Validator
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import GatewayConfig
from app.ingest.schemas import Event
from app.llm.audit import AuditRecorder, new_call_id
from app.llm.caller import CallAbandoned, CallResult, GuardedCaller, run_together
from app.llm.client import ClaudeRequest
from app.llm.prompts import render_event, system_blocks, tool_definitions
from app.llm.tools import ToolCheck, check_tool_uses, repair_request
from app.observability.metrics import (
    DEAD_LETTERS,
    DEDUP_HITS,
    EVENTS_FINISHED,
    GROUP_ID_DISAGREEMENTS,
)
from app.publish.ids import deduplication_id, resolve_group_id
from app.store.models import EventStatus, OutboxRow
from app.store.repository import (
    EVENT_FIELDS,
    DeadLetterRepository,
    EventRepository,
    LlmCallRepository,
    OutboxRepository,
    start_delivery,
)

log = structlog.get_logger(__name__)
TERMINAL = frozenset(
    {EventStatus.PUBLISHED, EventStatus.NO_ACTION, EventStatus.FILTERED, EventStatus.DEAD_LETTERED}
)
NO_PUBLISH_STOPS = frozenset({"max_tokens", "refusal"})


class EventProcessor:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        sessions: async_sessionmaker[AsyncSession],
        caller: GuardedCaller,
        audit: AuditRecorder,
        max_deliveries: int,
        on_stored: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.sessions = sessions
        # start_delivery is one statement: on an autocommit connection it is one round trip
        # (no BEGIN, no COMMIT) and skips the ORM session, on every event's critical path.
        engine: AsyncEngine = sessions.kw["bind"]
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.caller = caller
        self.audit = audit
        self.max_deliveries = max_deliveries
        self.on_stored = on_stored
        self.validators = {
            name: Draft202012Validator(tool.input_schema) for name, tool in config.tools.items()
        }

    async def process(self, event: Event) -> None:
        """Return once the event's outcome is committed (then the entry may be acked).

        May wait a long time (open breaker, rate limit, exhausted ``wait`` budget): that
        holds only this event's key lane, and the event stays queued meanwhile.
        """
        log_ = log.bind(event_id=event.id, source=event.source, group_key=event.group_key)
        stored: Sequence[OutboxRow] = ()
        attempts = 0
        async with self.autocommit.connect() as connection:
            delivery = await start_delivery(connection, fields=_event_fields(event))
        status, deliveries = delivery.status, delivery.deliveries
        if not delivery.first:
            async with self.sessions() as session:
                stored = await OutboxRepository(session).for_event(
                    event.id, generation=event.generation
                )
                attempts = await LlmCallRepository(session).count_for_event(event.id)
        if status in TERMINAL or stored:
            DEDUP_HITS.labels(layer="processed").inc()
            log_.info("event_already_processed", status=status, stored_calls=len(stored))
            return
        if deliveries > self.max_deliveries:
            await self._dead_letter(
                event, stage="worker", reason=f"processing failed {deliveries - 1} times"
            )
            return
        await self._decide(event, first_attempt=attempts + 1, log_=log_)

    async def _decide(self, event: Event, *, first_attempt: int, log_: Any) -> None:
        pipeline = self.config.pipelines[event.pipeline]
        request = ClaudeRequest(
            model=pipeline.model,
            system=system_blocks(pipeline.system),
            tools=tool_definitions(self.config, event.pipeline),
            messages=[{"role": "user", "content": render_event(event)}],
            max_tokens=pipeline.max_tokens,
        )
        try:
            result = await self.caller.call(event, request, attempt=first_attempt, reason=None)
            check = self._check(event, result)
            if check.invalid and result.reply.stop_reason not in NO_PUBLISH_STOPS:
                await run_together(
                    self._record_invalid(event, result, check), self.caller.account(result)
                )
                result = await self.caller.call(
                    event,
                    repair_request(result.attempt.request, result.reply, check),
                    attempt=result.attempt.number + 1,
                    reason="repair: invalid tool input",
                )
                check = self._check(event, result)
        except CallAbandoned as exc:
            await self._dead_letter(event, stage="llm", reason=str(exc))
            return
        # Side by side: the decision is stored even if Redis fails (the event is then retried,
        # finds it stored and does not call Claude again), and the store waits for no Redis.
        await run_together(
            self._store(event, result=result, check=check, log_=log_), self.caller.account(result)
        )

    def _check(self, event: Event, result: CallResult) -> ToolCheck:
        offered = self.config.pipelines[event.pipeline].tools
        return check_tool_uses(result.reply, offered=offered, validators=self.validators)

    async def _record_invalid(self, event: Event, result: CallResult, check: ToolCheck) -> None:
        error = "invalid tool input (repair requested): " + "; ".join(check.problems())
        row = self.audit.reply_row(
            event, result.attempt, result.reply, status="invalid_tool_input", error=error
        )
        async with self.sessions() as session:
            await LlmCallRepository(session).add(row)
            await session.commit()

    async def _store(
        self, event: Event, *, result: CallResult, check: ToolCheck, log_: Any
    ) -> None:
        reply = result.reply
        call_id = new_call_id()
        accepted, problems = check.accepted, check.problems()
        notes = []
        if check.refused:
            notes.append(f"refused tools not offered: {', '.join(sorted(set(check.refused)))}")
        if reply.stop_reason in NO_PUBLISH_STOPS:
            notes.append(f"stop_reason {reply.stop_reason}: nothing published")
            accepted, problems = [], []
        audit = self.audit.reply_row(
            event,
            result.attempt,
            reply,
            status="invalid_tool_input" if problems else "ok",
            error="; ".join(problems + notes) or None,
            call_id=call_id,
        )
        async with self.sessions() as session:
            await LlmCallRepository(session).add(audit)
            if problems:
                await self._dead_letter_in(
                    session,
                    event,
                    stage="llm",
                    reason="invalid tool input after repair: " + "; ".join(problems),
                )
                await session.commit()
                return
            rows = [
                self._outbox_row(event, use, index, call_id, reply.model)
                for index, use in enumerate(accepted)
            ]
            await OutboxRepository(session).add_all(rows)
            status = EventStatus.PROCESSING if rows else EventStatus.NO_ACTION
            await EventRepository(session).set_status(
                event.id, status, error="; ".join(notes) or None
            )
            await session.commit()
        if rows:
            self.on_stored()
        else:
            EVENTS_FINISHED.labels(status=EventStatus.NO_ACTION).inc()
        log_.info(
            "llm_decided",
            model=reply.model,
            tool_calls=len(rows),
            refused=check.refused,
            stop_reason=reply.stop_reason,
            cost_usd=result.cost_usd,
        )

    def _outbox_row(
        self, event: Event, use: dict[str, Any], index: int, call_id: str, model: str
    ) -> OutboxRow:
        body = {
            "tool": use["name"],
            "input": use.get("input", {}),
            "event": event.summary(),
            "llm_call_id": call_id,
            "model": model,
            "sequence": index,
        }
        tool = self.config.tools[use["name"]]
        group_id, disagreed = resolve_group_id(tool.group_id, event.group_key, use.get("input"))
        if disagreed:
            GROUP_ID_DISAGREEMENTS.labels(tool=use["name"], policy=tool.group_id).inc()
        return OutboxRow(
            event_id=event.id,
            seq=index,
            generation=event.generation,
            llm_call_id=call_id,
            tool=use["name"],
            topic_arn=tool.topic_arn,
            group_id=group_id,
            dedup_id=deduplication_id(event.id, index, event.generation),
            body=orjson.dumps(body).decode(),
        )

    async def _dead_letter(self, event: Event, *, stage: str, reason: str) -> None:
        async with self.sessions() as session:
            await self._dead_letter_in(session, event, stage=stage, reason=reason)
            await session.commit()

    async def _dead_letter_in(
        self, session: AsyncSession, event: Event, *, stage: str, reason: str
    ) -> None:
        DeadLetterRepository(session).add(event_id=event.id, stage=stage, reason=reason)
        await EventRepository(session).set_status(event.id, EventStatus.DEAD_LETTERED, error=reason)
        DEAD_LETTERS.labels(stage=stage).inc()
        EVENTS_FINISHED.labels(status=EventStatus.DEAD_LETTERED).inc()
        log.warning("event_dead_lettered", event_id=event.id, stage=stage, reason=reason)


def _event_fields(event: Event) -> dict[str, Any]:
    return {name: getattr(event, name) for name in EVENT_FIELDS}

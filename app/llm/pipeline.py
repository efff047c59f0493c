"""Process one event: Claude with the pipeline's tools → validated tool calls in the outbox.

Invariants:
- every attempt (success, API error, timeout) is an audit row, committed as it happens;
- the successful attempt's audit row, the outbox rows and the event status are one
  transaction, and the caller acks the stream entry only after it has committed;
- once tool calls are stored, processing the event again never calls Claude again.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from jsonschema import Draft202012Validator
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import GatewayConfig
from app.ingest.schemas import Event
from app.llm.client import ClaudeClient, ClaudeError, ClaudeReply, ClaudeRequest
from app.llm.prompts import render_event, system_blocks, tool_definitions
from app.observability.metrics import (
    DEAD_LETTERS,
    DEDUP_HITS,
    EVENTS_FINISHED,
    GROUP_ID_DISAGREEMENTS,
    LLM_DURATION,
    LLM_REQUESTS,
    LLM_TOKENS,
)
from app.publish.ids import deduplication_id, resolve_group_id
from app.store.models import EventStatus, LlmCallRow, OutboxRow
from app.store.repository import (
    DeadLetterRepository,
    EventRepository,
    LlmCallRepository,
    OutboxRepository,
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
        claude: ClaudeClient,
        llm_slots: asyncio.Semaphore,
        max_deliveries: int,
        on_stored: Callable[[], None] = lambda: None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        retry_base: float = 1.0,
        retry_cap: float = 30.0,
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.claude = claude
        self.llm_slots = llm_slots
        self.max_deliveries = max_deliveries
        self.on_stored = on_stored
        self.sleep = sleep
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.validators = {
            name: Draft202012Validator(tool.input_schema) for name, tool in config.tools.items()
        }

    async def process(self, event: Event) -> None:
        """Return once the event's outcome is committed (then the entry may be acked)."""
        log_ = log.bind(event_id=event.id, source=event.source, group_key=event.group_key)
        async with self.sessions() as session:
            row = await EventRepository(session).start_delivery(fields=_event_fields(event))
            status, deliveries = row.status, row.deliveries
            stored = await OutboxRepository(session).for_event(
                event.id, generation=event.generation
            )
            attempts = len(await LlmCallRepository(session).for_event(event.id))
            await session.commit()
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
        attempt = first_attempt
        retries = 0
        while True:
            try:
                async with self.llm_slots:
                    reply = await self.claude.create(request)
            except ClaudeError as exc:
                await self._audit_failure(event, attempt=attempt, model=pipeline.model, exc=exc)
                if not exc.retryable:
                    await self._dead_letter(event, stage="llm", reason=f"{exc.error_type}: {exc}")
                    return
                retries += 1
                delay = self._backoff(retries, exc.retry_after)
                log_.warning(
                    "llm_retry",
                    attempt=attempt,
                    error=exc.error_type,
                    status=exc.status,
                    retry_in=round(delay, 2),
                )
                attempt += 1
                await self.sleep(delay)
                continue
            await self._store(event, reply=reply, attempt=attempt, log_=log_)
            return

    def _backoff(self, retries: int, retry_after: float | None) -> float:
        delay = random.uniform(0, min(self.retry_cap, self.retry_base * 2**retries))
        if retry_after is not None:
            delay = max(delay, min(retry_after, 60.0))
        return delay

    async def _store(self, event: Event, *, reply: ClaudeReply, attempt: int, log_: Any) -> None:
        _observe(reply.model, "ok", reply.latency_ms, reply)
        call_id = f"llm_{uuid.uuid4().hex}"
        offered = set(self.config.pipelines[event.pipeline].tools)
        uses = reply.tool_uses()
        refused = [u["name"] for u in uses if u.get("name") not in offered]
        accepted = [u for u in uses if u.get("name") in offered]
        problems = [
            f"{u['name']}: {err.message}"
            for u in accepted
            for err in list(self.validators[u["name"]].iter_errors(u.get("input")))[:1]
        ]
        notes = []
        if refused:
            notes.append(f"refused tools not offered: {', '.join(sorted(set(refused)))}")
        if reply.stop_reason in NO_PUBLISH_STOPS:
            notes.append(f"stop_reason {reply.stop_reason}: nothing published")
            accepted = []
        audit = LlmCallRow(
            id=call_id,
            event_id=event.id,
            pipeline=event.pipeline,
            model=reply.model,
            attempt=attempt,
            status="invalid_tool_input" if problems else "ok",
            request_id=reply.request_id,
            latency_ms=reply.latency_ms,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cache_creation_input_tokens=reply.cache_creation_input_tokens,
            cache_read_input_tokens=reply.cache_read_input_tokens,
            stop_reason=reply.stop_reason,
            tool_calls=[{"name": u.get("name"), "input": u.get("input")} for u in uses],
            error="; ".join(problems + notes) or None,
        )
        async with self.sessions() as session:
            LlmCallRepository(session).add(audit)
            if problems:
                await self._dead_letter_in(
                    session, event, stage="llm", reason="invalid tool input: " + "; ".join(problems)
                )
                await session.commit()
                return
            rows = [
                self._outbox_row(event, use, index, call_id, reply.model)
                for index, use in enumerate(accepted)
            ]
            OutboxRepository(session).add_all(rows)
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
            refused=refused,
            stop_reason=reply.stop_reason,
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

    async def _audit_failure(
        self, event: Event, *, attempt: int, model: str, exc: ClaudeError
    ) -> None:
        _observe(model, "retry" if exc.retryable else "error", exc.latency_ms, None)
        async with self.sessions() as session:
            LlmCallRepository(session).add(
                LlmCallRow(
                    id=f"llm_{uuid.uuid4().hex}",
                    event_id=event.id,
                    pipeline=event.pipeline,
                    model=model,
                    attempt=attempt,
                    status="retry" if exc.retryable else "error",
                    request_id=exc.request_id,
                    latency_ms=exc.latency_ms,
                    tool_calls=[],
                    error_type=exc.error_type,
                    error=str(exc)[:2000],
                )
            )
            await session.commit()

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
    return {
        "id": event.id,
        "source": event.source,
        "type": event.type,
        "group_key": event.group_key,
        "delivery_id": event.delivery_id,
        "pipeline": event.pipeline,
        "payload": event.payload,
        "received_at": event.received_at,
    }


def _observe(model: str, outcome: str, latency_ms: float, reply: ClaudeReply | None) -> None:
    LLM_REQUESTS.labels(model=model, outcome=outcome).inc()
    LLM_DURATION.observe(latency_ms / 1000)
    if reply is not None:
        for kind, value in (
            ("input", reply.input_tokens),
            ("output", reply.output_tokens),
            ("cache_creation", reply.cache_creation_input_tokens),
            ("cache_read", reply.cache_read_input_tokens),
        ):
            LLM_TOKENS.labels(model=model, type=kind).inc(value)

"""Audit rows for Claude attempts: one per attempt, with cost, breaker state, prompt hash and
the prompt/response text as ``EVENTGATE_LLM_AUDIT_TEXT`` says (``full|redacted|none``).

A row is written before its call, with status ``unknown`` (so a process that dies during the
call leaves an honest row, not none), and completed with the outcome after it: a failure at
once, the reply of a call whose tool calls are stored in the same transaction as its outbox
rows, or on its own when that transaction is refused (``superseded``).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.decide.audit_text import TextMode, audit_text, prompt_hash
from app.events import Event
from app.llm.attempts import Attempt, usage_of
from app.llm.client import ClaudeError, ClaudeReply
from app.llm.pricing import PriceTable
from app.store.driver import DriverPool
from app.store.models import CallPurpose, LlmCallStatus
from app.store.repository import LLM_CALLS, LlmCallRepository
from app.store.row_batcher import RowBatcher


class AuditRecorder:
    def __init__(self, *, prices: PriceTable, text_mode: TextMode) -> None:
        self.prices = prices
        self.text_mode = text_mode

    def cost_usd(self, reply: ClaudeReply, *, batch: bool = False) -> float:
        return self.prices.cost_usd(reply.model, usage_of(reply), batch=batch)

    def started_row(
        self,
        event: Event,
        attempt: Attempt,
        *,
        call_id: str,
        purpose: str = CallPurpose.LIVE,
        cache_hit: bool = False,
    ) -> dict[str, Any]:
        """The columns of an attempt's row before its call (the database fills the others)."""
        return {
            **self._common(event, attempt, call_id=call_id),
            "purpose": purpose,
            "cache_hit": cache_hit,
            "model": attempt.request.model,
            "status": LlmCallStatus.UNKNOWN,
            "latency_ms": 0.0,
            "tool_calls": [],
            "cost_usd": 0.0,
        }

    def failure_outcome(self, attempt: Attempt, exc: ClaudeError) -> dict[str, Any]:
        return _outcome(
            model=attempt.request.model,
            status=LlmCallStatus.RETRY if exc.retryable else LlmCallStatus.ERROR,
            request_id=exc.request_id,
            latency_ms=exc.latency_ms,
            error_type=exc.error_type,
            error=str(exc)[:2000],
        )

    def reply_outcome(
        self, reply: ClaudeReply, *, status: str, error: str | None, batch: bool = False
    ) -> dict[str, Any]:
        """``batch``: the reply came through the Message Batches API, priced at its rate."""
        return _outcome(
            model=reply.model,
            status=status,
            request_id=reply.request_id,
            latency_ms=reply.latency_ms,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cache_creation_input_tokens=reply.cache_creation_input_tokens,
            cache_read_input_tokens=reply.cache_read_input_tokens,
            stop_reason=reply.stop_reason,
            tool_calls=[
                {"name": u.get("name"), "input": u.get("input")} for u in reply.tool_uses()
            ],
            error=error,
            cost_usd=self.cost_usd(reply, batch=batch),
            response_text=audit_text(self.text_mode, reply.content),
        )

    def _common(
        self, event: Event, attempt: Attempt, *, call_id: str | None = None
    ) -> dict[str, object]:
        return {
            "id": call_id or new_call_id(),
            "event_id": event.id,
            "pipeline": event.pipeline,
            "attempt": attempt.number,
            "provider": attempt.provider,
            "retry_reason": attempt.retry_reason,
            "breaker_state": attempt.breaker_state.value,
            "prompt_hash": prompt_hash(attempt.request.as_api()),
            "prompt_text": audit_text(self.text_mode, attempt.request.messages),
        }


def new_call_id() -> str:
    return f"llm_{uuid.uuid4().hex}"


def _outcome(**given: Any) -> dict[str, Any]:
    """Every outcome column: the given values, defaults for the others."""
    return {
        "request_id": None,
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "stop_reason": None,
        "tool_calls": [],
        "error_type": None,
        "error": None,
        "cost_usd": 0.0,
        "response_text": None,
    } | given


class AuditTrail:
    """Writes the rows: each statement alone on an autocommit connection (one round trip; the
    rows before calls batched, ``RowBatcher``, on the driver's pool when given), or inside
    the caller's transaction (``complete_in``)."""

    def __init__(
        self, *, engine: AsyncEngine, recorder: AuditRecorder, driver: DriverPool | None = None
    ) -> None:
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.recorder = recorder
        # The rows of attempts about to be made: those of events reaching their calls
        # together go in with one statement.
        self.started = RowBatcher(engine, LLM_CALLS, driver=driver)

    def of(self, event: Event, *, purpose: str = CallPurpose.LIVE) -> EventAttempts:
        """The attempt log the guarded caller writes for ``event`` (``purpose``: live, or a
        run that publishes nothing)."""
        return EventAttempts(self, event, purpose=purpose)

    async def begin(
        self,
        event: Event,
        attempt: Attempt,
        *,
        purpose: str = CallPurpose.LIVE,
        cache_hit: bool = False,
    ) -> str:
        """The row of an attempt about to be made (or of a cache hit), outcome unknown;
        returns its id."""
        call_id = new_call_id()
        row = self.recorder.started_row(
            event, attempt, call_id=call_id, purpose=purpose, cache_hit=cache_hit
        )
        await self.started.insert(row)
        return call_id

    async def complete(self, call_id: str, outcome: dict[str, Any]) -> None:
        async with self.autocommit.connect() as connection:
            await LlmCallRepository(connection).complete(call_id, outcome)


class EventAttempts:
    """``app.llm.attempts.AttemptLog`` for one event's attempts."""

    def __init__(self, trail: AuditTrail, event: Event, *, purpose: str) -> None:
        self.trail = trail
        self.event = event
        self.purpose = purpose

    async def begin(self, attempt: Attempt) -> str:
        return await self.trail.begin(self.event, attempt, purpose=self.purpose)

    async def failed(self, call_id: str, attempt: Attempt, exc: ClaudeError) -> None:
        await self.trail.complete(call_id, self.trail.recorder.failure_outcome(attempt, exc))

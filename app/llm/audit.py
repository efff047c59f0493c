"""Audit rows for Claude attempts: one per attempt, with cost, breaker state, prompt hash and
the prompt/response text as ``EVENTGATE_LLM_AUDIT_TEXT`` says (``full|redacted|none``).

Failure rows are committed as they happen; the row of the attempt whose tool calls are
stored is committed by the pipeline in the same transaction as its outbox rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from app.ingest.schemas import Event
from app.llm.breaker import BreakerState
from app.llm.client import ClaudeError, ClaudeReply, ClaudeRequest
from app.llm.pricing import PriceTable, Usage
from app.llm.redaction import TextMode, audit_text, prompt_hash
from app.store.models import LlmCallRow


@dataclass(frozen=True, slots=True)
class Attempt:
    """What is known about one attempt before it is made."""

    number: int
    provider: str
    request: ClaudeRequest
    breaker_state: BreakerState
    retry_reason: str | None = None


def usage_of(reply: ClaudeReply) -> Usage:
    return Usage(
        reply.input_tokens,
        reply.output_tokens,
        reply.cache_creation_input_tokens,
        reply.cache_read_input_tokens,
    )


class AuditRecorder:
    def __init__(self, *, prices: PriceTable, text_mode: TextMode) -> None:
        self.prices = prices
        self.text_mode = text_mode

    def cost_usd(self, reply: ClaudeReply) -> float:
        return self.prices.cost_usd(reply.model, usage_of(reply))

    def failure_row(self, event: Event, attempt: Attempt, exc: ClaudeError) -> LlmCallRow:
        return LlmCallRow(
            **self._common(event, attempt),
            model=attempt.request.model,
            status="retry" if exc.retryable else "error",
            request_id=exc.request_id,
            latency_ms=exc.latency_ms,
            tool_calls=[],
            error_type=exc.error_type,
            error=str(exc)[:2000],
            cost_usd=0.0,
        )

    def reply_row(
        self,
        event: Event,
        attempt: Attempt,
        reply: ClaudeReply,
        *,
        status: str,
        error: str | None,
        call_id: str | None = None,
    ) -> LlmCallRow:
        return LlmCallRow(
            **self._common(event, attempt, call_id=call_id),
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
            cost_usd=self.cost_usd(reply),
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

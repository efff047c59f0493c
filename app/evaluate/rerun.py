"""Decide stored events again, through any configured pipeline, publishing nothing.

A rerun asks Claude exactly as the live path does (the same prompt, tools, guarded caller
with its rate limits, breaker, budgets and concurrency, one repair turn for an invalid tool
input), audits each attempt with its ``purpose`` (never ``live``), and stops there: no outbox
row, no event status, nothing the relay could send. Its decision is what the live path would
have stored: the accepted calls, or none when the reply stopped short (``max_tokens``,
``refusal``) or stayed invalid after the repair.

The live decision of a stored event is read from its outbox rows (its current generation):
the accepted calls, in order, with the inputs as filtered for publishing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import GatewayConfig
from app.decide.processor import NO_PUBLISH_STOPS, EventProcessor
from app.evaluate.agreement import Decision
from app.events import Event, EventStatus, make_event
from app.llm.caller import CallAbandoned, run_together
from app.store.models import CallPurpose, EventRow, LlmCallStatus, OutboxRow

# Statuses of an event whose live decision is stored (its outbox rows are the decision).
DECIDED = frozenset(
    {EventStatus.PROCESSING, EventStatus.PUBLISHED, EventStatus.HELD, EventStatus.NO_ACTION}
)


@dataclass(frozen=True)
class Rerun:
    event_id: str
    pipeline: str
    decision: Decision | None  # None: the guarded caller gave up (``error`` says why)
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None


class Rerunner:
    def __init__(
        self, processor: EventProcessor, *, purpose: str, deadline_seconds: float = 600.0
    ) -> None:
        assert purpose != CallPurpose.LIVE, "a rerun never decides live"
        self.processor = processor
        self.purpose = purpose
        # The guarded caller waits out an open breaker and retries for the live deadline:
        # a run gives each event this long, then reports it (the run must end).
        self.deadline_seconds = deadline_seconds

    async def decide(self, event: Event, pipeline: str) -> Rerun:
        candidate = event.model_copy(update={"pipeline": pipeline})
        trail = self.processor.trail
        record = trail.of(candidate, purpose=self.purpose)
        try:
            async with asyncio.timeout(self.deadline_seconds) as deadline:
                result, check = await self.processor.ask(
                    candidate, record=record, fence=None, first_attempt=1
                )
        except CallAbandoned as exc:
            return Rerun(event.id, pipeline, None, error=str(exc))
        except TimeoutError:
            if not deadline.expired():
                raise
            error = f"no decision within {self.deadline_seconds:g}s (Claude failing or waited on)"
            return Rerun(event.id, pipeline, None, error=error)
        reply, problems = result.reply, check.problems()
        accepted = [] if problems or reply.stop_reason in NO_PUBLISH_STOPS else check.accepted
        outcome = trail.recorder.reply_outcome(
            reply,
            status=LlmCallStatus.INVALID_TOOL_INPUT if problems else LlmCallStatus.OK,
            error="; ".join(problems + check.notes()) or None,
        )
        await run_together(
            trail.complete(result.call_id, outcome), self.processor.caller.account(result)
        )
        decision = Decision(
            tuple((str(use["name"]), dict(use.get("input") or {})) for use in accepted),
            refused=tuple(check.refused),
        )
        return Rerun(
            event.id,
            pipeline,
            decision,
            cost_usd=result.cost_usd,
            latency_ms=reply.latency_ms,
            input_tokens=reply.input_tokens + reply.cache_creation_input_tokens,
            output_tokens=reply.output_tokens,
        )


def event_of(row: EventRow, config: GatewayConfig) -> Event:
    """The stored event as the worker saw it (rendered as its source is configured now)."""
    received = row.received_at
    return make_event(
        id=row.id,
        source=row.source,
        config=config.sources.get(row.source),
        type=row.type,
        group_key=row.group_key,
        delivery_id=row.delivery_id,
        pipeline=row.pipeline,
        received_at=received if received.tzinfo else received.replace(tzinfo=UTC),
        payload=row.payload,
        generation=row.replays,
    )


async def stored_events(
    session: AsyncSession,
    *,
    since: datetime | None,
    until: datetime | None = None,
    source: str | None = None,
    pipeline: str | None = None,
    limit: int = 100,
    decided_only: bool = True,
) -> Sequence[EventRow]:
    """Stored events received in [since, until), oldest first."""
    query = select(EventRow).order_by(EventRow.received_at, EventRow.id).limit(limit)
    if since is not None:
        query = query.where(EventRow.received_at >= since)
    if until is not None:
        query = query.where(EventRow.received_at < until)
    if source is not None:
        query = query.where(EventRow.source == source)
    if pipeline is not None:
        query = query.where(EventRow.pipeline == pipeline)
    if decided_only:
        query = query.where(EventRow.status.in_(DECIDED))
    return (await session.scalars(query)).all()


async def live_decision(session: AsyncSession, row: EventRow) -> Decision:
    rows = await session.scalars(
        select(OutboxRow)
        .where(OutboxRow.event_id == row.id, OutboxRow.generation == row.replays)
        .order_by(OutboxRow.seq)
    )
    calls = []
    for outbox in rows:
        body = orjson.loads(outbox.body)
        calls.append((str(body["tool"]), dict(body.get("input") or {})))
    return Decision(tuple(calls))

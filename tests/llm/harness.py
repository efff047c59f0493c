"""An EventProcessor wired like production (real Redis, real database), with Claude behind
respx or the fake server, an injected clock and sleeps that let fake time pass."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from anthropic import AsyncAnthropic
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import GatewayConfig, parse_config
from app.decide.audit import AuditRecorder, AuditTrail
from app.decide.processor import EventProcessor
from app.decide.wiring import breaker_policy, model_limits, retry_policy
from app.events import Event
from app.llm.breaker import CircuitBreaker
from app.llm.budget import BudgetLedger
from app.llm.caller import GuardedCaller
from app.llm.client import ClaudeClient
from app.llm.health import LlmHealth
from app.llm.pricing import PriceTable
from app.llm.ratelimit import RateLimiter
from app.settings import Settings
from app.store.driver import DriverPool
from app.store.models import DeadLetterRow, EventRow, LlmCallRow, OutboxRow
from tests.llm.helpers import FakeClock, RecordedSleeps

BASE = "https://api.anthropic.com"
ALERT_SCHEMA = """
    input_schema:
      type: object
      properties: {severity: {type: string, enum: [high, low]}, title: {type: string}}
      required: [severity, title]
      additionalProperties: false
"""


def config_text(pipeline_extra: str = "", *, fallback: bool = True) -> str:
    fallback_line = "    fallback_model: claude-haiku-4-5\n" if fallback else ""
    return f"""
sources:
  github: {{type: github, secret: llm-tests-github-secret, pipeline: triage}}
pipelines:
  triage:
    model: claude-sonnet-4-6
{fallback_line}    system: You triage events.
    tools: [publishAlert]
{pipeline_extra}
tools:
  publishAlert:
    description: Raise an alert.
{ALERT_SCHEMA}
  deleteRepository:
    description: Never offered to the triage pipeline.
    input_schema: {{type: object}}
"""


def make_event(n: int = 1, *, group: str = "acme/api", payload: Any = None) -> Event:
    return Event(
        id=f"evt_{uuid.uuid4().hex[:12]}_{n}",
        source="github",
        type="issues.opened",
        group_key=group,
        delivery_id=str(uuid.uuid4()),
        pipeline="triage",
        received_at=datetime(2026, 11, 29, 12, 0, n % 60, tzinfo=UTC),
        payload=payload if payload is not None else {"issue": {"number": n}},
    )


def tool_use(
    name: str = "publishAlert", value: Any = None, use_id: str = "toolu_1"
) -> dict[str, Any]:
    value = {"severity": "high", "title": "it broke"} if value is None else value
    return {"type": "tool_use", "id": use_id, "name": name, "input": value}


def reply(
    *blocks: dict[str, Any],
    model: str = "claude-sonnet-4-6",
    stop_reason: str = "tool_use",
    usage: dict[str, int] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": f"msg_{uuid.uuid4().hex[:8]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": list(blocks) or [tool_use()],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage or {"input_tokens": 100, "output_tokens": 20},
        },
        headers={"request-id": f"req_{uuid.uuid4().hex[:8]}", **(headers or {})},
    )


def error(status: int, *, retry_after: str | None = None) -> httpx.Response:
    headers = {"request-id": f"req_err_{status}"}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return httpx.Response(
        status,
        json={"type": "error", "error": {"type": "api_error", "message": f"fault {status}"}},
        headers=headers,
    )


@dataclass
class Script:
    """Answers requests in order (the last answer repeats); keeps every request body."""

    answers: list[httpx.Response | Callable[[dict[str, Any]], httpx.Response]]
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        self.bodies.append(body)
        answer = self.answers[min(len(self.bodies) - 1, len(self.answers) - 1)]
        return answer(body) if callable(answer) else answer


@dataclass
class Harness:
    processor: EventProcessor
    caller: GuardedCaller
    sessions: async_sessionmaker[AsyncSession]
    clock: FakeClock
    sleeps: RecordedSleeps
    health: LlmHealth
    budgets: BudgetLedger
    config: GatewayConfig

    async def rows(self, event_id: str) -> Outcome:
        async with self.sessions() as session:
            event = await session.get(EventRow, event_id)
            calls = (
                await session.scalars(
                    select(LlmCallRow)
                    .where(LlmCallRow.event_id == event_id)
                    .order_by(LlmCallRow.attempt)
                )
            ).all()
            outbox = (
                await session.scalars(
                    select(OutboxRow).where(OutboxRow.event_id == event_id).order_by(OutboxRow.seq)
                )
            ).all()
            dead = (
                await session.scalars(
                    select(DeadLetterRow).where(DeadLetterRow.event_id == event_id)
                )
            ).all()
        assert event is not None
        return Outcome(event, list(calls), list(outbox), list(dead))


@dataclass
class Outcome:
    event: EventRow
    calls: list[LlmCallRow]
    outbox: list[OutboxRow]
    dead: list[DeadLetterRow]


def build(
    *,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    prefix: str,
    text: str | None = None,
    clients: dict[str, ClaudeClient] | None = None,
    breaker: type[CircuitBreaker] = CircuitBreaker,
    budgets: type[BudgetLedger] = BudgetLedger,
    driver: DriverPool | None = None,
    **settings: Any,
) -> Harness:
    """``breaker`` and ``budgets`` let a test pass a subclass (e.g. one whose Redis fails);
    ``driver``, the worker's per-event statements on PostgreSQL's pool (as ``serve`` runs
    them there)."""
    config = parse_config(text or config_text())
    defaults: dict[str, Any] = {"llm_retry_base_seconds": 0.5, "llm_audit_text": "redacted"}
    s = Settings(**(defaults | settings))
    clock = FakeClock()
    sleeps = RecordedSleeps(clock)
    health = LlmHealth()
    ledger = budgets(redis, prefix=prefix, clock=clock)
    prices = PriceTable.from_config(config)
    audit = AuditRecorder(prices=prices, text_mode=s.llm_audit_text)  # type: ignore[arg-type]
    anthropic = ClaudeClient(AsyncAnthropic(api_key="sk-ant-test", base_url=BASE, max_retries=0))
    engine = sessions().bind
    assert isinstance(engine, AsyncEngine)
    trail = AuditTrail(engine=engine, recorder=audit, driver=driver)
    caller = GuardedCaller(
        config=config,
        clients=clients if clients is not None else {"anthropic": anthropic},
        limiter=RateLimiter(
            redis, prefix=prefix, limits=model_limits(s, config), clock=clock, sleep=sleeps
        ),
        breaker=breaker(redis, prefix=prefix, policy=breaker_policy(s), clock=clock),
        budgets=ledger,
        health=health,
        prices=prices,
        slots=asyncio.Semaphore(s.llm_max_concurrency),
        retry=retry_policy(s),
        sleep=sleeps,
    )
    processor = EventProcessor(
        config=config,
        engine=engine,
        sessions=sessions,
        caller=caller,
        trail=trail,
        max_deliveries=5,
        driver=driver,
    )
    return Harness(processor, caller, sessions, clock, sleeps, health, ledger, config)

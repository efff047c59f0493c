"""Runs that decide stored events again and publish nothing: ``eventgate replay`` (another
pipeline against what was decided live) and ``eventgate consistency`` (one pipeline, K runs
of each event against each other). Built here, beside the roles, from the same parts as a
worker: the guarded Claude caller with its rate limits, breaker and budgets in Redis, and
the audit log in the database (each attempt's row says its purpose)."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import GatewayConfig
from app.decide.wiring import build_processor
from app.evaluate.agreement import Agreement, Decision
from app.evaluate.evals import Case, failures
from app.evaluate.rerun import Rerun, Rerunner, event_of, live_decision, stored_events
from app.events import Event, make_event
from app.llm.health import LlmHealth
from app.llm.ratelimit import LIVE_RATE_RESERVE
from app.queue.connection import open_redis
from app.redaction import redact_to_json
from app.roles import _claude_clients
from app.settings import Settings
from app.store.db import create_engine, session_factory
from app.store.migrate import upgrade_head
from app.store.models import CallPurpose, EventRow, LlmCallRow, LlmCallStatus

# Where the runs' daily budgets are counted (beside the live ones, under the same prefix).
RERUN_BUDGETS = "reruns"


class RerunRefused(Exception):
    """The run cannot start (no Claude configured, an unknown pipeline); the message says so."""


@dataclass(frozen=True)
class Selection:
    since: datetime | None
    until: datetime | None = None
    source: str | None = None
    limit: int = 100


@asynccontextmanager
async def rerunner(
    settings: Settings, config: GatewayConfig, *, purpose: str
) -> AsyncIterator[tuple[Rerunner, async_sessionmaker[AsyncSession]]]:
    async with AsyncExitStack() as stack:
        clients = await _claude_clients(settings, config, stack)
        if not clients:
            raise RerunRefused("no Claude configured: set ANTHROPIC_API_KEY")
        if settings.auto_migrate:  # as the serving roles do: a new database has no audit table
            await asyncio.to_thread(upgrade_head, settings.database_url)
        engine = create_engine(settings.database_url, pool_size=settings.database_pool_size)
        stack.push_async_callback(engine.dispose)
        redis = await open_redis(settings.redis_url, cluster=settings.redis_cluster)
        stack.push_async_callback(redis.aclose)
        processor = build_processor(
            settings=settings,
            config=config,
            redis=redis,
            engine=engine,
            clients=clients,
            health=LlmHealth(),
            on_stored=lambda: None,
            # Each pipeline's daily budget again, counted apart: a run spending the live
            # one would make live events wait a day or be dead-lettered.
            budget_prefix=f"{settings.redis_prefix}:{RERUN_BUDGETS}",
            rate_reserve=LIVE_RATE_RESERVE,
        )
        runner = Rerunner(
            processor, purpose=purpose, deadline_seconds=settings.rerun_deadline_seconds
        )
        yield runner, session_factory(engine)


async def _decide_all(
    runner: Rerunner, work: list[tuple[Event, str]], *, limit: int
) -> list[Rerun]:
    """Each (event, pipeline) decided, at most ``limit`` at once (the guarded caller's own
    limits apply inside)."""
    slots = asyncio.Semaphore(limit)

    async def one(event: Event, pipeline: str) -> Rerun:
        async with slots:
            return await runner.decide(event, pipeline)

    return list(await asyncio.gather(*(one(event, pipeline) for event, pipeline in work)))


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def _schemas(config: GatewayConfig) -> dict[str, dict[str, Any]]:
    return {name: dict(tool.input_schema) for name, tool in config.tools.items()}


def _check_pipeline(config: GatewayConfig, pipeline: str) -> None:
    if pipeline not in config.pipelines:
        known = ", ".join(sorted(config.pipelines)) or "none"
        raise RerunRefused(f"no pipeline {pipeline!r} in the config (configured: {known})")


# Event ids per statement: PostgreSQL (asyncpg) and SQLite bind at most 32,767 parameters.
_IDS_PER_QUERY = 10_000


async def _live_costs(session: AsyncSession, event_ids: list[str]) -> tuple[float, list[float]]:
    total, latencies = 0.0, []
    for start in range(0, len(event_ids), _IDS_PER_QUERY):
        chunk = event_ids[start : start + _IDS_PER_QUERY]
        live = (LlmCallRow.event_id.in_(chunk), LlmCallRow.purpose == CallPurpose.LIVE)
        cost = await session.scalar(
            select(func.coalesce(func.sum(LlmCallRow.cost_usd), 0)).where(*live)
        )
        found = await session.scalars(
            select(LlmCallRow.latency_ms).where(*live, LlmCallRow.status == LlmCallStatus.OK)
        )
        total += float(cost or 0)
        latencies += [float(v) for v in found]
    return total, latencies


async def replay(
    settings: Settings, config: GatewayConfig, *, pipeline: str, selection: Selection
) -> dict[str, Any]:
    """Stored events, decided live, decided again by ``pipeline``: the agreement figures
    (keys as ``GET /v1/shadow``), each side's cost and latency, the disagreements."""
    _check_pipeline(config, pipeline)
    async with rerunner(settings, config, purpose=CallPurpose.REPLAY) as (runner, sessions):
        async with sessions() as session:
            rows = await stored_events(
                session,
                since=selection.since,
                until=selection.until,
                source=selection.source,
                limit=selection.limit,
            )
            live = {row.id: await live_decision(session, row) for row in rows}
        events = [event_of(row, config) for row in rows]
        work = [(event, pipeline) for event in events]
        reruns = await _decide_all(runner, work, limit=settings.llm_max_concurrency)
        async with sessions() as session:
            live_cost, live_latency = await _live_costs(session, [r.id for r in rows])
    found = Agreement(_schemas(config))
    for rerun in reruns:
        if rerun.decision is not None:
            found.add(rerun.event_id, live[rerun.event_id], rerun.decision)
    return {
        "candidate": pipeline,
        "baseline": "live",
        **found.summary(),
        "cost_usd": {
            "baseline": round(live_cost, 6),
            "candidate": round(sum(r.cost_usd for r in reruns), 6),
        },
        "latency_ms": {
            "baseline": _median(live_latency),
            "candidate": _median([r.latency_ms for r in reruns if r.decision is not None]),
        },
        "errors": [{"event_id": r.event_id, "error": r.error} for r in reruns if r.error],
    }


async def consistency(
    settings: Settings,
    config: GatewayConfig,
    *,
    pipeline: str,
    selection: Selection,
    runs: int,
) -> dict[str, Any]:
    """Each of the selected stored events decided ``runs`` times by ``pipeline``; every pair
    of runs of one event compared."""
    _check_pipeline(config, pipeline)
    async with rerunner(settings, config, purpose=CallPurpose.CONSISTENCY) as (runner, sessions):
        async with sessions() as session:
            rows = await stored_events(
                session,
                since=selection.since,
                until=selection.until,
                source=selection.source,
                limit=selection.limit,
                decided_only=False,
            )
        events = [event_of(row, config) for row in rows]
        work = [(event, pipeline) for event in events for _ in range(runs)]
        reruns = await _decide_all(runner, work, limit=settings.llm_max_concurrency)
    found = Agreement(_schemas(config))
    by_event: dict[str, list[Decision]] = {}
    for rerun in reruns:
        if rerun.decision is not None:
            by_event.setdefault(rerun.event_id, []).append(rerun.decision)
    for event_id, decisions in by_event.items():
        found.add_runs(event_id, decisions)
    return {
        "pipeline": pipeline,
        "runs": runs,
        **found.summary(),
        "tokens": {
            "input": sum(r.input_tokens for r in reruns),
            "output": sum(r.output_tokens for r in reruns),
        },
        "cost_usd": round(sum(r.cost_usd for r in reruns), 6),
        "latency_ms": _median([r.latency_ms for r in reruns if r.decision is not None]),
        "errors": [{"event_id": r.event_id, "error": r.error} for r in reruns if r.error],
    }


async def evaluate(
    settings: Settings, config: GatewayConfig, *, cases: list[Case], runs: int, min_pass: float
) -> dict[str, Any]:
    """Each case decided ``runs`` times; a run passes when every expectation holds."""
    async with rerunner(settings, config, purpose=CallPurpose.EVAL) as (runner, sessions):
        work: list[tuple[Event, str]] = []
        keys: list[str] = []
        async with sessions() as session:
            for case in cases:
                event = await _case_event(
                    session, case, config, redact=settings.payload_redaction == "on"
                )
                pipeline = case.pipeline or event.pipeline
                if pipeline not in config.pipelines:  # a stored event's, since removed
                    raise RerunRefused(
                        f"case {case.name!r}: no pipeline {pipeline!r} in the config "
                        "(give the case or the run a --pipeline)"
                    )
                work += [(event, pipeline)] * runs
                keys.append(event.group_key)
        reruns = await _decide_all(runner, work, limit=settings.llm_max_concurrency)
    found = Agreement(_schemas(config))
    reports: list[dict[str, Any]] = []
    rates: list[float] = []
    for index, case in enumerate(cases):
        mine = reruns[index * runs : (index + 1) * runs]
        missed: list[str] = []
        passed = 0
        for rerun in mine:
            if rerun.decision is None:
                missed.append(f"no decision: {rerun.error}")
                continue
            wrong = failures(case, rerun.decision, config=config, group_key=keys[index])
            passed += not wrong
            missed += wrong
        found.add_runs(case.name, [r.decision for r in mine if r.decision is not None])
        rates.append(passed / runs)
        reports.append(
            {
                "name": case.name,
                "pipeline": mine[0].pipeline,
                "runs": runs,
                "passed": passed,
                "pass_rate": rates[-1],
                "failures": sorted(set(missed))[:10],
            }
        )
    return {
        **found.summary(),
        "events": len(cases),
        "runs": runs,
        "cases": reports,
        "pass_rate": sum(rates) / len(rates),
        "min_pass": min_pass,
        "passed": all(rate >= min_pass for rate in rates),
        "tokens": {
            "input": sum(r.input_tokens for r in reruns),
            "output": sum(r.output_tokens for r in reruns),
        },
        "cost_usd": round(sum(r.cost_usd for r in reruns), 6),
        "errors": [{"event_id": r.event_id, "error": r.error} for r in reruns if r.error],
    }


async def _case_event(
    session: AsyncSession, case: Case, config: GatewayConfig, *, redact: bool
) -> Event:
    """A stored event as it was stored, or a case's payload as ingest would have made it
    (redacted unless ``EVENTGATE_PAYLOAD_REDACTION=off``): the file may hold real secrets."""
    if case.event_id is not None:
        row = await session.get(EventRow, case.event_id)
        if row is None:
            raise RerunRefused(f"case {case.name!r}: no stored event {case.event_id!r}")
        return event_of(row, config)
    assert case.source is not None  # the file's schema requires one with a payload
    source = config.sources[case.source]
    return make_event(
        id=case.synthetic_id,
        source=case.source,
        config=source,
        type=case.type,
        group_key=case.group_key,
        delivery_id=case.synthetic_id,
        pipeline=case.pipeline or source.pipeline,
        received_at=datetime.now(UTC),
        payload=redact_to_json(case.payload)[0] if redact else case.payload,
    )

"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from app.deps import StateDep
from app.state import AppState

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


async def _check(coro: Any) -> str:
    try:
        await asyncio.wait_for(coro, 2.0)
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready", with its name
        return f"error: {type(exc).__name__}"


async def readiness(state: AppState) -> dict[str, str]:
    checks = {
        "redis": await _check(state.redis.ping()),
        "database": await _check(_ping_db(state)),
        "backlog": state.backlog.overloaded or "ok",
        "tasks": _tasks(state),
        "llm": state.llm_health.describe()
        if state.claude is not None or state.bedrock is not None
        else "not configured: set ANTHROPIC_API_KEY (events are accepted and stay queued)",
    }
    topics = sorted({t.topic_arn for t in state.config.tools.values() if t.topic_arn})
    if state.publisher is not None and topics:
        results = [await _check(state.publisher.check(arn)) for arn in topics]
        bad = [f"{arn}: {r}" for arn, r in zip(topics, results, strict=True) if r != "ok"]
        checks["sns"] = "ok" if not bad else "; ".join(bad)
    else:
        checks["sns"] = "no topics configured: tool calls stay in the outbox"
    return checks


def _tasks(state: AppState) -> str:
    down = state.supervisor.down()
    if not down:
        return "ok"
    return "down: " + "; ".join(f"{name} ({why})" for name, why in sorted(down.items()))


async def _ping_db(state: AppState) -> None:
    async with state.engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


@router.get("/readyz")
async def readyz(state: StateDep) -> JSONResponse:
    """Ready when Redis and the database answer, every background loop runs and Claude is
    configured."""
    checks = await readiness(state)
    required = ["redis", "database", "tasks"]
    if state.role != "api":
        required.append("llm")
    ready = all(checks[name] == "ok" for name in required)
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", response_class=Response)
async def metrics(state: StateDep) -> Response:
    """Prometheus text format."""
    # A scrape must not fail because Redis is slow: the gauges keep their last values.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(state.backlog.refresh(), 2.0)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

"""``GET /v1/shadow``: how a shadow candidate's decisions of live events compare with the live
ones, over a time window (its newest ``MAX_ROWS`` decisions at most)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.admin.pagination import as_utc
from app.evaluate.agreement import Agreement, Decision
from app.store.models import ShadowDecisionRow

MAX_ROWS = 10_000


async def shadow_rows(
    session: AsyncSession, candidate: str, *, since: datetime | None, until: datetime | None
) -> Sequence[ShadowDecisionRow]:
    query = (
        select(ShadowDecisionRow)
        .where(ShadowDecisionRow.candidate == candidate)
        .order_by(ShadowDecisionRow.created_at.desc(), ShadowDecisionRow.id.desc())
        .limit(MAX_ROWS)
    )
    if since is not None:
        query = query.where(ShadowDecisionRow.created_at >= since)
    if until is not None:
        query = query.where(ShadowDecisionRow.created_at < until)
    return (await session.scalars(query)).all()


def decision(calls: Sequence[Mapping[str, Any]]) -> Decision:
    return Decision(tuple((str(c["tool"]), dict(c.get("input") or {})) for c in calls))


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 1), "p95": round(p95, 1)}


def shadow_report(
    candidate: str,
    rows: Sequence[ShadowDecisionRow],
    schemas: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    found = Agreement(schemas)
    for row in reversed(rows):  # oldest first, as the disagreements are listed
        if row.candidate_calls is not None:
            found.add(row.event_id, decision(row.baseline_calls), decision(row.candidate_calls))
    decided = [row for row in rows if row.candidate_calls is not None]
    return {
        "candidate": candidate,
        "baseline": ", ".join(sorted({row.baseline for row in rows})) or None,
        **found.summary(),
        "errors": len(rows) - len(decided),
        "cost_usd": {
            "baseline": round(sum(row.baseline_cost_usd for row in rows), 6),
            "candidate": round(sum(row.candidate_cost_usd for row in rows), 6),
        },
        "latency_ms": {
            "baseline": _spread([row.baseline_latency_ms for row in rows]),
            "candidate": _spread([row.candidate_latency_ms for row in decided]),
        },
    }


def event_shadows(rows: Sequence[ShadowDecisionRow]) -> list[dict[str, Any]]:
    """An event's candidates' decisions, for ``GET /v1/events/{id}``."""
    return [
        {
            "candidate": row.candidate,
            "agreement": row.agreement,
            "decision": row.candidate_calls,
            "cost_usd": row.candidate_cost_usd,
            "latency_ms": row.candidate_latency_ms,
            "error": row.error,
            "at": as_utc(row.created_at),
        }
        for row in rows
    ]

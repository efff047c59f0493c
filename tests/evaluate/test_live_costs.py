"""The live side's cost and latency of a replay, over as many events as ``--limit`` allows."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.reruns import _live_costs
from app.store.models import LlmCallRow


async def test_live_costs_of_more_events_than_one_statement_may_bind(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    # PostgreSQL (asyncpg) and SQLite refuse a statement of more than 32,767 parameters: a
    # replay of 40,000 events crashed after paying for every call, its figures lost.
    ids = [f"evt_{n}" for n in range(40_000)]
    async with sessions() as session:
        for n in (0, 39_999):
            session.add(
                LlmCallRow(
                    id=f"llm_{n}",
                    event_id=ids[n],
                    pipeline="triage",
                    model="claude-sonnet-4-6",
                    attempt=1,
                    status="ok",
                    latency_ms=100.0 + n,
                    tool_calls=[],
                    cost_usd=0.5,
                )
            )
        await session.commit()
        cost, latencies = await _live_costs(session, ids)
    assert cost == 1.0 and sorted(latencies) == [100.0, 40_099.0]

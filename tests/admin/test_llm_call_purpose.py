"""The audit log tells live calls from those that publish nothing (shadow, replay, ...)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.models import EventRow, LlmCallRow
from tests.admin.conftest import GatewayFactory

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


async def test_calls_say_their_purpose_and_filter_by_it(
    gateway_factory: GatewayFactory,
    sessions: async_sessionmaker[AsyncSession],
    auth: dict[str, str],
) -> None:
    async with sessions() as session:
        session.add(
            EventRow(
                id="evt_1",
                source="github",
                type="push",
                group_key="acme/api",
                delivery_id="d1",
                pipeline="triage",
                status="published",
                payload={},
                received_at=T0,
            )
        )
        for n, purpose in enumerate(["live", "shadow", "replay", "shadow"]):
            session.add(
                LlmCallRow(
                    id=f"llm_{n}",
                    event_id="evt_1",
                    pipeline="triage" if purpose == "live" else "triage-v2",
                    model="claude-sonnet-4-6",
                    attempt=1,
                    status="ok",
                    latency_ms=10.0,
                    tool_calls=[],
                    purpose=purpose,
                    created_at=T0 + timedelta(seconds=n),
                )
            )
        await session.commit()
    with gateway_factory() as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth) as client:
            every = (await client.get("/v1/llm-calls")).json()["items"]
            shadow = (await client.get("/v1/llm-calls", params={"shadow": "true"})).json()
            not_shadow = (await client.get("/v1/llm-calls", params={"shadow": "false"})).json()
            live = (await client.get("/v1/llm-calls", params={"purpose": "live"})).json()
            event = (await client.get("/v1/events/evt_1")).json()
    assert [(c["id"], c["purpose"], c["shadow"]) for c in every] == [
        ("llm_3", "shadow", True),
        ("llm_2", "replay", False),
        ("llm_1", "shadow", True),
        ("llm_0", "live", False),
    ]
    assert [c["id"] for c in shadow["items"]] == ["llm_3", "llm_1"]
    assert [c["id"] for c in not_shadow["items"]] == ["llm_2", "llm_0"]
    assert [c["id"] for c in live["items"]] == ["llm_0"] and live["total"] == 1
    details = [e["detail"] for e in event["timeline"] if e["stage"] == "llm_call"]
    assert details[0] == "claude-sonnet-4-6 attempt 1: ok"
    assert details[1] == "claude-sonnet-4-6 attempt 1 (shadow, triage-v2): ok"

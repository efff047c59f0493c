"""Shapes, filters, totals and keyset pages of every admin endpoint, over seeded rows."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.queue.connection import connect_redis
from app.queue.streams import EventQueue, NewEntry
from app.store.models import DeadLetterRow, EventRow, LlmCallRow, OutboxRow
from tests.admin.conftest import GatewayFactory

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
# evt_001 ... evt_010; evt_007 was dead-lettered once and has moved on since.
STATUSES = [
    "published",
    "dead_lettered",
    "no_action",
    "published",
    "processing",
    "published",
    "no_action",
    "queued",
    "published",
    "published",
]


def _event(n: int, *, status: str, source: str = "github") -> EventRow:
    return EventRow(
        id=f"evt_{n:03d}",
        source=source,
        type="issues.opened",
        group_key=f"acme/repo{n % 3}",
        delivery_id=f"d{n}",
        pipeline="triage",
        status=status,
        payload={"n": n},
        received_at=T0 + timedelta(seconds=n),
        updated_at=T0 + timedelta(seconds=n, milliseconds=500),
        deliveries=1,
    )


def _call(n: int, event_id: str, *, model: str, status: str = "ok") -> LlmCallRow:
    return LlmCallRow(
        id=f"llm_{n:03d}",
        event_id=event_id,
        pipeline="triage",
        model=model,
        attempt=1,
        status=status,
        request_id=f"req_{n}",
        latency_ms=100.0 + n,
        input_tokens=1000 + n,
        output_tokens=40,
        tool_calls=[],
        error_type="RateLimitError" if status == "retry" else None,
        created_at=T0 + timedelta(seconds=n, milliseconds=100),
    )


async def _seed(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as session:
        for n, status in enumerate(STATUSES, start=1):
            session.add(_event(n, status=status, source="github" if n < 9 else "alerts"))
        await session.flush()
        for n in range(1, 11):
            model = "claude-sonnet-4-6" if n % 2 else "claude-haiku-4-5"
            session.add(_call(n, f"evt_{n:03d}", model=model))
        session.add(_call(11, "evt_001", model="claude-sonnet-4-6", status="retry"))
        session.add(
            OutboxRow(
                event_id="evt_001",
                source="github",
                seq=0,
                llm_call_id="llm_001",
                tool="publishAlert",
                topic_arn="arn:aws:sns:us-east-1:123456789012:alerts.fifo",
                group_id="acme/repo1",
                dedup_id="dedup-1",
                body=orjson.dumps({"tool": "publishAlert", "input": {"severity": "high"}}).decode(),
                status="published",
                attempts=1,
                sns_message_id="msg-1",
                created_at=T0 + timedelta(seconds=1, milliseconds=200),
                published_at=T0 + timedelta(seconds=1, milliseconds=300),
            )
        )
        for n in (2, 7):
            session.add(
                DeadLetterRow(
                    event_id=f"evt_{n:03d}",
                    stage="llm",
                    reason="AuthenticationError: bad key",
                    created_at=T0 + timedelta(seconds=n, milliseconds=400),
                )
            )
        await session.commit()


async def test_event_detail_has_timeline_calls_tool_calls_and_dead_letter(
    gateway_factory: GatewayFactory,
    sessions: async_sessionmaker[AsyncSession],
    auth: dict[str, str],
) -> None:
    await _seed(sessions)
    with gateway_factory() as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth) as client:
            published = (await client.get("/v1/events/evt_001")).json()
            dead = (await client.get("/v1/events/evt_002")).json()
            missing = await client.get("/v1/events/evt_nope")

    assert {k: published[k] for k in ("event_id", "source", "type", "group_key", "status")} == {
        "event_id": "evt_001",
        "source": "github",
        "type": "issues.opened",
        "group_key": "acme/repo1",
        "status": "published",
    }
    assert published["received_at"] == "2026-11-29T12:00:01Z"
    assert published["generation"] == 0
    assert [e["stage"] for e in published["timeline"]] == [
        "received",
        "llm_call",
        "tool_call_stored",
        "published",
        "llm_call",  # llm_011 was written later (time order, not insertion order)
    ]
    assert published["dead_letter"] is None
    # Audit rows come out column by column: every column of the table is there.
    assert {c["id"] for c in published["llm_calls"]} == {"llm_001", "llm_011"}
    ok = next(c for c in published["llm_calls"] if c["id"] == "llm_001")
    assert set(LlmCallRow.__table__.columns.keys()) <= set(ok)
    assert ok["input_tokens"] == 1001
    assert ok["latency_ms"] == 101.0
    [tool] = published["tool_calls"]
    assert tool["message"] == {"tool": "publishAlert", "input": {"severity": "high"}}
    assert tool["sns_message_id"] == "msg-1"
    assert tool["generation"] == 0
    assert "body" not in tool

    assert dead["status"] == "dead_lettered"
    assert dead["dead_letter"]["reason"] == "AuthenticationError: bad key"
    assert dead["dead_letter"]["replayed_at"] is None
    assert dead["timeline"][-1]["stage"] == "dead_lettered"

    assert missing.status_code == 404
    assert missing.json()["error"] == "EventNotFound"


async def test_an_event_still_on_the_stream_is_reported_queued(
    gateway_factory: GatewayFactory, redis_url: str, redis_prefix: str, auth: dict[str, str]
) -> None:
    with gateway_factory() as server:
        if redis_url == "memory://":  # the in-process Redis cannot be reached from here
            return
        redis = connect_redis(redis_url)
        queue = EventQueue(redis, prefix=redis_prefix, partitions=4)
        await queue.enqueue(
            NewEntry(
                event_id="evt_waiting",
                source="github",
                delivery_id="d-waiting",
                group_key="acme/api",
                data=b"{}",
                dedup_window_ms=60_000,
            )
        )
        await redis.aclose()
        async with httpx.AsyncClient(base_url=server.url, headers=auth) as client:
            body = (await client.get("/v1/events/evt_waiting")).json()
    assert body["status"] == "queued"
    assert body["event_id"] == "evt_waiting"
    assert body["llm_calls"] == body["tool_calls"] == []
    assert body["timeline"][0]["stage"] == "queued"


async def _all_pages(client: httpx.AsyncClient, path: str, **params: Any) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        reply = await client.get(path, params=query)
        assert reply.status_code == 200, reply.text
        pages.append(reply.json())
        cursor = reply.json()["next_cursor"]
        if cursor is None:
            return pages


async def test_listings_filter_count_and_page_without_gaps(
    gateway_factory: GatewayFactory,
    sessions: async_sessionmaker[AsyncSession],
    auth: dict[str, str],
) -> None:
    await _seed(sessions)
    with gateway_factory() as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth) as client:
            events = await _all_pages(client, "/v1/events", limit=3)
            published = await _all_pages(client, "/v1/events", status="published")
            alerts = await _all_pages(
                client, "/v1/events", source="alerts", since="2026-11-29T12:00:09"
            )
            calls = await _all_pages(client, "/v1/llm-calls", limit=4)
            haiku = await _all_pages(client, "/v1/llm-calls", model="claude-haiku-4-5", limit=2)
            retry = await _all_pages(client, "/v1/llm-calls", status="retry", event_id="evt_001")
            window = await _all_pages(
                client,
                "/v1/llm-calls",
                since="2026-11-29T12:00:03Z",
                until="2026-11-29T12:00:05Z",
            )
            dead = await _all_pages(client, "/v1/dead-letters", limit=1)
            unreplayed = await _all_pages(client, "/v1/dead-letters", replayed="false")
            bad_cursor = await client.get("/v1/events", params={"cursor": "not-a-cursor"})
            bad_status = await client.get("/v1/events", params={"status": "lost"})
            bad_limit = await client.get("/v1/llm-calls", params={"limit": 0})

    ids = [item["event_id"] for page in events for item in page["items"]]
    assert ids == [f"evt_{n:03d}" for n in range(10, 0, -1)]  # newest first, no gaps
    assert [len(p["items"]) for p in events] == [3, 3, 3, 1]
    assert {p["total"] for p in events} == {10}
    assert [i["event_id"] for i in published[0]["items"]] == [
        "evt_010",
        "evt_009",
        "evt_006",
        "evt_004",
        "evt_001",
    ]
    assert published[0]["total"] == 5
    assert [i["event_id"] for i in alerts[0]["items"]] == ["evt_010", "evt_009"]

    call_ids = [i["id"] for p in calls for i in p["items"]]
    assert len(call_ids) == len(set(call_ids)) == 11
    assert calls[0]["total"] == 11
    assert {i["model"] for p in haiku for i in p["items"]} == {"claude-haiku-4-5"}
    assert haiku[0]["total"] == 5
    assert [i["id"] for i in retry[0]["items"]] == ["llm_011"]
    assert retry[0]["items"][0]["error_type"] == "RateLimitError"
    assert [i["id"] for i in window[0]["items"]] == ["llm_004", "llm_003"]

    assert [i["event_id"] for p in dead for i in p["items"]] == ["evt_007", "evt_002"]
    assert dead[0]["total"] == 2
    assert set(dead[0]["items"][0]) == {
        "id",
        "event_id",
        "stage",
        "reason",
        "created_at",
        "replayed_at",
    }
    assert unreplayed[0]["total"] == 2

    assert bad_cursor.status_code == 400
    assert bad_cursor.json()["error"] == "InvalidCursor"
    assert bad_status.status_code == 422
    assert bad_limit.status_code == 422


async def test_replay_refuses_unknown_and_not_dead_lettered(
    gateway_factory: GatewayFactory,
    sessions: async_sessionmaker[AsyncSession],
    auth: dict[str, str],
) -> None:
    await _seed(sessions)
    async with sessions() as session:  # evt_007's dead letter, but the event moved on
        row = await session.get(EventRow, "evt_007")
        assert row is not None
        assert row.status == "no_action"
    with gateway_factory() as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth) as client:
            unknown = await client.post("/v1/dead-letters/999/replay")
            dead = (await client.get("/v1/dead-letters", params={"event_id": "evt_007"})).json()
            moved_on = await client.post(f"/v1/dead-letters/{dead['items'][0]['id']}/replay")
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "DeadLetterNotFound"
    assert moved_on.status_code == 409
    assert moved_on.json()["error"] == "ReplayConflict"
    assert "no_action" in moved_on.json()["detail"]


def _cursor(value: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode().rstrip("=")


@pytest.mark.parametrize(
    "path",
    [
        # Times that leave datetime's range once moved to UTC.
        "/v1/events?cursor=" + _cursor(["9999-12-31T23:59:59-14:00", "evt_x"]),
        "/v1/llm-calls?cursor=" + _cursor(["0001-01-01T00:00:00+14:00", "llm_x"]),
        "/v1/events?since=9999-12-31T23:59:59-14:00",
        "/v1/llm-calls?until=0001-01-01T00:00:00%2B14:00",
        # Years past 9999, and epoch seconds past it or before year 1.
        "/v1/events?since=99999-01-01T00:00:00Z",
        "/v1/llm-calls?since=%2B099999-01-01",
        "/v1/llm-calls?until=100000000000000000000",
        "/v1/events?since=-100000000000000000000",
        "/v1/llm-calls?until=1e308",
        # NUL, which PostgreSQL refuses in text.
        "/v1/events?cursor=" + _cursor(["2026-01-01T00:00:00+00:00", "evt_\u0000"]),
        "/v1/events?source=a%00b",
        "/v1/llm-calls?event_id=evt_%00",
        "/v1/dead-letters?stage=%00",
        "/v1/events/evt_%00",
    ],
)
def test_bad_input_is_a_4xx_not_a_500(
    gateway_factory: GatewayFactory, auth: dict[str, str], path: str
) -> None:
    with gateway_factory() as server:
        reply = httpx.get(server.url + path, headers=auth)
    assert reply.status_code in (400, 422), f"{reply.status_code} {reply.text}"
    assert reply.json()["error"] in ("InvalidCursor", "ValidationError")

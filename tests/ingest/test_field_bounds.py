"""Every stored field is bounded at ingest, whatever the source type.

Over HTTP into the real app (role "api"), then each queued event is inserted into the real
PostgreSQL exactly as the worker does (``start_delivery`` with ``EVENT_FIELDS``): an event the
gateway answered 202 must be storable. Types that cannot be stored are refused with 400;
over-long or control-character keys are replaced by a readable, deterministic stand-in.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import hypothesis
import orjson
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from app.config import parse_config
from app.events import Event
from app.ingest.bounds import (
    MAX_DELIVERY_ID_CHARS,
    MAX_GROUP_KEY_CHARS,
    MAX_TYPE_CHARS,
    bounded_key,
)
from app.main import create_app
from app.queue.streams import unpack_entry
from app.settings import Settings
from app.store.db import create_engine
from app.store.models import EventRow
from app.store.repository import EVENT_FIELDS, start_delivery
from tests.conftest import HAVE_POSTGRES
from tests.support import ServerThread, github_request

GITHUB_SECRET = "field-bounds-github-secret"
TOKEN = "field-bounds-token-0123456789"
CONFIG = f"""
sources:
  github: {{type: github, secret: {GITHUB_SECRET}, pipeline: p}}
  hook:
    type: token
    token: {TOKEN}
    event_type: kind
    delivery_id: id
    group_key: device
    pipeline: p
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""
PARTITIONS = 4


@pytest.fixture
def gateway(
    make_settings: Callable[..., Settings], redis_url: str
) -> Iterator[tuple[httpx.Client, Settings]]:
    if not HAVE_POSTGRES or redis_url.startswith("memory://"):
        pytest.skip("needs the real PostgreSQL and a real Redis (reads the stream from outside)")
    settings = make_settings(partitions=PARTITIONS)
    app = create_app(settings, parse_config(CONFIG, env={}), role="api")
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        yield client, settings


def _hook(client: httpx.Client, reading: dict[str, Any]) -> httpx.Response:
    return client.post(
        "/v1/webhooks/hook",
        content=orjson.dumps(reading),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )


def _queued(settings: Settings) -> dict[str, Event]:
    client = redis.Redis.from_url(settings.redis_url)
    events: dict[str, Event] = {}
    try:
        for partition in range(PARTITIONS):
            key = f"{settings.redis_prefix}:{{p{partition}}}:stream"
            entries: list[Any] = client.xrange(key)  # type: ignore[assignment]
            for _, fields in entries:
                event = Event.from_bytes(unpack_entry(fields[b"e"]))
                events[event.id] = event
    finally:
        client.close()
    return events


async def _store(database_url: str, events: list[Event]) -> None:
    """What the worker does first with every event it reads."""
    engine = create_engine(database_url)
    try:
        autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        for event in events:
            async with autocommit.connect() as connection:
                fields = {name: getattr(event, name) for name in EVENT_FIELDS}
                await start_delivery(connection, fields=fields)
    finally:
        await engine.dispose()


def test_long_and_control_character_keys_are_stored_and_types_refused(
    gateway: tuple[httpx.Client, Settings], database_url: str
) -> None:
    client, settings = gateway
    long_id = "d" * 300
    readings = {
        "long delivery id": {"kind": "reading", "id": long_id, "device": "dev-1"},
        "NUL in delivery id": {"kind": "reading", "id": "a\u0000b", "device": "dev-1"},
        "long group key": {"kind": "reading", "id": "k1", "device": "g" * 600},
        "NUL in group key": {"kind": "reading", "id": "k2", "device": "x\u0000y\n"},
        "NUL inside the payload": {"kind": "reading", "id": "k3", "device": "d", "v": "a\u0000"},
    }
    accepted: dict[str, str] = {}
    for name, reading in readings.items():
        reply = _hook(client, reading)
        assert reply.status_code == 202, (name, reply.text)
        accepted[name] = reply.json()["event_id"]
    body, headers = github_request(
        GITHUB_SECRET,
        {"action": "opened", "repository": {"full_name": "acme/" + "r" * 700}},
        delivery="g" * 250,
    )
    reply = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 202, reply.text
    accepted["github"] = reply.json()["event_id"]

    for name, reading in {
        "long type": {"kind": "t" * 201, "id": "k4", "device": "d"},
        "NUL in type": {"kind": "alarm\u0000", "id": "k5", "device": "d"},
        "newline in type": {"kind": "alarm\nforged: line", "id": "k6", "device": "d"},
    }.items():
        reply = _hook(client, reading)
        assert (reply.status_code, reply.json()["error"]) == (400, "InvalidPayload"), name
        assert "type" in reply.json()["detail"]

    queued = _queued(settings)
    assert set(queued) == set(accepted.values())
    asyncio.run(_store(database_url, list(queued.values())))  # raised before the fix

    by_name = {name: queued[event_id] for name, event_id in accepted.items()}
    stand_in = by_name["long delivery id"].delivery_id
    digest = hashlib.sha256(long_id.encode()).hexdigest()
    assert stand_in.startswith("ddd") and stand_in.endswith(f"#sha256:{digest}")
    assert len(stand_in) <= 200
    assert "\x00" not in by_name["NUL in delivery id"].delivery_id
    assert len(by_name["long group key"].group_key) <= 512
    assert by_name["long group key"].group_key.startswith("ggg")
    assert not any(c in by_name["NUL in group key"].group_key for c in "\x00\n")
    assert len(by_name["github"].group_key) <= 512
    assert len(by_name["github"].delivery_id) <= 200
    assert by_name["NUL inside the payload"].payload["v"] == "a\u0000"  # kept as sent


def test_bounded_keys_still_deduplicate_and_stay_distinct(
    gateway: tuple[httpx.Client, Settings],
) -> None:
    client, _ = gateway
    shared = "s" * 250
    first = _hook(client, {"kind": "reading", "id": shared + "-1", "device": "dev"})
    again = _hook(client, {"kind": "reading", "id": shared + "-1", "device": "dev"})
    other = _hook(client, {"kind": "reading", "id": shared + "-2", "device": "dev"})
    assert first.status_code == 202
    assert (again.status_code, again.json()) == (
        200,
        {"event_id": first.json()["event_id"], "status": "duplicate"},
    )
    # Same first 200 characters, different ids: two events, not one.
    assert other.status_code == 202
    assert other.json()["event_id"] != first.json()["event_id"]


def test_the_bounds_are_the_columns_lengths() -> None:
    lengths = {column.name: getattr(column.type, "length", None) for column in EventRow.__table__.c}
    assert lengths["type"] == MAX_TYPE_CHARS
    assert lengths["delivery_id"] == MAX_DELIVERY_ID_CHARS
    assert lengths["group_key"] == MAX_GROUP_KEY_CHARS


@hypothesis.settings(max_examples=300)
@given(
    value=st.text(max_size=700) | st.text(st.characters(max_codepoint=0x9F), max_size=40),
    limit=st.sampled_from([MAX_DELIVERY_ID_CHARS, MAX_GROUP_KEY_CHARS]),
)
def test_a_bounded_key_fits_is_printable_and_deterministic(value: str, limit: int) -> None:
    bounded = bounded_key(value, limit)
    assert len(bounded) <= limit
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in bounded)
    assert bounded == bounded_key(value, limit)
    if len(value) <= limit and bounded == value:
        return
    assert bounded.endswith("#sha256:" + hashlib.sha256(value.encode()).hexdigest())
    assert bounded_key(value + "x", limit) != bounded

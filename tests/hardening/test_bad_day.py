"""A gateway on a bad day, in-process over HTTP: every background loop that dies is seen by
``/readyz`` and restarted, and a poison event ends dead-lettered without holding up others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis import Redis

from app.config import parse_config
from app.events import Event
from app.main import create_app
from app.queue.connection import connect_redis
from app.queue.streams import EventQueue
from app.settings import Settings
from app.state import Running, Shared
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.conftest import HAVE_POSTGRES
from tests.support import ServerThread, SnsFixture, gateway_config, github_request, issue_payload

SECRET = "bad-day-github-secret-0001"
ADMIN = "bad-day-admin-token-0001"


@pytest.fixture
def gateway(
    make_settings: Callable[..., Settings], fake_claude: FakeAnthropicServer, sns: SnsFixture
) -> Iterator[tuple[ServerThread, FastAPI]]:
    settings = make_settings(
        admin_token=ADMIN,
        llm_max_concurrency=1,
        max_deliveries=3,
        task_restart_seconds=1.0,
        lease_ttl_ms=2000,
    )
    app = create_app(settings, parse_config(gateway_config(sns.topic_arn, secret=SECRET)))
    with ServerThread(app) as server:
        yield server, app


def _state(app: FastAPI) -> Running:
    running: Running = app.state.running
    return running


def _wait(condition: Callable[[], Any], timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def _send(url: str, repo: str, number: int) -> str:
    body, headers = github_request(SECRET, issue_payload(repo, number))
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers, timeout=10)
    assert reply.status_code == 202, reply.text
    event_id: str = reply.json()["event_id"]
    return event_id


def _event(url: str, event_id: str) -> dict[str, Any]:
    reply = httpx.get(
        f"{url}/v1/events/{event_id}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def test_every_loop_killed_is_reported_by_readyz_and_restarted(
    gateway: tuple[ServerThread, FastAPI],
) -> None:
    server, app = gateway
    supervisor = _state(app).shared.supervisor
    _wait(lambda: httpx.get(f"{server.url}/readyz").status_code == 200)
    names = sorted(supervisor.loops)
    assert {"backlog", "lease-keeper", "read-loop", "relay", "retention", "dispatch-0"} <= set(
        names
    )
    for name in names:
        handle = supervisor.loops[name]
        task = handle.current
        assert task is not None
        task.get_loop().call_soon_threadsafe(task.cancel)  # it dies: not a stop
        down = _wait(lambda: (r := httpx.get(f"{server.url}/readyz")).status_code == 503 and r)
        assert name in down.json()["checks"]["tasks"], down.json()
        _wait(lambda: httpx.get(f"{server.url}/readyz").status_code == 200)
        assert handle.restarts >= 1
    # Everything restarted works: a webhook goes all the way to a decision.
    event_id = _send(server.url, "acme/api", 1)
    _wait(lambda: _event(server.url, event_id)["status"] in ("processing", "published"))


@pytest.mark.skipif(not HAVE_POSTGRES, reason="PostgreSQL enforces the column lengths")
@pytest.mark.parametrize(
    "poison",
    [
        {"type": "t" * 300},  # over the column's 200 characters
        {"group_key": "acme/\x00nul"},  # PostgreSQL text refuses NUL
    ],
)
def test_a_poison_entry_is_dead_lettered_and_other_keys_go_on(
    gateway: tuple[ServerThread, FastAPI], redis_url: str, poison: dict[str, str]
) -> None:
    """The entry was queued before ingest bounded its fields (an older version wrote it)."""
    server, app = gateway
    state = _state(app).shared
    event = Event(
        id="evt_poison0000000000000000000000000",
        source="github",
        type="issues.opened",
        group_key="acme/poison",
        delivery_id="poison-1",
        pipeline="triage",
        received_at=datetime.now(UTC),
        payload={"issue": {"number": 1}},
    ).model_copy(update=poison)
    queue = EventQueue(state.redis, prefix=state.settings.redis_prefix, partitions=16)
    client = Redis.from_url(redis_url)
    try:
        client.xadd(queue.stream_key(queue.partition_of(event.group_key)), {"e": event.to_bytes()})
    finally:
        client.close()
    healthy = _send(server.url, "acme/api", 1)
    _wait(lambda: _event(server.url, healthy)["status"] in ("processing", "published"))
    poisoned = _wait(
        lambda: (e := _event_or_none(server.url, event.id)) and e["status"] == "dead_lettered" and e
    )
    assert poisoned["dead_letter"]["stage"] == "worker"
    assert poisoned["dead_letter"]["reason"].startswith("processing failed 3 times")
    assert asyncio.run(_backlog(state)) == 0  # acked: it will not come back


def _event_or_none(url: str, event_id: str) -> dict[str, Any] | None:
    reply = httpx.get(
        f"{url}/v1/events/{event_id}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    if reply.status_code != 200 or reply.json()["status"] == "queued":
        return None
    body: dict[str, Any] = reply.json()
    return body


async def _backlog(state: Shared) -> int:
    redis = connect_redis(state.settings.redis_url)
    try:
        queue = EventQueue(redis, prefix=state.settings.redis_prefix, partitions=16)
        return (await queue.backlog())[0]
    finally:
        await redis.aclose()

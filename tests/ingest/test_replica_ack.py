"""``EVENTGATE_REDIS_ACK_REPLICAS``: a 2xx only once a replica holds the event, 503
``QueueNotReplicated`` (the event still queued once) when it cannot acknowledge, a retry
answered only once it can, ``/readyz`` without the replica, and ``EVENTGATE_REDIS_ACK_AOF``
refused on a server without WAITAOF. A private primary and replica (``redis-server``), never
the shared Redis."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis

from app.config import parse_config
from app.main import create_app
from app.queue.acks import AckUnsupported
from app.settings import Settings
from tests.hardening.faults import ReplicatedRedis
from tests.support import ServerThread, github_request, issue_payload

SECRET = "replica-ack-secret"
CONFIG = f"""
sources:
  github: {{type: github, secret: {SECRET}, pipeline: triage}}
pipelines:
  triage: {{model: claude-sonnet-4-5, system: Triage., tools: [publishAlert]}}
tools:
  publishAlert:
    description: Raise an alert.
    input_schema: {{type: object, properties: {{title: {{type: string}}}}}}
"""
PREFIX = "acktest"
TIMEOUT_MS = 1000  # the replica acknowledges well within it, even on a loaded machine


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ReplicatedRedis]:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing (needed for the replica tests)")
        pytest.skip("redis-server is missing")
    servers = ReplicatedRedis(tmp_path).start()
    try:
        yield servers
    finally:
        servers.close()


def _settings(pair: ReplicatedRedis, database_url: str, **extra: object) -> Settings:
    return Settings(
        redis_url=pair.url,
        redis_prefix=PREFIX,
        database_url=database_url,
        redis_ack_timeout_ms=TIMEOUT_MS,
        **extra,  # type: ignore[arg-type]
    )


def _gateway(pair: ReplicatedRedis, database_url: str) -> Iterator[ServerThread]:
    settings = _settings(pair, database_url, redis_ack_replicas=1)
    with ServerThread(create_app(settings, parse_config(CONFIG), role="api")) as server:
        yield server


@pytest.fixture
def gateway(pair: ReplicatedRedis, database_url: str) -> Iterator[ServerThread]:
    yield from _gateway(pair, database_url)


@pytest.fixture
def other_gateway(pair: ReplicatedRedis, database_url: str) -> Iterator[ServerThread]:
    """A second process behind the same balancer: its connections never wrote the event."""
    yield from _gateway(pair, database_url)


def _queued(port: int) -> list[bytes]:
    """The events on the streams of the Redis at ``port`` (primary or replica)."""
    with Redis(port=port) as client:
        return [
            entry_id
            for key in client.scan_iter(match=f"{PREFIX}:*:stream")
            for entry_id, _ in client.xrange(key)
        ]


def _waits(pair: ReplicatedRedis) -> int:
    with Redis(port=pair.primary_port) as client:
        stats = client.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def test_a_webhook_is_answered_202_once_the_replica_holds_it(
    pair: ReplicatedRedis, gateway: ServerThread
) -> None:
    body, headers = github_request(SECRET, issue_payload("acme/api", 1))
    waits = _waits(pair)

    reply = httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=headers)

    assert reply.status_code == 202, reply.text
    # The answer came after a WAIT on the primary (two on a new server: the script is loaded
    # after a NOSCRIPT and the round trip sent again, each with its WAIT).
    assert _waits(pair) > waits
    assert len(_queued(pair.replica_port)) == 1  # and the replica has it, at once


def test_a_replica_that_cannot_acknowledge_gets_503_and_the_retry_is_answered_once_it_can(
    pair: ReplicatedRedis, gateway: ServerThread, other_gateway: ServerThread
) -> None:
    request = github_request(SECRET, issue_payload("acme/api", 2))
    url = f"{gateway.url}/v1/webhooks/github"
    retry_url = f"{other_gateway.url}/v1/webhooks/github"
    # The replica has acknowledged whatever the processes wrote while starting, so a WAIT
    # of the other process's connections would answer at once if nothing made it wait.
    pair.wait_in_sync()
    pair.freeze_replica()  # connected, but acknowledges nothing

    started = time.monotonic()
    refused = httpx.post(url, content=request[0], headers=request[1])
    elapsed = time.monotonic() - started
    # The retry reaches the other process while the replica is still frozen: a duplicate,
    # and still no 2xx (its round trip wrote nothing; its WAIT covers the first copy, which
    # another process's connection wrote).
    again = httpx.post(retry_url, content=request[0], headers=request[1])

    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "QueueNotReplicated"
    assert "0 of 1 replicas" in refused.json()["detail"]
    assert refused.headers["retry-after"] == "5"
    assert TIMEOUT_MS / 1000 <= elapsed < TIMEOUT_MS / 1000 + 2
    assert (again.status_code, again.json()["error"]) == (503, "QueueNotReplicated")
    assert len(_queued(pair.primary_port)) == 1  # queued, once, all along

    pair.thaw_replica()
    retry = httpx.post(retry_url, content=request[0], headers=request[1])

    assert retry.status_code == 200, retry.text
    assert retry.json()["status"] == "duplicate"
    assert len(_queued(pair.primary_port)) == 1  # no second copy
    assert len(_queued(pair.replica_port)) == 1


def test_readyz_is_503_while_the_replica_is_gone(
    pair: ReplicatedRedis, gateway: ServerThread
) -> None:
    ready = httpx.get(f"{gateway.url}/readyz")
    assert ready.status_code == 200, ready.text

    pair.stop_replica()
    gone = httpx.get(f"{gateway.url}/readyz")

    assert gone.status_code == 503
    assert "0 of 1 replicas online" in gone.text

    pair.start_replica()
    assert httpx.get(f"{gateway.url}/readyz").status_code == 200


async def test_an_aof_acknowledgement_is_refused_at_start_without_waitaof(
    pair: ReplicatedRedis, database_url: str
) -> None:
    with Redis(port=pair.primary_port) as client:
        assert client.execute_command("COMMAND INFO", "WAITAOF") == [None]  # Redis < 7.2
    app = create_app(_settings(pair, database_url, redis_ack_aof=True), parse_config(CONFIG))

    with pytest.raises(AckUnsupported, match="needs WAITAOF"):
        async with app.router.lifespan_context(app):
            pass


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"redis_url": "memory://"}, "not memory://"),
        ({"ingest_batching": False}, "EVENTGATE_INGEST_BATCHING on"),
    ],
)
async def test_an_acknowledgement_that_cannot_be_given_is_refused_at_start(
    pair: ReplicatedRedis, database_url: str, extra: dict[str, object], why: str
) -> None:
    settings = _settings(pair, database_url, redis_ack_replicas=1).model_copy(update=extra)
    app = create_app(settings, parse_config(CONFIG), role="api")

    with pytest.raises(AckUnsupported, match=why):
        async with app.router.lifespan_context(app):
            pass


def test_the_round_trip_sent_again_after_noscript_is_still_acknowledged_or_refused(
    pair: ReplicatedRedis, gateway: ServerThread
) -> None:
    # The script cache lost (SCRIPT FLUSH): the enqueue is sent again with its own WAIT, on
    # its own connection, and a replica that acknowledges nothing still gets a 503.
    first = github_request(SECRET, issue_payload("acme/api", 3))
    assert httpx.post(f"{gateway.url}/v1/webhooks/github", content=first[0], headers=first[1])
    pair.wait_in_sync()
    with Redis(port=pair.primary_port) as client:
        client.script_flush()
    pair.freeze_replica()
    waits = _waits(pair)
    request = github_request(SECRET, issue_payload("acme/api", 4))

    refused = httpx.post(
        f"{gateway.url}/v1/webhooks/github", content=request[0], headers=request[1]
    )

    assert refused.status_code == 503, refused.text
    assert "0 of 1 replicas" in refused.json()["detail"]
    assert _waits(pair) == waits + 2  # one WAIT per round trip
    pair.thaw_replica()
    pair.wait_in_sync()
    assert len(_queued(pair.replica_port)) == 2  # queued once, and now replicated

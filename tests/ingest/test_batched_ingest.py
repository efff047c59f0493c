"""The ingest endpoint over the EnqueueBatcher: concurrent requests, each its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from app.config import parse_config
from app.main import create_app
from app.queue.batching import EnqueueBatcher
from app.settings import Settings
from tests.support import ServerThread, free_port, github_request, issue_payload

SECRET = "batched-ingest-secret"
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


def _serve(redis_url: str, redis_prefix: str, database_url: str) -> Iterator[ServerThread]:
    settings = Settings(redis_url=redis_url, redis_prefix=redis_prefix, database_url=database_url)
    app = create_app(settings, parse_config(CONFIG), role="api")
    with ServerThread(app) as server:
        assert isinstance(app.state.running.api.ingest.queue, EnqueueBatcher)
        yield server


@pytest.fixture
def gateway(redis_url: str, redis_prefix: str, database_url: str) -> Iterator[ServerThread]:
    yield from _serve(redis_url, redis_prefix, database_url)


@pytest.fixture
def gateway_without_redis(database_url: str) -> Iterator[ServerThread]:
    yield from _serve(f"redis://127.0.0.1:{free_port()}/0", "nothing", database_url)


async def _post_all(url: str, requests: list[tuple[bytes, dict[str, str]]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return await asyncio.gather(
            *(
                client.post("/v1/webhooks/github", content=body, headers=headers)
                for body, headers in requests
            )
        )


async def test_concurrent_deliveries_and_a_redelivery_get_their_own_answers(
    gateway: ServerThread,
) -> None:
    requests = [github_request(SECRET, issue_payload(f"acme/r{i % 3}", i)) for i in range(30)]
    redelivery = requests[4]
    replies = await _post_all(gateway.url, [*requests, redelivery])
    delivery = redelivery[1]["X-GitHub-Delivery"]
    pair = [r for r in replies if r.request.headers["x-github-delivery"] == delivery]
    assert sorted(r.json()["status"] for r in pair) == ["duplicate", "queued"]
    # Whichever of the two reached Redis first queued it; the other names the same event.
    assert len({r.json()["event_id"] for r in pair}) == 1
    queued = [r for r in replies if r.status_code == 202]
    assert len(queued) == 30
    assert len({r.json()["event_id"] for r in queued}) == 30


async def test_redis_down_fails_every_concurrent_request_with_503(
    gateway_without_redis: ServerThread,
) -> None:
    requests = [github_request(SECRET, issue_payload("acme/api", i)) for i in range(8)]
    replies = await _post_all(gateway_without_redis.url, requests)
    assert [r.status_code for r in replies] == [503] * 8
    assert all(r.json()["error"] == "QueueUnavailable" for r in replies)
    assert all(r.headers["retry-after"] == "5" for r in replies)

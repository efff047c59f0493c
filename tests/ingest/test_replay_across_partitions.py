"""A captured signed request replayed so that its group key lands in another partition.

The signed-digest dedup key (``replay_id``) lived in the partition's hash tag, and the
partition is the hash of the group key. Where an unsigned header picks the group key, an
attacker who saw one signed request could change that header: the replay went to another
partition, whose dedup keys had never seen the digest, and was queued as a new event (a new
Claude call, a new publish). The digest is now claimed across partitions first
(``app/queue/replays.py``).

- GitHub: ``X-GitHub-Event`` selects the group-key rule (``github_app_authorization`` groups
  by ``sender.login``, ``installation`` by ``installation/<id>``), so the same signed
  ``issues`` body relabelled gets another group key.
- CloudEvents binary mode with an HMAC: ``ce-subject`` (unsigned) is the group key.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
import zlib
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from app.config import parse_config
from app.main import create_app
from app.settings import Settings
from tests.support import ServerThread, github_request, issue_payload

GITHUB_SECRET = "attack-github-secret-0123456789"
CE_SECRET = "attack-cloudevents-secret-0123456789"
CONFIG = f"""
sources:
  github: {{type: github, secret: {GITHUB_SECRET}, pipeline: p}}
  events: {{type: cloudevents, secret: {CE_SECRET}, pipeline: p}}
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""
PARTITIONS = 16


def _partition(key: str) -> int:
    return zlib.crc32(key.encode()) % PARTITIONS


@pytest.fixture(params=[True, False], ids=["batched", "one-call-per-request"])
def client(
    request: pytest.FixtureRequest, make_settings: Callable[..., Settings]
) -> Iterator[httpx.Client]:
    settings = make_settings(ingest_batching=request.param, partitions=PARTITIONS)
    app = create_app(settings, parse_config(CONFIG, env={}), role="api")
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        yield http


@pytest.mark.parametrize(
    ("relabel", "group_key"),
    [("github_app_authorization", "octocat"), ("installation", "installation/42")],
)
def test_github_replay_relabelled_to_another_partition_is_a_duplicate(
    client: httpx.Client, relabel: str, group_key: str
) -> None:
    payload = issue_payload("acme/api", 1) | {"installation": {"id": 42}}
    assert _partition("acme/api") != _partition(group_key)  # the point of the relabel
    body, headers = github_request(GITHUB_SECRET, payload)
    first = client.post("/v1/webhooks/github", content=body, headers=headers)
    assert first.status_code == 202

    # The attacker has only the captured bytes: same body, same signature.
    replay = client.post(
        "/v1/webhooks/github",
        content=body,
        headers=headers | {"X-GitHub-Delivery": str(uuid.uuid4()), "X-GitHub-Event": relabel},
    )
    assert (replay.status_code, replay.json()) == (
        200,
        {"event_id": first.json()["event_id"], "status": "duplicate"},
    ), "a replay of a captured signed body was queued as a new event"


def test_binary_cloudevent_replay_with_another_subject_is_a_duplicate(
    client: httpx.Client,
) -> None:
    body = orjson.dumps({"reading": 21.5})
    signature = hmac.new(CE_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "ce-specversion": "1.0",
        "ce-source": "/plant/1",
        "ce-type": "reading",
        "ce-subject": "dev-1",
        "X-Signature": signature,
    }
    first = client.post("/v1/webhooks/events", content=body, headers=headers | {"ce-id": "a-1"})
    assert first.status_code == 202
    assert _partition("dev-1") != _partition("dev-2")

    replay = client.post(
        "/v1/webhooks/events",
        content=body,
        headers=headers | {"ce-id": "a-2", "ce-subject": "dev-2"},
    )
    assert (replay.status_code, replay.json()) == (
        200,
        {"event_id": first.json()["event_id"], "status": "duplicate"},
    ), "a replay of a captured signed body was queued as a new event"

"""POST /v1/webhooks/{source} over real HTTP, ingest role only (no worker consumes)."""

from __future__ import annotations

import hashlib
import hmac
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from redis import Redis

from app.config import load_config
from app.main import create_app
from app.queue.streams import unpack_entry
from app.settings import Settings
from tests.support import ServerThread, github_request, issue_payload

SECRET = "dev-github-secret"  # the built-in example config's default


@pytest.fixture
def api(make_settings: Callable[..., Settings]) -> Iterator[tuple[str, Settings]]:
    settings = make_settings(max_body_bytes=4096)
    with ServerThread(create_app(settings, load_config(None, env={}), role="api")) as server:
        yield server.url, settings


def _stream_entries(settings: Settings, group_key: str) -> list[dict[str, Any]]:
    partition = zlib.crc32(group_key.encode()) % settings.partitions
    client = Redis.from_url(settings.redis_url)
    try:
        entries = client.xrange(f"{settings.redis_prefix}:{{p{partition}}}:stream")
    finally:
        client.close()
    return [orjson.loads(unpack_entry(fields[b"e"])) for _, fields in entries]  # type: ignore[index,union-attr,arg-type]


def test_event_is_on_the_stream_before_202(api: tuple[str, Settings]) -> None:
    url, settings = api
    if settings.redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis to look at the stream from outside the process")
    body, headers = github_request(SECRET, issue_payload("acme/api", 7))
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 202
    event_id = reply.json()["event_id"]
    assert reply.json() == {"event_id": event_id, "status": "queued"}
    entries = _stream_entries(settings, "acme/api")
    assert [e["id"] for e in entries] == [event_id]
    assert entries[0]["type"] == "issues.opened"
    assert entries[0]["group_key"] == "acme/api"
    assert entries[0]["delivery_id"] == headers["X-GitHub-Delivery"]
    assert entries[0]["payload"]["issue"]["number"] == 7


def test_redelivery_gets_200_with_the_original_event_id(api: tuple[str, Settings]) -> None:
    url, _ = api
    body, headers = github_request(SECRET, issue_payload("acme/api", 1))
    first = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    second = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    assert first.status_code == 202
    assert second.status_code == 200
    assert second.json() == {"event_id": first.json()["event_id"], "status": "duplicate"}
    # Another delivery is another event (the same signed body under a new delivery id is a
    # replay: see test_replay_dedup.py).
    other_body, other_headers = github_request(SECRET, issue_payload("acme/api", 2))
    other = httpx.post(f"{url}/v1/webhooks/github", content=other_body, headers=other_headers)
    assert other.status_code == 202
    assert other.json()["event_id"] != first.json()["event_id"]


def test_ping_is_answered_and_not_queued(api: tuple[str, Settings]) -> None:
    url, settings = api
    body, headers = github_request(
        SECRET,
        {"zen": "Design for failure.", "hook_id": 1, "repository": {"full_name": "acme/ping"}},
        event="ping",
    )
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 200
    assert reply.json() == {"status": "ignored"}
    if not settings.redis_url.startswith("memory://"):
        assert _stream_entries(settings, "acme/ping") == []


def test_github_form_encoded_payload_is_accepted(api: tuple[str, Settings]) -> None:
    url, _ = api
    import hashlib
    import hmac
    from urllib.parse import urlencode

    body = urlencode({"payload": orjson.dumps(issue_payload("acme/form", 2)).decode()}).encode()
    _, headers = github_request(SECRET, {})
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    headers["X-Hub-Signature-256"] = (
        "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    )
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 202, reply.text


@pytest.mark.parametrize(
    ("mutate", "status", "error"),
    [
        (
            lambda b, h: (b, {**h, "X-Hub-Signature-256": "sha256=" + "0" * 64}),
            401,
            "InvalidSignature",
        ),
        (
            lambda b, h: (b, {k: v for k, v in h.items() if k != "X-Hub-Signature-256"}),
            401,
            "InvalidSignature",
        ),
        (lambda b, h: (b + b" ", h), 401, "InvalidSignature"),
        (lambda b, h: (b, {**h, "Content-Type": "text/plain"}), 415, "UnsupportedMediaType"),
        (
            lambda b, h: (b, {k: v for k, v in h.items() if k != "X-GitHub-Event"}),
            400,
            "InvalidPayload",
        ),
    ],
    ids=[
        "wrong-signature",
        "missing-signature",
        "tampered-body",
        "not-json-media",
        "missing-event-header",
    ],
)
def test_rejections(api: tuple[str, Settings], mutate: Any, status: int, error: str) -> None:
    url, _ = api
    body, headers = mutate(*github_request(SECRET, issue_payload("acme/api", 3)))
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == status
    assert reply.json()["error"] == error
    assert reply.json()["detail"]


def test_signed_body_that_is_not_json_is_400(api: tuple[str, Settings]) -> None:
    import hashlib
    import hmac

    url, _ = api
    body = b"{not json"
    _, headers = github_request(SECRET, {})
    headers["X-Hub-Signature-256"] = (
        "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    )
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 400
    assert reply.json()["error"] == "InvalidPayload"
    assert "not valid JSON" in reply.json()["detail"]


def test_unknown_source_is_404(api: tuple[str, Settings]) -> None:
    url, _ = api
    reply = httpx.post(f"{url}/v1/webhooks/gitlab", content=b"{}")
    assert reply.status_code == 404
    assert reply.json() == {
        "error": "UnknownSource",
        "detail": "no source named 'gitlab' is configured",
    }


def test_body_over_the_limit_is_413_declared_or_streamed(api: tuple[str, Settings]) -> None:
    url, _ = api
    big = b"x" * 5000
    # A signature header of the right shape: the body is read (and refused when too big).
    # Without one the request is refused from its headers, body unread.
    shaped = {"X-Hub-Signature-256": "sha256=" + "0" * 64}
    assert httpx.post(f"{url}/v1/webhooks/github", content=big).status_code == 401
    declared = httpx.post(f"{url}/v1/webhooks/github", content=big, headers=shaped)
    assert declared.status_code == 413
    assert declared.json()["error"] == "PayloadTooLarge"

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for _ in range(10):
            yield b"x" * 1000

    streamed = httpx.post(f"{url}/v1/webhooks/github", content=chunks(), headers=shaped)
    assert streamed.status_code == 413
    assert streamed.json()["error"] == "PayloadTooLarge"


def test_redis_unreachable_is_503_with_retry_after(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(redis_url="redis://127.0.0.1:1/0")
    with ServerThread(create_app(settings, load_config(None, env={}), role="api")) as server:
        body, headers = github_request(SECRET, issue_payload("acme/api", 1))
        reply = httpx.post(
            f"{server.url}/v1/webhooks/github", content=body, headers=headers, timeout=10
        )
        assert reply.status_code == 503
        assert reply.headers["Retry-After"].isdigit()
        assert reply.json()["error"] == "QueueUnavailable"
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json()["checks"]["redis"].startswith("error")


def test_health_readiness_and_docs(api: tuple[str, Settings]) -> None:
    url, _ = api
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/readyz")
    # The api role does not call Claude, so a missing key does not make it unready ...
    assert ready.status_code == 200
    # ... but the body still says the LLM is not configured.
    assert ready.json()["checks"]["llm"].startswith("not configured")
    schema = httpx.get(f"{url}/openapi.json").json()
    assert "/v1/webhooks/{source}" in schema["paths"]
    assert httpx.get(f"{url}/docs").status_code == 200


def test_webhooks_are_documented_by_fastapi_and_other_methods_routed(
    api: tuple[str, Settings],
) -> None:
    """The route is what the schema describes (the path parameter and the error answers);
    other methods and deeper paths go on to FastAPI's routing."""
    url, _ = api
    operation = httpx.get(f"{url}/openapi.json").json()["paths"]["/v1/webhooks/{source}"]
    assert [p["name"] for p in operation["post"]["parameters"]] == ["source"]
    assert {"202", "401", "404", "413", "503"} <= set(operation["post"]["responses"])
    wrong = httpx.get(f"{url}/v1/webhooks/github")
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "POST"
    assert wrong.json()["error"] == "MethodNotAllowed"
    deeper = httpx.post(f"{url}/v1/webhooks/github/extra", content=b"{}")
    assert (deeper.status_code, deeper.json()["error"]) == (404, "NotFound")
    unknown = httpx.post(f"{url}/v1/webhooks/nope", content=b"{}")
    assert (unknown.status_code, unknown.json()["error"]) == (404, "UnknownSource")


def _signed(body: bytes, *, event: str = "issues", media: str = "application/json") -> Any:
    _, headers = github_request(SECRET, {})
    headers["Content-Type"] = media
    headers["X-GitHub-Event"] = event
    headers["X-Hub-Signature-256"] = (
        "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    )
    return body, headers


def _answers(url: str) -> list[tuple[int, object]]:
    """Every kind of answer the endpoint gives, as (status, error name or answer status)."""
    issue = orjson.dumps(issue_payload("acme/api", 1))
    delivery = "parity-delivery-1"
    requests: list[tuple[str, bytes, dict[str, str]]] = []
    body, headers = _signed(issue)
    headers["X-GitHub-Delivery"] = delivery
    requests += [("github", body, headers), ("github", body, dict(headers))]  # 202, duplicate
    requests.append(("github", *_signed(b"{}", event="ping")))  # ignored
    requests.append(("github", *_signed(b"not json")))  # 400
    bad = dict(headers) | {"X-Hub-Signature-256": "sha256=" + "0" * 64}
    requests.append(("github", body, bad))  # 401
    requests.append(("nope", body, headers))  # 404
    requests.append(("github", *_signed(b"{" + b" " * 5000 + b"}")))  # 413
    requests.append(("github", *_signed(issue, media="text/plain")))  # 415
    answers = []
    for source, content, sent in requests:
        reply = httpx.post(f"{url}/v1/webhooks/{source}", content=content, headers=sent)
        data = reply.json()
        answers.append((reply.status_code, data.get("error", data.get("status"))))
    return answers


def test_the_direct_entry_and_the_route_answer_the_same_for_every_status(
    make_settings: Callable[..., Settings], redis_prefix: str
) -> None:
    """Webhooks enter directly (before FastAPI's middleware and routing) or through the
    route; both are one handler, and answer alike."""
    answers = []
    for direct_webhooks in (True, False):
        prefix = f"{redis_prefix}:{direct_webhooks}"  # the fixture deletes {redis_prefix}:*
        settings = make_settings(max_body_bytes=4096, redis_prefix=prefix)
        app = create_app(settings, load_config(None, env={}), role="api")
        app.direct_webhooks = direct_webhooks
        with ServerThread(app) as server:
            answers.append(_answers(server.url))
    direct, routed = answers
    assert [status for status, _ in direct] == [202, 200, 200, 400, 401, 404, 413, 415]
    assert routed == direct

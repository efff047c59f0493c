"""Ingest refuses with 503 + Retry-After once the backlog passes its depth or age limit."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from app.config import load_config
from app.main import create_app
from app.settings import Settings
from tests.support import ServerThread, github_request, issue_payload

SECRET = "dev-github-secret"


def _post(url: str, n: int) -> httpx.Response:
    body, headers = github_request(SECRET, issue_payload("acme/api", n))
    return httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)


def _wait_for_status(url: str, n: int, status: int, timeout: float = 5) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        reply = _post(url, n)
        if reply.status_code == status or time.monotonic() > deadline:
            return reply
        time.sleep(0.2)


def test_depth_limit(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(backlog_max_depth=3)
    with ServerThread(create_app(settings, load_config(None, env={}), role="api")) as server:
        for n in range(3):
            assert _post(server.url, n).status_code == 202
        refused = _wait_for_status(server.url, 99, 503)
        assert refused.status_code == 503
        assert refused.json()["error"] == "QueueUnavailable"
        assert "backlog of 3 events" in refused.json()["detail"]
        assert int(refused.headers["Retry-After"]) > 0
        ready = httpx.get(f"{server.url}/readyz").json()
        assert ready["checks"]["backlog"].startswith("backlog of 3 events")
        metrics = httpx.get(f"{server.url}/metrics").text
        assert "eventgate_queue_depth 3.0" in metrics


def test_age_limit(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(backlog_max_age_seconds=1)
    with ServerThread(create_app(settings, load_config(None, env={}), role="api")) as server:
        assert _post(server.url, 1).status_code == 202
        refused = _wait_for_status(server.url, 2, 503)
        assert refused.status_code == 503
        assert "oldest queued event" in refused.json()["detail"]


def test_no_limit_hit_accepts(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(backlog_max_depth=1000)
    with ServerThread(create_app(settings, load_config(None, env={}), role="api")) as server:
        replies = [_post(server.url, n) for n in range(20)]
        time.sleep(1.2)
        replies.append(_post(server.url, 21))
        assert {r.status_code for r in replies} == {202}

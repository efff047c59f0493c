"""The line per accepted delivery: written at debug only (at info it cost about a fifth of
ingest's CPU); refusals, filtered and collapsed deliveries are logged at info as before."""

from __future__ import annotations

import httpx
import orjson
import pytest
import structlog

from app.config import parse_config
from app.ingest import service
from app.main import create_app
from app.settings import Settings
from tests.sources_support import payload as fixture
from tests.support import ServerThread, github_request, issue_payload

SECRET = "accept-log-secret"
CONFIG = f"""
sources:
  github:
    type: github
    secret: {SECRET}
    pipeline: triage
    filters: {{drop: [{{path: action, equals: closed}}]}}
  alerts:
    type: alertmanager
    token: accept-log-token
    pipeline: triage
    collapse: {{window_seconds: 3600}}
pipelines:
  triage: {{model: claude-sonnet-4-5, system: Triage., tools: [publishAlert]}}
tools:
  publishAlert:
    description: Raise an alert.
    input_schema: {{type: object, properties: {{title: {{type: string}}}}}}
"""


def _deliver(settings: Settings) -> list[int]:
    app = create_app(settings, parse_config(CONFIG), role="api")
    opened = issue_payload("acme/logs", 1)
    closed = {**issue_payload("acme/logs", 2), "action": "closed"}
    statuses = []
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        for payload, delivery in ((opened, "d-1"), (opened, "d-1"), (closed, "d-2")):
            body, headers = github_request(SECRET, payload, delivery=delivery)
            statuses.append(client.post("/v1/webhooks/github", content=body, headers=headers))
        bad_body, bad_headers = github_request("not-the-secret", opened, delivery="d-3")
        statuses.append(client.post("/v1/webhooks/github", content=bad_body, headers=bad_headers))
        auth = {"Authorization": "Bearer accept-log-token", "Content-Type": "application/json"}
        alert = orjson.dumps(fixture("alertmanager_v4.json"))
        for _ in range(2):  # queued, then a repeat of the same firing alerts: collapsed
            statuses.append(client.post("/v1/webhooks/alerts", content=alert, headers=auth))
    structlog.reset_defaults()  # the gateway logged onto this test's captured stderr
    return [reply.status_code for reply in statuses]


@pytest.mark.parametrize("level", ["info", "debug"])
def test_an_accepted_delivery_is_logged_at_debug_only(
    level: str,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A logger keeps the level of its first use (``cache_logger_on_first_use``), which in
    # this test process may have come before: a new one takes the gateway's configuration.
    monkeypatch.setattr(service, "log", structlog.get_logger(service.__name__))
    settings = Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        database_url=database_url,
        log_level=level,
        log_format="json",
    )
    assert _deliver(settings) == [202, 200, 200, 401, 202, 200]
    err = capfd.readouterr().err
    accepted = ('"event":"webhook_queued"', '"event":"webhook_duplicate"')
    assert all((line in err) == (level == "debug") for line in accepted), err
    assert '"event":"webhook_filtered"' in err  # a dropped delivery still leaves a trace
    assert '"event":"webhook_collapsed"' in err
    assert '"event":"webhook_rejected"' in err

"""What a person sees when a gateway starts (where it is) and stops (what a memory:// queue
loses), and when the fake Claude starts (where it is, what to export)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import structlog

from app.config import parse_config
from app.main import create_app
from app.ready import gateway_urls
from app.settings import Settings
from tests.support import (
    GatewayProcess,
    ServerThread,
    free_port,
    gateway_config,
    gateway_env,
    github_request,
    issue_payload,
)

SECRET = "ready-tests-github-secret"


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def send(url: str, number: int) -> None:
    body, headers = github_request(SECRET, issue_payload("acme/exit", number))
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers, timeout=10)
    assert reply.status_code == 202, reply.text


def test_serve_says_where_it_is_and_what_a_memory_queue_loses(
    tmp_path: Path, database_url: str, redis_prefix: str
) -> None:
    config = tmp_path / "eventgate.yaml"
    config.write_text(gateway_config(None, secret=SECRET))
    # No Claude configured: the webhook stays queued until the process stops.
    process = GatewayProcess(
        log_path=tmp_path / "gateway.log",
        env=gateway_env(
            config=config,
            redis_url="memory://",
            redis_prefix=redis_prefix,
            database_url=database_url,
        ),
    )
    try:
        url = process.wait_ready(path="/healthz").url  # /readyz: 503, no LLM
        send(url, 1)
    finally:
        process.stop()
    events = process.log_events()
    (ready,) = [e for e in events if e["event"] == "gateway_ready"]
    assert (ready["url"], ready["docs"], ready["console"]) == (
        url,
        f"{url}/docs",
        f"{url}/console",
    )
    plain = f"eventgate serve is ready: {url} (API docs {url}/docs, console {url}/console)"
    assert plain in process.log_path.read_text().splitlines()
    (lost,) = [e for e in events if e["event"] == "queued_events_lost"]
    assert lost["level"] == "warning"
    assert lost["events"] == 1


@pytest.fixture
def in_process(
    make_settings: Callable[..., Settings], capfd: pytest.CaptureFixture[str]
) -> Callable[[str, int], list[dict[str, Any]]]:
    """Run a gateway without Claude on ``redis_url``, send ``webhooks``, stop it; its log."""

    def run(redis_url: str, webhooks: int) -> list[dict[str, Any]]:
        settings = make_settings(redis_url=redis_url)
        app = create_app(settings, parse_config(gateway_config(None, secret=SECRET)))
        with ServerThread(app) as server:
            for number in range(webhooks):
                send(server.url, number)
        lines = capfd.readouterr().err.splitlines()
        return [orjson.loads(line) for line in lines if line.startswith("{")]

    return run


def test_stopping_a_memory_gateway_counts_every_queued_event(
    in_process: Callable[[str, int], list[dict[str, Any]]],
) -> None:
    (lost,) = [e for e in in_process("memory://", 3) if e["event"] == "queued_events_lost"]
    assert lost["events"] == 3
    assert "3 queued event(s)" in lost["detail"]


def test_no_warning_when_nothing_is_lost(
    in_process: Callable[[str, int], list[dict[str, Any]]], redis_url: str
) -> None:
    assert not [e for e in in_process("memory://", 0) if e["event"] == "queued_events_lost"]
    if redis_url == "memory://":
        pytest.skip("no Redis server reachable for the kept-queue half")
    # A Redis server keeps the queue: stopping loses nothing, so nothing is said.
    assert not [e for e in in_process(redis_url, 2) if e["event"] == "queued_events_lost"]


@pytest.mark.parametrize(
    ("host", "role", "url", "console"),
    [
        ("127.0.0.1", "serve", "http://127.0.0.1:8080", "http://127.0.0.1:8080/console"),
        (
            "0.0.0.0",  # noqa: S104
            "api",
            "http://127.0.0.1:8080",
            "http://127.0.0.1:8080/console",
        ),
        ("::", "serve", "http://[::1]:8080", "http://[::1]:8080/console"),
        ("gateway.internal", "worker", "http://gateway.internal:8080", None),
    ],
)
def test_ready_urls(host: str, role: str, url: str, console: str | None) -> None:
    urls = gateway_urls(host, 8080, role=role)
    assert (urls.url, urls.docs, urls.console) == (url, f"{url}/docs", console)


def test_fake_claude_says_it_is_up_and_what_to_export() -> None:
    port = free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "eventgate_dev.fake_anthropic", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert fake.stdout is not None
        url = f"http://127.0.0.1:{port}"
        assert fake.stdout.readline() == f"fake Claude (Anthropic Messages API) is up on {url}\n"
        assert fake.stdout.readline() == f"point eventgate at it: export ANTHROPIC_BASE_URL={url}\n"
        # Up means answering, by the time the line is printed.
        assert httpx.get(f"{url}/_fake/stats", timeout=5).json()["requests"] == 0
    finally:
        fake.terminate()
        fake.wait(timeout=10)

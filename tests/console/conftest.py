"""Console fixtures: Debian's Chromium driven by Playwright (offline: every request to
anything but 127.0.0.1 is aborted), a gateway process with Claude faked at its HTTP edge,
and an in-process gateway for the HTTP-level checks.

Outside CI a machine without ``/usr/bin/chromium`` skips the browser tests, saying why; with
``CI`` set they fail instead (``.ci/run`` installs Chromium first).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import pytest
import structlog

from app.config import parse_config
from app.main import create_app
from app.settings import Settings
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.support import (
    GatewayProcess,
    ServerThread,
    SnsFixture,
    gateway_config,
    gateway_env,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Route

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
ADMIN_TOKEN = "console-admin-token-5f0c2a9e71d84b36"
GITHUB_SECRET = "console-tests-github-secret"
LOCAL_HOSTS = {"127.0.0.1"}


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def require_chromium() -> None:
    if not CHROMIUM.exists():
        why = f"{CHROMIUM} is missing (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"browser tests cannot run: {why}")
        pytest.skip(f"browser tests need Debian's Chromium: {why}")


@pytest.fixture
def browser() -> Iterator[Browser]:
    """One per test, and asked for after the gateway fixtures: while Playwright's sync API is
    open its event loop counts as running in this thread, so fixtures that call
    ``asyncio.run`` (the database's) must have run before."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


@dataclass
class OfflineContext:
    """A browser context whose requests leave this machine never: ``blocked`` lists what
    was aborted."""

    context: BrowserContext
    blocked: list[str]


@pytest.fixture
def offline(browser: Browser) -> Iterator[OfflineContext]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    blocked: list[str] = []

    def only_local(route: Route) -> None:
        if urlsplit(route.request.url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route(re.compile(r".*"), only_local)
    yield OfflineContext(context=context, blocked=blocked)
    context.close()


@dataclass
class RunningGateway:
    url: str
    process: GatewayProcess
    claude: FakeAnthropicServer
    sns: SnsFixture


@pytest.fixture
def console_gateway(
    tmp_path: Path,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    moto_endpoint: str,
) -> Iterator[RunningGateway]:
    """``eventgate serve`` as a real process: GitHub source, publishAlert on a moto topic,
    Claude faked over HTTP, the admin token set."""
    config = tmp_path / "eventgate.yaml"
    config.write_text(gateway_config(sns.topic_arn, secret="${CONSOLE_GITHUB_SECRET}"))
    process = GatewayProcess(
        log_path=tmp_path / "gateway.log",
        env=gateway_env(
            config=config,
            redis_url=redis_url,
            redis_prefix=redis_prefix,
            database_url=database_url,
            claude_url=fake_claude.base_url,
            sns_endpoint=moto_endpoint,
            CONSOLE_GITHUB_SECRET=GITHUB_SECRET,
            EVENTGATE_ADMIN_TOKEN=ADMIN_TOKEN,
            EVENTGATE_PARTITIONS="4",
            EVENTGATE_RELAY_POLL_SECONDS="0.1",
        ),
    )
    try:
        yield RunningGateway(
            url=process.wait_ready().url, process=process, claude=fake_claude, sns=sns
        )
    finally:
        process.stop()
    # The admin token never reaches the gateway's log.
    assert ADMIN_TOKEN not in process.log_path.read_text()


@pytest.fixture
def inprocess_gateway(redis_url: str, redis_prefix: str, database_url: str) -> Iterator[Any]:
    """An ``api`` gateway in a thread; ``start(admin_token=...)`` gives its URL."""
    servers: list[ServerThread] = []

    def start(*, admin_token: str | None = ADMIN_TOKEN, **overrides: Any) -> str:
        settings = Settings(
            redis_url=redis_url,
            redis_prefix=redis_prefix,
            database_url=database_url,
            admin_token=admin_token,
            auto_migrate=False,
            partitions=4,
            log_format="json",
            **overrides,
        )
        config = parse_config(gateway_config(None, secret=GITHUB_SECRET))
        server = ServerThread(create_app(settings, config, role="api")).__enter__()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def sign_in(client: httpx.Client, token: str = ADMIN_TOKEN) -> httpx.Response:
    """The sign-in form as a browser posts it: the form's nonce, from its page and cookie."""
    form = client.get("/console/sign-in")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None, form.text
    return client.post(
        "/console/sign-in",
        data={"token": token, "csrf": nonce.group(1), "next": "/console/events"},
    )


def csrf_of(page_html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page_html)
    assert found is not None
    return found.group(1)

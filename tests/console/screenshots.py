"""Screenshots of the console's main pages into docs/console/, run by hand (`make screenshots`).

A real `eventgate serve` on memory:// Redis and a fresh SQLite file, Claude faked over HTTP
(its first answer a 400, so one event is dead-lettered), SNS on moto; a few signed GitHub
webhooks; then headless Chromium signs in and photographs each page.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
from moto.server import ThreadedMotoServer
from playwright.sync_api import Page, sync_playwright

from eventgate_dev.fake_anthropic import FakeAnthropicServer, FakeBehaviour
from tests.console.conftest import ADMIN_TOKEN, CHROMIUM, CHROMIUM_ARGS, GITHUB_SECRET
from tests.support import (
    GatewayProcess,
    SnsFixture,
    free_port,
    gateway_config,
    gateway_env,
    github_request,
    issue_payload,
)

OUT = Path(__file__).resolve().parents[2] / "docs" / "console"
REPOS = ["acme/api", "acme/web", "acme/billing", "acme/api"]


def _wait(url: str, event_id: str, statuses: set[str]) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = httpx.get(f"{url}/v1/events/{event_id}", headers=auth)
        if reply.status_code == 200 and reply.json()["status"] in statuses:
            tools = reply.json()["tool_calls"]
            if all(t["sns_message_id"] for t in tools):
                return
        time.sleep(0.2)
    raise RuntimeError(f"event {event_id} did not settle")


def _send(url: str, repo: str, number: int) -> str:
    body, headers = github_request(GITHUB_SECRET, issue_payload(repo, number))
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    reply.raise_for_status()
    event_id: str = reply.json()["event_id"]
    return event_id


def _shoot(page: Page, name: str) -> None:
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
    print(f"docs/console/{name}.png")


def main() -> None:
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    OUT.mkdir(parents=True, exist_ok=True)
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    endpoint = f"http://127.0.0.1:{port}"
    claude = FakeAnthropicServer(FakeBehaviour(faults=[400])).start()
    with tempfile.TemporaryDirectory() as tmp:
        sns = SnsFixture(endpoint, "console-shots", count_all=False)
        config = Path(tmp) / "eventgate.yaml"
        config.write_text(gateway_config(sns.topic_arn, secret="${SHOTS_GITHUB_SECRET}"))
        gateway = GatewayProcess(
            log_path=Path(tmp) / "gateway.log",
            env=gateway_env(
                config=config,
                redis_url="memory://",
                redis_prefix="shots",
                database_url=f"sqlite+aiosqlite:///{tmp}/eventgate.db",
                claude_url=claude.base_url,
                sns_endpoint=endpoint,
                SHOTS_GITHUB_SECRET=GITHUB_SECRET,
                EVENTGATE_ADMIN_TOKEN=ADMIN_TOKEN,
                EVENTGATE_AUTO_MIGRATE="true",
                EVENTGATE_PARTITIONS="4",
                EVENTGATE_RELAY_POLL_SECONDS="0.1",
                EVENTGATE_LLM_REQUESTS_PER_MINUTE="60",
                EVENTGATE_LLM_INPUT_TOKENS_PER_MINUTE="400000",
            ),
        )
        try:
            url = gateway.wait_ready().url
            doomed = _send(url, "acme/legacy", 3)
            _wait(url, doomed, {"dead_lettered"})
            sent = [_send(url, repo, n) for n, repo in enumerate(REPOS, start=10)]
            for event_id in sent:
                _wait(url, event_id, {"published"})
            _photograph(url, newest=sent[-1])
        finally:
            gateway.stop()
            claude.stop()
            moto.stop()


def _photograph(url: str, *, newest: str) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{url}/console/sign-in")
        _shoot(page, "sign-in")
        page.fill("input[name=token]", ADMIN_TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(f"{url}/console/events")
        _shoot(page, "events")
        page.goto(f"{url}/console/events/{newest}")
        _shoot(page, "event")
        page.goto(f"{url}/console/dead-letters")
        _shoot(page, "dead-letters")
        page.goto(f"{url}/console/health")
        _shoot(page, "health")
        browser.close()


if __name__ == "__main__":
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: apt-get install chromium")
    main()

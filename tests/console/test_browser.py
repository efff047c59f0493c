"""The console and the API docs in headless Chromium, with every request that would leave
this machine aborted: an operator signs in, finds the event just sent, reads Claude's reply
and the tool call it published, replays a dead letter and signs out."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.console.conftest import (
    ADMIN_TOKEN,
    GITHUB_SECRET,
    OfflineContext,
    RunningGateway,
    require_chromium,
)
from tests.support import github_request, issue_payload

TIMEOUT_MS = 15_000


@pytest.fixture(autouse=True)
def _chromium() -> None:
    """Before any gateway starts: autouse fixtures come first."""
    require_chromium()


def _send(gateway: RunningGateway, repo: str) -> str:
    body, headers = github_request(GITHUB_SECRET, issue_payload(repo, 7))
    reply = httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 202, reply.text
    event_id: str = reply.json()["event_id"]
    return event_id


def _settled(gateway: RunningGateway, event_id: str, status: str) -> dict[str, Any]:
    """The admin API's view once the event is ``status`` (and published ones have their SNS
    message id)."""
    deadline = time.monotonic() + 30
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    while True:
        reply = httpx.get(f"{gateway.url}/v1/events/{event_id}", headers=auth)
        body: dict[str, Any] = reply.json()
        sent = status != "published" or all(t["sns_message_id"] for t in body["tool_calls"])
        if reply.status_code == 200 and body["status"] == status and sent:
            return body
        assert time.monotonic() < deadline, f"still {reply.text}"
        time.sleep(0.1)


def test_an_operator_follows_an_event_and_replays_a_dead_letter(
    console_gateway: RunningGateway, offline: OfflineContext
) -> None:
    gateway = console_gateway
    gateway.claude.behaviour.faults = [400]  # the first event's Claude call is refused
    doomed = _send(gateway, "acme/doomed")
    dead = _settled(gateway, doomed, "dead_lettered")["dead_letter"]
    sent = _send(gateway, "acme/api")
    published = _settled(gateway, sent, "published")
    [tool] = published["tool_calls"]
    assert published["payload"]["repository"]["full_name"] == "acme/api"
    assert published["pipeline"] == "triage"

    page = offline.context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{gateway.url}/console/events")
    expect(page).to_have_url(re.compile(r"/console/sign-in\?next=/console/events$"))

    page.fill("input[name=token]", "not-the-token")
    page.click("button[type=submit]")
    expect(page.get_by_role("alert")).to_have_text("That is not the admin token.")
    expect(page).to_have_url(re.compile(r"/console/sign-in$"))

    page.fill("input[name=token]", ADMIN_TOKEN)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{gateway.url}/console/events")
    [session] = [c for c in offline.context.cookies() if c["name"] == "eventgate_console"]
    assert session["httpOnly"] is True
    assert session["sameSite"] == "Strict"
    assert session["expires"] > time.time() + 7 * 3600
    assert ADMIN_TOKEN not in session["value"]

    # The event just sent is the newest one listed; its page shows what Claude did.
    first_row = page.locator("table.list tbody tr").first
    expect(first_row).to_contain_text(sent)
    expect(first_row).to_contain_text("published")
    first_row.get_by_role("link", name=sent).click()
    expect(page).to_have_url(f"{gateway.url}/console/events/{sent}")
    expect(page.locator("h1")).to_contain_text("published")
    expect(page.locator("dl.facts").first).to_contain_text(published["delivery_id"])
    expect(page.locator("details pre").first).to_contain_text('"full_name": "acme/api"')
    attempt = page.locator("article.attempt").first
    expect(attempt).to_contain_text("claude-sonnet-4-6")
    expect(attempt.locator("pre.reply")).to_contain_text("Raising this with the team.")
    tool_call = page.locator("article.tool").first
    expect(tool_call).to_contain_text("publishAlert")
    expect(tool_call).to_contain_text(tool["dedup_id"])
    expect(tool_call).to_contain_text(tool["group_id"])
    expect(tool_call).to_contain_text(tool["sns_message_id"])
    expect(tool_call.locator("pre")).to_contain_text('"severity": "high"')
    expect(page.locator("ol.timeline")).to_contain_text("published")

    # The dead letter, with its reason, and its replay.
    page.get_by_role("link", name="Dead letters").click()
    row = page.locator(f"#dead-letter-{dead['id']}")
    expect(row).to_contain_text(doomed)
    expect(row).to_contain_text(dead["reason"][:40])
    row.get_by_role("button", name="Replay").click()
    expect(page.get_by_role("status")).to_contain_text(f"Dead letter {dead['id']} was replayed")
    replayed = _settled(gateway, doomed, "published")
    assert replayed["generation"] == 1
    page.goto(f"{gateway.url}/console/events/{doomed}")
    expect(page.locator("h1")).to_contain_text("published")
    expect(page.locator("ol.timeline")).to_contain_text("replayed")

    page.get_by_role("link", name="Health").click()
    expect(page.locator("h1")).to_contain_text("ready")
    expect(page.get_by_text("claude-sonnet-4-6")).to_be_visible()

    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{gateway.url}/console/sign-in")
    page.goto(f"{gateway.url}/console/events/{sent}")
    expect(page).to_have_url(re.compile(r"/console/sign-in\?next="))
    assert ADMIN_TOKEN not in page.content()
    assert offline.blocked == []


def test_api_docs_render_with_the_network_blocked(
    inprocess_gateway: Any, offline: OfflineContext
) -> None:
    url = inprocess_gateway()
    page = offline.context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{url}/docs")
    webhook = page.locator(".opblock-post", has_text="/v1/webhooks/{source}")
    expect(webhook).to_be_visible()
    expect(page.locator(".opblock-get", has_text="/v1/events/{event_id}")).to_be_visible()
    assert offline.blocked == []  # Swagger UI asked for nothing outside the gateway
    page.goto(f"{url}/redoc")
    expect(page.get_by_role("heading", name="Receive Webhook")).to_be_visible()
    # ReDoc's script and styles come from the gateway; only its footer badge image (asked for
    # at some point while it renders) does not.
    assert set(offline.blocked) <= {"https://cdn.redoc.ly/redoc/logo-mini.svg"}

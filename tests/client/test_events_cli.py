"""`eventgate events list | show | tail` against a real gateway process (fake Claude over
HTTP, moto SNS), and the one-line errors a person gets when something is off."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner, Result

from app.cli import app as cli
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.admin.conftest import GatewayFactory
from tests.support import (
    GatewayProcess,
    SnsFixture,
    free_port,
    gateway_config,
    gateway_env,
    github_request,
    issue_payload,
)

SECRET = "cli-tests-github-secret"
TOKEN = "cli-tests-admin-token-0123456789"
TAIL_ARGS = ["--last", "1", "--count", "2", "--interval", "0.2"]


@pytest.fixture
def gateway(
    tmp_path: Path,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    moto_endpoint: str,
) -> Iterator[str]:
    config = tmp_path / "eventgate.yaml"
    config.write_text(gateway_config(sns.topic_arn))
    process = GatewayProcess(
        log_path=tmp_path / "gateway.log",
        env=gateway_env(
            config=config,
            redis_url=redis_url,
            redis_prefix=redis_prefix,
            database_url=database_url,
            claude_url=fake_claude.base_url,
            sns_endpoint=moto_endpoint,
            E2E_GITHUB_SECRET=SECRET,
            EVENTGATE_ADMIN_TOKEN=TOKEN,
            EVENTGATE_RELAY_POLL_SECONDS="0.1",
        ),
    )
    try:
        yield process.wait_ready().url
    finally:
        process.stop()


def send(url: str, repo: str, number: int) -> str:
    body, headers = github_request(SECRET, issue_payload(repo, number))
    reply = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers, timeout=10)
    assert reply.status_code == 202, reply.text
    event_id: str = reply.json()["event_id"]
    return event_id


def wait_published(url: str, event_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        reply = httpx.get(
            f"{url}/v1/events/{event_id}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        event: dict[str, Any] = reply.json()
        if event["status"] == "published":
            return event
        assert time.monotonic() < deadline, event
        time.sleep(0.1)


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "250", **(env or {})})


def said(result: Result) -> list[str]:
    """The CLI's stderr lines (an in-process gateway logs its JSON lines to the same stderr)."""
    return [line for line in result.stderr.splitlines() if not line.startswith("{")]


def test_list_and_show_a_decided_event(gateway: str) -> None:
    older = send(gateway, "acme/older", 1)
    wait_published(gateway, older)
    event_id = send(gateway, "acme/cli", 1)
    api = wait_published(gateway, event_id)
    (call,) = api["tool_calls"]
    auth = ["--url", gateway, "--token", TOKEN]

    listed = run("events", "list", *auth)
    assert listed.exit_code == 0, listed.output
    (row,) = [line for line in listed.stdout.splitlines() if event_id in line]
    assert row.split()[-4:] == ["github", "issues.opened", "acme/cli", "published"]
    assert older in listed.stdout
    assert "2 of 2 events" in listed.stdout
    newest = run("events", "list", *auth, "--limit", "1")
    assert event_id in newest.stdout
    assert older not in newest.stdout
    assert "1 of 2 events, newest first (more: raise --limit)" in newest.stdout
    other = run("events", "list", *auth, "--status", "no_action")
    assert other.exit_code == 0
    assert event_id not in other.stdout
    assert "no events" in other.stdout
    as_json = run("events", "list", *auth, "--source", "github", "--json")
    listed_ids = [item["event_id"] for item in orjson.loads(as_json.stdout)["items"]]
    assert listed_ids == [event_id, older]
    assert "no events" in run("events", "list", *auth, "--source", "alerts").stdout

    shown = run("events", "show", event_id, *auth)
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    assert f"event {event_id}  published" in out
    for stage in ("received", "llm_call", "tool_call_stored", "published"):
        assert f" {stage} " in out, stage
    (attempt,) = [line for line in out.splitlines() if "tool_use" in line]
    assert attempt.split("│")[2:4] == [" claude-sonnet-4-6 ", " ok     "]
    (audit,) = api["llm_calls"]
    assert f"{audit['input_tokens']}/40" in attempt
    assert f"${audit['cost_usd']:.6f}" in attempt
    assert "#0 publishAlert" in out
    assert f"published, SNS message id {call['sns_message_id']}" in out
    assert call["sns_message_id"]
    tool_input = orjson.dumps(call["message"]["input"]).decode()
    assert '"severity":"high"' in tool_input
    rows = [line.rstrip().split(maxsplit=1) for line in out.splitlines() if line.strip()]
    assert ["input", tool_input] in rows
    assert any(line.split() == ["group", "id", call["group_id"]] for line in out.splitlines())
    assert any(line.split() == ["dedup", "id", call["dedup_id"]] for line in out.splitlines())
    assert TOKEN not in shown.output
    as_json = run("events", "show", event_id, *auth, "--json")
    assert orjson.loads(as_json.stdout)["tool_calls"][0]["dedup_id"] == call["dedup_id"]


def test_tail_prints_new_events_as_they_come(gateway: str) -> None:
    before = send(gateway, "acme/tail", 1)
    wait_published(gateway, before)
    tail = subprocess.Popen(
        [sys.executable, "-m", "app", "events", "tail", *TAIL_ARGS],
        env={"PATH": "/usr/bin:/bin", "EVENTGATE_URL": gateway, "EVENTGATE_ADMIN_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert tail.stderr is not None
        assert "watching" in tail.stderr.readline()
        sent = [send(gateway, "acme/tail", number) for number in (2, 3)]
        out, err = tail.communicate(timeout=60)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    lines = out.splitlines()
    # The newest event first (--last 1), then the two new ones, each once (--count 2).
    assert len(lines) == 3, out
    assert lines[0].split()[2] == before
    assert {line.split()[2] for line in lines[1:]} == set(sent)
    assert all("github  issues.opened  acme/tail" in line for line in lines)


def test_tail_stops_quietly_on_ctrl_c(gateway_factory: GatewayFactory) -> None:
    with gateway_factory(admin_token=TOKEN) as server:
        tail = subprocess.Popen(
            [sys.executable, "-m", "app", "events", "tail", "--url", server.url],
            env={"PATH": "/usr/bin:/bin", "EVENTGATE_ADMIN_TOKEN": TOKEN},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert tail.stderr is not None
            assert "watching" in tail.stderr.readline()
            tail.send_signal(signal.SIGINT)
            out, err = tail.communicate(timeout=30)
        finally:
            tail.kill()
    assert tail.returncode == 0
    assert (out, err) == ("", "")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--token", "not-the-admin-token-000"], "refused the admin token (401)"),
        ([], "the admin API needs a token: set --token or EVENTGATE_ADMIN_TOKEN"),
    ],
    ids=["wrong-token", "no-token"],
)
def test_token_errors_are_one_line(
    gateway_factory: GatewayFactory, args: list[str], expected: str
) -> None:
    with gateway_factory() as server:
        result = run("events", "list", "--url", server.url, *args)
    assert result.exit_code == 1
    assert result.stdout == ""
    (line,) = said(result)
    assert line.startswith("error: ")
    assert expected in line
    assert "not-the-admin-token-000" not in line


def test_admin_api_off_connection_refused_and_unknown_event(
    gateway_factory: GatewayFactory,
) -> None:
    with gateway_factory(admin_token=None) as server:
        off = run("events", "show", "evt_x", "--url", server.url, "--token", TOKEN)
    assert off.exit_code == 1
    assert said(off) == [
        f"error: the admin API of {server.url} is off: start the gateway with"
        " EVENTGATE_ADMIN_TOKEN set"
    ]
    with gateway_factory(admin_token=TOKEN) as server:
        missing = run("events", "show", "evt_missing", "--url", server.url, "--token", TOKEN)
    assert missing.exit_code == 1
    assert said(missing) == [f"error: no event 'evt_missing' at {server.url}"]

    closed = f"http://127.0.0.1:{free_port()}"
    refused = run("events", "tail", "--url", closed, "--token", TOKEN)
    assert refused.exit_code == 1
    (line,) = said(refused)
    assert line.startswith(f"error: cannot reach the gateway at {closed} (connection refused)")
    assert "Traceback" not in refused.output


def test_version_comes_from_the_package_metadata() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout == f"eventgate {metadata.version('eventgate')}\n"

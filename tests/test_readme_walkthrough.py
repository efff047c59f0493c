"""The README's walkthrough, run as written on free ports: the fake Claude and `eventgate
serve` with the README's admin token, the README's own shell lines signing and sending the
webhook, then the decision in the console and in `eventgate events show`, whose output must
read as the README shows it (ids, times and numbers aside)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support import free_port

ROOT = Path(__file__).resolve().parent.parent
README_PORT, FAKE_PORT = "8080", "8787"


@dataclass(frozen=True)
class Walkthrough:
    commands: list[str]  # the ```sh blocks, in order
    outputs: list[str]  # the bare ``` blocks (what the commands print), in order


def walkthrough() -> Walkthrough:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Walkthrough.*?(?=^## )", text, re.S | re.M)
    assert match, "the README has no Walkthrough section"
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", match.group(0), re.S | re.M)
    return Walkthrough(
        commands=[body for lang, body in blocks if lang == "sh"],
        outputs=[body for lang, body in blocks if lang == ""],
    )


def normalized(text: str) -> list[str]:
    """Lines with what differs from run to run (ids, hashes, times, numbers) and column
    padding made equal."""
    text = re.sub(r"evt_[0-9a-f]{32}", "evt_ID", text)
    text = re.sub(r"\b[0-9a-f]{64}\b", "HASH", text)
    text = re.sub(r"\d+", "0", text)
    return [re.sub(r"[ ─━]+", " ", line).strip() for line in text.strip().splitlines()]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any gateway, Claude or secret setting of the test run."""
    kept = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("EVENTGATE_", "ANTHROPIC_", "GITHUB_", "AWS_", "COLUMNS"))
    }
    return kept | extra


def assignments(command: str) -> dict[str, str]:
    """`export A=b` and `A=b B=c cmd` assignments of a shell block, comments dropped."""
    found: dict[str, str] = {}
    for line in command.splitlines():
        for word in shlex.split(line, comments=True):
            name, sep, value = word.partition("=")
            if sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
                found[name] = value
    return found


def eventgate() -> list[str]:
    """The `eventgate` command `make run` installs next to this interpreter (.venv/bin)."""
    script = Path(sys.executable).parent / "eventgate"
    return [str(script)] if script.exists() else [sys.executable, "-m", "app"]


@dataclass
class Running:
    url: str
    fake_url: str
    token: str
    gateway_log: Path


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    """Terminals 1 and 2 of the walkthrough, on free ports."""
    steps = walkthrough()
    start = steps.commands[0]
    assert "make fake-claude" in start and "make run" in start
    makefile = (ROOT / "Makefile").read_text()
    # What the two make targets run, so the processes below are the ones the README starts.
    assert f"-m eventgate_dev.fake_anthropic --port {FAKE_PORT}" in makefile
    assert "$(BIN)/eventgate serve" in makefile
    env = assignments(start)
    token = env["EVENTGATE_ADMIN_TOKEN"]
    fake_port, port = free_port(), free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "eventgate_dev.fake_anthropic", "--port", str(fake_port)],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert fake.stdout is not None
    fake_lines = fake.stdout.readline() + fake.stdout.readline()
    fake_url = f"http://127.0.0.1:{fake_port}"
    env["ANTHROPIC_BASE_URL"] = env["ANTHROPIC_BASE_URL"].replace(FAKE_PORT, str(fake_port))
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            [*eventgate(), "serve", "--port", str(port)],
            env=clean_env(**env),
            cwd=tmp_path,  # the default SQLite file lands here, not in the checkout
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        assert fake_lines == steps.outputs[0].replace(FAKE_PORT, str(fake_port))
        deadline = time.monotonic() + 60
        while "is ready" not in log.read_text():
            assert gateway.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield Running(url=url, fake_url=fake_url, token=token, gateway_log=log)
    finally:
        for process in (gateway, fake):
            process.terminate()
            process.wait(timeout=30)


@pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("curl")), reason="needs openssl and curl"
)
def test_the_walkthrough_ends_on_claudes_decision(running: Running) -> None:
    steps = walkthrough()
    port = running.url.rsplit(":", 1)[1]
    ready = [line for line in running.gateway_log.read_text().splitlines() if "is ready" in line]
    assert ready == [steps.outputs[1].strip().replace(README_PORT, port)]

    send = steps.commands[1]
    sent = subprocess.run(
        ["bash", "-c", send.replace(README_PORT, port)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=30,
    )
    answer = orjson.loads(sent.stdout)
    [shown] = re.findall(r"^# (\{.*\})$", send, re.M)
    assert normalized(sent.stdout) == normalized(shown)
    event_id = answer["event_id"]

    # The console: sign in with the token, the event is in the list, its page has the decision.
    with httpx.Client(base_url=running.url, follow_redirects=True, timeout=10) as browser:
        form = browser.get("/console/sign-in").text
        [csrf] = re.findall(r'name="csrf" value="([^"]+)"', form)
        events = browser.post(
            "/console/sign-in",
            data={"csrf": csrf, "next": "/console/events", "token": running.token},
        )
        assert f'href="/console/events/{event_id}"' in events.text
        page = ""
        deadline = time.monotonic() + 30
        while "held in the outbox" not in page:
            assert time.monotonic() < deadline, page
            time.sleep(0.2)
            page = browser.get(f"/console/events/{event_id}").text
        assert "Claude attempts (1)" in page
        assert "publishAlert" in page

    show = steps.commands[2]
    assert assignments(show)["EVENTGATE_ADMIN_TOKEN"] == running.token
    [line] = [line for line in show.splitlines() if "events show" in line]
    words = shlex.split(line)
    assert words[0] == ".venv/bin/eventgate"
    words = eventgate() + [
        event_id if re.fullmatch(r"evt_[0-9a-f]+", w) else w.replace(README_PORT, port)
        for w in words[1:]
    ]
    printed = subprocess.run(
        words,
        capture_output=True,
        text=True,
        env=clean_env(EVENTGATE_ADMIN_TOKEN=running.token),
        timeout=30,
    )
    assert printed.returncode == 0, printed.stderr
    assert normalized(printed.stdout) == normalized(steps.outputs[2])

"""No fail-open or guessable credentials.

- Config validation refuses empty or short secrets, tokens and basic-auth passwords (every
  space-separated value; for Standard Webhooks ``whsec_`` secrets, the decoded key), naming
  the key: a ``whsec_`` secret with an empty key used to accept a signature made with an
  empty key.
- ``eventgate serve|api|worker`` refuse to listen on a non-loopback address while any
  credential is one of the built-in development values (or compose's default admin token),
  unless ``EVENTGATE_ALLOW_DEV_SECRETS=true``; they warn whenever such values are in use; and
  they refuse an admin token shorter than 16 characters on any address.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from app.config import ConfigError, load_config, parse_config
from app.secret_policy import development_keys, development_secrets, is_loopback, refusal
from app.settings import Settings
from tests.support import free_port

LONG = "a-sixteen-char-s"  # exactly 16
ANY_ADDRESS = "0.0.0.0"  # noqa: S104 (what the refusal is about)
SHORT = LONG[:-1]


def _whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


def _config(source: str) -> str:
    return f"""
sources:
  s: {source}
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""


@pytest.mark.parametrize(
    ("source", "key"),
    [
        (f"{{type: github, secret: {SHORT}, pipeline: p}}", "sources.s.secret"),
        (f"{{type: github, secret: '{LONG} {SHORT}', pipeline: p}}", "sources.s.secret"),
        (f"{{type: hmac, secret: {SHORT}, pipeline: p}}", "sources.s.secret"),
        (f"{{type: alertmanager, token: {SHORT}, pipeline: p}}", "sources.s.token"),
        (f"{{type: token, token: '{SHORT} {LONG}', pipeline: p}}", "sources.s.token"),
        (f"{{type: cloudevents, token: '', secret: {LONG}, pipeline: p}}", "sources.s.token"),
        (
            f"{{type: alertmanager, basic_auth: {{username: am, password: {SHORT}}}, pipeline: p}}",
            "sources.s.basic_auth.password",
        ),
        ("{type: standard-webhooks, secret: whsec_, pipeline: p}", "sources.s.secret"),
        (
            f"{{type: standard-webhooks, secret: {_whsec(b'k' * 15)}, pipeline: p}}",
            "sources.s.secret",
        ),
        ("{type: standard-webhooks, secret: whsec_not*base64, pipeline: p}", "sources.s.secret"),
        (f"{{type: grafana, secret: {SHORT}, token: {LONG}, pipeline: p}}", "sources.s.secret"),
    ],
)
def test_short_or_empty_credentials_are_config_errors(source: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(source), env={})
    (error,) = info.value.errors
    assert error.startswith(f"{key}: "), error
    assert "16" in error
    assert SHORT not in error  # the error names the key, never the value


@pytest.mark.parametrize(
    "source",
    [
        f"{{type: github, secret: '{LONG} {LONG}x', pipeline: p}}",
        f"{{type: alertmanager, basic_auth: {{username: am, password: {LONG}}}, pipeline: p}}",
        f"{{type: standard-webhooks, secret: {_whsec(b'k' * 16)}, pipeline: p}}",
        # A non-whsec_ Standard Webhooks secret is used as it is: its length counts.
        f"{{type: standard-webhooks, secret: {LONG}, pipeline: p}}",
    ],
)
def test_credentials_of_16_characters_or_bytes_are_accepted(source: str) -> None:
    parse_config(_config(source), env={})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.10.0.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        (ANY_ADDRESS, False),
        ("::", False),
        ("10.0.0.5", False),
        ("eventgate.example.com", False),
        ("", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_development_values_are_the_built_in_config_defaults() -> None:
    assert {
        "dev-github-secret",
        "dev-alertmanager-token",
        "whsec_ZGV2LXNlbnNvcnMtc2VjcmV0LWRldi1zZW5zb3Jz",
        "change-me-admin-token",
    } <= development_secrets()


# --- the serving commands, as real processes --------------------------------------------

REAL_SECRETS = {
    "GITHUB_WEBHOOK_SECRET": "real-github-secret-0123456789",
    "ALERTMANAGER_TOKEN": "real-alertmanager-token-0123456789",
    "SENSORS_SECRET": _whsec(b"real-sensors-key-0123456789abcdef"),
}


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (*REAL_SECRETS, "EVENTGATE_ADMIN_TOKEN", "EVENTGATE_ALLOW_DEV_SECRETS")
    }
    return env | {
        "EVENTGATE_REDIS_URL": "memory://",
        "EVENTGATE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'eventgate.db'}",
        "EVENTGATE_LOG_FORMAT": "json",
    }


def _run(role: str, host: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", role, "--host", host, "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("role", ["serve", "api", "worker"])
def test_development_secrets_on_a_public_address_refuse_to_start(
    role: str, base_env: dict[str, str]
) -> None:
    done = _run(role, ANY_ADDRESS, base_env)
    assert done.returncode == 2, done.stderr
    assert "sources.github.secret" in done.stderr
    assert "EVENTGATE_ALLOW_DEV_SECRETS" in done.stderr
    assert "dev-github-secret" not in done.stderr + done.stdout


def test_compose_default_admin_token_and_short_tokens_refuse_to_start(
    base_env: dict[str, str],
) -> None:
    real = base_env | REAL_SECRETS
    compose = _run("api", ANY_ADDRESS, real | {"EVENTGATE_ADMIN_TOKEN": "change-me-admin-token"})
    assert compose.returncode == 2, compose.stderr
    assert "EVENTGATE_ADMIN_TOKEN" in compose.stderr
    short = _run("api", "127.0.0.1", real | {"EVENTGATE_ADMIN_TOKEN": "too-short"})
    assert short.returncode == 2, short.stderr
    assert "EVENTGATE_ADMIN_TOKEN" in short.stderr and "16" in short.stderr
    assert "too-short" not in short.stderr


class Started:
    def __init__(self, host: str, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app", "api", "--host", host, "--port", str(self.port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(self.log.read_text())

    def warnings(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        events = [orjson.loads(line) for line in lines if line.startswith("{")]
        return [e for e in events if e["event"] == "development_secrets_in_use"]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Started]]:
    running: list[Started] = []
    yield running
    for process in running:
        process.proc.terminate()
        process.proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("host", "extra"),
    [("127.0.0.1", {}), (ANY_ADDRESS, {"EVENTGATE_ALLOW_DEV_SECRETS": "true"})],
)
def test_development_secrets_start_with_a_warning_where_allowed(
    host: str,
    extra: dict[str, str],
    base_env: dict[str, str],
    started: list[Started],
    tmp_path: Path,
) -> None:
    process = Started(host, base_env | extra, tmp_path / "gateway.log")
    started.append(process)
    process.wait_healthy()
    (warning,) = process.warnings()
    assert warning["level"] == "warning"
    assert "sources.github.secret" in warning["keys"]
    assert "dev-github-secret" not in process.log.read_text()


def test_real_secrets_start_without_a_warning(
    base_env: dict[str, str], started: list[Started], tmp_path: Path
) -> None:
    env = base_env | REAL_SECRETS | {"EVENTGATE_ADMIN_TOKEN": "a-real-admin-token-0123456789"}
    process = Started(ANY_ADDRESS, env, tmp_path / "gateway.log")
    started.append(process)
    process.wait_healthy()
    assert process.warnings() == []


def test_docker_compose_is_a_declared_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """`docker compose up` still starts: its gateways say they are a local demo."""
    compose = yaml.safe_load((Path(__file__).parents[2] / "docker-compose.yml").read_text())
    gateway = compose["services"]["gateway-1"]
    env = {
        key: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))
        for key, value in gateway["environment"].items()
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    config = load_config(None, env=env)
    assert development_keys(config, settings.admin_token)  # the demo's public values ...
    assert refusal(config=config, settings=settings, host=env["EVENTGATE_HOST"]) is None
    without = Settings(allow_dev_secrets=False)
    assert refusal(config=config, settings=without, host=env["EVENTGATE_HOST"]) is not None

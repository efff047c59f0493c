"""Gateway processes wired to dependencies the test can break (see ``faults.py``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.hardening.raw_http import CONFIG as RAW_HTTP_CONFIG
from tests.support import GatewayProcess, SnsFixture, gateway_config, gateway_env

# Distinctive secrets: a test greps every log line, audit row and error body for them.
WEBHOOK_SECRET = "hardening-webhook-secret-7f3a9c"
ANTHROPIC_KEY = "sk-ant-hardening-key-5d21e8"
AWS_KEY_ID = "AKIAHARDENING7TEST42"
AWS_SECRET = "hardening-aws-secret-key-0b9e77"
SECRETS = (WEBHOOK_SECRET, ANTHROPIC_KEY, AWS_KEY_ID, AWS_SECRET)


@pytest.fixture
def start_gateway(
    tmp_path: Path,
    sns: SnsFixture,
    fake_claude: FakeAnthropicServer,
    redis_prefix: str,
    moto_endpoint: str,
) -> Iterator[Callable[..., GatewayProcess]]:
    """``start(name, redis_url=..., database_url=..., sns_endpoint=..., **env)``; every
    process is stopped at the end and its log checked for secrets."""
    config = tmp_path / "eventgate.yaml"
    config.write_text(gateway_config(sns.topic_arn, secret="${HARDENING_SECRET}"))
    started: list[GatewayProcess] = []

    def start(
        name: str, *, redis_url: str, database_url: str, sns_endpoint: str = "", **env: Any
    ) -> GatewayProcess:
        process = GatewayProcess(
            log_path=tmp_path / f"{name}.log",
            env=gateway_env(
                config=config,
                redis_url=redis_url,
                redis_prefix=redis_prefix,
                database_url=database_url,
                claude_url=fake_claude.base_url,
                sns_endpoint=sns_endpoint or moto_endpoint,
                HARDENING_SECRET=WEBHOOK_SECRET,
                EVENTGATE_LEASE_TTL_MS="2000",
                EVENTGATE_RELAY_POLL_SECONDS="0.5",
                ANTHROPIC_API_KEY=ANTHROPIC_KEY,
                AWS_ACCESS_KEY_ID=AWS_KEY_ID,
                AWS_SECRET_ACCESS_KEY=AWS_SECRET,
                **{k.upper(): str(v) for k, v in env.items()},
            ),
        )
        started.append(process)
        return process

    yield start
    hung = []
    for process in started:
        if process.proc.poll() is None:
            try:
                process.stop(timeout=40)
            except subprocess.TimeoutExpired:
                hung.append(process.log_path.name)
                process.kill()
    for process in started:
        text = process.log_path.read_text()
        leaked = [s for s in SECRETS if s in text]
        assert not leaked, f"{process.log_path.name} leaks {leaked}"
    assert not hung, f"did not stop within 40 s of SIGTERM: {hung}"


@pytest.fixture
def start_api(tmp_path: Path, redis_prefix: str) -> Iterator[Callable[..., GatewayProcess]]:
    """``start_api(**env)``: an ``api`` process on the raw-HTTP config, in-memory Redis and
    SQLite, ready; stopped at the end."""
    config = tmp_path / "eventgate.yaml"
    config.write_text(RAW_HTTP_CONFIG)
    running: list[GatewayProcess] = []

    def launch(**env: str) -> GatewayProcess:
        process = GatewayProcess(
            role="api",
            log_path=tmp_path / f"gateway-{len(running)}.log",
            env={
                "EVENTGATE_CONFIG": str(config),
                "EVENTGATE_REDIS_URL": "memory://",
                "EVENTGATE_REDIS_PREFIX": redis_prefix,
                "EVENTGATE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'eventgate.db'}",
                **env,
            },
        )
        running.append(process)
        return process.wait_ready(path="/healthz")

    yield launch
    for process in running:
        process.stop()

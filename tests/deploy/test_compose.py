"""No Docker engine runs here: parse docker-compose.yml, the Dockerfile and nginx.conf and
check that they agree with each other and with the settings, the CLI and the config."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from app.cli import app as cli_app
from app.config import builtin_config_text, load_config
from app.settings import Settings
from eventgate_dev.sns_dev import QUEUE, TOPICS

ROOT = Path(__file__).resolve().parents[2]
GATEWAYS = ("gateway-1", "gateway-2")
EXPECTED = {"redis", "postgres", "sns", "sns-init", "migrate", "lb", "subscriber", *GATEWAYS}
_DEFAULT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _services(compose: dict[str, Any]) -> dict[str, Any]:
    services: dict[str, Any] = compose["services"]
    return services


def _env(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment as a container would see it with nothing set on the host."""
    return {
        k: _DEFAULT.sub(lambda m: m.group(2) or "", str(v))
        for k, v in service["environment"].items()
    }


def _allowed_eventgate_names() -> set[str]:
    fields = {f"EVENTGATE_{name.upper()}" for name in Settings.model_fields}
    cli = set(re.findall(r'envvar="(EVENTGATE_[A-Z_]+)"', (ROOT / "app/cli.py").read_text()))
    config = set(re.findall(r"\$\{(EVENTGATE_[A-Z_]+)", builtin_config_text()))
    return fields | cli | config


def test_every_service_is_there(compose: dict[str, Any]) -> None:
    assert set(_services(compose)) >= EXPECTED


def test_redis_persists_with_aof_and_postgres_has_a_volume(compose: dict[str, Any]) -> None:
    redis, postgres = _services(compose)["redis"], _services(compose)["postgres"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "healthcheck" in redis
    assert "healthcheck" in postgres
    assert {"redis-data", "postgres-data"} <= set(compose["volumes"])


def test_gateway_env_names_are_real_settings(compose: dict[str, Any]) -> None:
    allowed = _allowed_eventgate_names()
    assert {"EVENTGATE_REDIS_URL", "EVENTGATE_PORT", "EVENTGATE_ALERTS_TOPIC_ARN"} <= allowed
    assert "EVENTGATE_REDIS" not in allowed  # the check can fail
    for name in (*GATEWAYS, "migrate"):
        env = _env(_services(compose)[name])
        unknown = {k for k in env if k.startswith("EVENTGATE_")} - allowed
        assert not unknown, f"{name}: {unknown} are neither settings, CLI nor config variables"


def test_gateway_env_builds_valid_settings_and_config(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = _services(compose)
    env = _env(services["gateway-1"])
    assert env == _env(services["gateway-2"])
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.auto_migrate is False  # the migrate service does it, once
    assert settings.admin_token
    assert settings.log_format == "json"
    redis = urlparse(settings.redis_url)
    assert redis.hostname == "redis"
    assert redis.port == 6379
    db = urlparse(settings.database_url)
    pg = services["postgres"]["environment"]
    assert db.scheme == "postgresql+asyncpg"
    assert (db.hostname, db.port) == ("postgres", 5432)
    assert (db.username, db.password, db.path) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        "/" + pg["POSTGRES_DB"],
    )
    assert _env(services["migrate"])["EVENTGATE_DATABASE_URL"] == settings.database_url
    assert urlparse(env["AWS_ENDPOINT_URL_SNS"]).hostname == "sns"
    assert urlparse(env["ANTHROPIC_BASE_URL"]).hostname == "fake-claude"
    # The built-in config picks up the topics sns-init creates.
    config = load_config(None, env=env)
    arns = {tool.topic_arn for tool in config.tools.values()}
    assert arns == {f"arn:aws:sns:us-east-1:123456789012:{name}" for name in TOPICS}


def test_start_order_migrates_and_creates_topics_first(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in GATEWAYS:
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert depends["sns-init"]["condition"] == "service_completed_successfully"
        assert depends["redis"]["condition"] == "service_healthy"
        assert depends["postgres"]["condition"] == "service_healthy"
        assert services["lb"]["depends_on"][name]["condition"] == "service_healthy"
    assert services["migrate"]["command"] == ["eventgate", "migrate"]
    assert services["subscriber"]["depends_on"]["sns-init"]["condition"] == (
        "service_completed_successfully"
    )


def test_commands_exist(compose: dict[str, Any]) -> None:
    subcommands = {c.name or c.callback.__name__ for c in cli_app.registered_commands if c.callback}
    for name, service in _services(compose).items():
        command = service.get("command") or []
        if command[:1] == ["eventgate"]:
            assert command[1] in subcommands, name
        if command[:2] == ["python", "-m"]:
            importlib.import_module(command[2])
        if service.get("image") == "eventgate:local":
            assert service["build"] == "."


def test_one_port_in_front_of_two_replicas(compose: dict[str, Any]) -> None:
    services = _services(compose)
    assert services["lb"]["ports"] == ["8080:8080"]
    assert all("ports" not in services[name] for name in GATEWAYS)  # only via the balancer
    nginx = (ROOT / "deploy/nginx.conf").read_text()
    upstream = re.findall(r"^\s*server\s+([\w-]+):(\d+)", nginx, re.MULTILINE)
    port = _env(services["gateway-1"])["EVENTGATE_PORT"]
    assert sorted(upstream) == [(name, port) for name in GATEWAYS]
    assert re.search(r"listen\s+8080;", nginx)
    assert any(v.startswith("./deploy/nginx.conf:") for v in services["lb"]["volumes"])


def test_the_subscriber_reads_the_queue_sns_init_creates(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in ("sns-init", "subscriber"):
        assert urlparse(_env(services[name])["AWS_ENDPOINT_URL"]).hostname == "sns"
    assert QUEUE.endswith(".fifo")
    assert all(topic.endswith(".fifo") for topic in TOPICS)

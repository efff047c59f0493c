"""An in-process gateway (uvicorn in a thread) with the admin API on, plus seeded rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
import structlog

from app.config import parse_config
from app.main import Role, create_app
from app.settings import Settings
from tests.support import ServerThread
from tests.support import gateway_config as support_gateway_config

ADMIN_TOKEN = "admin-token-0123456789abcdef"
GITHUB_SECRET = "admin-tests-github-secret"


def gateway_config(topic_arn: str | None = None) -> str:
    return support_gateway_config(topic_arn, secret=GITHUB_SECRET)


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """Gateways configure structlog onto this test's captured stderr; undo it afterwards so a
    later test never writes to a closed capture."""
    yield
    structlog.reset_defaults()


GatewayFactory = Callable[..., AbstractContextManager[ServerThread]]


@pytest.fixture
def gateway_factory(redis_url: str, redis_prefix: str, database_url: str) -> GatewayFactory:
    @contextmanager
    def start(
        *,
        role: Role = "api",
        admin_token: str | None = ADMIN_TOKEN,
        topic_arn: str | None = None,
        **overrides: object,
    ) -> Iterator[ServerThread]:
        settings = Settings(
            redis_url=redis_url,
            redis_prefix=redis_prefix,
            database_url=database_url,
            admin_token=admin_token,
            auto_migrate=False,
            partitions=4,
            log_format="json",
            relay_poll_seconds=0.1,
            **overrides,  # type: ignore[arg-type]
        )
        app = create_app(settings, parse_config(gateway_config(topic_arn)), role=role)
        with ServerThread(app) as server:
            yield server

    return start


@pytest.fixture
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

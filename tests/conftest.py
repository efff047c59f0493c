"""Fixtures: real Redis and Postgres when reachable (fakeredis / SQLite otherwise, said so
in the header), moto server for SNS/SQS, and a fake Anthropic Messages API over HTTP."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from moto.server import ThreadedMotoServer
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.queue.connection import connect_redis, open_redis
from app.settings import Settings
from app.store.db import create_engine, session_factory
from app.store.migrate import upgrade_head
from eventgate_dev.fake_anthropic import FakeAnthropicServer, FakeBehaviour
from tests.redis_cluster import LocalCluster, require_cluster_tools
from tests.support import SnsFixture, free_port, reachable

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
HAVE_REDIS = reachable("127.0.0.1", 6379) if "TEST_REDIS_URL" not in os.environ else True
HAVE_POSTGRES = reachable("127.0.0.1", 5432)

# SDKs must never reach a real cloud from tests.
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }
)
os.environ.pop("ANTHROPIC_API_KEY", None)
os.environ.pop("ANTHROPIC_BASE_URL", None)


def pytest_report_header() -> list[str]:
    return [
        f"redis: {'real ' + REDIS_URL if HAVE_REDIS else 'fakeredis (memory://): none reachable'}",
        f"database: {'real PostgreSQL' if HAVE_POSTGRES else 'SQLite: no PostgreSQL reachable'}",
    ]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cluster_too: run the test on a real local Redis Cluster as well (``redis_cluster``)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``cluster_too`` test runs twice: on the usual Redis and on the session's cluster."""
    marked = metafunc.definition.get_closest_marker("cluster_too") is not None
    if marked and "redis_backend" in metafunc.fixturenames:
        metafunc.parametrize("redis_backend", ["one-redis", "cluster"], indirect=True)


@pytest.fixture
def redis_backend(request: pytest.FixtureRequest) -> str:
    """``cluster`` for a ``cluster_too`` test's second run; ``one-redis`` otherwise."""
    return str(getattr(request, "param", "one-redis"))


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three masters on free ports, for the session (``tests/redis_cluster.py``). Skipped
    without redis-server, except in CI, where that is a failure."""
    require_cluster_tools()
    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def redis_url(redis_backend: str, request: pytest.FixtureRequest) -> str:
    if redis_backend == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
    return REDIS_URL if HAVE_REDIS else "memory://"


@pytest.fixture
def on_cluster(redis_backend: str) -> bool:
    return redis_backend == "cluster"


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards (the Redis is shared)."""
    prefix = f"egtest-{uuid.uuid4().hex[:10]}"
    yield prefix
    if HAVE_REDIS:
        from redis import Redis

        client = Redis.from_url(REDIS_URL)
        try:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        finally:
            client.close()


@pytest.fixture
async def redis(redis_url: str, redis_prefix: str, on_cluster: bool) -> AsyncIterator[Redis]:
    """An async client of this test's Redis (a cluster client on the cluster); the test's
    keys go with ``redis_prefix``."""
    client = await open_redis(redis_url, cluster=True) if on_cluster else connect_redis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def _postgres_database() -> Iterator[str | None]:
    if not HAVE_POSTGRES:
        yield None
        return
    import asyncpg

    name = f"eventgate_test_{uuid.uuid4().hex[:10]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN_URL)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    url = f"{url}/{name}"
    upgrade_head(url)
    yield url
    asyncio.run(admin(f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture
def database_url(_postgres_database: str | None, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database: the session's Postgres (tables emptied) or a new SQLite."""
    if _postgres_database is None:
        url = f"sqlite+aiosqlite:///{tmp_path / 'eventgate.db'}"
        upgrade_head(url)
        yield url
        return

    async def truncate() -> None:
        engine = create_engine(_postgres_database)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "TRUNCATE outbox, llm_calls, dead_letters, shadow_decisions, windows,"
                    " batch_requests, events RESTART IDENTITY CASCADE"
                )
            )
        await engine.dispose()

    asyncio.run(truncate())
    yield _postgres_database


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(database_url)
    yield session_factory(engine)
    await engine.dispose()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def sns(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> SnsFixture:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SNS", moto_endpoint)
    return SnsFixture(moto_endpoint, f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture
def fake_claude(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropicServer]:
    server = FakeAnthropicServer(FakeBehaviour()).start()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key-not-real")
    yield server
    server.stop()


@pytest.fixture
def make_settings(redis_url: str, redis_prefix: str, database_url: str) -> Any:
    """Settings for an in-process gateway on this test's Redis prefix and database."""

    def build(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "redis_prefix": redis_prefix,
            "database_url": database_url,
            "auto_migrate": False,
            "log_format": "json",
        }
        values.update(overrides)
        return Settings(**values)

    return build

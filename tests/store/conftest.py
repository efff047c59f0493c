"""A migrated database for the store's tests: SQLite, and PostgreSQL when reachable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import create_engine
from app.store.migrate import upgrade_head


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        sqlite_url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
        upgrade_head(sqlite_url)
        return sqlite_url
    found: str = request.getfixturevalue("database_url")
    if not found.startswith("postgresql"):
        pytest.skip("PostgreSQL is not reachable here (SQLite was tested)")
    return found


@pytest.fixture
async def pg_engine(url: str) -> AsyncIterator[AsyncEngine]:
    """The migrated database's engine, PostgreSQL only: the driver's connections are
    asyncpg's."""
    if not url.startswith("postgresql"):
        pytest.skip("the driver's pool is PostgreSQL's")
    made = create_engine(url)
    yield made
    await made.dispose()

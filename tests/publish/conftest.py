"""An aioboto3 SNS client on moto, and the ways a relay writes a round, shared by the relay
tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aioboto3
import pytest

from app.store.db import create_engine
from app.store.driver import DriverPool
from tests.support import SnsFixture


@pytest.fixture
async def sns_client(sns: SnsFixture, moto_endpoint: str) -> AsyncIterator[object]:
    async with aioboto3.Session().client(
        "sns", region_name="us-east-1", endpoint_url=moto_endpoint
    ) as client:
        yield client


@pytest.fixture(params=["transaction", "driver"])
async def round_writes(
    request: pytest.FixtureRequest, database_url: str
) -> AsyncIterator[DriverPool | None]:
    """How the relay writes a round: a transaction through SQLAlchemy (None), or one
    statement on the driver's pool (PostgreSQL only, as ``serve`` runs it there)."""
    if request.param == "transaction":
        yield None
        return
    if not database_url.startswith("postgresql"):
        pytest.skip("the driver's pool is PostgreSQL's")
    engine = create_engine(database_url)
    driver = await DriverPool.open(engine.url, engine.dialect, size=2)
    try:
        yield driver
    finally:
        await driver.close()
        await engine.dispose()

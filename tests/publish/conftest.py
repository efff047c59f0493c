"""An aioboto3 SNS client on moto, shared by the relay tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aioboto3
import pytest

from tests.support import SnsFixture


@pytest.fixture
async def sns_client(sns: SnsFixture, moto_endpoint: str) -> AsyncIterator[object]:
    async with aioboto3.Session().client(
        "sns", region_name="us-east-1", endpoint_url=moto_endpoint
    ) as client:
        yield client

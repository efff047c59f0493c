"""The capacity benchmark's parts: the SNS stand-in speaks what the gateway's SNS client
sends, and the model's arithmetic says what it should."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aioboto3
import aiohttp
import pytest
from aiohttp import web

from app.publish.sns import OutgoingMessage, Published, SnsPublisher
from bench.capacity import MAX_PARTITIONS, Limits, Run, Sample, ceilings, needs
from bench.fake_sns import build_app


@pytest.fixture
async def fake_sns() -> AsyncIterator[str]:
    runner = web.AppRunner(build_app(latency=0.0))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_the_stand_in_answers_the_gateways_publisher(fake_sns: str) -> None:
    arn = "arn:aws:sns:us-east-1:123456789012:t.fifo"
    session = aioboto3.Session(
        aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1"
    )
    async with session.client("sns", endpoint_url=fake_sns) as client:
        publisher = SnsPublisher(client)
        await publisher.check(arn)
        messages = [
            OutgoingMessage(arn, f'{{"n": {n}}}', f"g{n % 2}", f"d{n}", {"tool": "t"})
            for n in range(3)
        ] + [OutgoingMessage(arn, "{}", "g0", "d0", {})]
        results = await publisher.publish_batch(messages)
        assert all(isinstance(r, Published) for r in results), results
    async with aiohttp.ClientSession() as http, http.get(fake_sns + "/_stats") as answer:
        stats = await answer.json()
    # GetTopicAttributes and PublishBatch: two calls; the repeated dedup id is counted.
    assert stats == {"calls": 2, "messages": 4, "body_bytes": 26, "repeated_dedup_ids": 1}


def _run(**per_event: float) -> Run:
    return Run(1, 600, 6.0, Sample(**per_event), Sample(), 100.0, 40.0)


def test_the_model_names_the_part_that_saturates_first() -> None:
    model = _run(
        gateway_cpu=0.002, redis_cpu=0.0004, pg_cpu=0.0005, sns_messages=1.0, claude_calls=1.0
    )
    ranked = ceilings(model, Limits(claude_rpm=60_000_000, claude_itpm=1e12, claude_otpm=1e12))
    assert ranked[0][0].startswith("one gateway process")
    assert ranked[0][1] == pytest.approx(350)
    ranked = ceilings(model, Limits(claude_rpm=4_000, claude_itpm=1e12, claude_otpm=1e12))
    name, rate = ranked[0]
    assert name == "Claude requests at 4,000 RPM"
    assert rate == pytest.approx(4000 / 60)


def test_the_model_says_when_partitions_run_out() -> None:
    model = _run(gateway_cpu=0.01, redis_cpu=0.0004, sns_messages=1.0, claude_calls=1.0)
    rows = needs(model, Limits(4_000, 2e6, 4e5))
    by_rate = {row.split(" | ")[0].strip("| "): row for row in rows[2:]}
    assert " | 15 | 15 | " in by_rate["1,000/s"]  # 1000 x 10 ms at 70% of a core
    assert f"1,429 (over the maximum, {MAX_PARTITIONS})" in by_rate["100,000/s"]

"""A readiness probe, a scrape's refresh or the SNS topics check cancelled as a check ends
stops there: the checks are bounded with ``asyncio.timeout``, which keeps the cancel (Python
3.11's ``wait_for`` dropped it and ran the next check)."""

from __future__ import annotations

import asyncio
from typing import cast

from app.observability.health import Health
from app.publish.sns import SnsPublisher
from app.roles import _topics


async def test_a_readiness_probe_cancelled_as_a_check_ends_runs_no_further_check() -> None:
    health = Health()
    probe: list[asyncio.Task[object]] = []
    ran: list[str] = []

    async def cancels_its_probe() -> str:
        probe[0].cancel()  # the probe's client went away just as this check answered
        return "ok"

    async def later() -> str:
        await asyncio.sleep(0)  # a check's first I/O
        ran.append("later")
        return "ok"

    health.check("first", cancels_its_probe, required=True)
    health.check("later", later, required=True)
    probe.append(asyncio.create_task(health.readiness()))
    done, _ = await asyncio.wait(probe, timeout=2)
    assert done == set(probe)
    assert probe[0].cancelled(), "the cancel was dropped and the probe answered"
    assert ran == []


async def test_a_refresh_cancelled_as_a_hook_ends_runs_no_further_hook() -> None:
    health = Health()
    refresh: list[asyncio.Task[object]] = []
    ran: list[str] = []

    async def cancels_its_refresh() -> None:
        refresh[0].cancel()

    async def later() -> None:
        await asyncio.sleep(0)
        ran.append("later")

    health.before_scrape.extend([cancels_its_refresh, later])
    refresh.append(asyncio.create_task(health.refresh()))
    done, _ = await asyncio.wait(refresh, timeout=2)
    assert done == set(refresh)
    assert refresh[0].cancelled(), "the cancel was dropped and the refresh went on"
    assert ran == []


async def test_the_topics_check_cancelled_as_a_topic_answers_checks_no_further_topic() -> None:
    """The SNS readiness check bounds each topic's check on its own (2 s): with
    ``asyncio.timeout``, a probe cancelled as one topic answers stops there; 3.11's
    ``wait_for`` dropped that cancel and went on to check the next topic."""
    checking: list[asyncio.Task[object]] = []
    checked: list[str] = []

    class Publisher:
        async def check(self, arn: str) -> None:
            await asyncio.sleep(0)  # a check's first I/O
            checked.append(arn)
            if arn == "first":
                checking[0].cancel()  # the probe went away just as this topic answered

    checking.append(
        asyncio.create_task(_topics(cast(SnsPublisher, Publisher()), ["first", "second"]))
    )
    done, _ = await asyncio.wait(checking, timeout=2)
    assert done == set(checking)
    assert checking[0].cancelled(), "the cancel was dropped and the check went on"
    assert checked == ["first"]

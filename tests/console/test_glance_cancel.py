"""The console's health page reads each figure within ``READ_SECONDS``; a page cancelled as a
figure is read (its client went away) stops there and reads no further figure. The bound is
``asyncio.timeout``: Python 3.11's ``wait_for`` dropped a cancel that arrived as the reading
finished, and the page went on reading."""

from __future__ import annotations

import asyncio

import pytest

import app.console.glance as glance_module
from app.console.glance import Glance, _read


async def test_a_page_cancelled_as_a_figure_is_read_reads_no_further_figure() -> None:
    page: list[asyncio.Task[None]] = []
    read: list[str] = []

    async def cancels_its_page() -> int:
        page[0].cancel()
        return 1

    async def later() -> int:
        await asyncio.sleep(0)  # a reading's first I/O
        read.append("later")
        return 2

    async def render(glance: Glance) -> None:
        await _read(glance, "first", cancels_its_page())
        await _read(glance, "later", later())

    glance = Glance()
    page.append(asyncio.create_task(render(glance)))
    done, _ = await asyncio.wait(page, timeout=2)
    assert done == set(page)
    assert page[0].cancelled(), "the cancel was dropped and the page went on"
    assert read == []
    assert glance.unavailable == {}


async def test_a_figure_that_hangs_is_listed_unavailable_and_the_next_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(glance_module, "READ_SECONDS", 0.05)
    glance = Glance()
    hung = await _read(glance, "hung", asyncio.sleep(30, result="late"))
    answered = await _read(glance, "next", asyncio.sleep(0, result="ok"))
    assert hung is None
    assert glance.unavailable == {"hung": "TimeoutError"}
    assert answered == "ok"

"""Body reads under ``ReadDeadlines``: one timer for every read, not one per request.

A read that outlasts its seconds is ``RequestTimeout`` (408); a read that completes leaves
nothing behind; a cancel from elsewhere (shutdown, a client gone) stays a cancel, also when
the deadline cut the same read; a new event loop starts afresh. The 408 over a real socket,
with other requests served meanwhile, is ``tests/hardening/test_body_limits.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request
from starlette.types import Message

from app.ingest.budget import BodyBudget
from app.ingest.deadlines import ReadDeadlines
from app.ingest.exceptions import RequestTimeout
from app.ingest.router import read_body
from app.sources.admission import Body


class NoCheck:
    def update(self, chunk: Body) -> None:
        pass

    async def finish(self, body: Body) -> None:
        pass


def _request(chunks: list[bytes], *, gate: asyncio.Event | None = None) -> Request:
    """A request whose body is ``chunks``; with ``gate``, the last one waits for it."""

    async def receive() -> Message:
        chunk = chunks.pop(0)
        if not chunks and gate is not None:
            await gate.wait()
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


async def _read(request: Request, deadlines: ReadDeadlines) -> Body:
    with BodyBudget(1 << 20).hold() as reservation:
        return await read_body(
            request, 1 << 20, deadlines=deadlines, reservation=reservation, check=NoCheck()
        )


def test_a_read_past_its_deadline_is_a_timeout_and_the_others_are_read() -> None:
    async def run() -> None:
        deadlines = ReadDeadlines(0.05)
        stalled = asyncio.create_task(
            _read(_request([b"{", b"}"], gate=asyncio.Event()), deadlines)
        )
        await asyncio.sleep(0.01)
        quick = [await _read(_request([b'{"n": %d}' % n]), deadlines) for n in range(100)]
        assert quick[99] == b'{"n": 99}'
        with pytest.raises(RequestTimeout, match=r"within 0\.05s"):
            await stalled
        assert deadlines.pending == 0
        assert not stalled.cancelled()

    asyncio.run(run())


def test_reads_that_complete_arm_one_timer_between_them() -> None:
    """asyncio.timeout armed (and cancelled) a timer per read: 1,000 here."""

    async def run() -> int:
        loop = asyncio.get_running_loop()
        armed = 0
        call_at = loop.call_at

        def counting(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            nonlocal armed
            armed += 1
            return call_at(when, callback, *args)

        loop.call_at = counting  # type: ignore[method-assign,assignment]
        deadlines = ReadDeadlines(30)
        for _ in range(1000):
            assert await _read(_request([b"{", b"}"]), deadlines) == b"{}"
        assert deadlines.pending == 0
        return armed

    assert asyncio.run(run()) == 1


def test_the_timer_fires_for_the_oldest_read_and_rearms_for_the_next() -> None:
    """Reads started 30 ms apart, each with 60 ms: each is cut at its own deadline, not at
    the first one's and not never."""

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        deadlines = ReadDeadlines(0.06)
        started = loop.time()
        ended: list[float] = []

        async def stalled() -> None:
            with pytest.raises(RequestTimeout):
                await _read(_request([b"{", b"}"], gate=asyncio.Event()), deadlines)
            ended.append(loop.time() - started)

        tasks = []
        for _ in range(3):
            tasks.append(asyncio.create_task(stalled()))
            await asyncio.sleep(0.03)
        await asyncio.gather(*tasks)
        return ended

    ended = asyncio.run(run())
    for n, at in enumerate(ended):
        assert 0.06 + 0.03 * n - 0.005 <= at < 0.06 + 0.03 * n + 0.05, ended


def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    async def run() -> None:
        deadlines = ReadDeadlines(30)
        task = asyncio.create_task(_read(_request([b"{", b"}"], gate=asyncio.Event()), deadlines))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert deadlines.pending == 0

    asyncio.run(run())


class CutThenShutdown(ReadDeadlines):
    """The timer cuts the read and, in the same callback, a shutdown cancels it too."""

    victim: asyncio.Task[Any] | None = None

    def _check(self) -> None:
        super()._check()
        if self.victim is not None:
            self.victim.cancel()


def test_a_cancel_from_elsewhere_with_the_deadline_cut_stays_a_cancel() -> None:
    """The deadline and a shutdown cancel the same read before it runs again: the shutdown's
    cancel is not turned into a 408 and swallowed."""

    async def run() -> None:
        deadlines = CutThenShutdown(0.02)
        task = asyncio.create_task(_read(_request([b"{", b"}"], gate=asyncio.Event()), deadlines))
        deadlines.victim = task
        with pytest.raises(asyncio.CancelledError):
            await task
        assert deadlines.pending == 0

    asyncio.run(run())


def test_a_new_event_loop_starts_afresh() -> None:
    """The first loop closed with the timer armed; reads on the next one still time out."""
    deadlines = ReadDeadlines(0.05)

    async def stalled() -> None:
        await _read(_request([b"{", b"}"], gate=asyncio.Event()), deadlines)

    async def first() -> None:
        task = asyncio.create_task(stalled())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(first())
    with pytest.raises(RequestTimeout):
        asyncio.run(asyncio.wait_for(stalled(), 5))

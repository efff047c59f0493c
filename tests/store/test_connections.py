"""The driver's connections lent one statement at a time (``app/store/connections.py``):
never more than its size, waiters served in turn, nothing lost when a wait ends as a
connection arrives, broken connections never lent again. With stand-in connections; the
driver's tests (``test_driver.py``) run the lender against PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from app.store.connections import ConnectionLender


class FakeConnection:
    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False
        self.terminated = False
        self.in_transaction = False

    def is_closed(self) -> bool:
        return self.closed or self.terminated

    def is_in_transaction(self) -> bool:
        return self.in_transaction

    def terminate(self) -> None:
        self.terminated = True

    async def close(self, *, timeout: float) -> None:
        self.closed = True


class Opener:
    def __init__(self) -> None:
        self.numbers = itertools.count(1)
        self.opened: list[FakeConnection] = []
        self.fail = False
        self.seconds = 0.0

    async def __call__(self) -> Any:
        failing = self.fail  # as the attempt starts
        await asyncio.sleep(self.seconds)  # a connection takes a round trip or more
        if failing:
            raise OSError("connection refused")
        connection = FakeConnection(next(self.numbers))
        self.opened.append(connection)
        return connection


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lender(size: int, **options: Any) -> tuple[ConnectionLender, Opener]:
    opener = Opener()
    # A wait that should have been served fails in two seconds, not the default thirty.
    return ConnectionLender(opener, size=size, **{"wait_seconds": 2.0, **options}), opener


async def test_an_idle_connection_is_lent_again_and_no_more_than_size_are_opened() -> None:
    lender, opener = _lender(2)
    first = await lender.take()
    lender.give_back(first, usable=True)
    assert await lender.take() is first  # no second connection for one at a time
    second = await lender.take()
    assert (len(opener.opened), lender.open_count) == (2, 2)
    waiting = asyncio.ensure_future(lender.take())
    await asyncio.sleep(0.01)
    assert not waiting.done() and len(opener.opened) == 2
    lender.give_back(second, usable=True)
    assert await waiting is second


async def test_waiters_are_served_in_turn() -> None:
    lender, _ = _lender(1)
    held = await lender.take()
    served: list[int] = []

    async def wait(n: int) -> None:
        connection = await lender.take()
        served.append(n)
        await asyncio.sleep(0)
        lender.give_back(connection, usable=True)

    waiting = [asyncio.ensure_future(wait(n)) for n in range(5)]
    await asyncio.sleep(0.01)
    lender.give_back(held, usable=True)
    await asyncio.gather(*waiting)
    assert served == [0, 1, 2, 3, 4]


async def test_a_wait_that_times_out_fails_and_loses_nothing() -> None:
    lender, opener = _lender(1, wait_seconds=0.05)
    held = await lender.take()
    with pytest.raises(TimeoutError):
        await lender.take()
    lender.give_back(held, usable=True)
    assert await lender.take() is held
    assert len(opener.opened) == 1


async def test_a_waiter_cancelled_as_it_is_handed_a_connection_passes_it_on() -> None:
    lender, opener = _lender(1)
    held = await lender.take()
    first = asyncio.ensure_future(lender.take())
    second = asyncio.ensure_future(lender.take())
    await asyncio.sleep(0.01)
    lender.give_back(held, usable=True)  # handed to the first waiter...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second is held
    assert len(opener.opened) == 1 and lender.open_count == 1


async def test_a_broken_connection_is_terminated_and_a_waiter_opens_another() -> None:
    lender, opener = _lender(1)
    broken = await lender.take()
    waiting = asyncio.ensure_future(lender.take())
    await asyncio.sleep(0.01)
    lender.give_back(broken, usable=False)  # its statement was cancelled, say
    fresh = await waiting
    assert broken.terminated and fresh is not broken and lender.open_count == 1
    fresh.in_transaction = True  # never left so by the driver: not lent again
    lender.give_back(fresh, usable=True)
    assert fresh.terminated
    closed = await lender.take()
    closed.closed = True
    lender.give_back(closed, usable=True)
    assert (await lender.take()).number == 4 and len(opener.opened) == 4


async def test_a_connection_idle_too_long_is_closed_when_next_taken() -> None:
    clock = Clock()
    lender, _ = _lender(2, idle_seconds=300, clock=clock)
    connection = await lender.take()
    lender.give_back(connection, usable=True)
    clock.now = 299.0
    assert await lender.take() is connection
    lender.give_back(connection, usable=True)
    clock.now = 599.0
    replaced = await lender.take()
    assert replaced is not connection and connection.terminated and lender.open_count == 1


async def test_a_failed_open_gives_its_room_to_a_waiter() -> None:
    lender, opener = _lender(1)
    opener.fail = True
    opening = asyncio.ensure_future(lender.take())
    waiting = asyncio.ensure_future(lender.take())  # room is taken by the one opening
    await asyncio.sleep(0)
    opener.fail = False  # the first open fails (it read ``fail`` already); the next works
    with pytest.raises(OSError, match="refused"):
        await opening
    assert (await waiting).number == 1 and lender.open_count == 1
    lender.give_back(opener.opened[0], usable=True)
    opener.fail = True
    opener.fail = False
    held = await lender.take()
    lender.give_back(held, usable=False)
    assert lender.open_count == 0
    assert await lender.take() is not held


async def test_a_waiter_cancelled_as_it_is_given_room_passes_the_room_on() -> None:
    lender, _ = _lender(1)
    held = await lender.take()
    first = asyncio.ensure_future(lender.take())
    second = asyncio.ensure_future(lender.take())
    await asyncio.sleep(0.01)
    lender.give_back(held, usable=False)  # room to open one, given to the first waiter...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (await second) is not held and lender.open_count == 1


async def test_closing_closes_the_idle_and_terminates_the_lent_as_they_come_back() -> None:
    lender, _ = _lender(2)
    idle, lent = await lender.take(), await lender.take()
    lender.give_back(idle, usable=True)
    await lender.close()
    assert idle.closed and not lent.is_closed()
    lender.give_back(lent, usable=True)
    assert lent.terminated
    with pytest.raises(Exception, match="closed"):
        await lender.take()


async def test_closing_fails_the_waiters_at_once() -> None:
    lender, _ = _lender(1, wait_seconds=30.0)
    held = await lender.take()
    waiting = asyncio.ensure_future(lender.take())
    await asyncio.sleep(0.01)
    async with asyncio.timeout(1):
        await lender.close()
        with pytest.raises(Exception, match="closed"):
            await waiting
    lender.give_back(held, usable=True)
    assert held.terminated


async def test_terminating_closes_the_lent_ones_too() -> None:
    lender, _ = _lender(2)
    idle, lent = await lender.take(), await lender.take()
    lender.give_back(idle, usable=True)
    lender.terminate()
    assert idle.terminated and lent.terminated


async def test_waiting_and_opening_together_take_at_most_the_wait() -> None:
    """A database behind a silent network: opening a connection is bounded by the same
    wait, and so is a wait followed by an opening."""
    lender, opener = _lender(1, wait_seconds=0.2)
    opener.seconds = 60.0
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await lender.take()
    assert loop.time() - started < 1.0 and lender.open_count == 0
    opener.seconds = 0.0
    held = await lender.take()
    waiting = asyncio.ensure_future(lender.take())
    await asyncio.sleep(0.15)
    opener.seconds = 60.0
    lender.give_back(held, usable=False)  # room for the waiter, 0.05 s of its wait left
    with pytest.raises(TimeoutError):
        await waiting
    assert loop.time() - started < 2.0 and lender.open_count == 0

"""Requests of one turn of the event loop handled together (``app/turns.py``)."""

from __future__ import annotations

import asyncio

import pytest

from app.turns import Turn

Batch = list[tuple[int, "asyncio.Future[int]"]]


async def test_what_one_turn_asks_is_handled_at_once_and_each_caller_gets_its_own() -> None:
    handled: list[list[int]] = []

    async def double(batch: Batch) -> None:
        handled.append([item for item, _ in batch])
        for item, done in batch:
            if item < 0:
                done.set_exception(ValueError(f"refused {item}"))
            else:
                done.set_result(item * 2)

    turn: Turn[int, int] = Turn(double)
    outcomes = await asyncio.gather(
        turn.submit(1), turn.submit(-1), turn.submit(3), return_exceptions=True
    )
    assert handled == [[1, -1, 3]]
    assert outcomes[0] == 2 and outcomes[2] == 6
    assert isinstance(outcomes[1], ValueError)
    assert await turn.submit(5) == 10  # a later turn: handled on its own
    assert handled == [[1, -1, 3], [5]]


async def test_no_caller_is_left_waiting_whatever_ends_the_handling() -> None:
    async def breaks(_: Batch) -> None:
        raise RuntimeError("a bug in the handling")

    broken: Turn[int, int] = Turn(breaks)
    outcomes = await asyncio.wait_for(
        asyncio.gather(broken.submit(1), broken.submit(2), return_exceptions=True), timeout=5
    )
    assert [type(outcome) for outcome in outcomes] == [RuntimeError, RuntimeError]

    async def forgets(_: Batch) -> None:
        return None

    forgetful: Turn[int, int] = Turn(forgets)
    with pytest.raises(RuntimeError, match="without an answer"):
        await asyncio.wait_for(forgetful.submit(1), timeout=5)


async def test_a_caller_that_stops_waiting_does_not_cancel_the_others() -> None:
    seen: list[int] = []

    async def slow(batch: Batch) -> None:
        await asyncio.sleep(0.05)
        for item, done in batch:
            seen.append(item)
            done.set_result(item)

    turn: Turn[int, int] = Turn(slow)
    first = asyncio.ensure_future(turn.submit(1))
    second = asyncio.ensure_future(turn.submit(2))
    await asyncio.sleep(0.01)
    first.cancel()
    assert await second == 2
    assert seen == [1, 2]  # the cancelled caller's item was handled all the same
    with pytest.raises(asyncio.CancelledError):
        await first

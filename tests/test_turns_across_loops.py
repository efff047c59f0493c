"""Attack: a ``Turn`` outliving an event loop. ``submit`` schedules the handling only when
nothing is waiting; items left waiting by a loop that stopped before its next turn (its
``_start`` never ran) make every later ``submit``, on another loop, wait forever. The
RowBatcher's Turn is one per AuditTrail, not one per loop (unlike run_scripts')."""

from __future__ import annotations

import asyncio

import pytest

from app.turns import Turn


async def _echo(batch: list[tuple[int, asyncio.Future[int]]]) -> None:
    for item, done in batch:
        done.set_result(item)


def test_a_loop_stopped_mid_turn_does_not_strand_the_next_loops_callers() -> None:
    turn: Turn[int, int] = Turn(_echo)
    first = asyncio.new_event_loop()
    try:
        stranded = first.create_task(turn.submit(1))
        first.call_soon(first.stop)  # stops after the submit, before the turn's handling
        first.run_forever()
    finally:
        stranded.cancel()
        first.close()

    async def later() -> int:
        return await asyncio.wait_for(turn.submit(2), 1.0)

    try:
        assert asyncio.run(later()) == 2
    except TimeoutError:
        pytest.fail("the second loop's caller was left waiting: its batch was never started")

"""Supervised loops: an unexpected end is logged, reported down and restarted."""

from __future__ import annotations

import asyncio

import pytest

from app.supervision import Supervisor


class Gate:
    """A ``sleep`` the test releases by hand, recording what was asked."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.release = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        await self.release.wait()
        self.release.clear()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_crash_is_logged_with_its_traceback_reported_down_and_restarted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs: list[int] = []
    forever = asyncio.Event()

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise KeyError(3)
        await forever.wait()

    gate = Gate()
    supervisor = Supervisor(restart_seconds=1.0, sleep=gate)
    handle = supervisor.start("lease-keeper", loop)
    await _settle()
    assert supervisor.down() == {"lease-keeper": "KeyError: 3"}
    # Loggers are cached once configured, so the rendered line is what can be read here.
    logged = "".join(capsys.readouterr())
    assert "task_crashed" in logged
    assert "Traceback" in logged and "KeyError: 3" in logged
    gate.release.set()
    await _settle()
    assert runs == [0, 1]
    assert supervisor.down() == {}
    assert handle.restarts == 1
    await handle.stop()


async def test_a_cancel_from_below_and_a_normal_return_are_unexpected_ends() -> None:
    started = asyncio.Event()

    async def loop() -> None:
        started.set()
        await asyncio.Event().wait()

    gate = Gate()
    supervisor = Supervisor(sleep=gate)
    handle = supervisor.start("relay", loop)
    await started.wait()
    assert handle.current is not None
    handle.current.cancel()  # something below cancelled it: not a stop
    await _settle()
    assert "relay" in supervisor.down()
    await handle.stop()
    assert handle.ended.is_set()

    async def returns() -> None:
        return None

    handle = supervisor.start("backlog", returns)
    await _settle()
    assert supervisor.down() == {"backlog": "returned while it should still run"}
    await handle.stop()


async def test_a_loop_may_end_by_returning_once_its_condition_holds() -> None:
    stopping = asyncio.Event()

    async def loop() -> None:
        await stopping.wait()

    supervisor = Supervisor()
    handle = supervisor.start("read-loop", loop, until=stopping.is_set)
    stopping.set()
    await asyncio.wait_for(handle.wait(), 1)
    assert supervisor.down() == {}
    assert handle.restarts == 0


async def test_restarts_back_off_and_stop_ends_a_waiting_loop() -> None:
    async def crashes() -> None:
        raise RuntimeError("boom")

    gate = Gate()
    supervisor = Supervisor(restart_seconds=1.0, max_restart_seconds=4.0, sleep=gate)
    handle = supervisor.start("retention", crashes)
    for _ in range(4):
        await _settle()
        gate.release.set()
    await _settle()
    assert gate.asked[:4] == [1.0, 2.0, 4.0, 4.0]
    await asyncio.wait_for(handle.stop(), 1)
    assert handle.ended.is_set()

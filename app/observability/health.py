"""What ``/readyz`` checks and what ``/metrics`` refreshes, registered by the app factory for
the role it builds (this module knows no stage: each check is a callable).

A check answers ``"ok"`` or a description of what is wrong; a check that raises or takes
longer than ``CHECK_SECONDS`` answers ``error: <ExceptionName>``. The process is ready when
every *required* check answers ``ok``; the others are reported only (SNS: the outbox holds
tool calls while it is down).

The bound is ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` drops a cancel
that arrives as the check ends (a readiness probe whose client went away, a stopping process),
and the probe's task went on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

CHECK_SECONDS = 2.0
Check = Callable[[], Awaitable[str]]


@dataclass
class Health:
    checks: dict[str, tuple[Check, bool]] = field(default_factory=dict)
    # Gauges brought up to date before a scrape (the backlog depth and age).
    before_scrape: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def check(self, name: str, run: Check, *, required: bool) -> None:
        self.checks[name] = (run, required)

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        """(ready, each check's answer)."""
        answers: dict[str, str] = {}
        ready = True
        for name, (run, required) in self.checks.items():
            answers[name] = await _answer(run)
            ready = ready and (not required or answers[name] == "ok")
        return ready, answers

    async def refresh(self) -> None:
        """Best effort: a scrape must not fail because a dependency is slow (the gauges keep
        their last values)."""
        for hook in self.before_scrape:
            try:
                async with asyncio.timeout(CHECK_SECONDS):
                    await hook()
            except Exception:  # noqa: BLE001, S112 - the scrape goes on with the old values
                continue


async def _answer(run: Check) -> str:
    try:
        async with asyncio.timeout(CHECK_SECONDS):
            return await run()
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready", with its name
        return f"error: {type(exc).__name__}"


def succeeds(action: Callable[[], Awaitable[object]]) -> Check:
    """A check that is ``ok`` when ``action`` completes."""

    async def run() -> str:
        await action()
        return "ok"

    return run

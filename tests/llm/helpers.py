"""Small test helpers for the LLM stage."""

from __future__ import annotations


class FakeClock:
    """An injectable clock: tests move time with ``advance``."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordedSleeps:
    """An injectable ``sleep`` that records delays and lets time pass on a FakeClock."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.delays: list[float] = []
        self.clock = clock

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.clock is not None:
            self.clock.advance(seconds)

"""Small test helpers for the LLM stage."""

from __future__ import annotations

from dataclasses import replace

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from app.redis_scripts import ScriptCall


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


# A Redis nobody listens on: a script sent there fails as one sent to a Redis that went away.
_GONE = Redis(host="127.0.0.1", port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))


def on_a_redis_gone(call: ScriptCall) -> ScriptCall:
    """``call`` as it would go to a Redis that is unreachable: running it raises
    ``redis.exceptions.ConnectionError``, from the client, as a dropped connection would."""
    return replace(call, script=_GONE.register_script(call.script.script))

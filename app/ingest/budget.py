"""A process-wide budget of request-body bytes held in memory at once.

Before a request is verified, its body is only bytes some client sent. Each request reserves
its bytes from one shared budget as they arrive and gives them back when it is done (answered,
refused or cut off), so however many clients send large bodies at once, the bodies held by
the process stay within ``capacity`` (``EVENTGATE_INGEST_BUFFER_BYTES``). A chunk that does
not fit ends its request with ``503 BodyBufferFull`` + ``Retry-After``; the bytes it had
reserved are released at once for the others.

One event loop per process touches the budget, so plain integers need no lock.
"""

from __future__ import annotations

from types import TracebackType

from app.ingest.exceptions import BodyBufferFull

RETRY_AFTER_SECONDS = 1


class BodyBudget:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0

    def hold(self) -> Reservation:
        """One request's reservation, released when its ``with`` block exits (whatever
        happened). A plain class, not a generator context manager: one per webhook."""
        return Reservation(self)


class Reservation:
    __slots__ = ("budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.budget.in_use -= self.size
        self.size = 0

    def reserve(self, count: int) -> None:
        budget = self.budget
        if budget.in_use + count > budget.capacity:
            raise BodyBufferFull(
                "the gateway holds as many request bodies as it may; retry later",
                retry_after=RETRY_AFTER_SECONDS,
            )
        budget.in_use += count
        self.size += count

    def release(self, count: int) -> None:
        """Give back ``count`` of this reservation's bytes (no longer held)."""
        count = min(count, self.size)
        self.budget.in_use -= count
        self.size -= count

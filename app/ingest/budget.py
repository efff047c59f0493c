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

from collections.abc import Iterator
from contextlib import contextmanager

from app.ingest.exceptions import BodyBufferFull

RETRY_AFTER_SECONDS = 1


class BodyBudget:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0

    @contextmanager
    def hold(self) -> Iterator[Reservation]:
        """One request's reservation, released when the block exits (whatever happened)."""
        reservation = Reservation(self)
        try:
            yield reservation
        finally:
            self.in_use -= reservation.size
            reservation.size = 0


class Reservation:
    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
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

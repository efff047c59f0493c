"""A process-wide budget of request-body memory held at once.

Before a request is verified, its body is only bytes some client sent. Each request reserves
the memory that holds its body before that memory is allocated and gives it back when it is
done (answered, refused or cut off), so however many clients send large bodies at once, the
bodies held by the process stay within ``capacity`` (``EVENTGATE_INGEST_BUFFER_BYTES``). What
is reserved is what is allocated: a body that arrives in one chunk reserves that chunk's
length; one in several is read into a ``BodyBuffer``, which reserves its whole allocation
(headroom included), never a list of chunks nor a joined copy. Not reserved (the stated
slack): about 60 bytes of object header per request, and for an instant, with no await in
between, the chunk being copied in and the zeros a growing buffer is extended with. An
allocation that does not fit ends its request with ``503 BodyBufferFull`` + ``Retry-After``;
what it had reserved is released at once for the others.

One event loop per process touches the budget, so plain integers need no lock.
"""

from __future__ import annotations

import sys
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


# A bytearray's size beyond its payload: header and the trailing NUL CPython keeps.
_OVERHEAD = sys.getsizeof(bytearray(1)) - 1
MIN_GROWTH = 4096


def allocated(buffer: bytearray) -> int:
    """The bytes ``buffer`` has allocated for its payload, headroom included."""
    return max(0, sys.getsizeof(buffer) - _OVERHEAD)


class BodyBuffer:
    """A body read chunk by chunk into one ``bytearray`` whose every allocation is reserved
    before it is made, and never exceeds ``cap`` (the most the body may be).

    CPython sizes a bytearray exactly when it grows by more than an eighth, and over-allocates
    by an eighth, unreserved, when it grows by less. So the buffer chooses its own sizes and
    grows in steps CPython makes exact: by a quarter (at least ``MIN_GROWTH``) or to what
    arrived, zero-filled, and straight to ``cap`` once the next step would come within an
    eighth of it. A body of ``cap`` bytes thus takes ``cap`` bytes; memory is never allocated
    for more than what arrived plus that step (nothing before the first byte). ``received``
    must never exceed ``cap`` (the caller refuses larger bodies first).
    """

    __slots__ = ("cap", "data", "filled", "reservation", "reserved")

    def __init__(self, reservation: Reservation, cap: int) -> None:
        self.reservation = reservation
        self.cap = cap
        self.data = bytearray()
        self.filled = 0
        self.reserved = 0

    def write(self, chunk: bytes) -> None:
        end = self.filled + len(chunk)
        if end > len(self.data):
            self._grow(end)
        self.data[self.filled : end] = chunk  # same length: a copy, no resize
        self.filled = end

    def body(self) -> bytearray:
        """The body read so far; nothing may write to it afterwards (it has been verified)."""
        del self.data[self.filled :]  # CPython frees the tail only if it is most of it
        self._settle()
        return self.data

    def _grow(self, needed: int) -> None:
        size = len(self.data)
        target = max(needed, size + size // 4 + MIN_GROWTH)
        if target + target // 8 + MIN_GROWTH > self.cap:
            target = max(needed, self.cap)
        self._reserve(target)
        self.data.extend(bytes(target - size))
        self._settle()

    def _settle(self) -> None:
        """Reserve exactly what is allocated (it is what was reserved, as CPython is now)."""
        self._reserve(allocated(self.data))

    def _reserve(self, total: int) -> None:
        if total > self.reserved:
            self.reservation.reserve(total - self.reserved)
        else:
            self.reservation.release(self.reserved - total)
        self.reserved = total

"""The body budget bounds the memory a body really takes, and lets any body up to it in.

- A body read in several chunks was held twice (the chunks and their joined copy, both
  reserved), so one larger than half the budget was refused with 503 ``BodyBufferFull`` for
  ever, even with nothing else in flight. Any body up to ``min(max_body_bytes, capacity)``
  passes a free budget, however it is framed.
- A body sent as 2-byte chunks was kept as a list of thousands of small ``bytes`` objects,
  each costing ~40 bytes of header and list slot for the 2 it reserved. What a request holds
  between chunks is now covered by what it reserved, give or take a few KiB.

The second is measured in-process with ``tracemalloc`` over ``read_body`` fed by an ASGI
``receive`` that hands over one 2-byte chunk at a time: uvicorn merges what arrived between
two reads into one chunk, so a real server hands the app tiny chunks only at the sender's
pace (hours for 32768 of them); RSS of a real process is also too coarse for 64 KiB.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.requests import Request
from starlette.types import Message

from app.config import parse_config
from app.ingest.budget import BodyBudget
from app.ingest.exceptions import BodyBufferFull, PayloadTooLarge
from app.ingest.router import read_body
from app.main import create_app
from app.settings import Settings
from app.sources.admission import Body
from tests.hardening.raw_http import CONFIG, GITHUB_SECRET
from tests.support import ServerThread, github_request, issue_payload

KiB = 1024
MiB = 1024 * KiB
# Held between chunks and not reserved: object headers, the coroutine's frames, the chunk in
# hand and its ASGI message.
SLACK = 4 * KiB


def _issue_of_size(size: int, number: int) -> dict[str, Any]:
    """A GitHub issue event whose JSON is exactly ``size`` bytes."""
    payload = issue_payload("acme/api", number)
    payload["issue"]["body"] = ""
    payload["issue"]["body"] = "x" * (size - len(orjson.dumps(payload)))
    assert len(orjson.dumps(payload)) == size
    return payload


@pytest.mark.parametrize("share", [0.75, 1.0])
def test_a_body_in_several_chunks_fits_a_free_budget_up_to_its_capacity(
    make_settings: Callable[..., Settings], share: float
) -> None:
    """Bodies of 1.5 and 2 MiB against a free 2 MiB budget, declared or chunked: uvicorn hands
    the app at most 64 KiB plus one socket read (256 KiB) at a time, so each arrives in
    several chunks. Before, both were 503 BodyBufferFull (2 x 1.5 MiB reserved)."""
    capacity = 2 * MiB
    settings = make_settings(ingest_buffer_bytes=capacity, max_body_bytes=capacity)
    app = create_app(settings, parse_config(CONFIG, env={}), role="api")

    def chunks(body: bytes) -> Iterator[bytes]:  # no Content-Length: chunked encoding
        for start in range(0, len(body), 64 * KiB):
            yield body[start : start + 64 * KiB]

    framings: dict[str, Callable[[bytes], bytes | Iterator[bytes]]] = {
        "declared": bytes,
        "chunked": chunks,
    }
    with ServerThread(app) as server:
        for number, (framing, content) in enumerate(framings.items()):
            body, headers = github_request(
                GITHUB_SECRET, _issue_of_size(int(capacity * share), number)
            )
            reply = httpx.post(
                f"{server.url}/v1/webhooks/github",
                content=content(body),
                headers=headers,
                timeout=30,
            )
            assert reply.status_code == 202, (framing, reply.text)


class HeldBetweenChunks:
    """A ``BodyCheck`` that notes, after each chunk, the memory traced since it was made
    (what the request holds while it waits for the next chunk) and the budget's use."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.base = tracemalloc.get_traced_memory()[0]
        self.unreserved = 0  # most held beyond what was reserved
        self.in_use = 0

    def update(self, chunk: Body) -> None:
        held = tracemalloc.get_traced_memory()[0] - self.base
        self.unreserved = max(self.unreserved, held - self.budget.in_use)
        self.in_use = max(self.in_use, self.budget.in_use)

    async def finish(self, body: Body) -> None:
        pass


def _read_tiny_chunks(
    count: int, *, capacity: int, limit: int, occupied: int = 0
) -> tuple[Body | BodyBufferFull | PayloadTooLarge, HeldBetweenChunks]:
    """``read_body`` over ``count`` 2-byte chunks (distinct objects, as a server makes them)
    without a Content-Length, ``occupied`` bytes of the budget held by other requests: the
    body it returned or the refusal, and what it held."""

    async def run() -> tuple[Body | BodyBufferFull | PayloadTooLarge, HeldBetweenChunks]:
        pieces = (n.to_bytes(2, "big") for n in range(count))

        async def receive() -> Message:
            piece = next(pieces, None)
            if piece is None:
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.request", "body": piece, "more_body": True}

        request = Request({"type": "http", "method": "POST", "headers": []}, receive)
        budget = BodyBudget(capacity)
        budget.hold().reserve(occupied)  # the other requests'
        with budget.hold() as reservation:
            check = HeldBetweenChunks(budget)
            try:
                body = await read_body(
                    request, limit, deadlines=None, reservation=reservation, check=check
                )
            except (BodyBufferFull, PayloadTooLarge) as exc:
                return exc, check
            return body, check

    tracemalloc.start()
    try:
        return asyncio.run(run())
    finally:
        tracemalloc.stop()


CAPACITY = 64 * KiB


def test_tiny_chunks_hold_no_more_than_they_reserve() -> None:
    """48 KiB as 24576 2-byte chunks against a 64 KiB budget: accepted, and held within what
    was reserved (the list of chunks held ~1 MiB for 48 KiB reserved, and its joined copy
    did not fit)."""
    body, held = _read_tiny_chunks(24 * KiB, capacity=CAPACITY, limit=MiB)
    assert body == b"".join(n.to_bytes(2, "big") for n in range(24 * KiB))
    assert held.unreserved <= SLACK, f"{held.unreserved} bytes held beyond the reservation"
    assert held.in_use <= CAPACITY


def test_tiny_chunks_past_the_budget_are_refused_once_their_memory_reaches_it() -> None:
    """48 KiB as 2-byte chunks while other requests hold 32 KiB of a 64 KiB budget: refused
    with BodyBufferFull (it fits once they are done) once the buffer's memory, not a count of
    bytes, would pass what is left; never held beyond it (the list of chunks held ~1.4 MiB by
    the time 64 KiB were counted)."""
    refused, held = _read_tiny_chunks(24 * KiB, capacity=CAPACITY, limit=MiB, occupied=32 * KiB)
    assert isinstance(refused, BodyBufferFull)
    assert held.unreserved <= SLACK, f"{held.unreserved} bytes held beyond the reservation"
    assert held.in_use <= CAPACITY


def test_a_body_larger_than_the_whole_budget_is_too_large_not_retry_later() -> None:
    """A source may allow bodies larger than the process's whole budget: such a body can
    never fit, so it is 413 PayloadTooLarge, not 503 BodyBufferFull with a Retry-After that
    has its sender retry for ever."""
    refused, held = _read_tiny_chunks(64 * KiB, capacity=CAPACITY, limit=MiB)
    assert isinstance(refused, PayloadTooLarge)
    assert held.in_use <= CAPACITY

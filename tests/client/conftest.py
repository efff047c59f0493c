"""The admin client's fixtures: a real gateway (from tests/admin), and ``fake_admin``, a
server that answers the admin API's paths with whatever a test sets (a hostile gateway, a
proxy page, the wrong service)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.admin.conftest import _reset_logging, gateway_factory
from tests.support import ServerThread

__all__ = ["FakeAdmin", "_reset_logging", "fake_admin", "gateway_factory"]


@dataclass
class Answer:
    """``endless``: ``body`` repeated for as long as the client reads."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"
    endless: bool = False


@dataclass
class FakeAdmin:
    """``list_answers`` for ``GET /v1/events`` (each request takes the next; the last one
    repeats) and ``event_answer`` for ``GET /v1/events/{id}``."""

    url: str = ""
    list_answers: list[Answer] = field(default_factory=list)
    event_answer: Answer | None = None

    def answer_list(self, *pages: object) -> None:
        self.list_answers = [Answer(orjson.dumps(page)) for page in pages]

    def answer_event(self, event: object) -> None:
        self.event_answer = Answer(orjson.dumps(event))

    def answer_everything(self, answer: Answer) -> None:
        self.list_answers = [answer]
        self.event_answer = answer

    def reply(self, request: Request) -> Response:
        if request.url.path == "/v1/events":
            answer = self.list_answers[0]
            if len(self.list_answers) > 1:
                self.list_answers.pop(0)
        else:
            assert self.event_answer is not None
            answer = self.event_answer
        if answer.endless:
            return StreamingResponse(
                _forever(answer.body), answer.status, media_type=answer.content_type
            )
        return Response(answer.body, answer.status, media_type=answer.content_type)


async def _forever(chunk: bytes) -> AsyncIterator[bytes]:
    while True:
        yield chunk
        await asyncio.sleep(0)  # lets the server see the client leave


@pytest.fixture
def fake_admin() -> Iterator[FakeAdmin]:
    fake = FakeAdmin()

    async def endpoint(request: Request) -> Response:
        return fake.reply(request)

    app = Starlette(
        routes=[Route("/v1/events", endpoint), Route("/v1/events/{event_id:path}", endpoint)]
    )
    with ServerThread(app) as server:
        fake.url = server.url
        yield fake

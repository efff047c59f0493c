"""Answers that are not the admin API's (a worker process, a proxy page, a silent server)
become one sentence naming the URL, never the token."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from app.client.admin import AdminClient, GatewayUnreachable, UnexpectedAnswer

URL = "http://gateway.test:8080"
TOKEN = "client-tests-admin-token-0123"


def client(handler: httpx.MockTransport) -> AdminClient:
    return AdminClient(url=URL + "/", token=TOKEN, transport=handler)


def test_the_token_goes_in_the_header_only() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"items": [], "total": 0, "next_cursor": None})

    with client(httpx.MockTransport(answer)) as admin:
        assert admin.events(status="published", limit=5)["total"] == 0
    (request,) = seen
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert str(request.url) == f"{URL}/v1/events?status=published&limit=5"


def test_a_process_without_the_admin_api() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": "NotFound", "detail": "Not Found"})

    with client(httpx.MockTransport(answer)) as admin, pytest.raises(UnexpectedAnswer) as info:
        admin.event("evt_1")
    assert str(info.value) == (
        f"{URL} has no admin API (404 on /v1/events/evt_1): point --url at an"
        " `eventgate serve` or `eventgate api` process"
    )


def test_an_answer_that_is_not_json() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>proxy login</html>")

    with client(httpx.MockTransport(answer)) as admin, pytest.raises(UnexpectedAnswer) as info:
        admin.events()
    assert "not JSON" in str(info.value)
    assert TOKEN not in str(info.value)


def test_other_errors_say_the_status_and_the_detail() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": "QueueUnavailable", "detail": "Redis is down"})

    with client(httpx.MockTransport(answer)) as admin, pytest.raises(UnexpectedAnswer) as info:
        admin.event("evt_1")
    assert str(info.value) == f"{URL} answered 503 QueueUnavailable: Redis is down"


def test_a_gateway_that_does_not_answer_in_time() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with client(httpx.MockTransport(answer)) as admin, pytest.raises(GatewayUnreachable) as info:
        admin.events()
    assert str(info.value) == f"the gateway at {URL} did not answer within 10.0s"


def test_an_answer_is_read_up_to_max_bytes() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"items": [], "total": 0}' + b" " * 1000)

    small = AdminClient(url=URL, token=TOKEN, transport=httpx.MockTransport(answer), max_bytes=1000)
    with small as admin, pytest.raises(UnexpectedAnswer) as info:
        admin.events()
    assert "more than" in str(info.value)
    exact = AdminClient(url=URL, token=TOKEN, transport=httpx.MockTransport(answer), max_bytes=1025)
    with exact as admin:
        assert admin.events()["total"] == 0


def test_an_answer_dripping_slower_than_the_whole_answer_may_take_is_cut_off() -> None:
    """Each byte comes within the read timeout, the whole answer never."""

    def drip() -> Iterator[bytes]:
        while True:
            time.sleep(0.02)
            yield b" "

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=drip())

    slow = AdminClient(
        url=URL, token=TOKEN, transport=httpx.MockTransport(answer), answer_seconds=0.3
    )
    started = time.monotonic()
    with slow as admin, pytest.raises(GatewayUnreachable) as info:
        admin.events()
    assert time.monotonic() - started < 5
    assert str(info.value) == f"the gateway at {URL} did not finish its answer within 0.3s"

"""A request answered before its body has arrived (unknown source, bad credentials, a body
timeout) ends its connection: the rest of the body would be read for nothing, and a sender
trickling it would otherwise hold the connection, and a slot of the connection limit, for as
long as it kept sending (uvicorn cancels its keep-alive timer on every byte). The answer says
``Connection: close``, so a client does not send its next request on it."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable

import pytest

from tests.hardening.raw_http import head, response
from tests.support import GatewayProcess


@pytest.fixture
def gateway(start_api: Callable[..., GatewayProcess]) -> GatewayProcess:
    return start_api(
        EVENTGATE_KEEP_ALIVE_SECONDS="1",
        EVENTGATE_HEAD_TIMEOUT_SECONDS="1",
        EVENTGATE_BODY_READ_TIMEOUT_SECONDS="1",
    )


def _trickle_until_closed(sock: socket.socket, seconds: float) -> float | None:
    """Sends a byte every 100 ms; how long until the gateway closed, None if it never did."""
    started = time.monotonic()
    sock.settimeout(0.1)
    while time.monotonic() - started < seconds:
        try:
            sock.sendall(b"x")
            if sock.recv(1) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:  # reset: closed with bytes still unread
            return time.monotonic() - started
    return None


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/v1/webhooks/nowhere", {}, 404),
        ("/v1/webhooks/alerts", {"Authorization": "Bearer wrong-token-0123456789"}, 401),
        ("/v1/webhooks/partner", {"X-Ts": "1", "X-Signature": "sha256=00"}, 401),
    ],
    ids=["unknown-source", "wrong-token", "stale-timestamp"],
)
def test_a_body_still_trickling_after_the_answer_does_not_hold_the_connection(
    gateway: GatewayProcess, path: str, headers: dict[str, str], status: int
) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        fields = {"Content-Type": "application/json", "Content-Length": "100000", **headers}
        sock.sendall(head(path, fields) + b'{"a": ')
        answered, said, _ = response(sock, timeout=5)
        assert answered == status
        assert said.get("connection") == "close"  # a client must not reuse it
        closed_after = _trickle_until_closed(sock, seconds=8)
    assert closed_after is not None, "the connection stayed open while bytes kept coming"
    assert closed_after < 4


def test_a_body_timeout_ends_the_connection(gateway: GatewayProcess) -> None:
    """The 408 for a body not received in time is the last word on that connection."""
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        fields = {
            "Content-Type": "application/json",
            "Content-Length": "100000",
            "X-GitHub-Event": "issues",
            "X-GitHub-Delivery": "d-1",
            "X-Hub-Signature-256": "sha256=" + "0" * 64,
        }
        sock.sendall(head("/v1/webhooks/github", fields) + b'{"a": ')
        for _ in range(15):  # a byte every 100 ms: slower than the 1 s body timeout allows
            with contextlib.suppress(OSError):
                sock.sendall(b" ")
            time.sleep(0.1)
        answered, said, error = response(sock, timeout=5)
        assert (answered, error["error"]) == (408, "RequestTimeout")
        assert said.get("connection") == "close"
        closed_after = _trickle_until_closed(sock, seconds=8)
    assert closed_after is not None, "the connection stayed open while bytes kept coming"
    assert closed_after < 4


def test_an_answer_after_the_whole_body_keeps_the_connection(gateway: GatewayProcess) -> None:
    """A request whose body had all arrived keeps its keep-alive connection: a second
    request on it is answered."""
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        for _ in range(2):
            sock.sendall(head("/v1/webhooks/nowhere", {"Content-Length": "2"}) + b"{}")
            answered, said, _ = response(sock, timeout=5)
            assert answered == 404 and said.get("connection") != "close"


def test_an_early_answer_that_says_close_already_says_it_once(
    start_api: Callable[..., GatewayProcess],
) -> None:
    """``503 TooManyConnections`` carries its own ``Connection: close``; answered before the
    body arrived, it must not get a second one."""
    gateway = start_api(EVENTGATE_LIMIT_CONCURRENCY="2")
    with (
        socket.create_connection(("127.0.0.1", gateway.port)) as held,
        socket.create_connection(("127.0.0.1", gateway.port)) as sock,
    ):
        held.sendall(head("/v1/webhooks/nowhere", {"Content-Length": "10"}) + b"{")
        time.sleep(0.3)
        sock.sendall(head("/v1/webhooks/nowhere", {"Content-Length": "10"}) + b"{")
        sock.settimeout(5)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(65536)
    answer = reply.split(b"\r\n\r\n", 1)[0].lower()
    assert answer.startswith(b"http/1.1 503")
    assert answer.count(b"\r\nconnection:") == 1, answer.decode()

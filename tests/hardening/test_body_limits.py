"""The body is read under a size limit and a time limit, over a raw socket so the test
controls exactly what the client sends and when.

- A 30 MB chunked body (no Content-Length to refuse it by) gets 413 once the limit is
  passed: the client stops being read long before it has sent the whole body.
- A client trickling its body gets 408 at the read timeout, while other requests on the
  same server are answered meanwhile."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from app.config import load_config
from app.main import create_app
from app.settings import Settings
from tests.support import ServerThread, github_request, issue_payload

LIMIT = 1024 * 1024
TOTAL = 30 * 1024 * 1024
CHUNK = 64 * 1024


@pytest.fixture
def server(make_settings: Callable[..., Settings]) -> Iterator[ServerThread]:
    settings = make_settings(max_body_bytes=LIMIT, body_read_timeout_seconds=1.0)
    with ServerThread(create_app(settings, load_config(None, env={}), role="api")) as running:
        yield running


def _head(port: int, extra: str) -> bytes:
    return (
        f"POST /v1/webhooks/github HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nX-GitHub-Event: issues\r\n"
        f"X-GitHub-Delivery: d1\r\nX-Hub-Signature-256: sha256={'0' * 64}\r\n{extra}\r\n"
    ).encode()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, object]]:
    data = b""
    sock.settimeout(10)
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body[body.find(b"{") :])


def test_a_30mb_chunked_body_is_refused_without_reading_it_whole(server: ServerThread) -> None:
    sent = 0
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head(server.port, "Transfer-Encoding: chunked\r\n"))
        chunk = b"%x\r\n%s\r\n" % (CHUNK, b"x" * CHUNK)
        while sent < TOTAL:
            readable, writable, _ = select.select([sock], [sock], [], 5)
            if readable:
                break  # the server answered before the body was complete
            if writable:
                try:
                    sock.sendall(chunk)
                except OSError:
                    break
                sent += CHUNK
        status, body = _read_response(sock)
    assert (status, body["error"]) == (413, "PayloadTooLarge")
    # Refused just past the 1 MiB limit; socket buffers hold a few MiB at most, never 30.
    assert sent < 8 * 1024 * 1024, sent


def test_a_slow_body_gets_408_while_others_are_served(server: ServerThread) -> None:
    outcome: dict[str, object] = {}

    def trickle() -> None:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(_head(server.port, "Content-Length: 200\r\n"))
            started = time.monotonic()
            for _ in range(200):  # one byte every 50 ms: 10 s for the whole body
                readable, _, _ = select.select([sock], [], [], 0.05)
                if readable:
                    break
                try:
                    sock.sendall(b" ")
                except OSError:
                    break
            outcome["status"], outcome["body"] = _read_response(sock)
            outcome["after"] = time.monotonic() - started

    slow = threading.Thread(target=trickle)
    slow.start()
    served: list[int] = []
    body, headers = github_request("dev-github-secret", issue_payload("acme/api", 1))
    while slow.is_alive() and len(served) < 20:
        reply = httpx.post(f"{server.url}/v1/webhooks/github", content=body, headers=headers)
        served.append(reply.status_code)
        time.sleep(0.02)
    slow.join(15)
    assert outcome["status"] == 408, outcome
    assert outcome["body"] == {
        "error": "RequestTimeout",
        "detail": "the body was not received within 1s",
    }
    assert served[0] == 202 and set(served[1:]) <= {200}  # the rest are duplicates
    assert len(served) >= 5  # answered while the slow body was still being read

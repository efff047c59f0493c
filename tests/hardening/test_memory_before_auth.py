"""What a process buffers before a request is verified is bounded.

Against real gateway processes (``python -m app api``, uvicorn configured by the CLI), over raw
sockets so the test controls what is sent and when:

- N concurrent 5 MiB bodies with a well-formed but wrong signature: the process's peak RSS
  grows by less than ``EVENTGATE_INGEST_BUFFER_BYTES`` plus a margin; requests past the budget
  get 503 ``BodyBufferFull`` with ``Retry-After``; a valid webhook still works.
- Sources whose credentials are tokens / basic auth, a missing signature header and a stale
  signed timestamp are refused from the headers: the body is never read.
- A 50 MiB request head, or chunk trailers that never end, are cut off without
  being held (431).
- Connections past ``EVENTGATE_LIMIT_CONCURRENCY`` get a JSON 503; idle keep-alive connections
  are closed after ``EVENTGATE_KEEP_ALIVE_SECONDS``, new ones that send nothing as well, and
  ones that do not finish a head within ``EVENTGATE_HEAD_TIMEOUT_SECONDS`` get 408.
- A declared Content-Length reserves nothing before its bytes arrive.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import parse_config
from app.ingest.budget import BodyBudget
from app.ingest.exceptions import BodyBufferFull
from app.main import create_app
from app.settings import Settings
from tests.hardening.raw_http import CONFIG, GITHUB_SECRET, head, response
from tests.support import GatewayProcess, ServerThread, github_request, issue_payload

MiB = 1024 * 1024
BUDGET = 16 * MiB
BODY = 5 * MiB
SENDERS = 40
CHUNK = 64 * 1024


def _status(pid: int) -> dict[str, int]:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


class Sender(threading.Thread):
    """Sends one request of ``size`` bytes; holds back its last byte until ``gate`` opens,
    so that every sender's body is in the server at once."""

    def __init__(self, port: int, head: bytes, size: int, gate: threading.Barrier) -> None:
        super().__init__(daemon=True)
        self.port, self.head, self.size, self.gate = port, head, size, gate
        self.sent = 0
        self.result: tuple[int, dict[str, str], Any] = (0, {}, None)

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            sock.sendall(self.head)
            answered = self._send(sock, self.size - 1)
            with contextlib.suppress(threading.BrokenBarrierError):
                self.gate.wait(timeout=60)
            if not answered:
                self._send(sock, 1)
            self.result = response(sock)

    def _send(self, sock: socket.socket, count: int) -> bool:
        """True once the server answered (it stops reading what is left)."""
        chunk = b"x" * CHUNK
        deadline = time.monotonic() + 60
        while count > 0 and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1)
            if readable:
                return True
            if writable:
                try:
                    written = sock.send(chunk[: min(count, CHUNK)])
                except OSError:
                    return True
                self.sent += written
                count -= written
        return False


def test_unverified_bodies_stay_within_the_budget(start_api: Callable[..., GatewayProcess]) -> None:
    gateway = start_api(EVENTGATE_INGEST_BUFFER_BYTES=str(BUDGET))
    body, headers = github_request(GITHUB_SECRET, issue_payload("acme/api", 1))
    assert httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=headers).is_success
    before = _status(gateway.proc.pid)["VmHWM"]

    wrong = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "issues",
        "X-GitHub-Delivery": "d",
        "X-Hub-Signature-256": "sha256=" + "0" * 64,  # well-formed, not the body's
        "Content-Length": str(BODY),
    }
    gate = threading.Barrier(SENDERS)
    senders = [Sender(gateway.port, head("/v1/webhooks/github", wrong), BODY, gate)
               for _ in range(SENDERS)]  # fmt: skip
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(120)
    grown = _status(gateway.proc.pid)["VmHWM"] - before

    statuses = [s.result[0] for s in senders]
    busy = [s.result for s in senders if s.result[0] == 503]
    assert set(statuses) <= {401, 503}, statuses
    assert busy, "nobody was turned away: the budget did not bind"
    for _, headers_, error in busy:
        assert error["error"] == "BodyBufferFull"
        assert int(headers_["retry-after"]) >= 1
    # Every body would have been 200 MiB in memory at once (181 MiB of peak RSS measured
    # before the budget); the budget holds 16 MiB. The rest is what uvicorn buffers per
    # connection and buffers the heap could not reuse (32-36 MiB while glibc's raised mmap
    # threshold put growing buffers on the heap; see ``app.cli.pin_mmap_threshold``).
    assert grown < BUDGET + 12 * MiB, f"peak RSS grew by {grown / MiB:.0f} MiB"

    body, headers = github_request(GITHUB_SECRET, issue_payload("acme/api", 2))
    reply = httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=headers)
    assert reply.status_code == 202


def _refused_before_the_body(port: int, path: str, headers: dict[str, str]) -> tuple[int, int]:
    """(status, bytes of a 50 MiB body sent before the answer came)."""
    sender = Sender(port, head(path, headers | {"Content-Length": str(50 * MiB)}), 50 * MiB,
                    threading.Barrier(1))  # fmt: skip
    sender.run()
    return sender.result[0], sender.sent


def test_credentials_checked_from_the_headers_never_buffer_the_body(
    start_api: Callable[..., GatewayProcess],
) -> None:
    gateway = start_api()
    json_type = {"Content-Type": "application/json"}
    cases = {
        "wrong bearer token": ("/v1/webhooks/alerts", json_type | {"Authorization": "Bearer no"}),
        "no credentials": ("/v1/webhooks/alerts", json_type),
        "no signature": ("/v1/webhooks/github", json_type | {"X-GitHub-Event": "push"}),
        "malformed signature": (
            "/v1/webhooks/github",
            json_type | {"X-GitHub-Event": "push", "X-Hub-Signature-256": "sha256=zz"},
        ),
        "stale timestamp": (
            "/v1/webhooks/partner",
            json_type | {"X-Ts": str(int(time.time()) - 3600), "X-Signature": "0" * 64},
        ),
    }
    before = _status(gateway.proc.pid)["VmHWM"]
    for name, (path, headers) in cases.items():
        status, sent = _refused_before_the_body(gateway.port, path, headers)
        assert status == 401, name
        # Answered from the headers: what was sent is what socket buffers hold, not 50 MiB.
        assert sent < 8 * MiB, (name, sent)
    assert _status(gateway.proc.pid)["VmHWM"] - before < 8 * MiB


def test_a_50_mib_request_head_is_refused_without_being_held(
    start_api: Callable[..., GatewayProcess],
) -> None:
    gateway = start_api(EVENTGATE_MAX_HEADER_BYTES=str(64 * 1024))
    before = _status(gateway.proc.pid)["VmHWM"]
    sent = 0
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(b"POST /v1/webhooks/github HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * CHUNK
        while sent < 50 * MiB:
            readable, writable, _ = select.select([sock], [sock], [], 5)
            if readable:
                break
            if writable:
                try:
                    sent += sock.send(chunk)
                except OSError:
                    break
        status, _, error = response(sock)
        # Then the connection is closed (reset, if unread bytes were left).
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(65536) == b""
    assert status == 431
    assert error["error"] == "RequestHeadersTooLarge"
    assert sent < 8 * MiB, sent
    refused = [e for e in gateway.log_events() if e["event"] == "request_refused"]
    assert [(e["error"], e["status"]) for e in refused] == [("RequestHeadersTooLarge", 431)]
    assert _status(gateway.proc.pid)["VmHWM"] - before < 8 * MiB
    # The process is fine afterwards.
    body, good = github_request(GITHUB_SECRET, issue_payload("acme/api", 3))
    assert httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=good).is_success


def test_connection_limit_and_keep_alive_timeout(start_api: Callable[..., GatewayProcess]) -> None:
    gateway = start_api(EVENTGATE_LIMIT_CONCURRENCY="4", EVENTGATE_KEEP_ALIVE_SECONDS="1")
    idle = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(4)]
    try:
        time.sleep(0.2)
        reply = httpx.get(f"{gateway.url}/healthz")
        assert reply.status_code == 503
        assert reply.json()["error"] == "TooManyConnections"
        assert int(reply.headers["retry-after"]) >= 1
        refused = [e for e in gateway.log_events() if e["event"] == "request_refused"]
        assert [e["error"] for e in refused] == ["TooManyConnections"]
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, _ = response(sock)
        assert status == 200
        sock.settimeout(5)
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server closed the idle connection
        assert time.monotonic() - started < 3


def test_the_budget_binds_declared_and_chunked_bodies_and_is_given_back(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(ingest_buffer_bytes=512 * 1024, max_body_bytes=MiB)
    app = create_app(settings, parse_config(CONFIG, env={}), role="api")
    shaped = {"X-GitHub-Event": "push", "X-Hub-Signature-256": "sha256=" + "0" * 64}

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        for _ in range(20):
            yield b"x" * (40 * 1024)

    with ServerThread(app) as server:
        url = f"{server.url}/v1/webhooks/github"
        declared = httpx.post(url, content=b"x" * (600 * 1024), headers=shaped)
        streamed = httpx.post(url, content=chunks(), headers=shaped)
        # Larger than the whole budget: they could never fit, so they are too large (a 503
        # BodyBufferFull would have their senders retry for ever); the 503 for bodies that
        # find the budget held by others is test_unverified_bodies_stay_within_the_budget's.
        for reply in (declared, streamed):
            assert reply.status_code == 413
            assert reply.json()["error"] == "PayloadTooLarge"
        # What the refused requests had reserved was given back: a body that fits passes.
        for _ in range(3):
            fits = httpx.post(url, content=b"x" * (250 * 1024), headers=shaped)
            assert (fits.status_code, fits.json()["error"]) == (401, "InvalidSignature")
        body, headers = github_request(GITHUB_SECRET, issue_payload("acme/api", 9))
        assert httpx.post(url, content=body, headers=headers).status_code == 202


def test_a_reservation_is_released_whatever_ends_the_request() -> None:
    budget = BodyBudget(100)

    def failing_request() -> None:
        with budget.hold() as reservation:
            reservation.reserve(60)
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        failing_request()
    assert budget.in_use == 0
    with budget.hold() as joined:
        joined.reserve(30)
        joined.reserve(30)
        joined.release(30)
        assert (budget.in_use, joined.size) == (30, 30)
    assert budget.in_use == 0
    with budget.hold() as first:
        first.reserve(60)
        with budget.hold() as second, pytest.raises(BodyBufferFull):
            second.reserve(41)
        assert budget.in_use == 60
    assert budget.in_use == 0


def test_the_documented_defaults() -> None:
    defaults = Settings()
    assert defaults.ingest_buffer_bytes == 64 * MiB
    assert defaults.max_header_bytes == 64 * 1024
    assert defaults.limit_concurrency == 1000
    assert defaults.keep_alive_seconds == 5
    assert defaults.head_timeout_seconds == 10
    assert defaults.allow_dev_secrets is False


def test_a_chunked_trailer_is_bounded_like_a_head(start_api: Callable[..., GatewayProcess]) -> None:
    """Trailers come after the body and were parsed without a limit (httptools grows a header
    value with ``bytes +=``), here while the gateway waits for the body's end to verify it."""
    gateway = start_api(EVENTGATE_MAX_HEADER_BYTES=str(64 * 1024))
    before = _status(gateway.proc.pid)["VmRSS"]
    sent = 0
    fields = {
        "Transfer-Encoding": "chunked",
        "X-GitHub-Event": "issues",
        "X-GitHub-Delivery": "trailer-1",
        "X-Hub-Signature-256": "sha256=" + "0" * 64,
    }
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head("/v1/webhooks/github", fields))
        sock.sendall(b"1\r\na\r\n" * 1000 + b"0\r\nX-Pad: ")
        with contextlib.suppress(OSError):  # the gateway cuts the trailer off
            while sent < 64 * MiB:
                sock.sendall(b"a" * MiB)
                sent += MiB
        time.sleep(0.5)
    assert sent < 8 * MiB, f"{sent >> 20} MiB of trailer were accepted"
    assert _status(gateway.proc.pid)["VmRSS"] - before < 8 * MiB
    refused = [e for e in gateway.log_events() if e["event"] == "request_refused"]
    assert [(e["error"], e["status"]) for e in refused] == [("RequestHeadersTooLarge", 431)]


def test_declared_lengths_without_bodies_hold_no_budget(
    start_api: Callable[..., GatewayProcess],
) -> None:
    """A declared Content-Length was reserved whole once the headers passed: four idle
    connections declaring 16 MiB between them locked every real webhook out."""
    gateway = start_api(EVENTGATE_INGEST_BUFFER_BYTES=str(BUDGET))
    shaped = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "issues",
        "X-Hub-Signature-256": "sha256=" + "0" * 64,
    }
    squatters = []
    try:
        for length in (5 * MiB, 5 * MiB, 5 * MiB, BUDGET - 15 * MiB):
            sock = socket.create_connection(("127.0.0.1", gateway.port))
            sock.sendall(head("/v1/webhooks/github", {**shaped, "Content-Length": str(length)}))
            squatters.append(sock)  # ... and never a body byte
        time.sleep(0.5)
        body, headers = github_request(GITHUB_SECRET, issue_payload("acme/api", 1))
        reply = httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=headers)
    finally:
        for sock in squatters:
            sock.close()
    assert reply.status_code == 202, reply.text


def test_connections_that_send_no_head_are_closed(start_api: Callable[..., GatewayProcess]) -> None:
    """uvicorn times a connection out only after a response: sockets that never sent a byte,
    trickled a head, or sent only blank lines held the connection limit for ever."""
    gateway = start_api(
        EVENTGATE_LIMIT_CONCURRENCY="6",
        EVENTGATE_KEEP_ALIVE_SECONDS="1",
        EVENTGATE_HEAD_TIMEOUT_SECONDS="2",
    )
    silent = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(2)]
    trickling = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(2)]
    blank = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(2)]
    try:
        for sock in trickling:
            sock.sendall(b"POST /v1/webhooks/github HTTP/1.1\r\n")
        started = time.monotonic()
        while time.monotonic() - started < 4:
            with contextlib.suppress(OSError):  # closed by the gateway, as it should
                trickling[1].sendall(b"X-A: b\r\n")
                for sock in blank:
                    sock.sendall(b"\r\n")
            time.sleep(0.5)
        body, headers = github_request(GITHUB_SECRET, issue_payload("acme/api", 2))
        reply = httpx.post(f"{gateway.url}/v1/webhooks/github", content=body, headers=headers)
        assert reply.status_code == 202, reply.text
        for sock in silent + blank:
            sock.settimeout(1)
            # Closed without a word (no request was begun), or reset: blank lines were still
            # arriving when it closed.
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""
        status, _, error = response(trickling[0], timeout=1)
        assert (status, error["error"]) == (408, "RequestHeadTimeout")
        refused = [e for e in gateway.log_events() if e["event"] == "request_refused"]
        assert [e["error"] for e in refused] == ["RequestHeadTimeout"]  # one line per 10 s
    finally:
        for sock in silent + trickling + blank:
            sock.close()


def test_a_later_head_on_a_kept_alive_connection_gets_its_own_timeout(
    start_api: Callable[..., GatewayProcess],
) -> None:
    """One head timer per connection, re-armed when it fires: a head that starts while the
    timer armed for the previous request is pending is timed out from its own first byte,
    neither at the earlier deadline nor never."""
    gateway = start_api(EVENTGATE_KEEP_ALIVE_SECONDS="5", EVENTGATE_HEAD_TIMEOUT_SECONDS="2")
    body, headers = github_request(GITHUB_SECRET, issue_payload("acme/api", 3))
    headers["Content-Length"] = str(len(body))
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head("/v1/webhooks/github", headers) + body)
        assert response(sock)[0] == 202
        time.sleep(1.5)  # the first request's timer is still pending
        sock.sendall(b"POST /v1/webhooks/github HTTP/1.1\r\n")
        began = time.monotonic()
        status, _, error = response(sock, timeout=6)
        waited = time.monotonic() - began
    assert (status, error["error"]) == (408, "RequestHeadTimeout")
    assert 1.8 <= waited <= 3.5, waited


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        "Content-Length: +2\r\n\r\n{}",
    ],
    ids=["cl-and-te", "two-cl", "signed-cl"],
)
def test_a_request_the_parser_refuses_gets_a_json_400(
    start_api: Callable[..., GatewayProcess], framing: str
) -> None:
    gateway = start_api()
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(b"POST /v1/webhooks/github HTTP/1.1\r\nHost: x\r\n" + framing.encode())
        status, headers, error = response(sock)
    assert status == 400 and headers["content-type"] == "application/json"
    assert error["error"] == "InvalidHTTPRequest"

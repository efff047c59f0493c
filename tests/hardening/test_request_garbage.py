"""A served request leaves nothing for the cyclic GC: its objects (scope, body, the
response cycle) are freed by reference counting as soon as it is answered. A reference
cycle per request (``app/serving.py`` once stored a closure over the cycle on the cycle)
keeps every request's objects alive until a collection, costing CPU and a latency tail."""

from __future__ import annotations

import gc
import socket
import threading
import time
from typing import Any

import orjson
import uvicorn

from app.serving import http_protocol
from app.settings import Settings
from tests.hardening.raw_http import head, response
from tests.support import free_port

REQUESTS = 200


async def _answer(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = orjson.dumps({"status": "queued"})
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 202, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def test_answered_requests_leave_no_reference_cycles() -> None:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            _answer,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            http=http_protocol(Settings()),
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    body = b'{"action": "opened"}'
    request = head("/v1/webhooks/github", {"Content-Length": str(len(body))}) + body
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request)
            assert response(sock)[0] == 202  # warm: whatever one-off objects exist now
            gc.collect()
            gc.disable()
            try:
                for _ in range(REQUESTS):
                    sock.sendall(request)
                    assert response(sock)[0] == 202
                unreachable = gc.collect()
            finally:
                gc.enable()
    finally:
        server.should_exit = True
        thread.join(timeout=20)
    # A cycle per request leaves a dozen or more objects each (2,400+ here).
    assert unreachable < REQUESTS, f"{unreachable} objects were only freed by the cyclic GC"

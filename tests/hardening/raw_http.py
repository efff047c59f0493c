"""A gateway config for raw-socket tests of what is held before a request is verified, and
a request head and response read over a plain socket."""

from __future__ import annotations

import socket
from typing import Any

import orjson

GITHUB_SECRET = "memory-github-secret"
TOKEN = "memory-alerts-token-0123456789"
HMAC_SECRET = "memory-hmac-secret-0123"
CONFIG = f"""
sources:
  github: {{type: github, secret: {GITHUB_SECRET}, pipeline: p}}
  alerts: {{type: alertmanager, token: {TOKEN}, pipeline: p, max_body_bytes: 52428800}}
  partner:
    type: hmac
    secret: {HMAC_SECRET}
    signature: {{timestamp_header: X-Ts}}
    max_body_bytes: 52428800
    pipeline: p
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""


def head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def response(sock: socket.socket, timeout: float = 30) -> tuple[int, dict[str, str], Any]:
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    if not head:
        return 0, {}, None
    status = int(head.split()[1])
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, orjson.loads(body[body.find(b"{") :]) if b"{" in body else None

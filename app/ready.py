"""The line a serving process prints once it listens: its URL, ``/docs`` and ``/console``.

It comes after the socket is bound (a process that cannot bind never claims to be ready):
a structlog ``gateway_ready`` event for log pipelines, and the same as a plain line on stdout
for the person who just typed ``make run``.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from dataclasses import dataclass

import structlog
import uvicorn

log = structlog.get_logger(__name__)
# Roles that serve the admin API (and so the console beside it).
WITH_CONSOLE = frozenset({"serve", "api"})


@dataclass(frozen=True, slots=True)
class GatewayUrls:
    url: str
    docs: str
    console: str | None


def gateway_urls(host: str, port: int, *, role: str) -> GatewayUrls:
    """Where a person reaches a process listening on ``host:port``: a wildcard address is
    shown as the loopback one (what a browser on the same machine opens)."""
    shown = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    try:
        if ipaddress.ip_address(shown).version == 6:
            shown = f"[{shown}]"
    except ValueError:
        pass  # a host name
    url = f"http://{shown}:{port}"
    return GatewayUrls(
        url=url, docs=f"{url}/docs", console=f"{url}/console" if role in WITH_CONSOLE else None
    )


class GatewayServer(uvicorn.Server):
    """uvicorn's server, announcing where it listens once its socket is bound."""

    def __init__(self, config: uvicorn.Config, *, role: str) -> None:
        super().__init__(config)
        self.role = role

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self.announce()

    def announce(self) -> None:
        port = self.config.port
        if self.servers and self.servers[0].sockets:
            port = self.servers[0].sockets[0].getsockname()[1]  # the real one for port 0
        urls = gateway_urls(self.config.host, port, role=self.role)
        log.info(
            "gateway_ready",
            role=self.role,
            url=urls.url,
            docs=urls.docs,
            console=urls.console,
            listen=f"{self.config.host}:{port}",
        )
        console = f", console {urls.console}" if urls.console else ""
        print(f"eventgate {self.role} is ready: {urls.url} (API docs {urls.docs}{console})")
        sys.stdout.flush()

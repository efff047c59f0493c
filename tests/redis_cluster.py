"""A real three-master Redis Cluster on free local ports, for the tests that must run on one.

``LocalCluster.start`` runs three ``redis-server --cluster-enabled yes`` (no persistence, each
in its own directory), joins them with ``redis-cli --cluster create`` (no replicas) and waits
for ``cluster_state:ok``. Ports are chosen by binding port 0, never 6379 (other processes on
the machine use that Redis). ``kill`` stops one master, for outage tests; ``stop`` all.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import free_port

MASTERS = 3


def require_cluster_tools() -> None:
    """Skip the test when redis-server or redis-cli is missing; in CI (``CI`` set) fail."""
    missing = [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]
    if not missing:
        return
    reason = f"no Redis Cluster: {' and '.join(missing)} not installed"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs the cluster tests)")
    pytest.skip(reason)


@dataclass
class LocalCluster:
    root: Path
    ports: list[int] = field(default_factory=list)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """One node's URL: what a gateway is given (it finds the others itself)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def node_url(self, index: int) -> str:
        return f"redis://127.0.0.1:{self.ports[index]}/0"

    def start(self) -> LocalCluster:
        for index in range(MASTERS):
            port = _unused_port(self.ports)
            node_dir = self.root / f"node-{index}"
            node_dir.mkdir(parents=True)
            self.processes[port] = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(node_dir / "nodes.conf"),
                    "--cluster-node-timeout",
                    "2000",
                    "--dir",
                    str(node_dir),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--logfile",
                    str(node_dir / "redis.log"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.ports.append(port)
        for port in self.ports:
            _wait(lambda: _cli(port, "PING") == "PONG", what=f"redis-server on {port}")  # noqa: B023
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for port in self.ports:
            _wait(
                lambda: "cluster_state:ok" in _cli(port, "CLUSTER", "INFO"),  # noqa: B023
                what=f"cluster_state:ok on {port}",
            )
        return self

    def kill(self, index: int) -> None:
        """SIGKILL one master: its slots become unwritable (no replica takes over)."""
        process = self.processes[self.ports[index]]
        process.kill()
        process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _unused_port(taken: list[int]) -> int:
    while True:
        port = free_port()
        # A cluster node also listens on port + 10000 (the cluster bus): free as well.
        if port not in taken and port != 6379 and port + 10000 <= 65535 and _free(port + 10000):
            return port


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cli(port: int, *command: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *command],
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    )
    return done.stdout.strip()


def _wait(ready: Callable[[], bool], *, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")

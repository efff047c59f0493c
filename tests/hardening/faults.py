"""Fault injection for tests: a TCP proxy that can be cut, made to throttle or slowed down,
and a private ``redis-server`` that can be killed and restarted empty. The shared Redis and
PostgreSQL are never stopped; the gateway reaches them (or moto) through a proxy instead."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from redis import Redis

from tests.support import free_port, reachable

THROTTLED = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/xml\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)
THROTTLE_XML = (
    b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>"
    b"<Message>Rate exceeded</Message></Error><RequestId>x</RequestId></ErrorResponse>"
)


class FaultProxy:
    """``127.0.0.1:<port>`` → ``target``, on its own event loop thread.

    mode ``pass`` forwards; ``cut`` closes every open connection and every new one at once
    (a dependency that is down); ``throttle`` answers each HTTP request with an AWS
    ``Throttling`` error. ``delay`` holds each chunk from the target back that long.
    ``requests`` counts chunks sent by clients (seen while forwarding), ``refused`` the
    connections a fault turned away."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.mode = "pass"
        self.delay = 0.0
        self.requests = 0
        self.refused = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Close every connection and stop the proxy's loop."""
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._close_all)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def vanish(self) -> None:
        """The host vanishes: the loop stops with every connection left open and unanswered,
        so a peer waiting on one waits for ever. (``stop`` queued closes first, and whether
        they went out before the loop stopped was a race.) Call ``drop_leftovers`` after."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def drop_leftovers(self) -> None:
        """After ``vanish()``: close what it left open, running the stopped loop briefly from
        this thread. Left open, a database connection stays idle in transaction and its
        locks block the next test."""
        self._close_all()
        self._loop.run_until_complete(asyncio.sleep(0.1))

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        if mode != "pass":
            self._loop.call_soon_threadsafe(self._close_all)

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", self.port)
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode != "pass":
            self.refused += 1
        if self.mode == "cut":
            writer.close()
            return
        if self.mode == "throttle":
            await _throttle(reader, writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, upstream=True),
                self._pipe(up_reader, writer, upstream=False),
            )
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await reader.read(65536):
                if self.mode != "pass":
                    break
                if upstream:
                    self.requests += 1
                elif self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(chunk)
                await writer.drain()
        writer.close()


async def _throttle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            await reader.readexactly(length)
            writer.write(THROTTLED % (len(THROTTLE_XML), THROTTLE_XML))
            await writer.drain()
            break
    writer.close()


class PrivateRedis:
    """A throwaway ``redis-server`` on a free port: no persistence, or with ``aof=True`` an
    append-only file fsynced on every write, so a restart after a kill keeps everything."""

    def __init__(self, workdir: Path, *, aof: bool = False) -> None:
        self.binary = shutil.which("redis-server") or "redis-server"
        self.port = free_port()
        self.workdir = workdir
        self.aof = aof
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            [
                *(self.binary, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--dir", str(self.workdir)),
                *(
                    ("--appendonly", "yes", "--appendfsync", "always")
                    if self.aof
                    else ("--appendonly", "no")
                ),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not reachable("127.0.0.1", self.port):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def client(self) -> Redis:
        return Redis.from_url(self.url)


class ReplicatedRedis:
    """A private primary (no persistence) and one replica of it, each on a free port. The
    replica can be frozen (SIGSTOP: still connected, it acknowledges nothing), thawed, and
    stopped (the primary then counts no replica) and started again."""

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("redis-server") or "redis-server"
        self.workdir = workdir
        self.primary_port = free_port()
        self.replica_port = free_port()
        self.primary: subprocess.Popen[bytes] | None = None
        self.replica: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.primary_port}/0"

    def start(self) -> ReplicatedRedis:
        # No delay before a full sync (the default waits 5 s for more replicas to join).
        self.primary = self._server(self.primary_port, "primary", "--repl-diskless-sync-delay", "0")
        self.start_replica()
        return self

    def start_replica(self) -> None:
        self.replica = self._server(
            self.replica_port, "replica", "--replicaof", "127.0.0.1", str(self.primary_port)
        )
        self.wait_in_sync()

    def stop_replica(self) -> None:
        _end(self.replica)
        deadline = time.monotonic() + 10
        while self.replicas_online():
            assert time.monotonic() < deadline, "the primary still counts the stopped replica"
            time.sleep(0.05)

    def freeze_replica(self) -> None:
        assert self.replica is not None
        self.replica.send_signal(signal.SIGSTOP)

    def thaw_replica(self) -> None:
        assert self.replica is not None
        self.replica.send_signal(signal.SIGCONT)
        self.wait_in_sync()

    def replicas_online(self) -> int:
        with Redis(port=self.primary_port) as client:
            info = client.info("replication")
        return sum(1 for k, v in info.items() if k.startswith("slave") and _online(v))

    def wait_in_sync(self, timeout: float = 20) -> None:
        """Until the replica is online and has acknowledged everything the primary wrote."""
        deadline = time.monotonic() + timeout
        while True:
            with Redis(port=self.primary_port) as client:
                info = client.info("replication")
            replica = info.get("slave0")
            if _online(replica) and replica["offset"] == info["master_repl_offset"]:
                return
            assert time.monotonic() < deadline, f"the replica did not catch up: {info}"
            time.sleep(0.05)

    def close(self) -> None:
        if self.replica is not None and self.replica.poll() is None:
            self.replica.send_signal(signal.SIGCONT)
        _end(self.replica)
        _end(self.primary)

    def _server(self, port: int, name: str, *extra: str) -> subprocess.Popen[bytes]:
        directory = self.workdir / name
        directory.mkdir(exist_ok=True)
        proc = subprocess.Popen(
            [
                *(self.binary, "--port", str(port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(directory), *extra),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not reachable("127.0.0.1", port):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        return proc


def _online(replica: object) -> bool:
    return isinstance(replica, dict) and replica.get("state") == "online"


def _end(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

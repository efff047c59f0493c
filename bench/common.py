"""What every benchmark shares: the machine line, the report file, processes, Redis, a DB."""

from __future__ import annotations

import asyncio
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "benchmarks.md"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_ADMIN_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
GITHUB_SECRET = "bench-github-secret"
PYTHON = sys.executable
# The tool the direct SDK calls offer (the sequential loop, the client benchmark).
ALERT_TOOL = {
    "name": "publishAlert",
    "description": "Raise an alert.",
    "input_schema": {
        "type": "object",
        "properties": {"severity": {"type": "string", "enum": ["high", "low"]}},
        "required": ["severity"],
    },
}

# The benchmarks talk to moto only; boto3 still wants credentials and a region.
for _name, _value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ.setdefault(_name, _value)


class Skip(Exception):
    """A benchmark cannot run here (a service or tool is missing); the message says which."""


def machine() -> str:
    mem_kb = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (
        f"{os.cpu_count()} CPUs (nproc), {mem_kb / 1024 / 1024:.1f} GiB RAM, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}, "
        f"commit {commit or '?'}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )


def report(title: str, command: str, body: Sequence[str]) -> None:
    """Print the figures and append them, with the machine and command, to docs/benchmarks.md."""
    text = "\n".join(
        [f"### {title}", "", f"- machine: {machine()}", f"- command: `{command}`", "", *body, ""]
    )
    print(text, flush=True)
    REPORT.parent.mkdir(exist_ok=True)
    if not REPORT.exists():
        REPORT.write_text(
            "# Benchmarks\n\nAppended by `make bench` (`python -m bench.run_all`); newest last. "
            "Each section names the machine, the command and the commit it measured.\n\n"
        )
    with REPORT.open("a") as out:
        out.write(text + "\n")


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_redis() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise Skip(f"no Redis at {REDIS_URL} ({exc}); start one or set BENCH_REDIS_URL") from None
    return client


def redis_prefix(name: str) -> str:
    return f"bench-{name}-{uuid.uuid4().hex[:8]}"


def drop_prefix(client: redis.Redis, prefix: str) -> None:
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


def stream_depth(client: redis.Redis, prefix: str) -> int:
    return sum(int(client.xlen(key)) for key in client.scan_iter(match=f"{prefix}:*:stream"))


@contextmanager
def database(name: str) -> Iterator[str]:
    """A fresh PostgreSQL database when one is reachable (dropped after), else SQLite."""
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=0.5):
            have_pg = True
    except OSError:
        have_pg = False
    if not have_pg:
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite+aiosqlite:///{tmp}/{name}.db"
        return
    import asyncpg

    db = f"eventgate_bench_{name}_{uuid.uuid4().hex[:8]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN_URL)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{db}"'))
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    try:
        yield f"{base}/{db}"
    finally:
        asyncio.run(admin(f'DROP DATABASE "{db}" WITH (FORCE)'))


class Server:
    """A server process (its own process group), ready once ``ready_path`` answers 200."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        port: int,
        ready_path: str = "/healthz",
        cwd: Path = ROOT,
    ) -> None:
        self.argv = list(argv)
        self.cwd = cwd
        self.env = env
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self.log = tempfile.NamedTemporaryFile(prefix="eventgate-bench-", suffix=".log")  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def __enter__(self) -> Server:
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.command} exited:\n{self.output()}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"{self.command} not ready:\n{self.output()}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def pids(self) -> list[int]:
        """The server process and its children (uvicorn --workers)."""
        assert self.proc is not None
        found = [self.proc.pid]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        if children.exists():
            found += [int(pid) for pid in children.read_text().split()]
        return found

    def cpu_seconds(self) -> float:
        """User + system CPU of the server and its workers, all threads."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.pids():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / ticks

    def memory_mb(self, field: str = "VmRSS") -> float:
        for line in Path(f"/proc/{self.pids()[0]}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        return 0.0


def fake_sns_and_claude(stack: ExitStack) -> tuple[Server, Server]:
    """``bench.fake_sns`` and the fake Messages API (zero latency), each its own process on a
    free port, entered into ``stack``."""
    sns_port, claude_port = free_port(), free_port()
    sns = Server(
        [PYTHON, "-m", "bench.fake_sns", "--port", str(sns_port)],
        env=dict(os.environ),
        port=sns_port,
        ready_path="/_stats",
    )
    claude = Server(
        [PYTHON, "-m", "eventgate_dev.fake_anthropic", "--port", str(claude_port)],
        env=dict(os.environ),
        port=claude_port,
        ready_path="/_fake/stats",
    )
    return stack.enter_context(sns), stack.enter_context(claude)


def gateway_env(
    *, prefix: str, database_url: str, config: Path, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENTGATE_", "ANTHROPIC_"))}
    env.update(
        {
            "BENCH_GITHUB_SECRET": GITHUB_SECRET,
            "EVENTGATE_CONFIG": str(config),
            "EVENTGATE_REDIS_URL": REDIS_URL,
            "EVENTGATE_REDIS_PREFIX": prefix,
            "EVENTGATE_DATABASE_URL": database_url,
            "EVENTGATE_LOG_FORMAT": "json",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }
    )
    env.update(extra or {})
    return env


def write_config(directory: Path, topic_arn: str | None = None) -> Path:
    topic = f"\n    topic_arn: {topic_arn}" if topic_arn else ""
    path = directory / "eventgate.yaml"
    path.write_text(
        f"""
sources:
  github: {{type: github, secret: "${{BENCH_GITHUB_SECRET}}", pipeline: triage}}
pipelines:
  triage:
    model: claude-sonnet-4-6
    system: You triage GitHub events for the on-call team.
    tools: [publishAlert]
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties: {{severity: {{type: string, enum: [high, low]}}, title: {{type: string}}}}
      required: [severity, title]{topic}
"""
    )
    return path

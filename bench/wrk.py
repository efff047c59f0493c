"""wrk with signed GitHub deliveries: a generated Lua script, one unique delivery id each.

The bodies (and their HMAC signatures) are made here, in Python; the Lua script only cycles
through them and sets ``X-GitHub-Delivery`` to a fresh id per request (the signature covers
the body, not the headers). ``quota`` stops each thread after that many requests.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.common import GITHUB_SECRET, Skip
from tests.support import issue_payload

_LUA = """
local bodies = {%(bodies)s}
local sigs = {%(sigs)s}
local n = #bodies
local quota = %(quota)d
local counter = 0
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function request()
  counter = counter + 1
  local i = (counter + tid * 7919) %% n + 1
  local headers = {}
  headers["Content-Type"] = "application/json"
  headers["X-GitHub-Event"] = "issues"
  headers["X-GitHub-Delivery"] = "%(run)s-" .. tid .. "-" .. counter
  headers["X-Hub-Signature-256"] = sigs[i]
  return wrk.format("POST", "/v1/webhooks/github", headers, bodies[i])
end

function response(status, headers, body)
  if quota > 0 and counter >= quota then wrk.thread:stop() end
end

function done(summary, latency, requests)
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, ' ..
    '"status_errors": %%d, "socket_errors": %%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    status_errors: int
    socket_errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def require_wrk() -> str:
    """wrk, installed with apt-get when missing and allowed (root on Debian/Ubuntu)."""
    found = shutil.which("wrk")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        print("wrk is missing: apt-get install -y wrk", flush=True)
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
            subprocess.run(argv, check=False, capture_output=True)
        found = shutil.which("wrk")
    if found is None:
        raise Skip("wrk is not installed: `apt-get install -y wrk` or `brew install wrk`")
    return found


def write_script(directory: Path, *, keys: int = 200, quota: int = 0) -> Path:
    bodies, sigs = [], []
    for n in range(keys * 3):
        body = orjson.dumps(issue_payload(f"bench/repo-{n % keys}", n))
        sig = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
        bodies.append("[==[" + body.decode() + "]==]")
        sigs.append(f'"sha256={sig}"')
    script = directory / f"signed-{uuid.uuid4().hex[:6]}.lua"
    script.write_text(
        _LUA
        % {
            "bodies": ",".join(bodies),
            "sigs": ",".join(sigs),
            "quota": quota,
            "run": uuid.uuid4().hex[:10],
        }
    )
    return script


def run_wrk(
    url: str, script: Path, *, seconds: int, connections: int = 32, threads: int = 2
) -> WrkResult:
    argv = [
        require_wrk(),
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("WRKJSON "))
    data = json.loads(line.removeprefix("WRKJSON "))
    return WrkResult(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        status_errors=data["status_errors"],
        socket_errors=data["socket_errors"],
    )

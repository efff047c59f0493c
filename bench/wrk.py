"""wrk with signed GitHub deliveries: a generated Lua script, every request a new delivery.

The bodies are made here, in Python; the Lua script cycles through them, makes each request's
body unique (a ``bench_nonce`` field) and signs it with HMAC-SHA256 from the system's
libcrypto through LuaJIT's FFI, and sets ``X-GitHub-Delivery`` to a fresh id. Every request
must be a new, signed body: the gateway deduplicates a replayed signed body under a new
delivery id (the header is not signed), so a fixed body would measure the duplicate path.
``quota`` stops each thread after that many requests.
"""

from __future__ import annotations

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
local ffi = require("ffi")
ffi.cdef[[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_sha256(void);
unsigned char *HMAC(const EVP_MD *evp_md, const void *key, int key_len,
                    const unsigned char *d, size_t n, unsigned char *md, unsigned int *md_len);
]]
local crypto = ffi.load("crypto")
local digest = ffi.new("unsigned char[32]")
local digest_len = ffi.new("unsigned int[1]")
local secret = "%(secret)s"

local function signature(body)
  crypto.HMAC(crypto.EVP_sha256(), secret, #secret, body, #body, digest, digest_len)
  local hex = {}
  for i = 0, 31 do hex[i + 1] = string.format("%%02x", digest[i]) end
  return "sha256=" .. table.concat(hex)
end

local bodies = {%(bodies)s}
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
  local nonce = "%(run)s-" .. tid .. "-" .. counter
  local body = string.sub(bodies[i], 1, -2) .. ',"bench_nonce":"' .. nonce .. '"}'
  local headers = {}
  headers["Content-Type"] = "application/json"
  headers["X-GitHub-Event"] = "issues"
  headers["X-GitHub-Delivery"] = nonce
  headers["X-Hub-Signature-256"] = signature(body)
  return wrk.format("POST", "/v1/webhooks/github", headers, body)
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
    bodies = []
    for n in range(keys * 3):
        body = orjson.dumps(issue_payload(f"bench/repo-{n % keys}", n))
        bodies.append("[==[" + body.decode() + "]==]")
    script = directory / f"signed-{uuid.uuid4().hex[:6]}.lua"
    script.write_text(
        _LUA
        % {
            "bodies": ",".join(bodies),
            "secret": GITHUB_SECRET,
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

"""A small fake of the Anthropic Messages API over real HTTP, for end-to-end tests, the
first-run walkthrough and benchmarks (point ``ANTHROPIC_BASE_URL`` at it).

By default it answers every request by calling the first offered tool with an input built
from the tool's schema (plus the event type and group parsed from the prompt). ``faults`` is
a list of HTTP statuses returned, one per request, before normal answers resume;
``fail_every`` fails every n-th request, ``fail_ratio`` a random share of them (with a
status drawn from ``fail_statuses``; ``slow_ratio`` makes a share answer only after
``slow_seconds``, past a client's timeout), and ``down_until`` (a ``time.monotonic()`` value)
fails every request until then. ``answered`` keeps the request id of every answer. Usage
reports the system prompt and tools as a cache write the first time a prefix is seen and as a
cache read afterwards, like prompt caching does.

``personas`` makes it answer differently per model or per system prompt, so tests comparing
two pipelines see real disagreements: a ``Persona`` names the tool it calls (or none), which
enum value it picks, and the share of its answers whose enum values and numbers vary at
random (a model that is not consistent with itself), and optionally a ``when`` text: it
calls its tool only for prompts whose user turn contains that text, the first offered tool
otherwise (a triage model that escalates only the critical alerts). A persona is chosen by
the request's model name, or by a ``system:TEXT`` key whose TEXT the system prompt contains
(those first).

The Message Batches endpoints (``/v1/messages/batches``, eventgate_dev/fake_batches.py)
answer each request as ``/v1/messages`` would, after ``batch_delay`` seconds, with their own
faults (``batch_expire_first``, ``batch_error_rate``); ``/_fake/stats`` counts them.

    python -m eventgate_dev.fake_anthropic --port 8787 --latency 0.2 \
        [--persona claude-haiku-4-5=enum:last,vary:0.2] [--persona "system:v2=tool:none"] \
        [--persona "claude-haiku-4-5=tool:escalate,when:severity=critical"] \
        [--batch-delay 2 --batch-error-rate 0.1 --batch-expire-first 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from eventgate_dev.fake_batches import FakeBatch, batch_routes


@dataclass(frozen=True)
class Persona:
    """How one model (or system prompt) answers: ``tool`` is the offered tool it calls (None:
    the first offered; "none": no tool at all), ``enum`` the value it picks ("first" or
    "last"), ``vary`` the share of answers whose enum values and numbers are drawn at
    random instead (seeded, so a run is repeatable); with ``when`` set, ``tool`` applies only
    to user turns containing that text, and the others get the first offered tool."""

    tool: str | None = None
    enum: str = "first"
    vary: float = 0.0
    seed: int = 0
    when: str | None = None

    @classmethod
    def parse(cls, text: str) -> Persona:
        """``tool:NAME,enum:last,vary:0.2,seed:1,when:TEXT`` (each part optional; TEXT
        without commas)."""
        parts = dict(part.split(":", 1) for part in text.split(",") if part)
        unknown = set(parts) - {"tool", "enum", "vary", "seed", "when"}
        if unknown or parts.get("enum", "first") not in ("first", "last"):
            raise ValueError(
                f"persona {text!r}: parts are tool:, enum:first|last, vary:, seed:, when:"
            )
        return cls(
            tool=parts.get("tool"),
            enum=parts.get("enum", "first"),
            vary=float(parts.get("vary", 0)),
            seed=int(parts.get("seed", 0)),
            when=parts.get("when"),
        )


@dataclass
class FakeBehaviour:
    latency: float = 0.0
    jitter: float = 0.0
    faults: list[int] = field(default_factory=list)
    # Called with the request JSON; returns content blocks, or None for the default answer.
    responder: Any = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    # Every n-th request (counting all requests) fails with fail_status; 0 = never.
    fail_every: int = 0
    fail_status: int = 500
    # Until this time.monotonic() value every request fails with down_status.
    down_until: float = 0.0
    down_status: int = 529
    # A random share of requests fails (status drawn from fail_statuses) or is slow.
    fail_ratio: float = 0.0
    fail_statuses: tuple[int, ...] = (429, 500, 503, 529)
    slow_ratio: float = 0.0
    slow_seconds: float = 0.0
    # The request id of every answer, error or not.
    answered: list[str] = field(default_factory=list)
    # Extra headers on successful answers (e.g. anthropic-ratelimit-*).
    headers: dict[str, str] = field(default_factory=dict)
    # (time.monotonic() when received, HTTP status answered) per request.
    log: list[tuple[float, int]] = field(default_factory=list)
    cached_prefixes: set[str] = field(default_factory=set)
    # model name, or "system:TEXT" (matched in the system prompt) → how it answers
    personas: dict[str, Persona] = field(default_factory=dict)
    _rngs: dict[Persona, random.Random] = field(default_factory=dict)
    # Message Batches (eventgate_dev/fake_batches.py): seconds before a batch ends, the first
    # n batches that expire, the share of a batch's requests that end errored.
    batch_delay: float = 0.0
    batch_expire_first: int = 0
    batch_error_rate: float = 0.0
    batches: dict[str, FakeBatch] = field(default_factory=dict)

    def persona_for(self, body: dict[str, Any]) -> Persona:
        system = repr(body.get("system") or "")
        for key, persona in self.personas.items():
            if key.startswith("system:") and key[len("system:") :] in system:
                return persona
        return self.personas.get(str(body.get("model")), Persona())

    def rng(self, persona: Persona) -> random.Random:
        return self._rngs.setdefault(persona, random.Random(persona.seed))

    def fault_for(self, number: int, now: float) -> int | None:
        if self.faults:
            return self.faults.pop(0)
        if now < self.down_until:
            return self.down_status
        if self.fail_every and number % self.fail_every == 0:
            return self.fail_status
        if self.fail_ratio and random.random() < self.fail_ratio:
            return random.choice(self.fail_statuses)
        return None

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The message answering a Messages API request ``body`` (faults aside)."""
        persona = self.persona_for(body)
        content = (self.responder(body) if self.responder else None) or default_answer(
            body, persona, self.rng(persona)
        )
        uses_tool = any(block["type"] == "tool_use" for block in content)
        return {
            "id": f"msg_{uuid.uuid4().hex[:20]}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "tool_use" if uses_tool else "end_turn",
            "stop_sequence": None,
            "usage": self.usage(body),
        }

    def usage(self, body: dict[str, Any]) -> dict[str, int]:
        prefix = repr((body.get("system"), body.get("tools")))
        prefix_tokens = len(prefix) // 4
        seen = prefix in self.cached_prefixes
        self.cached_prefixes.add(prefix)
        return {
            "input_tokens": len(repr(body.get("messages"))) // 4 + 1,
            "output_tokens": 40,
            "cache_creation_input_tokens": 0 if seen else prefix_tokens,
            "cache_read_input_tokens": prefix_tokens if seen else 0,
        }


def _first(values: list[Any]) -> Any:
    return values[0]


def _last(values: list[Any]) -> Any:
    return values[-1]


def _sample(schema: dict[str, Any], hints: dict[str, str], pick: Any = _first) -> Any:
    kind = schema.get("type")
    if "enum" in schema:
        return pick(schema["enum"])
    if kind == "object":
        props = schema.get("properties", {})
        return {
            name: _sample(props.get(name, {}), hints, pick) for name in schema.get("required", [])
        }
    if kind in ("integer", "number"):
        return pick([1, 2, 3])
    if kind == "boolean":
        return pick([True, False])
    if kind == "array":
        return []
    return f"{hints.get('event type', 'event')} in {hints.get('group', '?')}"


def default_answer(
    request: dict[str, Any], persona: Persona | None = None, rng: random.Random | None = None
) -> list[dict[str, Any]]:
    persona = persona or Persona()
    tools = request.get("tools") or []
    prompt = str(request["messages"][-1]["content"])
    if persona.when is not None and persona.when not in prompt:
        persona = Persona(enum=persona.enum, vary=persona.vary, seed=persona.seed)
    if not tools or persona.tool == "none":
        return [{"type": "text", "text": "nothing to do"}]
    hints = dict(re.findall(r"^(event type|group|source): (.*)$", prompt, re.MULTILINE))
    named = [t for t in tools if t["name"] == persona.tool]
    tool = named[0] if named else tools[0]
    pick: Any = _first
    if rng is not None and persona.vary and rng.random() < persona.vary:
        pick = rng.choice
    elif persona.enum == "last":
        pick = _last
    return [
        {"type": "text", "text": "Raising this with the team."},
        {
            "type": "tool_use",
            "id": f"toolu_{uuid.uuid4().hex[:20]}",
            "name": tool["name"],
            "input": _sample(tool.get("input_schema", {}), hints, pick),
        },
    ]


def build_app(behaviour: FakeBehaviour) -> Starlette:
    async def messages(request: Request) -> JSONResponse:
        body = await request.json()
        received = time.monotonic()
        behaviour.requests.append(body)
        fault = behaviour.fault_for(len(behaviour.requests), received)
        behaviour.log.append((received, fault or 200))
        behaviour.in_flight += 1
        behaviour.max_in_flight = max(behaviour.max_in_flight, behaviour.in_flight)
        try:
            delay = behaviour.latency + random.uniform(0, behaviour.jitter)
            if behaviour.slow_ratio and random.random() < behaviour.slow_ratio:
                delay += behaviour.slow_seconds
            if delay:
                await asyncio.sleep(delay)
            request_id = f"req_fake_{uuid.uuid4().hex[:16]}"
            behaviour.answered.append(request_id)
            if fault is not None:
                status = fault
                kind = {
                    429: "rate_limit_error",
                    529: "overloaded_error",
                    401: "authentication_error",
                    400: "invalid_request_error",
                }
                return JSONResponse(
                    {
                        "type": "error",
                        "error": {
                            "type": kind.get(status, "api_error"),
                            "message": f"fake fault {status}",
                        },
                    },
                    status_code=status,
                    headers={"request-id": request_id, "retry-after": "0"},
                )
            return JSONResponse(
                behaviour.answer(body), headers={"request-id": request_id, **behaviour.headers}
            )
        finally:
            behaviour.in_flight -= 1

    async def stats(request: Request) -> JSONResponse:
        """For benchmarks running the fake as a process: what it has seen, with the wall-clock
        times (``time.time()``) of the first and the last request received at or after
        ``?since=`` (a ``time.time()`` value; all requests without it; null if none).
        ``requests`` counts /v1/messages only; ``batches`` and ``batch_requests`` the
        Message Batches created and the requests in them (``since`` does not apply)."""
        to_wall = time.time() - time.monotonic()
        try:
            since = float(request.query_params.get("since", "0"))
        except ValueError:
            return JSONResponse({"error": "since must be a number (time.time())"}, 400)
        times = [received + to_wall for received, _ in behaviour.log]
        times = [t for t in times if t >= since]
        return JSONResponse(
            {
                "requests": len(behaviour.requests),
                "in_flight": behaviour.in_flight,
                "max_in_flight": behaviour.max_in_flight,
                "first_at": times[0] if times else None,
                "last_at": times[-1] if times else None,
                "batches": len(behaviour.batches),
                "batch_requests": sum(len(b.results) for b in behaviour.batches.values()),
            }
        )

    return Starlette(
        routes=[
            Route("/v1/messages", messages, methods=["POST"]),
            *batch_routes(behaviour),
            Route("/_fake/stats", stats, methods=["GET"]),
        ]
    )


class FakeAnthropicServer:
    """Runs the fake in a background thread on 127.0.0.1; ``base_url`` once started."""

    def __init__(self, behaviour: FakeBehaviour | None = None, port: int = 0) -> None:
        self.behaviour = behaviour or FakeBehaviour()
        config = uvicorn.Config(
            build_app(self.behaviour),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        sockets = self.server.servers[0].sockets
        return f"http://127.0.0.1:{sockets[0].getsockname()[1]}"

    def start(self) -> FakeAnthropicServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake Anthropic server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


class AnnouncedServer(uvicorn.Server):
    """Says where the fake listens, and what to export, once its socket is bound."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started or self.should_exit:
            return
        port = self.servers[0].sockets[0].getsockname()[1]
        url = f"http://{self.config.host}:{port}"
        print(f"fake Claude (Anthropic Messages API) is up on {url}", flush=True)
        print(f"point eventgate at it: export ANTHROPIC_BASE_URL={url}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument(
        "--persona",
        action="append",
        default=[],
        metavar="MODEL=SPEC",
        help="how MODEL (or system:TEXT) answers: tool:NAME|none,enum:first|last,vary:0.2",
    )
    parser.add_argument(
        "--batch-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="Message Batches: seconds before a batch ends (default 0: at once)",
    )
    parser.add_argument(
        "--batch-expire-first",
        type=int,
        default=0,
        metavar="N",
        help="Message Batches: the first N batches end with every request expired",
    )
    parser.add_argument(
        "--batch-error-rate",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="Message Batches: this exact share of a batch's requests end errored (by position)",
    )
    args = parser.parse_args()
    personas = {}
    for item in args.persona:
        key, _, spec = item.partition("=")
        personas[key] = Persona.parse(spec)
    behaviour = FakeBehaviour(
        latency=args.latency,
        jitter=args.jitter,
        personas=personas,
        batch_delay=args.batch_delay,
        batch_expire_first=args.batch_expire_first,
        batch_error_rate=args.batch_error_rate,
    )
    config = uvicorn.Config(
        build_app(behaviour), host=args.host, port=args.port, log_level="warning"
    )
    AnnouncedServer(config).run()


if __name__ == "__main__":
    main()

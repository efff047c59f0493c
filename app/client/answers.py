"""What the CLI needs of the admin API's answers, checked before anything is printed.

Only the fields the CLI reads are typed; every other key is let through as it is (a newer
gateway may add some), and ``--json`` prints the answer unchanged. A 200 from something
else at ``--url`` (a proxy, another service) fails here, as one sentence.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class _Shape(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _EventRow(_Shape):
    event_id: str
    status: str


class EventsPage(_Shape):
    items: list[_EventRow]
    total: int
    next_cursor: str | None = None


class _Attempt(_Shape):
    latency_ms: float | None = None
    cost_usd: float | None = None


class EventAnswer(_EventRow):
    timeline: list[dict[str, Any]] = []
    llm_calls: list[_Attempt] = []
    tool_calls: list[dict[str, Any]] = []
    dead_letter: dict[str, Any] | None = None


def shape_problem(shape: type[_Shape], body: Any) -> str | None:
    """Why ``body`` is not a ``shape`` (its first mismatch), or None when it is."""
    try:
        shape.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        if not error["loc"]:
            return f"{_json_type(body)} where an object was expected"
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        return f"{where.removeprefix('.')}: {error['msg']}"
    return None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")

"""When two decisions agree, and how often a set of pairs of them does.

A decision is the ordered list of (tool, input) pairs Claude asked for and the gateway
accepted; calls it refused are kept apart and do not count. Two decisions **agree on
action** when they name the same tools in the same order, and **agree exactly** when the
inputs are also equal as canonical JSON. Per field: for each enum, boolean or number field
of a tool's input schema (nested objects by dotted path), the share of pairs of calls of that
tool, at the same position in both decisions, whose values are equal. A group id Claude
proposed (``message_group_id`` in an input) is compared the same way. Every figure is a
fraction between 0 and 1, or None when nothing was compared.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GROUP_ID_FIELD = "message_group_id"
# Nested objects of a tool's schema whose fields are compared, at most this deep.
MAX_FIELD_DEPTH = 4
_MISSING = object()


@dataclass(frozen=True)
class Decision:
    calls: tuple[tuple[str, Mapping[str, Any]], ...]
    refused: tuple[str, ...] = ()

    @property
    def tools(self) -> tuple[str, ...]:
        return tuple(tool for tool, _ in self.calls)

    def shown(self) -> list[dict[str, Any]]:
        return [{"tool": tool, "input": dict(given)} for tool, given in self.calls]


def canonical(value: Any) -> str:
    """The JSON text two equal JSON values share: keys sorted, and a whole float written as
    the integer it is (JSON has one number type: 5 and 5.0 are one value)."""
    return json.dumps(
        _whole_numbers(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {key: _whole_numbers(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_whole_numbers(inner) for inner in value]
    return value


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values: 1 and 1.0 are (nested too), True and 1 are not."""
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, numbers) and isinstance(b, numbers):
        return a == b or (a != a and b != b)  # NaN: as the JSON text says, one value
    return a is b or (a is not _MISSING and b is not _MISSING and canonical(a) == canonical(b))


def scalar_fields(schema: Mapping[str, Any], depth: int = 0) -> list[str]:
    """Dotted paths of the enum, boolean and number fields a tool's input schema declares."""
    found: list[str] = []
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or depth >= MAX_FIELD_DEPTH:
        return found
    for name, sub in properties.items():
        if not isinstance(sub, Mapping):
            continue
        kinds = sub.get("type")
        kinds = set(kinds) if isinstance(kinds, list) else {kinds}
        if "enum" in sub or kinds & {"boolean", "number", "integer"}:
            found.append(str(name))
        elif "object" in kinds:
            found += [f"{name}.{inner}" for inner in scalar_fields(sub, depth + 1)]
    return found


def _at(given: Mapping[str, Any], path: str) -> Any:
    value: Any = given
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


@dataclass
class Tally:
    agreed: int = 0
    compared: int = 0

    def add(self, agrees: bool) -> None:
        self.compared += 1
        self.agreed += agrees

    @property
    def share(self) -> float | None:
        return self.agreed / self.compared if self.compared else None


@dataclass
class Agreement:
    """What a set of (event id, baseline, candidate) pairs agreed on."""

    schemas: Mapping[str, Mapping[str, Any]]
    max_disagreements: int = 50
    event_ids: set[str] = field(default_factory=set)
    action: Tally = field(default_factory=Tally)
    exact: Tally = field(default_factory=Tally)
    fields: dict[str, Tally] = field(default_factory=dict)
    group_id: Tally = field(default_factory=Tally)
    disagreements: list[dict[str, Any]] = field(default_factory=list)

    def add(self, event_id: str, baseline: Decision, candidate: Decision) -> bool:
        """Count one pair; True when it agrees exactly."""
        self.event_ids.add(event_id)
        on_action = baseline.tools == candidate.tools
        exactly = on_action and all(
            canonical(a) == canonical(b)
            for (_, a), (_, b) in zip(baseline.calls, candidate.calls, strict=True)
        )
        self.action.add(on_action)
        self.exact.add(exactly)
        for (tool, a), (other, b) in zip(baseline.calls, candidate.calls, strict=False):
            if tool != other:
                continue
            for path in scalar_fields(self.schemas.get(tool, {})):
                left, right = _at(a, path), _at(b, path)
                if left is not _MISSING or right is not _MISSING:
                    self.fields.setdefault(f"{tool}.{path}", Tally()).add(same(left, right))
            if GROUP_ID_FIELD in a or GROUP_ID_FIELD in b:
                self.group_id.add(
                    same(a.get(GROUP_ID_FIELD, _MISSING), b.get(GROUP_ID_FIELD, _MISSING))
                )
        if not exactly and len(self.disagreements) < self.max_disagreements:
            self.disagreements.append(
                {
                    "event_id": event_id,
                    "baseline": baseline.shown(),
                    "candidate": candidate.shown(),
                }
            )
        return exactly

    def add_runs(self, event_id: str, runs: Sequence[Decision]) -> None:
        """K runs of one event: every pair of them (K·(K-1)/2 pairs)."""
        for i, first in enumerate(runs):
            for second in runs[i + 1 :]:
                self.add(event_id, first, second)

    def summary(self) -> dict[str, Any]:
        return {
            "events": len(self.event_ids),
            "pairs": self.action.compared,
            "action_agreement": self.action.share,
            "exact_agreement": self.exact.share,
            "fields": {name: tally.share for name, tally in sorted(self.fields.items())},
            "group_id_agreement": self.group_id.share,
            "disagreements": self.disagreements,
        }


def agreement(
    pairs: Iterable[tuple[str, Decision, Decision]], schemas: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    found = Agreement(schemas)
    for event_id, baseline, candidate in pairs:
        found.add(event_id, baseline, candidate)
    return found.summary()

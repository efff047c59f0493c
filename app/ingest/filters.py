"""Declarative filters, evaluated at ingest before an event is queued.

Why at ingest and not in the worker: a filter is a pure function of one event, so deciding
it where the event arrives costs nothing downstream: noise never takes a stream entry, a
database row or a worker slot, and the sender is told the outcome (``filtered``) in the same
answer. The price is that a filtered event has no row for the admin API; it is counted in
``eventgate_events_filtered_total{source, reason}`` and logged with its type and reason.

Order: ``deny_types`` (any glob matches → drop), ``allow_types`` (none matches → drop),
``drop`` conditions (any holds → drop), ``require`` conditions (one fails → drop).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from app.payloads import dotted
from app.source_config import Condition, FilterRules

_MISSING = object()


@dataclass(frozen=True, slots=True)
class Verdict:
    keep: bool
    reason: str = ""  # a bounded word for the metric label
    detail: str = ""  # for the sender and the log


KEEP = Verdict(True)


def evaluate(rules: FilterRules | None, event_type: str, payload: Any) -> Verdict:
    if rules is None:
        return KEEP
    for pattern in rules.deny_types:
        if fnmatchcase(event_type, pattern):
            return Verdict(False, "type_denied", f"event type {event_type!r} matches {pattern!r}")
    if rules.allow_types is not None and not any(
        fnmatchcase(event_type, p) for p in rules.allow_types
    ):
        return Verdict(False, "type_not_allowed", f"event type {event_type!r} is not allowed")
    for condition in rules.drop:
        if holds(condition, payload):
            return Verdict(False, "dropped", f"drop condition on {condition.path!r} holds")
    for condition in rules.require:
        if not holds(condition, payload):
            return Verdict(False, "required", f"required condition on {condition.path!r} fails")
    return KEEP


def holds(condition: Condition, payload: Any) -> bool:
    found = dotted(payload, condition.path) if _has_path(payload, condition.path) else _MISSING
    op = condition.operator
    if op == "exists":
        return (found is not _MISSING and found is not None) == condition.exists
    if found is _MISSING:
        return op == "not_equals"
    if op == "equals":
        return _same(found, condition.equals)
    if op == "not_equals":
        return not _same(found, condition.not_equals)
    if op == "in_":
        return any(_same(found, option) for option in condition.in_ or [])
    number = _number(found)
    if number is None:
        return False
    limit = float(getattr(condition, op))
    return {
        "gt": number > limit,
        "gte": number >= limit,
        "lt": number < limit,
        "lte": number <= limit,
    }[op]


def _has_path(payload: Any, path: str) -> bool:
    parent, _, last = path.rpartition(".")
    node = dotted(payload, parent) if parent else payload
    if isinstance(node, dict):
        return last in node
    return isinstance(node, list) and last.isdigit() and int(last) < len(node)


def _same(found: Any, expected: Any) -> bool:
    # YAML `equals: 5` must match a JSON 5.0, but `true` must not match 1.
    if isinstance(found, bool) or isinstance(expected, bool):
        return found is expected
    if isinstance(found, int | float) and isinstance(expected, int | float):
        return float(found) == float(expected)
    return bool(found == expected)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None

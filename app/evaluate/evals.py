"""Eval files: cases with expectations, so a prompt or model change can be gated in CI.

    pipeline: triage                  # the default pipeline of every case
    cases:
      - name: a firing disk alert pages
        source: alerts                # a configured source: its type renders the payload
        type: alert.firing            # the event type and group key the prompt shows
        group_key: acme/api/DiskFull  #   (defaults: "eval" and "eval")
        payload: {status: firing}     # an event payload, or instead:
        # event_id: evt_...           # a stored event (its source, type, key and payload)
        expect:
          tool: publishAlert          # a call of this tool (the rest apply to it)
          input.severity: {in: [critical, high]}   # a value, or {in: [...]}
          group_id: acme/api/DiskFull # the MessageGroupId the gateway would publish with
      - name: a push needs nothing
        source: github
        payload: {ref: refs/heads/main}
        expect: {no_tool: true}       # no accepted call at all

A run of a case passes when every expectation holds for the decision; a case's pass rate is
its passing runs over all its runs. The file's shape is checked (JSON schema) before any call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from jsonschema import Draft202012Validator

from app.config import GatewayConfig
from app.evaluate.agreement import Decision, same
from app.publish.ids import resolve_group_id
from app.redaction import NestingTooDeep, payload_to_json

CASE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["cases"],
    "additionalProperties": False,
    "properties": {
        "pipeline": {"type": "string"},
        "cases": {
            "type": "array",
            "minItems": 1,
            "maxItems": 1000,
            "items": {
                "type": "object",
                "required": ["name", "expect"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "maxLength": 200},
                    "source": {"type": "string"},
                    "pipeline": {"type": "string"},
                    "type": {"type": "string", "maxLength": 200},
                    "group_key": {"type": "string", "maxLength": 512},
                    "payload": {},
                    "event_id": {"type": "string", "maxLength": 64},
                    "expect": {
                        "type": "object",
                        "minProperties": 1,
                        "propertyNames": {"pattern": r"^(tool|no_tool|group_id|input\..+)$"},
                        # no_tool alone: beside it, an expectation of a call was ignored.
                        "dependentSchemas": {"no_tool": {"maxProperties": 1}},
                        "properties": {
                            "tool": {"type": "string"},
                            "no_tool": {"const": True},
                            "group_id": {"type": "string"},
                        },
                        # A value, or {in: [...]}: an ``in`` that is no list is refused (a
                        # string would be read as its characters).
                        "patternProperties": {
                            r"^input\.": {
                                "if": {"type": "object", "required": ["in"]},
                                "then": {"properties": {"in": {"type": "array"}}},
                            }
                        },
                    },
                },
                "oneOf": [
                    {"required": ["payload", "source"], "not": {"required": ["event_id"]}},
                    {"required": ["event_id"], "not": {"required": ["payload"]}},
                ],
            },
        },
    },
}


class EvalFileError(ValueError):
    """The eval file is not of the expected shape; ``str()`` says where."""


@dataclass(frozen=True)
class Case:
    name: str
    expect: Mapping[str, Any]
    pipeline: str | None
    source: str | None = None
    type: str = "eval"
    group_key: str = "eval"
    payload: Any = None
    event_id: str | None = None

    @property
    def synthetic_id(self) -> str:
        """The id of a payload case's event: stable per case, so its audit rows group."""
        digest = hashlib.sha256(
            orjson.dumps([self.name, self.payload], option=orjson.OPT_SORT_KEYS)
        )
        return f"eval_{digest.hexdigest()[:24]}"


def parse_cases(document: Any, config: GatewayConfig, *, pipeline: str | None) -> list[Case]:
    errors = sorted(Draft202012Validator(CASE_SCHEMA).iter_errors(document), key=str)
    if errors:
        first = errors[0]
        where = "/".join(str(part) for part in first.absolute_path) or "the file"
        raise EvalFileError(f"{where}: {first.message}")
    default = pipeline or document.get("pipeline")
    cases = []
    for item in document["cases"]:
        try:
            # As JSON, which is what a webhook carries and a tool input holds: a YAML date is
            # its ISO text; refused past MAX_DEPTH levels, an integer past 64 bits, a key that
            # is not a string.
            payload, expect = orjson.loads(payload_to_json([item.get("payload"), item["expect"]]))
        except (NestingTooDeep, TypeError) as exc:
            raise EvalFileError(f"case {item['name']!r}: payload or expect: {exc}") from None
        chosen = pipeline or item.get("pipeline") or default
        source = item.get("source")
        if source is not None and source not in config.sources:
            raise EvalFileError(f"case {item['name']!r}: no source {source!r} in the config")
        if chosen is None and source is not None:
            chosen = config.sources[source].pipeline
        if chosen is not None and chosen not in config.pipelines:
            raise EvalFileError(f"case {item['name']!r}: no pipeline {chosen!r} in the config")
        cases.append(
            Case(
                name=item["name"],
                expect=expect,
                pipeline=chosen,
                source=source,
                type=item.get("type", "eval"),
                group_key=item.get("group_key", "eval"),
                payload=payload,
                event_id=item.get("event_id"),
            )
        )
    return cases


def failures(case: Case, decision: Decision, *, config: GatewayConfig, group_key: str) -> list[str]:
    """The expectations ``decision`` does not meet (none: the run passes)."""
    expect = case.expect
    if expect.get("no_tool"):
        return [f"expected no tool call, got {list(decision.tools)}"] if decision.calls else []
    calls = list(decision.calls)
    wanted = expect.get("tool")
    if wanted is not None:
        calls = [call for call in calls if call[0] == wanted]
        if not calls:
            return [f"expected a call of {wanted}, got {list(decision.tools) or 'none'}"]
    if not calls:
        return ["expected a tool call, got none"]
    # The expectations hold for some call (of the named tool, when one is named).
    best: list[str] | None = None
    for tool, given in calls:
        missed = _missed(expect, tool, given, config=config, group_key=group_key)
        if not missed:
            return []
        best = missed if best is None or len(missed) < len(best) else best
    return best or []


def _missed(
    expect: Mapping[str, Any],
    tool: str,
    given: Mapping[str, Any],
    *,
    config: GatewayConfig,
    group_key: str,
) -> list[str]:
    missed = []
    for name, wanted in expect.items():
        if name.startswith("input."):
            value = _at(given, name[len("input.") :])
            allowed = wanted["in"] if isinstance(wanted, Mapping) and "in" in wanted else [wanted]
            if value is _MISSING or not any(same(value, a) for a in allowed):
                shown = "missing" if value is _MISSING else orjson.dumps(value).decode()
                missed.append(f"{tool} {name}: {shown}, expected {_shown(wanted)}")
        elif name == "group_id":
            policy = config.tools[tool].group_id if tool in config.tools else "event"
            group_id, _ = resolve_group_id(policy, group_key, given)
            if group_id != wanted:
                missed.append(f"{tool} group_id: {group_id}, expected {wanted}")
    return missed


_MISSING = object()


def _at(given: Mapping[str, Any], path: str) -> Any:
    value: Any = given
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _shown(wanted: Any) -> str:
    if isinstance(wanted, Mapping) and "in" in wanted:
        return "one of " + orjson.dumps(wanted["in"]).decode()
    return orjson.dumps(wanted).decode()

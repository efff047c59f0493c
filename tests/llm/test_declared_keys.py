"""Schemas under which the undeclared-key filter read other subschemas than validation did.

Slips (an undeclared key reached the published input): a ``$ref`` to an ``$id``, a
``$dynamicRef``, a pointer into (or relative to) an embedded resource, ``prefixItems``
positions, ``patternProperties`` without ``properties``, and the values under
``patternProperties`` / ``additionalProperties`` schemas, which were kept unfiltered.
Wrong drops (a declared key was removed): a ``$ref`` to an ``$anchor``, ``dependentSchemas``,
``if``, ``items`` applied to ``prefixItems`` positions too, and declarations past the 64th
composed subschema. What cannot be read (a reference that does not resolve, too many
composed subschemas) refuses the call instead of publishing it unfiltered or trimmed.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from app.decide.tools import ToolCheck, check_tool_uses, repair_request
from app.llm.client import ClaudeReply, ClaudeRequest

TARGET = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
SMUGGLED = {"id": "db-1", "topic_arn": "arn:aws:sns:us-east-1:6:x.fifo"}


def _reply(*uses: tuple[str, Any]) -> ClaudeReply:
    return ClaudeReply(
        model="claude-sonnet-4-6",
        request_id=None,
        stop_reason="tool_use",
        content=[
            {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": tool_input}
            for n, (name, tool_input) in enumerate(uses)
        ],
        latency_ms=1.0,
    )


def _check(schema: dict[str, Any], tool_input: Any) -> ToolCheck:
    return check_tool_uses(
        _reply(("notify", tool_input)),
        offered=["notify"],
        validators={"notify": Draft202012Validator(schema)},
        max_calls=5,
    )


def _published(schema: dict[str, Any], tool_input: Any) -> Any:
    check = _check(schema, tool_input)
    assert not check.invalid, check.invalid
    assert len(check.accepted) == 1, check.notes()
    return check.accepted[0]["input"]


def _obj(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **more}


SLIPS: dict[str, tuple[dict[str, Any], Any]] = {
    "$ref-to-$id": (
        _obj({"target": {"$ref": "urn:t"}}, **{"$defs": {"t": {"$id": "urn:t", **TARGET}}}),
        {"target": SMUGGLED},
    ),
    "$dynamicRef": (
        _obj(
            {"target": {"$dynamicRef": "#t"}}, **{"$defs": {"t": {"$dynamicAnchor": "t", **TARGET}}}
        ),
        {"target": SMUGGLED},
    ),
    # The outermost $dynamicAnchor wins: the list's open default item is not what applies.
    "$dynamicRef-overridden": (
        {
            "$id": "urn:tool",
            "$ref": "urn:list",
            "$defs": {
                "item": {"$dynamicAnchor": "item", **TARGET},
                "list": _obj(
                    {"targets": {"type": "array", "items": {"$dynamicRef": "#item"}}},
                    **{"$id": "urn:list", "$defs": {"open": {"$dynamicAnchor": "item"}}},
                ),
            },
        },
        {"targets": [SMUGGLED]},
    ),
    "pointer-into-embedded-resource": (
        _obj(
            {"target": {"$ref": "urn:x#/properties/t"}},
            **{"$defs": {"x": {"$id": "urn:x", "properties": {"t": TARGET}}}},
        ),
        {"target": SMUGGLED},
    ),
    # "#/$defs/t" inside the resource urn:x is urn:x's $defs, not the root's (an open object).
    "pointer-relative-to-embedded-$id": (
        _obj(
            {
                "wrap": _obj(
                    {"target": {"$ref": "#/$defs/t"}}, **{"$id": "urn:x", "$defs": {"t": TARGET}}
                )
            },
            **{"$defs": {"t": {"type": "object"}}},
        ),
        {"wrap": {"target": SMUGGLED}},
    ),
    "prefixItems": (
        _obj({"pair": {"type": "array", "prefixItems": [TARGET, TARGET]}}),
        {"pair": [SMUGGLED, SMUGGLED]},
    ),
    "patternProperties-alone": (
        {"type": "object", "patternProperties": {"^id$": {"type": "string"}}},
        SMUGGLED,
    ),
    "patternProperties-value": (
        {"type": "object", "patternProperties": {"^t": TARGET}},
        {"target": SMUGGLED},
    ),
    "additionalProperties-value": (
        _obj({"title": {"type": "string"}}, additionalProperties=TARGET),
        {"title": "x", "target": SMUGGLED},
    ),
    "map-of-objects": (
        {"type": "object", "additionalProperties": TARGET},
        {"target": SMUGGLED},
    ),
    "array-of-arrays": (
        _obj({"grid": {"type": "array", "items": {"type": "array", "prefixItems": [TARGET]}}}),
        {"grid": [[SMUGGLED]]},
    ),
}


@pytest.mark.parametrize(("schema", "tool_input"), list(SLIPS.values()), ids=list(SLIPS))
def test_no_undeclared_key_reaches_the_published_input(schema: Any, tool_input: Any) -> None:
    published = orjson.dumps(_published(schema, tool_input)).decode()
    assert "topic_arn" not in published, published
    assert '"id":"db-1"' in published, published  # the declared key stays


WRONG_DROPS: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "$ref-to-$anchor": (
        _obj({"target": {"$ref": "#t"}}, **{"$defs": {"t": {"$anchor": "t", **TARGET}}}),
        {"target": SMUGGLED},
        {"target": {"id": "db-1"}},
    ),
    "dependentSchemas": (
        _obj({"kind": {}}, dependentSchemas={"kind": {"properties": {"detail": {}}}}),
        {"kind": "disk", "detail": "full", "topic_arn": "a"},
        {"kind": "disk", "detail": "full"},
    ),
    "if-then-else": (
        {
            "type": "object",
            "if": {"properties": {"kind": {"const": "disk"}}},
            "then": {"properties": {"path": {}}},
            "else": {"properties": {"host": {}}},
        },
        {"kind": "disk", "path": "/", "topic_arn": "a"},
        {"kind": "disk", "path": "/"},
    ),
    "unevaluatedProperties": (
        _obj({"title": {}}, unevaluatedProperties=TARGET),
        {"title": "t", "target": SMUGGLED},
        {"title": "t", "target": {"id": "db-1"}},
    ),
    # items applies after the prefixItems positions only.
    "items-after-prefixItems": (
        _obj({"row": {"type": "array", "prefixItems": [_obj({"kind": {}})], "items": TARGET}}),
        {"row": [{"kind": "k", "id": "a"}, {"kind": "k", "id": "b"}]},
        {"row": [{"kind": "k"}, {"id": "b"}]},
    ),
}


@pytest.mark.parametrize(
    ("schema", "tool_input", "expected"), list(WRONG_DROPS.values()), ids=list(WRONG_DROPS)
)
def test_declared_keys_are_kept_and_only_those(schema: Any, tool_input: Any, expected: Any) -> None:
    assert _published(schema, tool_input) == expected


def test_past_the_64th_composed_schema_the_call_is_refused_not_trimmed() -> None:
    """Keys declared only past the limit were dropped from a published input."""
    schema = {"type": "object", "allOf": [_obj({f"k{i}": {}}) for i in range(70)]}
    check = _check(schema, {"k0": 0, "k69": 69})
    assert check.accepted == []
    assert any("cannot be filtered" in note for note in check.notes()), check.notes()


@pytest.mark.parametrize(
    "target",
    [{"$ref": "#/$defs/missing"}, {"anyOf": [TARGET, {"$ref": "#/$defs/missing"}]}],
    # anyOf stops at the first branch that passes: validation never reads the second one.
    ids=["met-by-validation", "never-followed-by-validation"],
)
def test_a_reference_that_does_not_resolve_refuses_the_call(target: dict[str, Any]) -> None:
    check = _check(_obj({"target": target}), {"target": SMUGGLED})
    assert check.accepted == []
    (note,) = (note for note in check.notes() if "cannot be filtered" in note)
    assert "/$defs/missing" in note


def test_a_refused_call_is_not_asked_to_be_repeated_in_a_repair_turn() -> None:
    answer = _reply(("notify", {"target": SMUGGLED}), ("page", {"target": {"id": 5}}))
    unreadable = _obj({"target": {"anyOf": [TARGET, {"$ref": "#/$defs/missing"}]}})
    validators = {
        "notify": Draft202012Validator(unreadable),
        "page": Draft202012Validator(_obj({"target": TARGET})),
    }
    check = check_tool_uses(answer, offered=["notify", "page"], validators=validators, max_calls=5)
    assert list(check.invalid) == ["toolu_1"] and check.accepted == []

    request = ClaudeRequest(model="m", system=[], tools=[], messages=[], max_tokens=1)
    results = repair_request(request, answer, check).messages[-1]["content"]
    assert [r.get("is_error", False) for r in results] == [True, True]
    assert "Not executed" in results[0]["content"]


def test_a_free_form_object_is_kept_whole() -> None:
    schema = _obj({"labels": {"type": "object"}, "extra": True})
    tool_input = {"labels": {"any": "thing"}, "extra": SMUGGLED}
    assert _published(schema, tool_input) == tool_input

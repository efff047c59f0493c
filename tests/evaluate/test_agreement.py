"""When decisions agree: on action, exactly, per field, on the group id."""

from __future__ import annotations

from typing import Any

import pytest

from app.evaluate.agreement import Agreement, Decision, agreement, same, scalar_fields

SCHEMAS: dict[str, dict[str, Any]] = {
    "publishAlert": {
        "type": "object",
        "properties": {
            "severity": {"type": "string", "enum": ["critical", "high", "low"]},
            "page": {"type": "boolean"},
            "score": {"type": "number"},
            "title": {"type": "string"},
            "where": {"type": "object", "properties": {"zone": {"enum": ["a", "b"]}}},
            "message_group_id": {"type": "string"},
        },
    },
    "publishNotification": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def alert(severity: str, **more: Any) -> tuple[str, dict[str, Any]]:
    return ("publishAlert", {"severity": severity, "title": "disk full", **more})


def test_scalar_fields_are_enums_booleans_and_numbers_nested_by_path() -> None:
    assert scalar_fields(SCHEMAS["publishAlert"]) == ["severity", "page", "score", "where.zone"]
    assert scalar_fields({"properties": {"n": {"type": ["integer", "null"]}}}) == ["n"]
    assert scalar_fields({"type": "object"}) == []


def test_json_equality_tells_true_from_one() -> None:
    assert same(1, 1.0) and same({"a": [1]}, {"a": [1]})
    assert not same(True, 1) and not same("1", 1)


def test_the_worked_example() -> None:
    """Four events, live against a candidate: the figures the README explains."""
    live = {
        "e1": Decision((alert("high", page=True),)),
        "e2": Decision((alert("high", page=False),)),
        "e3": Decision((alert("low", page=False),)),
        "e4": Decision((alert("critical", page=True), ("publishNotification", {"text": "x"}))),
    }
    candidate = {
        "e1": Decision((alert("high", page=True),)),  # exactly the same
        "e2": Decision((alert("low", page=False),)),  # same action, another severity
        "e3": Decision(()),  # did nothing
        "e4": Decision((alert("critical", page=True),)),  # one call fewer
    }
    found = agreement(((e, live[e], candidate[e]) for e in live), SCHEMAS)
    assert found["events"] == 4
    assert found["action_agreement"] == 0.5  # e1, e2
    assert found["exact_agreement"] == 0.25  # e1
    # severity compared in e1, e2, e4 (e3 has no call to pair with): 2 of 3 equal
    assert found["fields"] == {
        "publishAlert.page": 1.0,
        "publishAlert.severity": pytest.approx(2 / 3),
    }
    assert found["group_id_agreement"] is None  # no input proposed one
    assert [d["event_id"] for d in found["disagreements"]] == ["e2", "e3", "e4"]
    assert found["disagreements"][1] == {
        "event_id": "e3",
        "baseline": [{"tool": "publishAlert", "input": dict(alert("low", page=False)[1])}],
        "candidate": [],
    }


def test_inputs_agree_exactly_whatever_their_key_order() -> None:
    a = Decision((("publishAlert", {"severity": "high", "title": "t"}),))
    b = Decision((("publishAlert", {"title": "t", "severity": "high"}),))
    assert agreement([("e", a, b)], SCHEMAS)["exact_agreement"] == 1.0


def test_order_of_calls_matters_for_action() -> None:
    a = Decision((alert("high"), ("publishNotification", {"text": "x"})))
    b = Decision((("publishNotification", {"text": "x"}), alert("high")))
    found = agreement([("e", a, b)], SCHEMAS)
    assert (found["action_agreement"], found["exact_agreement"]) == (0.0, 0.0)
    assert found["fields"] == {}  # no position holds the same tool in both


def test_group_ids_claude_proposed_are_compared() -> None:
    pairs = [
        (
            "e1",
            Decision((alert("high", message_group_id="acme/api"),)),
            Decision((alert("high", message_group_id="acme/api"),)),
        ),
        ("e2", Decision((alert("high", message_group_id="acme/api"),)), Decision((alert("high"),))),
        ("e3", Decision((alert("high"),)), Decision((alert("high"),))),
    ]
    assert agreement(pairs, SCHEMAS)["group_id_agreement"] == 0.5


def test_refused_calls_do_not_count() -> None:
    a = Decision((alert("high"),), refused=("deleteRepo",))
    b = Decision((alert("high"),))
    assert agreement([("e", a, b)], SCHEMAS)["exact_agreement"] == 1.0


def test_runs_of_one_event_are_compared_pairwise() -> None:
    found = Agreement(SCHEMAS)
    runs = [Decision((alert(s),)) for s in ("high", "high", "high", "low")]
    found.add_runs("e1", runs)
    summary = found.summary()
    # 6 pairs; the 3 among the "high" runs agree exactly
    assert (summary["events"], summary["pairs"], summary["exact_agreement"]) == (1, 6, 0.5)
    assert summary["action_agreement"] == 1.0


def test_nothing_compared_is_none_not_zero_or_one() -> None:
    found = Agreement(SCHEMAS).summary()
    assert found["events"] == 0
    assert found["action_agreement"] is None and found["exact_agreement"] is None


def test_disagreements_listed_are_bounded() -> None:
    found = Agreement(SCHEMAS, max_disagreements=2)
    for n in range(5):
        found.add(f"e{n}", Decision((alert("high"),)), Decision(()))
    assert len(found.summary()["disagreements"]) == 2
    assert found.summary()["exact_agreement"] == 0.0


def test_exact_agreement_and_nested_values_use_the_same_json_equality_as_fields() -> None:
    # JSON has one number type: 5 and 5.0 agree inside objects and lists, and exactly, as they
    # do field by field; true and 1 still do not, and NaN is the same value on both sides.
    assert same([1], [1.0]) and same({"a": {"b": 2}}, {"a": {"b": 2.0}})
    assert not same([True], [1]) and not same({"a": False}, {"a": 0})
    assert same(float("nan"), float("nan"))
    found = agreement(
        [
            ("e1", Decision((alert("high", score=5),)), Decision((alert("high", score=5.0),))),
            ("e2", Decision((alert("high", page=True),)), Decision((alert("high", page=1),))),
        ],
        SCHEMAS,
    )
    assert found["exact_agreement"] == 0.5
    assert found["fields"]["publishAlert.score"] == 1.0
    assert found["fields"]["publishAlert.page"] == 0.0

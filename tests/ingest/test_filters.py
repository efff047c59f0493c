"""Declarative filters: type globs, drop/require conditions with each operator."""

from __future__ import annotations

from typing import Any

import pytest

from app.ingest.filters import evaluate
from app.source_config import FilterRules
from tests.sources_support import payload


def rules(**data: Any) -> FilterRules:
    return FilterRules.model_validate(data)


def test_type_globs_deny_wins_then_allow() -> None:
    r = rules(allow_types=["pull_request.*", "issues.opened"], deny_types=["*.labeled"])
    assert evaluate(r, "pull_request.opened", {}).keep
    assert evaluate(r, "issues.opened", {}).keep
    denied = evaluate(r, "pull_request.labeled", {})
    assert (denied.keep, denied.reason) == (False, "type_denied")
    assert evaluate(r, "push", {}).reason == "type_not_allowed"


@pytest.mark.parametrize(
    ("condition", "keeps"),
    [
        ({"path": "pull_request.draft", "equals": False}, True),
        ({"path": "pull_request.draft", "equals": True}, False),
        ({"path": "pull_request.additions", "gt": 40}, True),
        ({"path": "pull_request.additions", "lte": 40}, False),
        ({"path": "pull_request.additions", "gte": 48}, True),
        ({"path": "pull_request.additions", "lt": 48}, False),
        ({"path": "pull_request.base.ref", "in": ["main", "release"]}, True),
        ({"path": "pull_request.base.ref", "in": ["develop"]}, False),
        ({"path": "pull_request.merged_by", "exists": False}, True),  # null counts as absent
        ({"path": "pull_request.title", "exists": True}, True),
        ({"path": "pull_request.nope", "exists": True}, False),
        ({"path": "pull_request.nope", "gt": 1}, False),
        ({"path": "pull_request.title", "gt": 1}, False),  # not a number
        ({"path": "pull_request.user.login", "not_equals": "dependabot[bot]"}, True),
        ({"path": "pull_request.labels.0.name", "equals": "bug"}, True),
    ],
)
def test_require_conditions_on_a_real_pull_request(condition: dict[str, Any], keeps: bool) -> None:
    pr = payload("github_pull_request_opened.json")
    verdict = evaluate(rules(require=[condition]), "pull_request.opened", pr)
    assert verdict.keep is keeps
    if not keeps:
        assert verdict.reason == "required"


def test_drop_conditions_and_strict_equality() -> None:
    r = rules(drop=[{"path": "status", "equals": "OK"}, {"path": "temperature_c", "lt": 20}])
    assert evaluate(r, "reading", {"status": "ALARM", "temperature_c": 72.4}).keep
    assert evaluate(r, "reading", {"status": "OK", "temperature_c": 72.4}).reason == "dropped"
    assert not evaluate(r, "reading", {"status": "ALARM", "temperature_c": 18}).keep
    # YAML 1 matches JSON 1.0, but true does not match 1.
    assert evaluate(rules(require=[{"path": "a", "equals": 1}]), "t", {"a": 1.0}).keep
    assert not evaluate(rules(require=[{"path": "a", "equals": True}]), "t", {"a": 1}).keep
    assert evaluate(None, "t", {}).keep

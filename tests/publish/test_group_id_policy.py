"""Per-tool MessageGroupId policy: the event's key, or a valid id proposed by Claude."""

from __future__ import annotations

from app.publish.ids import message_group_id, resolve_group_id


def test_event_policy_ignores_the_llm_but_reports_disagreement() -> None:
    assert resolve_group_id("event", "acme/api", {"message_group_id": "acme/web"}) == (
        "acme/api",
        True,
    )
    assert resolve_group_id("event", "acme/api", {"message_group_id": "acme/api"}) == (
        "acme/api",
        False,
    )
    assert resolve_group_id("event", "acme/api", {}) == ("acme/api", False)


def test_llm_policy_uses_a_valid_id_else_the_event_key() -> None:
    assert resolve_group_id("llm", "acme/api", {"message_group_id": "incident-42"}) == (
        "incident-42",
        True,
    )
    bad = "has spaces and ü"
    assert resolve_group_id("llm", "acme/api", {"message_group_id": bad}) == ("acme/api", True)
    assert resolve_group_id("llm", "acme/api", {"message_group_id": "x" * 129})[0] == "acme/api"
    assert resolve_group_id("llm", "acme/api", {"message_group_id": 7}) == ("acme/api", False)
    assert resolve_group_id("llm", "acme/api", None) == ("acme/api", False)
    # An event key SNS cannot take is hashed; agreeing with the raw key is not a disagreement.
    key = "site lyon/device 7"
    assert resolve_group_id("llm", key, {"message_group_id": key}) == (message_group_id(key), False)

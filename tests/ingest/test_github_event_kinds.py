"""Every event kind GitHub documents gets a type (kind + action) and the right group key."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import orjson
import pytest

from app.config import parse_config
from app.sources.github import GitHubSource

# GitHub's webhook event names (docs: "Webhook events and payloads").
REPOSITORY_KINDS = [
    "branch_protection_configuration",
    "branch_protection_rule",
    "check_run",
    "check_suite",
    "code_scanning_alert",
    "commit_comment",
    "create",
    "custom_property_values",
    "delete",
    "dependabot_alert",
    "deploy_key",
    "deployment",
    "deployment_protection_rule",
    "deployment_review",
    "deployment_status",
    "discussion",
    "discussion_comment",
    "fork",
    "gollum",
    "issue_comment",
    "issue_dependencies",
    "issues",
    "label",
    "member",
    "merge_group",
    "meta",
    "milestone",
    "package",
    "page_build",
    "project_card",
    "public",
    "pull_request",
    "pull_request_review",
    "pull_request_review_comment",
    "pull_request_review_thread",
    "push",
    "registry_package",
    "release",
    "repository",
    "repository_advisory",
    "repository_dispatch",
    "repository_import",
    "repository_ruleset",
    "repository_vulnerability_alert",
    "secret_scanning_alert",
    "secret_scanning_alert_location",
    "secret_scanning_scan",
    "security_and_analysis",
    "star",
    "status",
    "sub_issues",
    "watch",
    "workflow_dispatch",
    "workflow_job",
    "workflow_run",
]
ORGANIZATION_KINDS = [
    "custom_property",
    "membership",
    "org_block",
    "organization",
    "personal_access_token_request",
    "projects_v2",
    "projects_v2_item",
    "projects_v2_status_update",
    "team",
    "team_add",
]
SPECIAL_KINDS: dict[str, tuple[dict[str, object], str]] = {
    "installation": ({"installation": {"id": 42}}, "installation/42"),
    "installation_repositories": ({"installation": {"id": 42}}, "installation/42"),
    "installation_target": ({"installation": {"id": 7}}, "installation/7"),
    "github_app_authorization": ({}, "octocat"),
    "marketplace_purchase": (
        {"marketplace_purchase": {"account": {"login": "acme-co"}}},
        "acme-co",
    ),
    "sponsorship": ({"sponsorship": {"sponsorable": {"login": "maintainer"}}}, "maintainer"),
    "security_advisory": (
        {"security_advisory": {"ghsa_id": "GHSA-xxxx-yyyy-zzzz"}},
        "GHSA-xxxx-yyyy-zzzz",
    ),
}
SENDER = {"sender": {"login": "octocat", "id": 1}}


@pytest.fixture(scope="module")
def source() -> GitHubSource:
    config = parse_config(
        """
sources: {gh: {type: github, secret: event-kinds-secret, pipeline: p}}
pipelines: {p: {model: m, system: s, tools: [t]}}
tools: {t: {description: d, input_schema: {type: object}}}
""",
        env={},
    )
    return GitHubSource("gh", config.sources["gh"])


def _describe(source: GitHubSource, kind: str, payload: Mapping[str, object]) -> tuple[str, str]:
    headers = {
        "x-github-event": kind,
        "x-github-delivery": "d-1",
        "content-type": "application/json",
    }
    [described] = asyncio.run(source.describe(headers, orjson.dumps(payload)))
    return described.type, described.group_key


@pytest.mark.parametrize("kind", REPOSITORY_KINDS)
def test_repository_kinds_group_by_repository(source: GitHubSource, kind: str) -> None:
    payload = {
        "action": "created",
        "repository": {"full_name": "acme/api"},
        "organization": {"login": "acme"},
        **SENDER,
    }
    assert _describe(source, kind, payload) == (f"{kind}.created", "acme/api")
    without_action = {k: v for k, v in payload.items() if k != "action"}
    assert _describe(source, kind, without_action) == (kind, "acme/api")


@pytest.mark.parametrize("kind", ORGANIZATION_KINDS)
def test_organization_kinds_group_by_organization(source: GitHubSource, kind: str) -> None:
    payload = {"action": "edited", "organization": {"login": "acme"}, **SENDER}
    assert _describe(source, kind, payload) == (f"{kind}.edited", "acme")


@pytest.mark.parametrize("kind", sorted(SPECIAL_KINDS))
def test_kinds_about_apps_accounts_and_advisories(source: GitHubSource, kind: str) -> None:
    extra, expected = SPECIAL_KINDS[kind]
    assert _describe(source, kind, {"action": "created", **extra, **SENDER})[1] == expected


def test_ping_is_not_an_event(source: GitHubSource) -> None:
    headers = {"x-github-event": "ping", "content-type": "application/json"}
    assert asyncio.run(source.describe(headers, b'{"zen": "Keep it logically awesome."}')) == []

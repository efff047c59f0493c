"""GitHub (``type: github``): the adapter, its config keys, its prompt summary and trim hints.

GitHub sends ~60 event kinds; all share the envelope read here: the kind in
``X-GitHub-Event``, an optional ``action`` (the event type becomes ``kind.action``), the
delivery GUID in ``X-GitHub-Delivery`` (kept across GitHub's redeliveries) and one of
``repository`` / ``organization`` / ``installation`` / ``sender`` naming what it is about.
Only the body is signed, so its digest is a second dedup identity (a replay under a new
delivery GUID is a duplicate).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from app.payloads import content_hash, dotted, first_key
from app.source_config import SourceConfig
from app.sources.admission import Body, StreamedMac, verify_whole
from app.sources.base import (
    AdapterDeps,
    Described,
    Headers,
    Lines,
    SourceKind,
    media_type,
    parse_json,
    signed_digest,
)
from app.sources.exceptions import InvalidPayload
from app.sources.signatures import github_admission

# Built-in group-key rules for kinds that are not about one repository.
GITHUB_GROUP_KEYS: dict[str, str] = {
    "marketplace_purchase": "marketplace_purchase.account.login",
    "sponsorship": "sponsorship.sponsorable.login",
    "security_advisory": "security_advisory.ghsa_id",
    "installation": "installation/{installation.id}",
    "installation_repositories": "installation/{installation.id}",
    "installation_target": "installation/{installation.id}",
    "github_app_authorization": "sender.login",
}
GITHUB_DEFAULT_RULE = [
    "repository.full_name",
    "organization.login",
    "installation/{installation.id}",
    "sender.login",
]


class GitHubSource:
    def __init__(self, name: str, config: SourceConfig) -> None:
        self.name = name
        self.secrets = [s.encode() for s in config.secrets()]
        self.group_key = config.group_key
        self.group_keys = {**GITHUB_GROUP_KEYS, **config.group_keys}

    def admit(self, headers: Headers) -> StreamedMac:
        return github_admission(self.secrets, headers.get("x-hub-signature-256"))

    async def verify(self, headers: Headers, body: Body) -> None:
        await verify_whole(self.admit(headers), body)

    async def describe(self, headers: Headers, body: Body) -> list[Described]:
        kind = headers.get("x-github-event")
        if not kind:
            raise InvalidPayload("missing X-GitHub-Event header")
        payload = _github_payload(headers, body)
        if kind == "ping":
            return []
        if not isinstance(payload, dict):
            raise InvalidPayload("a GitHub payload is a JSON object")
        action = payload.get("action")
        event_type = f"{kind}.{action}" if isinstance(action, str) and action else kind
        delivery = headers.get("x-github-delivery") or content_hash(payload)
        return [
            Described(
                event_type,
                delivery,
                self.group_key_of(kind, payload),
                payload,
                replay_id=signed_digest(body),  # X-GitHub-Delivery is not signed
            )
        ]

    def group_key_of(self, kind: str, payload: dict[str, Any]) -> str:
        specs = [s for s in (self.group_key, self.group_keys.get(kind)) if s]
        return first_key(payload, [*specs, *GITHUB_DEFAULT_RULE]) or self.name


def _github_payload(headers: Headers, body: Body) -> Any:
    media = media_type(headers)
    if media == "application/x-www-form-urlencoded":
        # GitHub's "form" content type: the JSON document is in the `payload` field.
        form = parse_qs(body.decode("utf-8", "replace"))
        if "payload" not in form:
            raise InvalidPayload("form body has no 'payload' field")
        return parse_json(form["payload"][0].encode())
    return parse_json(body, media)


def summary(event_type: str, p: dict[str, Any]) -> Lines:
    """Who, where, and what happened, by event kind."""
    kind = event_type.split(".", 1)[0]
    lines: Lines = [("who", _user(p.get("sender")))]
    lines += [("where", dotted(p, "repository.full_name") or dotted(p, "organization.login"))]
    subject = p.get(kind) if isinstance(p.get(kind), dict) else None
    if kind == "push":
        commits = p.get("commits") or []
        flags = [f for f in ("created", "deleted", "forced") if p.get(f)]
        lines += [("what", f"push of {len(commits)} commit(s) to {p.get('ref')} {flags or ''}")]
        lines += [("head commit", dotted(p, "head_commit.message"))]
        lines += [("link", p.get("compare"))]
    elif kind == "pull_request" and subject:
        lines += [("what", _numbered("pull request", subject, p.get("action")))]
        lines += [("state", _pr_state(subject))]
        lines += [("branches", f"{dotted(subject, 'head.ref')} -> {dotted(subject, 'base.ref')}")]
        lines += [("size", _pr_size(subject)), ("text", subject.get("body"))]
        lines += [("link", subject.get("html_url"))]
    elif kind == "issues" and (issue := p.get("issue")):
        lines += [("what", _numbered("issue", issue, p.get("action")))]
        lines += [("labels", _names(issue.get("labels"))), ("text", issue.get("body"))]
        lines += [("link", issue.get("html_url"))]
    elif kind == "issue_comment" and (comment := p.get("comment")):
        lines += [("what", _numbered("comment on", p.get("issue") or {}, p.get("action")))]
        lines += [("text", comment.get("body")), ("link", comment.get("html_url"))]
    elif kind in ("workflow_run", "workflow_job", "check_run", "check_suite") and subject:
        name = subject.get("name") or dotted(subject, "app.name") or kind
        outcome = f"{subject.get('status')}/{subject.get('conclusion') or '-'}"
        lines += [("what", f"{kind} {name!r} {p.get('action')}: {outcome}")]
        lines += [("severity", "failure" if subject.get("conclusion") == "failure" else None)]
        lines += [("branch", subject.get("head_branch")), ("trigger", subject.get("event"))]
        lines += [("link", subject.get("html_url"))]
    else:
        title = subject and (subject.get("title") or subject.get("name") or subject.get("tag_name"))
        lines += [("what", f"{event_type}{f' {title!r}' if title else ''}")]
        lines += [("link", (subject or {}).get("html_url") or dotted(p, "repository.html_url"))]
    return lines


def _user(user: Any) -> str | None:
    if not isinstance(user, dict):
        return None
    login = user.get("login")
    return f"{login} (bot)" if user.get("type") == "Bot" else login


def _numbered(noun: str, item: dict[str, Any], action: Any) -> str:
    return f"{noun} #{item.get('number')} {item.get('title')!r} {action or ''}".strip()


def _pr_state(pr: dict[str, Any]) -> str:
    if pr.get("merged"):
        return "merged"
    return f"{pr.get('state')}{' (draft)' if pr.get('draft') else ''}"


def _pr_size(pr: dict[str, Any]) -> str | None:
    if "additions" not in pr:
        return None
    return f"+{pr.get('additions')} -{pr.get('deletions')} in {pr.get('changed_files')} file(s)"


def _names(items: Any) -> str:
    return ", ".join(str(i.get("name")) for i in items or [] if isinstance(i, dict))


# Trim hints: the API's link noise goes at any depth; nested users become their login and
# repository copies their full name (the top-level repository keeps a few fields).
NOISE = frozenset({"node_id", "avatar_url", "gravatar_id", "_links", "url"})
KEEP_URLS = frozenset({"html_url", "compare", "runbook_url"})
REPOSITORY_KEYS = frozenset(
    {"full_name", "html_url", "private", "default_branch", "archived", "fork", "description"}
)


def noise(key: str) -> bool:
    if key in NOISE:
        return True
    return key.endswith("_url") and key not in KEEP_URLS


def slim(node: Any, *, top: bool = True) -> Any:
    if isinstance(node, list):
        return [slim(item, top=False) for item in node]
    if not isinstance(node, dict):
        return node
    if "login" in node and node.get("type") in ("User", "Bot", "Organization"):
        return f"{node['login']} (bot)" if node.get("type") == "Bot" else node["login"]
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and "full_name" in value and "owner" in value:
            keep = top and key == "repository"
            out[key] = (
                {k: value[k] for k in REPOSITORY_KEYS if k in value} if keep else value["full_name"]
            )
        else:
            out[key] = slim(value, top=False)
    return out


def _adapter(name: str, config: SourceConfig, _: AdapterDeps) -> GitHubSource:
    return GitHubSource(name, config)


KIND = SourceKind(
    name="github",
    keys=frozenset({"secret", "group_keys"}),
    needs=("secret",),
    adapter=_adapter,
    summary=summary,
    slim=slim,
    noise=noise,
)

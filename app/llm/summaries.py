"""The few fields of an event that decide what to do, by source type: who, what, where,
severity, links. Values come from the untrusted payload: each is flattened to one line and
capped, so a crafted title cannot forge another summary line.
"""

from __future__ import annotations

import re
from typing import Any

from app.payloads import dotted

Lines = list[tuple[str, Any]]
_SPACE = re.compile(r"\s+")
VALUE_CAP = 300
ALERT_LINES = 10


def one_line(value: Any, cap: int = VALUE_CAP) -> str:
    text = _SPACE.sub(" ", str(value)).strip()
    return text if len(text) <= cap else text[:cap] + "..."


def summarize(source_type: str | None, event_type: str, payload: Any) -> list[tuple[str, str]]:
    if not isinstance(payload, dict):
        return []
    if source_type == "github":
        lines = github(event_type, payload)
    elif source_type in ("alertmanager", "grafana"):
        lines = alerts(payload)
    elif source_type == "cloudevents":
        lines = _pick(payload, [("what", "type"), ("where", "source"), ("subject", "subject")])
        lines += _pick(payload, [("time", "time")])
    elif source_type == "aws-sns":
        lines = sns(payload)
    else:
        lines = []
    return [(label, one_line(value)) for label, value in lines if value not in (None, "")]


def github(event_type: str, p: dict[str, Any]) -> Lines:
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
        lines += [("size", _pr_size(subject)), ("text", _cut(subject.get("body")))]
        lines += [("link", subject.get("html_url"))]
    elif kind == "issues" and (issue := p.get("issue")):
        lines += [("what", _numbered("issue", issue, p.get("action")))]
        lines += [("labels", _names(issue.get("labels"))), ("text", _cut(issue.get("body")))]
        lines += [("link", issue.get("html_url"))]
    elif kind == "issue_comment" and (comment := p.get("comment")):
        lines += [("what", _numbered("comment on", p.get("issue") or {}, p.get("action")))]
        lines += [("text", _cut(comment.get("body"))), ("link", comment.get("html_url"))]
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


def alerts(p: dict[str, Any]) -> Lines:
    items = [a for a in p.get("alerts") or [] if isinstance(a, dict)]
    firing = sum(1 for a in items if a.get("status") == "firing")
    lines: Lines = [
        ("what", f"{p.get('status')}: {firing} firing, {len(items) - firing} resolved"),
        ("title", p.get("title")),
        ("severity", dotted(p, "commonLabels.severity") or _worst(items)),
        ("group", _labels(p.get("groupLabels"))),
        ("receiver", p.get("receiver")),
    ]
    truncated = p.get("truncatedAlerts")
    if isinstance(truncated, int) and truncated > 0:
        lines.append(("truncated", f"{truncated} more alert(s) were not sent by the sender"))
    for index, alert in enumerate(items[:ALERT_LINES]):
        labels = alert.get("labels") or {}
        notes = alert.get("annotations") or {}
        text = notes.get("summary") or notes.get("description") or ""
        where = _labels({k: v for k, v in labels.items() if k not in ("alertname", "severity")})
        lines.append(
            (
                f"alert {index + 1}",
                f"[{alert.get('status')}] {labels.get('alertname', '?')} "
                f"severity={labels.get('severity', '-')} {where} since {alert.get('startsAt')}"
                f" — {text}",
            )
        )
    if len(items) > ALERT_LINES:
        lines.append(("more alerts", str(len(items) - ALERT_LINES)))
    first = items[0] if items else {}
    runbook = dotted(first, "annotations.runbook_url")
    for label, url in (("runbook", runbook), ("source link", first.get("generatorURL"))):
        lines.append((label, url))
    lines.append(("dashboard", first.get("dashboardURL") or p.get("externalURL")))
    return lines


def sns(p: dict[str, Any]) -> Lines:
    message = p.get("Message")
    lines: Lines = [("topic", p.get("TopicArn")), ("subject", p.get("Subject"))]
    if isinstance(message, dict) and "AlarmName" in message:
        state = f"{message.get('OldStateValue')} -> {message.get('NewStateValue')}"
        lines += [("what", f"CloudWatch alarm {message['AlarmName']!r}: {state}")]
        lines += [("severity", "alarm" if message.get("NewStateValue") == "ALARM" else None)]
        lines += [("reason", message.get("NewStateReason")), ("region", message.get("Region"))]
        metric = f"{dotted(message, 'Trigger.Namespace')}/{dotted(message, 'Trigger.MetricName')}"
        lines += [("metric", metric)]
    elif isinstance(message, dict) and isinstance(message.get("Records"), list):
        for record in message["Records"][:ALERT_LINES]:
            key = f"s3://{dotted(record, 's3.bucket.name')}/{dotted(record, 's3.object.key')}"
            lines.append(("what", f"{record.get('eventName')} {key}"))
    return lines


def _pick(p: dict[str, Any], fields: list[tuple[str, str]]) -> Lines:
    return [(label, dotted(p, path)) for label, path in fields]


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


def _labels(labels: Any) -> str:
    if not isinstance(labels, dict):
        return ""
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _worst(items: list[dict[str, Any]]) -> str | None:
    order = ["critical", "error", "high", "warning", "medium", "low", "info"]
    found = {str(dotted(a, "labels.severity")).lower() for a in items}
    return next((s for s in order if s in found), None)


def _cut(text: Any, cap: int = 500) -> str | None:
    return one_line(text, cap) if text else None

"""Fit a payload into a character budget, dropping noise before meaning.

Steps, each only if the previous result is still over budget:
1. always: drop nulls and empties, and what the summary already says or no decision needs:
   for GitHub the API links (``*_url`` except ``html_url``, ``node_id``, ``_links`` ...),
   nested user objects (→ their login) and repository copies (→ their full name); for
   alert sources each alert's labels, summary and links (rendered in the summary lines);
2. long strings cut to 300 characters, lists to their first 5 items (with a count of the rest);
3. objects deeper than 3 levels replaced by a note of how many keys they had;
4. a hard cut of the serialised text, with the number of characters left out.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.llm.summaries import ALERT_LINES

GITHUB_NOISE = frozenset({"node_id", "avatar_url", "gravatar_id", "_links", "url"})
GITHUB_KEEP_URLS = frozenset({"html_url", "compare", "runbook_url"})
STRING_CAP = 300
LIST_CAP = 5
DEPTH_CAP = 3


def dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


REPOSITORY_KEYS = frozenset(
    {"full_name", "html_url", "private", "default_branch", "archived", "fork", "description"}
)
ALERT_SUMMARISED = frozenset(
    {"status", "receiver", "groupLabels", "truncatedAlerts", "title", "externalURL", "message"}
)


def fit(payload: Any, *, budget: int, source_type: str | None) -> str:
    if source_type == "github":
        payload = github_slim(payload, top=True)
    elif source_type in ("alertmanager", "grafana"):
        payload = alerts_slim(payload)
    pruned = prune(payload, github=source_type == "github")
    text = dumps(pruned)
    if len(text) <= budget:
        return text
    text = dumps(shorten(pruned, depth=0, max_depth=None))
    if len(text) <= budget:
        return text
    text = dumps(shorten(pruned, depth=0, max_depth=DEPTH_CAP))
    if len(text) <= budget:
        return text
    return text[:budget] + f"... [truncated {len(text) - budget} chars]"


def prune(node: Any, *, github: bool) -> Any:
    if isinstance(node, dict):
        kept = {}
        for key, value in node.items():
            if github and _github_noise(str(key)):
                continue
            value = prune(value, github=github)
            if value is None or value == "" or value == [] or value == {}:
                continue
            kept[key] = value
        return kept
    if isinstance(node, list):
        return [prune(item, github=github) for item in node]
    return node


def github_slim(node: Any, *, top: bool = False) -> Any:
    if isinstance(node, list):
        return [github_slim(item) for item in node]
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
            out[key] = github_slim(value)
    return out


def alerts_slim(payload: Any) -> Any:
    """Alert fields the summary does not carry: fingerprints, other annotations, values."""
    if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
        return payload
    slim = {k: v for k, v in payload.items() if k not in ALERT_SUMMARISED}
    alerts = [a for a in payload["alerts"] if isinstance(a, dict)]
    # Only the alerts the summary lists lose their labels; any beyond keep everything.
    slim["alerts"] = [
        {
            k: v
            for k, v in alert.items()
            if k not in ("labels", "status", "startsAt", "generatorURL", "silenceURL", "panelURL")
            and not (k == "endsAt" and str(v).startswith("0001"))
        }
        | {"annotations": _other_notes(alert.get("annotations"))}
        for alert in alerts[:ALERT_LINES]
    ] + alerts[ALERT_LINES:]
    return slim


def _other_notes(notes: Any) -> Any:
    if not isinstance(notes, dict):
        return notes
    return {k: v for k, v in notes.items() if k not in ("summary", "runbook_url")}


def shorten(node: Any, *, depth: int, max_depth: int | None) -> Any:
    if isinstance(node, dict):
        if max_depth is not None and depth >= max_depth:
            return f"{{... {len(node)} keys}}"
        return {k: shorten(v, depth=depth + 1, max_depth=max_depth) for k, v in node.items()}
    if isinstance(node, list):
        head = [shorten(v, depth=depth + 1, max_depth=max_depth) for v in node[:LIST_CAP]]
        if len(node) > LIST_CAP:
            head.append(f"... {len(node) - LIST_CAP} more items")
        return head
    if isinstance(node, str) and len(node) > STRING_CAP:
        return node[:STRING_CAP] + f"... [{len(node) - STRING_CAP} more chars]"
    return node


def _github_noise(key: str) -> bool:
    if key in GITHUB_NOISE:
        return True
    return key.endswith("_url") and key not in GITHUB_KEEP_URLS

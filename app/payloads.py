"""Reading values out of a JSON payload: dotted paths, key templates, content hashes.

Shared by every stage that looks into payloads (source adapters, filters, alert collapse,
prompt summaries); they never raise on a shape they did not expect, they answer None.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def dotted(payload: Any, path: str) -> Any:
    """``a.b.0.c`` into nested dicts and lists; None when any step is missing."""
    node = payload
    for part in path.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def scalar(payload: Any, path: str) -> str | None:
    value = dotted(payload, path)
    if value is None or isinstance(value, dict | list) or value == "":
        return None
    return str(value)


def resolve_key(payload: Any, spec: str | None) -> str | None:
    """A dotted path, or a template like ``{device.site}/{device.id}``.

    A template resolves only when every placeholder does (a half-filled key would merge
    unrelated entities into one group); None otherwise.
    """
    if spec is None:
        return None
    if "{" not in spec:
        return scalar(payload, spec)
    missing = False

    def fill(match: re.Match[str]) -> str:
        nonlocal missing
        value = scalar(payload, match.group(1).strip())
        if value is None:
            missing = True
            return ""
        return value

    rendered = _PLACEHOLDER.sub(fill, spec)
    return None if missing else rendered


def first_key(payload: Any, specs: list[str]) -> str | None:
    for spec in specs:
        value = resolve_key(payload, spec)
        if value:
            return value
    return None


def content_hash(value: Any) -> str:
    """A stable id for a JSON value (keys sorted), for senders with no delivery id."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()

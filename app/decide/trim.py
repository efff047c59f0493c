"""Fit a payload into a character budget, dropping noise before meaning.

Steps, each only if the previous result is still over budget:
1. always: drop nulls and empties, and what the summary already says or no decision needs,
   as the source type's module says (``SourceKind.slim`` and ``noise``: GitHub's API links,
   nested users and repository copies; each alert's labels, summary and links ...);
2. long strings cut to 300 characters, lists to their first 5 items (with a count of the rest);
3. objects deeper than 3 levels replaced by a note of how many keys they had;
4. a hard cut of the serialised text, with the number of characters left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from app.sources.registry import KINDS

STRING_CAP = 300
LIST_CAP = 5
DEPTH_CAP = 3


def dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def fit(payload: Any, *, budget: int, source_type: str | None) -> str:
    kind = KINDS.get(source_type or "")
    if kind is not None:
        payload = kind.slim(payload)
    pruned = prune(payload, noise=kind.noise if kind is not None else None)
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


def prune(node: Any, *, noise: Callable[[str], bool] | None) -> Any:
    """Without nulls and empties, and without the keys ``noise`` names, at any depth."""
    if isinstance(node, dict):
        kept = {}
        for key, value in node.items():
            if noise is not None and noise(str(key)):
                continue
            value = prune(value, noise=noise)
            if value is None or value == "" or value == [] or value == {}:
                continue
            kept[key] = value
        return kept
    if isinstance(node, list):
        return [prune(item, noise=noise) for item in node]
    return node


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

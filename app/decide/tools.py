"""Claude's tool calls against what the pipeline offered: refuse, validate, ask for a repair.

A tool the pipeline did not offer is refused (recorded, never published), and so is every
call beyond the pipeline's ``max_tool_calls``. An input that does not match its tool's JSON
schema gets one repair turn: every tool_use of the reply is answered with a tool_result
(``is_error`` with the validation message for the invalid ones), and the repaired reply
replaces the first one as the whole decision. Keys that a tool's schema does not declare
(``properties``/``patternProperties``, through local ``$ref``s and ``allOf``/``anyOf``/
``oneOf`` branches too) are dropped from an accepted input unless the schema allows them
explicitly (``additionalProperties: true`` or a schema), so a reply cannot carry, say, a
``topic_arn`` into the published message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from jsonschema import Draft202012Validator

from app.llm.client import ClaudeReply, ClaudeRequest

_MAX_ERRORS = 3


@dataclass(frozen=True, slots=True)
class ToolCheck:
    accepted: list[dict[str, Any]]
    refused: list[str]
    # tool_use id → validation message, for offered tools whose input is invalid
    invalid: dict[str, str] = field(default_factory=dict)
    # tool_use id → tool name, for calls beyond max_tool_calls
    over_limit: dict[str, str] = field(default_factory=dict)
    max_calls: int = 0
    # "tool.key" paths dropped from accepted inputs: not declared by the tool's schema
    dropped: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return list(self.invalid.values())

    def notes(self) -> list[str]:
        """What was refused or changed, for the audit row and the event's error field."""
        notes = []
        if self.refused:
            names = sorted({shown(name) for name in self.refused})
            notes.append(f"refused tools not offered: {', '.join(names)}")
        if self.over_limit:
            notes.append(
                f"refused {len(self.over_limit)} tool call(s) beyond max_tool_calls "
                f"({self.max_calls})"
            )
        if self.dropped:
            notes.append(f"dropped undeclared input keys: {', '.join(self.dropped[:20])}")
        return notes


def check_tool_uses(
    reply: ClaudeReply,
    *,
    offered: list[str],
    validators: dict[str, Draft202012Validator],
    max_calls: int,
) -> ToolCheck:
    accepted: list[dict[str, Any]] = []
    refused: list[str] = []
    invalid: dict[str, str] = {}
    over_limit: dict[str, str] = {}
    dropped: list[str] = []
    for use in reply.tool_uses():
        name = use.get("name")
        if name not in offered:
            refused.append(str(name))
            continue
        if len(accepted) + len(invalid) >= max_calls:
            over_limit[str(use.get("id"))] = name
            continue
        validator = validators[name]
        errors = list(validator.iter_errors(use.get("input")))[:_MAX_ERRORS]
        if errors:
            where = [("/".join(str(p) for p in e.absolute_path) or "input") for e in errors]
            detail = "; ".join(f"{w}: {e.message}" for w, e in zip(where, errors, strict=True))
            invalid[str(use.get("id"))] = f"{name}: {detail}"
        else:
            cleaned, extra = declared_only(validator.schema, use.get("input"))
            dropped += [f"{name}.{path}" for path in extra]
            accepted.append({**use, "input": cleaned})
    return ToolCheck(
        accepted=accepted,
        refused=refused,
        invalid=invalid,
        over_limit=over_limit,
        max_calls=max_calls,
        dropped=dropped,
    )


def declared_only(
    schema: Any, value: Any, path: str = "", *, root: Any = None
) -> tuple[Any, list[str]]:
    """``value`` without the object keys ``schema`` does not declare; the dropped paths.

    What a schema declares includes what it composes: its local ``$ref``s and its ``allOf``
    / ``anyOf`` / ``oneOf`` / ``then`` / ``else`` branches (a key declared by any of them is
    kept). An object schema with no ``properties`` anywhere declares nothing in particular
    and keeps all; ``additionalProperties: true`` (or a schema) keeps undeclared keys
    explicitly."""
    root = schema if root is None else root
    parts = _parts(schema, root)
    if isinstance(value, list):
        items = [part["items"] for part in parts if isinstance(part.get("items"), dict)]
        if not items:
            return value, []
        item_schema = items[0] if len(items) == 1 else {"allOf": items}
        kept, dropped = [], []
        for index, item in enumerate(value):
            clean, more = declared_only(item_schema, item, f"{path}{index}.", root=root)
            kept.append(clean)
            dropped += more
        return kept, dropped
    declared: dict[str, list[Any]] = {}
    for part in parts:
        properties = part.get("properties")
        if isinstance(properties, dict):
            for key, sub in properties.items():
                declared.setdefault(key, []).append(sub)
    if not isinstance(value, dict) or not any(
        isinstance(part.get("properties"), dict) for part in parts
    ):
        return value, []
    keep_extra = any(
        part.get("additionalProperties") is True
        or isinstance(part.get("additionalProperties"), dict)
        for part in parts
    )
    patterns = [
        pattern
        for part in parts
        for pattern in (part.get("patternProperties") or {})
        if isinstance(pattern, str)
    ]
    out: dict[str, Any] = {}
    dropped = []
    for key, item in value.items():
        if key in declared:
            subs = declared[key]
            sub = subs[0] if len(subs) == 1 else {"allOf": subs}
            out[key], more = declared_only(sub, item, f"{path}{shown(key)}.", root=root)
            dropped += more
        elif keep_extra or any(re.search(pattern, key) for pattern in patterns):
            out[key] = item
        else:
            dropped.append(f"{path}{shown(key)}")
    return out, dropped


_BRANCHES = ("allOf", "anyOf", "oneOf")
_MAX_PARTS = 64


def _parts(schema: Any, root: Any) -> list[dict[str, Any]]:
    """``schema`` and every schema it composes at this level, local ``$ref``s resolved."""
    parts: list[dict[str, Any]] = []
    seen: set[int] = set()
    stack = [schema]
    while stack and len(parts) < _MAX_PARTS:
        part = stack.pop()
        if not isinstance(part, dict) or id(part) in seen:
            continue
        seen.add(id(part))
        parts.append(part)
        ref = part.get("$ref")
        if isinstance(ref, str):
            stack.append(_resolve(root, ref))
        for name in _BRANCHES:
            branches = part.get(name)
            if isinstance(branches, list):
                stack.extend(reversed(branches))
        stack.extend(part.get(name) for name in ("then", "else"))
    return parts


def _resolve(root: Any, ref: str) -> Any:
    """A ``#/...`` JSON pointer into the tool's own schema; None for anything else."""
    if not ref.startswith("#"):
        return None
    node = root
    for token in ref[1:].split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def shown(text: str, limit: int = 64) -> str:
    """A name from Claude's reply as the audit row and the event's error show it: control
    characters escaped, cut to ``limit`` characters."""
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text[:limit])
    return escaped if len(text) <= limit else escaped + "..."


def repair_request(request: ClaudeRequest, reply: ClaudeReply, check: ToolCheck) -> ClaudeRequest:
    """The conversation so far plus one user turn of tool_results asking for corrections."""
    results: list[dict[str, Any]] = []
    for use in reply.tool_uses():
        use_id = str(use.get("id"))
        if use_id in check.invalid:
            text = (
                f"Invalid input, nothing was done. {check.invalid[use_id]}. Call the tool "
                "again with input that matches its input_schema."
            )
            results.append(_result(use_id, text, error=True))
        elif use_id in check.over_limit:
            text = f"Not executed: at most {check.max_calls} tool calls per event."
            results.append(_result(use_id, text, error=True))
        elif use.get("name") in check.refused:
            results.append(_result(use_id, "This tool is not available here.", error=True))
        else:
            text = (
                "Input valid but not executed yet: repeat this call unchanged, together "
                "with the corrected calls, if it is still wanted."
            )
            results.append(_result(use_id, text, error=False))
    messages = [
        *request.messages,
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": results},
    ]
    return replace(request, messages=messages)


def _result(tool_use_id: str, text: str, *, error: bool) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    if error:
        block["is_error"] = True
    return block

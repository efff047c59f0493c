"""Claude's tool calls against what the pipeline offered: refuse, validate, ask for a repair.

A tool the pipeline did not offer is refused (recorded, never published), and so is every
call beyond the pipeline's ``max_tool_calls``. An input that does not match its tool's JSON
schema gets one repair turn: every tool_use of the reply is answered with a tool_result
(``is_error`` with the validation message for the invalid ones), and the repaired reply
replaces the first one as the whole decision. Keys that a tool's schema does not declare
are dropped from an accepted input (``app.declared_keys`` says what counts as declared), so a
reply cannot carry, say, a ``topic_arn`` into the published message; a call whose schema
cannot be read well enough to tell is refused, never published unfiltered.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from jsonschema import Draft202012Validator
from referencing.exceptions import Unresolvable

from app.declared_keys import Unfilterable, declared_only
from app.llm.client import ClaudeReply, ClaudeRequest

_MAX_ERRORS = 3
# Deepest tool input checked (JSON schema validation and the key filter recurse per level).
MAX_INPUT_DEPTH = 64


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
    # tool_use id → "tool: why", for calls refused because the schema cannot be read
    unfilterable: dict[str, str] = field(default_factory=dict)

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
        if self.unfilterable:
            notes.append(
                "refused tool call(s) whose input cannot be filtered to the keys its schema "
                f"declares: {'; '.join(self.unfilterable.values())}"
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
    unfilterable: dict[str, str] = {}
    for use in reply.tool_uses():
        name = use.get("name")
        if name not in offered:
            refused.append(str(name))
            continue
        if len(accepted) + len(invalid) + len(unfilterable) >= max_calls:
            over_limit[str(use.get("id"))] = name
            continue
        validator = validators[name]
        if _nested_deeper_than(use.get("input"), MAX_INPUT_DEPTH):
            # Validation and the key filter recurse: refused before they could overflow.
            invalid[str(use.get("id"))] = f"{name}: input nested deeper than {MAX_INPUT_DEPTH}"
            continue
        try:
            errors = list(validator.iter_errors(use.get("input")))[:_MAX_ERRORS]
            if errors:
                where = [("/".join(str(p) for p in e.absolute_path) or "input") for e in errors]
                detail = "; ".join(f"{w}: {e.message}" for w, e in zip(where, errors, strict=True))
                invalid[str(use.get("id"))] = f"{name}: {detail}"
            else:
                cleaned, extra = declared_only(validator.schema, use.get("input"))
                dropped += [".".join(shown(str(key)) for key in (name, *path)) for path in extra]
                accepted.append({**use, "input": cleaned})
        except Unresolvable as exc:  # met by validation before the filter could say so
            unfilterable[str(use.get("id"))] = f"{name}: {exc.ref!r} does not resolve"
        except Unfilterable as exc:
            unfilterable[str(use.get("id"))] = f"{name}: {exc}"
    return ToolCheck(
        accepted=accepted,
        refused=refused,
        invalid=invalid,
        over_limit=over_limit,
        max_calls=max_calls,
        dropped=dropped,
        unfilterable=unfilterable,
    )


def shown(text: str, limit: int = 64) -> str:
    """A name from Claude's reply as the audit row and the event's error show it: control
    characters escaped, cut to ``limit`` characters."""
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text[:limit])
    return escaped if len(text) <= limit else escaped + "..."


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """True when ``value`` nests objects or arrays more than ``limit`` levels deep."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


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
        elif use_id in check.unfilterable:
            text = "Not executed: this tool cannot take calls here (its schema is unusable)."
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

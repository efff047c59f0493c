"""Claude's tool calls against what the pipeline offered: refuse, validate, ask for a repair.

A tool the pipeline did not offer is refused (recorded, never published). An input that does
not match its tool's JSON schema gets one repair turn: every tool_use of the reply is
answered with a tool_result (``is_error`` with the validation message for the invalid ones),
and the repaired reply replaces the first one as the whole decision.
"""

from __future__ import annotations

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

    def problems(self) -> list[str]:
        return list(self.invalid.values())


def check_tool_uses(
    reply: ClaudeReply, *, offered: list[str], validators: dict[str, Draft202012Validator]
) -> ToolCheck:
    accepted: list[dict[str, Any]] = []
    refused: list[str] = []
    invalid: dict[str, str] = {}
    for use in reply.tool_uses():
        name = use.get("name")
        if name not in offered:
            refused.append(str(name))
            continue
        errors = list(validators[name].iter_errors(use.get("input")))[:_MAX_ERRORS]
        if errors:
            where = [("/".join(str(p) for p in e.absolute_path) or "input") for e in errors]
            detail = "; ".join(f"{w}: {e.message}" for w, e in zip(where, errors, strict=True))
            invalid[str(use.get("id"))] = f"{name}: {detail}"
        else:
            accepted.append(use)
    return ToolCheck(accepted=accepted, refused=refused, invalid=invalid)


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

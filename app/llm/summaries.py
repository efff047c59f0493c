"""The few fields of an event that decide what to do (who, what, where, severity, links), as
its source type's module picks them. Values come from the untrusted payload: each is
flattened to one line and capped, so a crafted title cannot forge another summary line.
"""

from __future__ import annotations

import re
from typing import Any

from app.sources.registry import summary_lines

_SPACE = re.compile(r"\s+")
VALUE_CAP = 300


def one_line(value: Any, cap: int = VALUE_CAP) -> str:
    text = _SPACE.sub(" ", str(value)).strip()
    return text if len(text) <= cap else text[:cap] + "..."


def summarize(source_type: str | None, event_type: str, payload: Any) -> list[tuple[str, str]]:
    return [
        (label, one_line(value))
        for label, value in summary_lines(source_type, event_type, payload)
        if value not in (None, "")
    ]

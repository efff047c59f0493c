"""One attempt at a Claude call, as the guarded caller makes it, and the record it keeps.

The caller does not know what the call is for: whoever asks for it passes an ``AttemptLog``
that writes each attempt's row before the call and its failure after it (the decide stage
writes the audit log; ``app/decide/audit.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from app.llm.breaker import BreakerState
from app.llm.client import ClaudeError, ClaudeReply, ClaudeRequest
from app.llm.pricing import Usage


@dataclass(frozen=True, slots=True)
class Attempt:
    """What is known about one attempt before it is made."""

    number: int
    provider: str
    request: ClaudeRequest
    breaker_state: BreakerState
    retry_reason: str | None = None


class AttemptLog(Protocol):
    async def begin(self, attempt: Attempt) -> str:
        """Record an attempt about to be made (outcome unknown); its record's id."""
        ...

    async def failed(self, call_id: str, attempt: Attempt, exc: ClaudeError) -> None:
        """Complete the record of an attempt that failed."""
        ...


def usage_of(reply: ClaudeReply) -> Usage:
    return Usage(
        reply.input_tokens,
        reply.output_tokens,
        reply.cache_creation_input_tokens,
        reply.cache_read_input_tokens,
    )

"""What the readiness check knows about Claude: did the last call fail authentication?

A 401/403 means the key (or the Bedrock credentials) is wrong: every event would be
dead-lettered, so ``/readyz`` fails until a later call succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LlmHealth:
    auth_error: str | None = None

    def auth_failed(self, *, provider: str, status: int | None) -> None:
        # Only the status: the API's message may echo part of the credential.
        self.auth_error = f"{provider} rejected the credentials (HTTP {status})"

    def call_succeeded(self) -> None:
        self.auth_error = None

    def describe(self) -> str:
        return "ok" if self.auth_error is None else f"error: {self.auth_error}"

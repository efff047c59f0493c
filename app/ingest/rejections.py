"""Rejected deliveries, visible in the log without letting a flood write a line each.

A misconfigured sender (a wrong token in Alertmanager, a rotated GitHub secret) otherwise
shows only as a counter. Each rejection is counted in ``eventgate_webhooks_received_total``;
the first one of a (source, error) pair is logged at warning with its status and remote
address, then at most one line per ``interval_seconds`` for that pair, carrying how many
were held back since the previous line. Lines carry the error's detail, which never holds
a credential (the verifiers name headers, never their values).

Keys are configured source names (unknown ones share one key) and error class names, so the
state stays small whatever a sender does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from app.observability.metrics import WEBHOOKS_RECEIVED

log = structlog.get_logger(__name__)
UNKNOWN_SOURCE = "(unknown source)"


class RejectionLog:
    def __init__(
        self,
        *,
        interval_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        event: str = "webhook_rejected",
    ) -> None:
        self.event = event
        self.interval = interval_seconds
        self.clock = clock
        self._last_line: dict[tuple[str, str], float] = {}
        self._held_back: dict[tuple[str, str], int] = {}

    def record(
        self,
        *,
        source: str,
        error: str,
        status: int,
        remote: str | None,
        detail: str,
        requested: str | None = None,
    ) -> int | None:
        """Log (returns how many were held back before this line) or hold back (None).

        ``requested``: the source name in the URL when it is not a configured one."""
        key = (source, error)
        now = self.clock()
        last = self._last_line.get(key)
        if last is not None and now - last < self.interval:
            self._held_back[key] = self._held_back.get(key, 0) + 1
            return None
        self._last_line[key] = now
        held_back = self._held_back.pop(key, 0)
        extra = {} if requested is None else {"requested": requested[:64]}
        log.warning(
            self.event,
            source=source,
            error=error,
            status=status,
            remote=remote,
            detail=detail,
            suppressed=held_back,
            **extra,
        )
        return held_back


def count_rejection(source: str, error: str) -> None:
    """Metric labels take configured source names only (bounded series)."""
    if source != UNKNOWN_SOURCE:
        WEBHOOKS_RECEIVED.labels(source=source, outcome=error).inc()

"""Claude through the Message Batches API, over the official SDK: half the price, answers
within 24 hours instead of seconds.

A batch is submitted once (``submit``), polled (``status``) until it has ended, then read
once (``results``): every custom id submitted comes back either as a ``ClaudeReply``, read
as ``ClaudeClient.create`` reads a reply, or as a ``BatchFailure`` (errored, expired,
canceled). Nothing is retried here; the caller decides which failures to submit again.
SDK and HTTP errors are the ``ClaudeError`` tree of ``app/llm/client.py``:

ClaudeError
├── BatchNotEnded   retryable: results asked for before the batch ended; poll again
├── (retryable)     BatchResultsUnreadable: a results line that is not JSON
└── (as client.py)  status errors, timeouts, connection errors, a malformed message
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

import anthropic
from anthropic import AsyncAnthropic
from anthropic.types.messages import MessageBatch

from app.llm.client import (
    ClaudeClient,
    ClaudeError,
    ClaudeReply,
    ClaudeRequest,
    error_from_sdk,
    reply_from_message,
)

# The API's own limit on a custom id; checked here so a bad one fails before the upload.
CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class BatchNotEnded(ClaudeError):
    def __init__(self, batch_id: str, processing_status: str) -> None:
        super().__init__(
            f"batch {batch_id} has not ended ({processing_status}): no results yet",
            error_type="BatchNotEnded",
            retryable=True,
        )
        self.batch_id = batch_id


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """Requests by state. All are ``processing`` until the whole batch has ended."""

    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


@dataclass(frozen=True, slots=True)
class BatchStatus:
    batch_id: str
    # "in_progress", "canceling" or "ended"
    processing_status: str
    counts: BatchCounts
    expires_at: datetime

    @property
    def ended(self) -> bool:
        return self.processing_status == "ended"


@dataclass(frozen=True, slots=True)
class BatchFailure:
    """A request of an ended batch that has no answer. ``detail`` is the API's error type and
    message for ``errored`` (an ``invalid_request_error`` will fail again; an ``api_error``
    may not), a short sentence otherwise."""

    kind: Literal["errored", "expired", "canceled"]
    detail: str


class BatchClient:
    """Over an ``AsyncAnthropic`` client whose owner closes it (``sharing`` takes the one the
    gateway's ``ClaudeClient`` already holds, with its connections and no SDK retries)."""

    def __init__(self, client: AsyncAnthropic) -> None:
        self.client = client

    @classmethod
    def sharing(cls, claude: ClaudeClient) -> BatchClient:
        """Bedrock has no Message Batches API: a ``ValueError`` for a Bedrock client."""
        if not isinstance(claude.client, AsyncAnthropic):
            raise ValueError(f"no Message Batches API on {claude.provider}")
        return cls(claude.client)

    async def submit(self, requests: Sequence[tuple[str, ClaudeRequest]]) -> str:
        """Creates a batch of ``(custom_id, request)`` and returns its id. Custom ids must be
        unique and match ``CUSTOM_ID``; a ``ValueError`` says which is not, before any call."""
        _check_custom_ids([custom_id for custom_id, _ in requests])
        started = time.perf_counter()
        try:
            batch = await self.client.messages.batches.create(
                requests=[
                    {"custom_id": custom_id, "params": cast(Any, request.as_api())}
                    for custom_id, request in requests
                ]
            )
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            raise error_from_sdk(exc, started=started) from exc
        return batch.id

    async def status(self, batch_id: str) -> BatchStatus:
        started = time.perf_counter()
        try:
            batch = await self.client.messages.batches.retrieve(batch_id)
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            raise error_from_sdk(exc, started=started) from exc
        return _status(batch)

    async def cancel(self, batch_id: str) -> BatchStatus:
        """Asks the API to stop; the batch ends later, its unfinished requests ``canceled``."""
        started = time.perf_counter()
        try:
            batch = await self.client.messages.batches.cancel(batch_id)
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            raise error_from_sdk(exc, started=started) from exc
        return _status(batch)

    async def results(self, batch_id: str) -> dict[str, ClaudeReply | BatchFailure]:
        """Every request of an ended batch by custom id; ``BatchNotEnded`` before the end."""
        started = time.perf_counter()
        found: dict[str, ClaudeReply | BatchFailure] = {}
        try:
            # The SDK's results() checks this too, but raises a bare AnthropicError.
            batch = await self.client.messages.batches.retrieve(batch_id)
            if batch.processing_status != "ended" or not batch.results_url:
                raise BatchNotEnded(batch_id, batch.processing_status)
            lines = await self.client.messages.batches.results(batch_id)
            async for line in lines:
                entry = line.to_dict(mode="json")
                found[str(entry.get("custom_id"))] = _outcome(entry.get("result"))
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            raise error_from_sdk(exc, started=started) from exc
        except ValueError as exc:  # a line that is not JSON: the download may be whole later
            raise ClaudeError(
                f"batch {batch_id}: results not readable ({type(exc).__name__})",
                error_type="BatchResultsUnreadable",
                retryable=True,
            ) from exc
        return found


def _check_custom_ids(custom_ids: list[str]) -> None:
    if not custom_ids:
        raise ValueError("a batch needs at least one request")
    bad = [custom_id for custom_id in custom_ids if not CUSTOM_ID.fullmatch(custom_id)]
    if bad:
        raise ValueError(f"custom ids must be 1-64 of A-Z a-z 0-9 _ -: {bad[:3]}")
    if len(set(custom_ids)) != len(custom_ids):
        raise ValueError("custom ids must be unique within a batch")


def _status(batch: MessageBatch) -> BatchStatus:
    counts = batch.request_counts
    return BatchStatus(
        batch_id=batch.id,
        processing_status=batch.processing_status,
        counts=BatchCounts(
            processing=counts.processing,
            succeeded=counts.succeeded,
            errored=counts.errored,
            canceled=counts.canceled,
            expired=counts.expired,
        ),
        expires_at=batch.expires_at,
    )


def _outcome(result: Any) -> ClaudeReply | BatchFailure:
    """One line's ``result`` (parsed JSON) as a reply or a failure. The SDK builds result
    lines without validating them, so they are read as JSON, as ``ClaudeClient.create`` reads
    a message: a line that is not what it says is a failure of that request alone."""
    kind = result.get("type") if isinstance(result, dict) else None
    if kind == "succeeded":
        message = result.get("message")
        try:
            # A batch answer has no request id or headers of its own, and no latency: the
            # caller knows when it submitted.
            return reply_from_message(
                message,
                request_model=str(message.get("model")) if isinstance(message, dict) else "",
                request_id=None,
                headers={},
                latency_ms=0.0,
            )
        except ClaudeError as exc:
            return BatchFailure("errored", f"{exc.error_type}: {exc}")
    if kind == "errored":
        error = result.get("error")
        error = error.get("error") if isinstance(error, dict) else None
        if isinstance(error, dict):
            return BatchFailure("errored", f"{error.get('type')}: {error.get('message')}")
        return BatchFailure("errored", "the API gave no error object")
    if kind == "expired":
        return BatchFailure("expired", "the batch reached its 24 hours before this request ran")
    if kind == "canceled":
        return BatchFailure("canceled", "the batch was canceled before this request ran")
    return BatchFailure("errored", f"unknown result type {kind!r}")

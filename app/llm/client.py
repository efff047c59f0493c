"""Claude over the official SDK. The gateway owns retries, so the SDK's are off.

ClaudeError                  (carries status, request id, retry-after)
├── retryable = True         408, 409, 429, 5xx/529, timeouts, connection errors
└── retryable = False        400, 401, 403, 404, 413 ... (dead-letter the event)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

import anthropic
import orjson
from anthropic import AsyncAnthropic, AsyncAnthropicBedrock, DefaultAioHttpClient

RETRYABLE_STATUS = frozenset({408, 409, 429})
# What a reply's metadata may be, as kept (the audit row's columns, app/store/models.py): a
# reply beyond them (a broken or hostile proxy) must not make its decision unstorable.
MAX_MODEL, MAX_STOP_REASON, MAX_REQUEST_ID = 100, 64, 200
MAX_COUNT = 2**31 - 1


class ClaudeError(Exception):
    def __init__(
        self,
        message: str,
        *,
        error_type: str,
        retryable: bool,
        status: int | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
        latency_ms: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.retryable = retryable
        self.status = status
        self.request_id = request_id
        self.retry_after = retry_after
        self.latency_ms = latency_ms


@dataclass(frozen=True, slots=True)
class ClaudeRequest:
    model: str
    system: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    max_tokens: int

    def as_api(self) -> dict[str, Any]:
        """The request body as sent (for token estimates and the prompt hash; also a Message
        Batches request's ``params``)."""
        return {
            "model": self.model,
            "system": self.system,
            "tools": self.tools,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
        }


@dataclass(frozen=True, slots=True)
class ClaudeReply:
    model: str
    request_id: str | None
    stop_reason: str | None
    content: list[dict[str, Any]]
    latency_ms: float
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    def tool_uses(self) -> list[dict[str, Any]]:
        return [block for block in self.content if block.get("type") == "tool_use"]


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class ClaudeClient:
    def __init__(
        self, client: AsyncAnthropic | AsyncAnthropicBedrock, *, provider: str = "anthropic"
    ) -> None:
        self.client = client
        self.provider = provider

    @classmethod
    def from_env(cls, *, api_key: str | None, timeout: float) -> ClaudeClient:
        """The SDK over its aiohttp transport, which it offers for high concurrency: with 64
        calls in flight it takes about a third less CPU per call (docs/benchmarks.md)."""
        # base_url comes from ANTHROPIC_BASE_URL, read by the SDK itself.
        client = AsyncAnthropic(
            api_key=api_key,
            max_retries=0,
            timeout=timeout,
            http_client=DefaultAioHttpClient(timeout=timeout),
            # The gateway exports no traces; the SDK's call spans would go to no tracer
            # after building their attributes on every call.
            open_telemetry=False,
        )
        return cls(client)

    @classmethod
    def bedrock(cls, *, region: str, timeout: float) -> ClaudeClient:
        """Claude on Amazon Bedrock; credentials come from the usual AWS chain."""
        client = AsyncAnthropicBedrock(
            aws_region=region, max_retries=0, timeout=timeout, open_telemetry=False
        )
        return cls(client, provider="bedrock")

    async def close(self) -> None:
        await self.client.close()

    async def create(
        self, request: ClaudeRequest, *, call_timeout: float | None = None
    ) -> ClaudeReply:
        started = time.perf_counter()
        try:
            raw = await self.client.messages.with_raw_response.create(
                model=request.model,
                system=cast(Any, request.system),
                tools=cast(Any, request.tools),
                messages=cast(Any, request.messages),
                max_tokens=request.max_tokens,
                timeout=call_timeout if call_timeout is not None else anthropic.NOT_GIVEN,
            )
            # The JSON as sent, not the SDK's models: the reply is kept as plain dicts anyway,
            # and building and dumping the models cost more CPU than the rest of the call.
            body = await raw.read()
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            raise error_from_sdk(exc, started=started) from exc
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            message = None  # a proxy's error page, an empty or cut-off body
        return reply_from_message(
            message,
            request_model=request.model,
            request_id=_request_id(raw.headers),
            headers={
                k: v
                for k, v in raw.headers.items()
                if k.startswith("anthropic-ratelimit-") or k == "retry-after"
            },
            latency_ms=_ms(started),
        )


def error_from_sdk(
    exc: anthropic.APIStatusError | anthropic.APIConnectionError, *, started: float
) -> ClaudeError:
    """The ``ClaudeError`` for an SDK error (a status, a timeout, a failed connection),
    retryable or not as the module docstring says."""
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        return ClaudeError(
            _status_message(exc),
            error_type=type(exc).__name__,
            retryable=status in RETRYABLE_STATUS or status >= 500,
            status=status,
            request_id=_request_id(exc.response.headers),
            retry_after=_retry_after(exc.response.headers),
            latency_ms=_ms(started),
        )
    if isinstance(exc, anthropic.APITimeoutError):
        return ClaudeError(
            "request timed out",
            error_type="APITimeoutError",
            retryable=True,
            latency_ms=_ms(started),
        )
    return ClaudeError(
        f"connection failed: {exc}",
        error_type="APIConnectionError",
        retryable=True,
        latency_ms=_ms(started),
    )


def reply_from_message(
    message: Any,
    *,
    request_model: str,
    request_id: str | None,
    headers: dict[str, str],
    latency_ms: float,
) -> ClaudeReply:
    """A Messages API ``message`` (parsed JSON) as the gateway keeps it: every field bounded
    and typed, so a broken or hostile reply cannot make its decision unstorable. Raises a
    retryable ``ClaudeError`` (``MalformedReply``) when it is not a message at all."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        # A proxy's error page or a broken reply: nothing was decided; tried again.
        raise ClaudeError(
            "the reply is not a Messages API message",
            error_type="MalformedReply",
            retryable=True,
            request_id=request_id,
            latency_ms=latency_ms,
        )
    usage = message.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return ClaudeReply(
        model=_short(message.get("model"), MAX_MODEL) or request_model,
        request_id=request_id,
        stop_reason=_short(message.get("stop_reason"), MAX_STOP_REASON),
        content=[_without_nulls(block) for block in content],
        latency_ms=latency_ms,
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
        cache_creation_input_tokens=_count(usage.get("cache_creation_input_tokens")),
        cache_read_input_tokens=_count(usage.get("cache_read_input_tokens")),
        headers=headers,
    )


def _without_nulls(block: dict[str, Any]) -> dict[str, Any]:
    """A content block without its null fields (as the SDK's ``exclude_none`` dump had it)."""
    return {key: value for key, value in block.items() if value is not None}


def _request_id(headers: Any) -> str | None:
    return _short(headers.get("request-id") or headers.get("x-amzn-requestid"), MAX_REQUEST_ID)


def _short(value: Any, limit: int) -> str | None:
    """A short text field of a reply as the gateway keeps it: printable characters only,
    at most ``limit`` of them; None for anything but a string."""
    if not isinstance(value, str):
        return None
    text = value if value.isprintable() else "".join(c for c in value if c.isprintable())
    return text[:limit] or None


def _count(value: Any) -> int:
    """A token count as the gateway keeps it: a whole number from 0 to ``MAX_COUNT``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0
    return int(min(max(value, 0), MAX_COUNT))


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _status_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return f"{exc.status_code}: {error['message']}"
    return f"{exc.status_code}: {exc.message}"

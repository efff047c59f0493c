"""Each Claude error class, seen through the SDK over (mocked) HTTP: retryable or not,
status, request id and retry-after."""

from __future__ import annotations

from collections.abc import Iterator

import httpcore2
import httpx
import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from anthropic import AsyncAnthropic

from app.llm.client import ClaudeClient, ClaudeError, ClaudeRequest

BASE = "https://api.anthropic.com"
REQUEST = ClaudeRequest(
    model="claude-sonnet-4-6",
    system=[{"type": "text", "text": "sys"}],
    tools=[{"name": "t", "description": "d", "input_schema": {"type": "object"}}],
    messages=[{"role": "user", "content": "hi"}],
    max_tokens=64,
)


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(base_url=BASE, using="httpcore2") as router:
        yield router


def _client() -> ClaudeClient:
    return ClaudeClient(AsyncAnthropic(api_key="sk-ant-test", base_url=BASE, max_retries=0))


def _error(status: int, kind: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(
        status,
        json={"type": "error", "error": {"type": kind, "message": f"{kind} says no"}},
        headers={"request-id": f"req_{status}", **(headers or {})},
    )


@pytest.mark.parametrize(
    ("status", "kind", "error_type", "retryable"),
    [
        (400, "invalid_request_error", "BadRequestError", False),
        (401, "authentication_error", "AuthenticationError", False),
        (403, "permission_error", "PermissionDeniedError", False),
        (404, "not_found_error", "NotFoundError", False),
        (413, "request_too_large", "ContentTooLargeError", False),
        (408, "timeout_error", "RequestTimeoutError", True),
        (409, "conflict_error", "ConflictError", True),
        (429, "rate_limit_error", "RateLimitError", True),
        (500, "api_error", "InternalServerError", True),
        (503, "api_error", "ServiceUnavailableError", True),
        (529, "overloaded_error", "OverloadedError", True),
    ],
)
async def test_status_errors_are_classified(
    api: respx.Router, status: int, kind: str, error_type: str, retryable: bool
) -> None:
    route = api.post("/v1/messages").mock(return_value=_error(status, kind))
    with pytest.raises(ClaudeError) as caught:
        await _client().create(REQUEST)
    exc = caught.value
    assert route.call_count == 1  # the SDK never retries by itself
    assert exc.status == status
    assert exc.retryable is retryable
    assert exc.error_type == error_type
    assert exc.request_id == f"req_{status}"
    assert f"{kind} says no" in str(exc)


async def test_retry_after_is_read_from_the_response(api: respx.Router) -> None:
    api.post("/v1/messages").mock(
        return_value=_error(429, "rate_limit_error", {"retry-after": "7"})
    )
    with pytest.raises(ClaudeError) as caught:
        await _client().create(REQUEST)
    assert caught.value.retry_after == 7.0


async def test_unparseable_retry_after_is_ignored(api: respx.Router) -> None:
    api.post("/v1/messages").mock(
        return_value=_error(529, "overloaded_error", {"retry-after": "soon"})
    )
    with pytest.raises(ClaudeError) as caught:
        await _client().create(REQUEST)
    assert caught.value.retry_after is None
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("raised", "error_type"),
    [
        (httpcore2.ReadTimeout("slow"), "APITimeoutError"),
        (httpcore2.ConnectError("refused"), "APIConnectionError"),
    ],
)
async def test_timeouts_and_connection_errors_are_retryable(
    api: respx.Router, raised: Exception, error_type: str
) -> None:
    api.post("/v1/messages").mock(side_effect=raised)
    with pytest.raises(ClaudeError) as caught:
        await _client().create(REQUEST, call_timeout=1.0)
    assert caught.value.error_type == error_type
    assert caught.value.retryable
    assert caught.value.status is None


async def test_a_reply_carries_usage_and_rate_limit_headers(api: respx.Router) -> None:
    api.post("/v1/messages").mock(
        return_value=httpx.Response(
            200,
            json={
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-6",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 11,
                    "output_tokens": 7,
                    "cache_creation_input_tokens": 100,
                    "cache_read_input_tokens": 200,
                },
            },
            headers={
                "request-id": "req_ok",
                "anthropic-ratelimit-requests-remaining": "41",
                "x-unrelated": "dropped",
            },
        )
    )
    reply = await _client().create(REQUEST)
    assert reply.request_id == "req_ok"
    assert (reply.input_tokens, reply.output_tokens) == (11, 7)
    assert (reply.cache_creation_input_tokens, reply.cache_read_input_tokens) == (100, 200)
    assert reply.headers == {"anthropic-ratelimit-requests-remaining": "41"}
    assert reply.tool_uses()[0]["name"] == "t"

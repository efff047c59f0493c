"""The client the gateway builds (`ClaudeClient.from_env`: the SDK over its aiohttp transport)
against the fake Messages API over real HTTP: a reply, a status error with its headers, a
timeout and a refused connection each come out as the same `ClaudeReply` / `ClaudeError`
as over the SDK's default transport."""

from __future__ import annotations

import socket
from typing import Any

import anthropic._base_client
import anthropic._tracing
import pytest

from app.llm.client import ClaudeClient, ClaudeError, ClaudeRequest
from eventgate_dev.fake_anthropic import FakeAnthropicServer

REQUEST = ClaudeRequest(
    model="claude-sonnet-4-6",
    system=[{"type": "text", "text": "sys"}],
    tools=[
        {
            "name": "publishAlert",
            "description": "d",
            "input_schema": {
                "type": "object",
                "properties": {"severity": {"type": "string"}},
                "required": ["severity"],
            },
        }
    ],
    messages=[{"role": "user", "content": "hi"}],
    max_tokens=64,
)


def _client(timeout: float = 10.0) -> ClaudeClient:
    # base_url comes from ANTHROPIC_BASE_URL, as in the gateway (fake_claude sets it).
    return ClaudeClient.from_env(api_key="sk-ant-test", timeout=timeout)


async def test_a_reply_is_read_with_usage_and_headers(fake_claude: FakeAnthropicServer) -> None:
    fake_claude.behaviour.headers = {"anthropic-ratelimit-requests-remaining": "41"}
    client = _client()
    try:
        reply = await client.create(REQUEST)
    finally:
        await client.close()
    assert reply.stop_reason == "tool_use"
    assert [block["name"] for block in reply.tool_uses()] == ["publishAlert"]
    assert reply.request_id is not None and reply.request_id.startswith("req_fake_")
    assert reply.input_tokens + reply.cache_creation_input_tokens > 0
    assert reply.headers == {"anthropic-ratelimit-requests-remaining": "41"}
    assert fake_claude.behaviour.requests[-1]["tools"][0]["name"] == "publishAlert"


async def test_a_status_error_keeps_status_request_id_and_retry_after(
    fake_claude: FakeAnthropicServer,
) -> None:
    fake_claude.behaviour.faults = [529, 400]
    client = _client()
    try:
        with pytest.raises(ClaudeError) as overloaded:
            await client.create(REQUEST)
        with pytest.raises(ClaudeError) as bad:
            await client.create(REQUEST)
    finally:
        await client.close()
    assert (overloaded.value.status, overloaded.value.retryable) == (529, True)
    assert overloaded.value.error_type == "OverloadedError"
    assert overloaded.value.retry_after == 0.0
    assert (overloaded.value.request_id or "").startswith("req_fake_")
    assert (bad.value.status, bad.value.retryable) == (400, False)
    assert "fake fault 400" in str(bad.value)


async def test_a_slow_answer_is_a_retryable_timeout(fake_claude: FakeAnthropicServer) -> None:
    fake_claude.behaviour.latency = 2.0
    client = _client()
    try:
        with pytest.raises(ClaudeError) as caught:
            await client.create(REQUEST, call_timeout=0.3)
    finally:
        await client.close()
    assert (caught.value.error_type, caught.value.retryable) == ("APITimeoutError", True)
    assert 250 <= caught.value.latency_ms < 1900


async def test_a_refused_connection_is_a_retryable_connection_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{port}")
    client = _client()
    try:
        with pytest.raises(ClaudeError) as caught:
            await client.create(REQUEST)
    finally:
        await client.close()
    assert (caught.value.error_type, caught.value.retryable) == ("APIConnectionError", True)
    assert caught.value.status is None


async def test_blocks_are_kept_as_sent_less_their_null_fields(
    fake_claude: FakeAnthropicServer,
) -> None:
    fake_claude.behaviour.responder = lambda _: [
        {"type": "text", "text": "looking", "citations": None},
        {"type": "tool_use", "id": "toolu_1", "name": "publishAlert", "input": {"note": None}},
    ]
    client = _client()
    try:
        reply = await client.create(REQUEST)
    finally:
        await client.close()
    assert reply.content == [
        {"type": "text", "text": "looking"},
        {"type": "tool_use", "id": "toolu_1", "name": "publishAlert", "input": {"note": None}},
    ]


async def test_a_call_builds_no_trace_span(
    fake_claude: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway exports no traces: the SDK's span of each call (its attributes built
    from the request on every call) is turned off."""
    started: list[object] = []
    real = anthropic._tracing.start_api_call_span

    def counting(*args: Any, **kwargs: Any) -> Any:
        started.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(anthropic._base_client, "start_api_call_span", counting)
    client = _client()
    try:
        reply = await client.create(REQUEST)
    finally:
        await client.close()
    assert reply.stop_reason == "tool_use"
    assert started == []

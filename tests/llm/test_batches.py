"""The Message Batches client against the fake Anthropic API over real HTTP: submit, poll
until ended, results per custom id (replies read as ClaudeClient reads them, failures as
BatchFailure), cancel, errors as ClaudeError, and the half price of a batch call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx2
import pytest
from anthropic import AsyncAnthropic, DefaultAioHttpClient

from app.llm.batches import BatchClient, BatchFailure, BatchNotEnded, BatchStatus
from app.llm.client import ClaudeClient, ClaudeError, ClaudeReply, ClaudeRequest
from app.llm.pricing import DEFAULT_PRICES, PriceTable, Usage
from eventgate_dev.fake_anthropic import FakeAnthropicServer, Persona
from tests.support import free_port

TOOLS = [
    {
        "name": "publishAlert",
        "description": "d",
        "input_schema": {
            "type": "object",
            "properties": {"severity": {"type": "string", "enum": ["high", "low"]}},
            "required": ["severity"],
        },
    }
]


def _request(model: str = "claude-sonnet-4-5", text: str = "event type: push") -> ClaudeRequest:
    return ClaudeRequest(
        model=model,
        system=[{"type": "text", "text": "You triage."}],
        tools=TOOLS,
        messages=[{"role": "user", "content": f"{text}\ngroup: acme/api"}],
        max_tokens=64,
    )


@pytest.fixture(params=["httpx", "aiohttp"])
async def batches(
    request: pytest.FixtureRequest, fake_claude: FakeAnthropicServer
) -> AsyncIterator[BatchClient]:
    """Over the SDK's default transport and over the aiohttp one the gateway builds; the
    base URL comes from ANTHROPIC_BASE_URL (set by fake_claude)."""
    http = DefaultAioHttpClient() if request.param == "aiohttp" else None
    client = AsyncAnthropic(api_key="sk-ant-test", max_retries=0, http_client=http)
    yield BatchClient(client)
    await client.close()


async def _until_ended(batches: BatchClient, batch_id: str) -> BatchStatus:
    deadline = time.monotonic() + 10
    while not (status := await batches.status(batch_id)).ended:
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.05)
    return status


def _severity(reply: ClaudeReply | BatchFailure) -> str:
    assert isinstance(reply, ClaudeReply), reply
    return str(reply.tool_uses()[0]["input"]["severity"])


async def test_submit_poll_and_read_answers_that_differ_per_model(
    batches: BatchClient, fake_claude: FakeAnthropicServer
) -> None:
    fake_claude.behaviour.personas = {"claude-haiku-4-5": Persona(enum="last")}
    fake_claude.behaviour.batch_delay = 0.3
    batch_id = await batches.submit(
        [("sonnet", _request()), ("haiku", _request("claude-haiku-4-5"))]
    )
    first = await batches.status(batch_id)
    assert (first.ended, first.processing_status, first.counts.processing) == (
        False,
        "in_progress",
        2,
    )
    assert first.expires_at.tzinfo is not None
    ended = await _until_ended(batches, batch_id)
    assert (ended.counts.succeeded, ended.counts.processing) == (2, 0)
    results = await batches.results(batch_id)
    assert set(results) == {"sonnet", "haiku"}
    assert (_severity(results["sonnet"]), _severity(results["haiku"])) == ("high", "low")
    haiku = results["haiku"]
    assert isinstance(haiku, ClaudeReply)
    assert (haiku.model, haiku.stop_reason) == ("claude-haiku-4-5", "tool_use")
    assert haiku.output_tokens == 40 and haiku.input_tokens > 0


async def test_errored_and_expired_requests_come_back_as_failures(
    batches: BatchClient, fake_claude: FakeAnthropicServer
) -> None:
    fake_claude.behaviour.batch_expire_first = 1
    fake_claude.behaviour.batch_error_rate = 0.5
    requests = [(f"r{n}", _request()) for n in range(4)]
    expired = await batches.results(await batches.submit(requests))
    assert expired == {
        f"r{n}": BatchFailure("expired", "the batch reached its 24 hours before this request ran")
        for n in range(4)
    }
    batch_id = await batches.submit(requests)
    status = await batches.status(batch_id)
    assert (status.counts.errored, status.counts.succeeded) == (2, 2)
    results = await batches.results(batch_id)
    assert results["r1"] == BatchFailure("errored", "api_error: fake batch fault")
    assert results["r3"] == results["r1"]
    assert isinstance(results["r0"], ClaudeReply) and isinstance(results["r2"], ClaudeReply)


async def test_cancel_ends_the_batch_with_every_request_canceled(
    batches: BatchClient, fake_claude: FakeAnthropicServer
) -> None:
    fake_claude.behaviour.batch_delay = 60
    batch_id = await batches.submit([("a", _request()), ("b", _request())])
    canceling = await batches.cancel(batch_id)
    assert (canceling.processing_status, canceling.ended) == ("canceling", False)
    ended = await _until_ended(batches, batch_id)
    assert ended.counts.canceled == 2
    results = await batches.results(batch_id)
    assert {kind.kind for kind in results.values() if isinstance(kind, BatchFailure)} == {
        "canceled"
    }
    assert set(results) == {"a", "b"}


async def test_results_before_the_end_are_refused_as_a_retryable_claude_error(
    batches: BatchClient, fake_claude: FakeAnthropicServer
) -> None:
    fake_claude.behaviour.batch_delay = 60
    batch_id = await batches.submit([("a", _request())])
    with pytest.raises(BatchNotEnded) as caught:
        await batches.results(batch_id)
    assert isinstance(caught.value, ClaudeError) and caught.value.retryable
    assert caught.value.batch_id == batch_id
    assert "in_progress" in str(caught.value)


async def test_api_and_connection_errors_are_claude_errors(batches: BatchClient) -> None:
    with pytest.raises(ClaudeError) as missing:
        await batches.status("msgbatch_unknown")
    assert (missing.value.status, missing.value.retryable) == (404, False)
    assert missing.value.error_type == "NotFoundError"
    assert (missing.value.request_id or "").startswith("req_fake_")
    refused = AsyncAnthropic(
        api_key="sk-ant-test", max_retries=0, base_url=f"http://127.0.0.1:{free_port()}"
    )
    try:
        with pytest.raises(ClaudeError) as down:
            await BatchClient(refused).submit([("a", _request())])
    finally:
        await refused.close()
    assert (down.value.error_type, down.value.retryable) == ("APIConnectionError", True)


@pytest.mark.parametrize(
    ("custom_ids", "message"),
    [([], "at least one"), (["a b"], "1-64"), (["x" * 65], "1-64"), (["a", "a"], "unique")],
)
async def test_bad_custom_ids_fail_before_any_call(
    batches: BatchClient, fake_claude: FakeAnthropicServer, custom_ids: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        await batches.submit([(custom_id, _request()) for custom_id in custom_ids])
    assert fake_claude.behaviour.batches == {}


async def test_a_batch_call_costs_half(batches: BatchClient) -> None:
    batch_id = await batches.submit([("a", _request())])
    reply = (await batches.results(batch_id))["a"]
    assert isinstance(reply, ClaudeReply)
    usage = Usage(
        reply.input_tokens,
        reply.output_tokens,
        reply.cache_creation_input_tokens,
        reply.cache_read_input_tokens,
    )
    table = PriceTable(DEFAULT_PRICES)
    standard = table.cost_usd("claude-sonnet-4-5", usage)
    assert standard > 0
    assert table.cost_usd("claude-sonnet-4-5", usage, batch=True) == pytest.approx(standard / 2)
    every_kind = Usage(1_000_000, 1_000_000, 1_000_000, 1_000_000)
    assert table.cost_usd("claude-sonnet-4-5", every_kind, batch=True) == pytest.approx(
        (3 + 15 + 3.75 + 0.30) / 2
    )


async def test_it_shares_the_gateway_client_but_not_a_bedrock_one(
    fake_claude: FakeAnthropicServer,
) -> None:
    claude = ClaudeClient.from_env(api_key="sk-ant-test", timeout=10)
    try:
        shared = BatchClient.sharing(claude)
        assert shared.client is claude.client
        results = await shared.results(await shared.submit([("a", _request())]))
        assert _severity(results["a"]) == "high"
    finally:
        await claude.close()
    bedrock = ClaudeClient.bedrock(region="us-east-1", timeout=10)
    try:
        with pytest.raises(ValueError, match="bedrock"):
            BatchClient.sharing(bedrock)
    finally:
        await bedrock.close()


async def test_results_the_client_cannot_parse_are_a_claude_error() -> None:
    """A results line that is not JSON (a truncated download, a proxy's error page) is a
    ``ClaudeError``, which the lane catches (it polls again later), not a bare
    ``ValueError`` that ends the lane's round at that batch every time."""
    ended = {
        "id": "msgbatch_1",
        "type": "message_batch",
        "processing_status": "ended",
        "request_counts": {
            "processing": 0,
            "succeeded": 1,
            "errored": 0,
            "canceled": 0,
            "expired": 0,
        },
        "created_at": "2026-12-03T09:00:00Z",
        "expires_at": "2026-12-04T09:00:00Z",
        "ended_at": "2026-12-03T09:01:00Z",
        "archived_at": None,
        "cancel_initiated_at": None,
        "results_url": "https://api.anthropic.com/v1/messages/batches/msgbatch_1/results",
    }

    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/results"):
            return httpx2.Response(200, content=b'{"custom_id": "r1-a1", "result": {\n')
        return httpx2.Response(200, json=ended)

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    client = AsyncAnthropic(api_key="sk-ant-test", max_retries=0, http_client=http)
    try:
        with pytest.raises(ClaudeError) as caught:
            await BatchClient(client).results("msgbatch_1")
    finally:
        await client.close()
    assert caught.value.retryable

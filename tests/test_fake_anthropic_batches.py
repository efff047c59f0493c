"""The fake's Message Batches endpoints, over plain HTTP: the real API's shapes, answers as
``/v1/messages`` gives them, the end after a delay, cancel, the faults, and ``/_fake/stats``."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest

from eventgate_dev.fake_anthropic import FakeAnthropicServer, FakeBehaviour, Persona

TOOLS = [
    {
        "name": "publishAlert",
        "input_schema": {
            "type": "object",
            "properties": {"severity": {"type": "string", "enum": ["high", "low"]}},
            "required": ["severity"],
        },
    }
]


def _params(model: str = "claude-sonnet-4-5") -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 100,
        "system": [{"type": "text", "text": "You triage."}],
        "tools": TOOLS,
        "messages": [{"role": "user", "content": "event type: push\ngroup: acme/api"}],
    }


def _submit(client: httpx.Client, requests: list[dict[str, Any]]) -> dict[str, Any]:
    created = client.post("/v1/messages/batches", json={"requests": requests})
    assert created.status_code == 200, created.text
    batch: dict[str, Any] = created.json()
    return batch


def _results(client: httpx.Client, batch_id: str) -> dict[str, Any]:
    answer = client.get(f"/v1/messages/batches/{batch_id}/results")
    assert answer.status_code == 200, answer.text
    lines = [orjson.loads(line) for line in answer.content.splitlines() if line]
    return {line["custom_id"]: line["result"] for line in lines}


@pytest.fixture
def server() -> Any:
    fake = FakeAnthropicServer(
        FakeBehaviour(personas={"claude-haiku-4-5": Persona(enum="last")})
    ).start()
    yield fake
    fake.stop()


def test_a_batch_answers_each_request_as_messages_would(server: FakeAnthropicServer) -> None:
    with httpx.Client(base_url=server.base_url) as client:
        one = client.post("/v1/messages", json=_params("claude-haiku-4-5")).json()
        batch = _submit(
            client,
            [
                {"custom_id": "sonnet", "params": _params()},
                {"custom_id": "haiku", "params": _params("claude-haiku-4-5")},
            ],
        )
        assert batch["id"].startswith("msgbatch_")
        assert batch["type"] == "message_batch"
        assert batch["processing_status"] == "ended"
        assert batch["request_counts"] == {
            "processing": 0,
            "succeeded": 2,
            "errored": 0,
            "canceled": 0,
            "expired": 0,
        }
        assert batch["results_url"] == (
            f"{server.base_url}/v1/messages/batches/{batch['id']}/results"
        )
        assert batch["created_at"].endswith("Z") and batch["ended_at"] is not None
        assert (batch["cancel_initiated_at"], batch["archived_at"]) == (None, None)
        results = _results(client, batch["id"])
    assert {result["type"] for result in results.values()} == {"succeeded"}
    by_model = {key: result["message"] for key, result in results.items()}
    severity = {
        key: [b["input"]["severity"] for b in message["content"] if b["type"] == "tool_use"]
        for key, message in by_model.items()
    }
    # The haiku persona picks the last enum value, through /v1/messages and in a batch alike.
    assert severity == {"sonnet": ["high"], "haiku": ["low"]}
    assert next(b for b in one["content"] if b["type"] == "tool_use")["input"] == {
        "severity": "low"
    }
    assert by_model["haiku"]["model"] == "claude-haiku-4-5"
    assert by_model["haiku"]["usage"]["output_tokens"] == 40
    # The same prefix was already seen by /v1/messages: a cache read, as there.
    assert by_model["haiku"]["usage"]["cache_read_input_tokens"] > 0


def test_a_batch_ends_after_the_delay_and_refuses_results_before(
    server: FakeAnthropicServer,
) -> None:
    server.behaviour.batch_delay = 0.4
    with httpx.Client(base_url=server.base_url) as client:
        batch = _submit(client, [{"custom_id": "a", "params": _params()}])
        assert batch["processing_status"] == "in_progress"
        assert batch["request_counts"]["processing"] == 1
        assert (batch["ended_at"], batch["results_url"]) == (None, None)
        early = client.get(f"/v1/messages/batches/{batch['id']}/results")
        assert early.status_code == 404
        assert early.json()["error"]["type"] == "not_found_error"
        time.sleep(0.5)
        later = client.get(f"/v1/messages/batches/{batch['id']}").json()
        assert later["processing_status"] == "ended"
        assert later["request_counts"]["succeeded"] == 1
        assert _results(client, batch["id"])["a"]["type"] == "succeeded"
        assert client.get("/v1/messages/batches/msgbatch_nope").status_code == 404


def test_cancel_answers_canceling_then_every_request_is_canceled(
    server: FakeAnthropicServer,
) -> None:
    server.behaviour.batch_delay = 60
    with httpx.Client(base_url=server.base_url) as client:
        batch = _submit(
            client, [{"custom_id": "a", "params": _params()}, {"custom_id": "b", "params": {}}]
        )
        canceled = client.post(f"/v1/messages/batches/{batch['id']}/cancel").json()
        assert canceled["processing_status"] == "canceling"
        assert canceled["cancel_initiated_at"] is not None
        after = client.get(f"/v1/messages/batches/{batch['id']}").json()
        assert after["processing_status"] == "ended"
        assert after["request_counts"]["canceled"] == 2
        assert _results(client, batch["id"]) == {
            "a": {"type": "canceled"},
            "b": {"type": "canceled"},
        }


def test_faults_expire_the_first_batches_and_error_an_exact_share(
    server: FakeAnthropicServer,
) -> None:
    server.behaviour.batch_expire_first = 1
    server.behaviour.batch_error_rate = 0.25
    requests = [{"custom_id": f"r{n}", "params": _params()} for n in range(8)]
    with httpx.Client(base_url=server.base_url) as client:
        expired = _submit(client, requests)
        assert expired["request_counts"]["expired"] == 8
        assert _results(client, expired["id"]) == {f"r{n}": {"type": "expired"} for n in range(8)}
        second = _submit(client, requests)
        assert second["request_counts"]["errored"] == 2
        assert second["request_counts"]["succeeded"] == 6
        results = _results(client, second["id"])
        stats = client.get("/_fake/stats").json()
    errored = sorted(key for key, result in results.items() if result["type"] == "errored")
    assert errored == ["r3", "r7"]
    assert results["r3"]["error"] == {
        "type": "error",
        "error": {"type": "api_error", "message": "fake batch fault"},
    }
    assert (stats["batches"], stats["batch_requests"], stats["requests"]) == (2, 16, 0)


def test_invalid_params_error_per_request_and_bad_shapes_are_refused(
    server: FakeAnthropicServer,
) -> None:
    with httpx.Client(base_url=server.base_url) as client:
        batch = _submit(
            client,
            [{"custom_id": "ok", "params": _params()}, {"custom_id": "bad", "params": {"x": 1}}],
        )
        results = _results(client, batch["id"])
        assert results["bad"]["type"] == "errored"
        assert results["bad"]["error"]["error"]["type"] == "invalid_request_error"
        bodies: list[dict[str, Any]] = [
            {"requests": []},
            {"requests": [{"custom_id": "a"}]},
            {"requests": [{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]},
        ]
        for body in bodies:
            refused = client.post("/v1/messages/batches", json=body)
            assert refused.status_code == 400, body
            assert refused.json()["error"]["type"] == "invalid_request_error"

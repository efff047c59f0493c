"""The fake Messages API reports what it saw (benchmarks run it as a separate process)."""

from __future__ import annotations

import time

import httpx

from eventgate_dev.fake_anthropic import FakeAnthropicServer


def test_stats_count_requests(fake_claude: FakeAnthropicServer) -> None:
    request = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with httpx.Client(base_url=fake_claude.base_url) as client:
        assert client.get("/_fake/stats").json() == {
            "requests": 0,
            "in_flight": 0,
            "max_in_flight": 0,
            "first_at": None,
            "last_at": None,
            "batches": 0,
            "batch_requests": 0,
        }
        before = time.time()
        assert client.post("/v1/messages", json=request).status_code == 200
        assert client.post("/v1/messages", json=request).status_code == 200
        after = time.time()
        stats = client.get("/_fake/stats").json()
        first, last = stats.pop("first_at"), stats.pop("last_at")
        assert stats == {
            "requests": 2,
            "in_flight": 0,
            "max_in_flight": 1,
            "batches": 0,
            "batch_requests": 0,
        }
        assert before - 0.01 <= first <= last <= after + 0.01
        later = client.get("/_fake/stats", params={"since": after + 0.01}).json()
        assert (later["requests"], later["first_at"], later["last_at"]) == (2, None, None)
        bad = client.get("/_fake/stats", params={"since": "yesterday"})
        assert bad.status_code == 400 and "since" in bad.json()["error"]

"""Claude calls made during an outage, with the gateway's default breaker settings.

Runs the gateway in-process (memory:// Redis, SQLite, fake Claude over HTTP, no SNS: tool
calls stay in the outbox), takes Claude down for ``--outage`` seconds while events keep
arriving, and prints how many calls reached Claude meanwhile and when every event was
stored.

    python -m bench.llm_outage --outage 60 --events 40
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid

import httpx
from sqlalchemy import func, select

from app.config import load_config
from app.main import create_app
from app.settings import Settings
from app.store.db import create_engine, session_factory
from app.store.models import EventRow, LlmCallRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer, FakeBehaviour
from tests.support import ServerThread, github_request, issue_payload


async def _stored(database_url: str) -> tuple[int, int]:
    engine = create_engine(database_url)
    async with session_factory(engine)() as session:
        done = await session.scalar(
            select(func.count()).select_from(EventRow).where(EventRow.status == "processing")
        )
        probes = await session.scalar(
            select(func.count())
            .select_from(LlmCallRow)
            .where(LlmCallRow.breaker_state == "half_open")
        )
    await engine.dispose()
    return int(done or 0), int(probes or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=60.0)
    parser.add_argument("--events", type=int, default=40)
    args = parser.parse_args()
    fake = FakeAnthropicServer(FakeBehaviour(latency=0.05)).start()
    os.environ.update({"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "sk-bench"})
    database_url = f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/bench.db"
    settings = Settings(database_url=database_url, redis_prefix=f"bench-{uuid.uuid4().hex[:6]}")
    app = create_app(settings, load_config(None))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        down_from = time.monotonic()
        fake.behaviour.down_until = down_from + args.outage
        for n in range(args.events):
            body, headers = github_request(
                "dev-github-secret", issue_payload(f"acme/repo{n % 8}", n)
            )
            client.post("/v1/webhooks/github", content=body, headers=headers).raise_for_status()
        while asyncio.run(_stored(database_url))[0] < args.events:
            if time.monotonic() - down_from > args.outage + 120:
                raise SystemExit("events were not all stored two minutes after recovery")
            time.sleep(0.5)
        all_stored = time.monotonic() - down_from
    during = [t for t, _ in fake.behaviour.log if t < fake.behaviour.down_until]
    _, probes = asyncio.run(_stored(database_url))
    fake.stop()
    print(
        f"defaults: window {settings.llm_breaker_window_seconds:.0f}s, min calls "
        f"{settings.llm_breaker_min_calls}, failure ratio {settings.llm_breaker_failure_ratio}, "
        f"{settings.llm_breaker_consecutive_failures} consecutive failures, cooldown "
        f"{settings.llm_breaker_cooldown_seconds:.0f}s"
    )
    print(f"outage: {args.outage:.0f}s, events sent during it: {args.events}")
    print(f"claude calls during the outage: {len(during)} (half-open probes in total: {probes})")
    print(f"all {args.events} events stored {all_stored:.1f}s after the outage began")
    print(f"claude calls in total: {len(fake.behaviour.requests)}")


if __name__ == "__main__":
    main()

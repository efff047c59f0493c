"""The least a webhook → Claude → SNS FIFO pipeline can do, as a same-run baseline for
``bench.pipeline``: what this machine, the fake Claude and moto allow, before any of the
gateway's safety work.

It keeps per-key order and the concurrency limit C, and nothing else: no signature check,
no Redis (events live in memory and are lost on a crash), no database (no audit, no outbox),
no dedup, rate limit or breaker. Claude is called through the same SDK and transport as the
gateway; tool calls go to SNS in PublishBatch calls of up to ten, one group at most once per
call, in order, like the gateway's relay. Both clients are set up as the gateway's are (the
SDK's spans off; the SNS form encoded once, no client-side parameter check), so what the
gateway costs more is its own work.

    uvicorn --factory bench.minimal:minimal_app   (MINIMAL_TOPIC_ARN, MINIMAL_CONCURRENCY,
                                                   ANTHROPIC_BASE_URL, AWS_ENDPOINT_URL_SNS)
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from anthropic import AsyncAnthropic, DefaultAioHttpClient
from fastapi import FastAPI, Request
from fastapi.responses import Response

from app.publish.sns import ENCODE_FORM_ONCE, encode_form_once, open_client
from bench.common import ALERT_TOOL

Message = tuple[str, str, str]  # group, dedup id, body


class MinimalPipeline:
    def __init__(self, claude: AsyncAnthropic, sns: Any, *, topic: str, concurrency: int) -> None:
        self.claude = claude
        self.sns = sns
        self.topic = topic
        self.slots = asyncio.Semaphore(concurrency)
        self.lanes: dict[str, asyncio.Queue[tuple[str, Any]]] = {}
        self.outgoing: asyncio.Queue[Message] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._spawn(self._publish())

    def submit(self, key: str, event_id: str, payload: Any) -> None:
        if key not in self.lanes:
            self.lanes[key] = asyncio.Queue()
            self._spawn(self._lane(self.lanes[key]))
        self.lanes[key].put_nowait((event_id, payload))

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _lane(self, lane: asyncio.Queue[tuple[str, Any]]) -> None:
        """One key's events, one at a time: the next waits for this one's tool calls."""
        while True:
            event_id, payload = await lane.get()
            async with self.slots:
                raw = await self.claude.messages.with_raw_response.create(
                    model="claude-sonnet-4-6",
                    max_tokens=1024,
                    system="You triage GitHub events.",
                    tools=[ALERT_TOOL],  # type: ignore[list-item]
                    messages=[{"role": "user", "content": orjson.dumps(payload).decode()}],
                )
                reply = orjson.loads(await raw.read())
            key = payload["repository"]["full_name"]
            for n, block in enumerate(b for b in reply["content"] if b["type"] == "tool_use"):
                body = {"tool": block["name"], "input": block["input"], "event": {"id": event_id}}
                self.outgoing.put_nowait((key, f"{event_id}-{n}", orjson.dumps(body).decode()))

    async def _publish(self) -> None:
        """Queue order is per-key order; a batch stops before a group it already holds."""
        held: list[Message] = []
        while True:
            batch = held or [await self.outgoing.get()]
            held = []
            while len(batch) < 10 and not self.outgoing.empty():
                message = self.outgoing.get_nowait()
                if any(message[0] == m[0] for m in batch):
                    held = [message]
                    break
                batch.append(message)
            await self.sns.publish_batch(
                TopicArn=self.topic,
                PublishBatchRequestEntries=[
                    {
                        "Id": str(i),
                        "Message": body,
                        "MessageGroupId": group,
                        "MessageDeduplicationId": dedup,
                    }
                    for i, (group, dedup, body) in enumerate(batch)
                ],
            )


def minimal_app() -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        claude = AsyncAnthropic(
            api_key="sk-bench",
            max_retries=0,
            http_client=DefaultAioHttpClient(),
            open_telemetry=False,
        )
        region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
        async with open_client(region) as sns:
            sns.meta.events.register_first(
                "request-created.sns", encode_form_once, unique_id=ENCODE_FORM_ONCE
            )
            app.state.pipeline = MinimalPipeline(
                claude,
                sns,
                topic=os.environ["MINIMAL_TOPIC_ARN"],
                concurrency=int(os.environ["MINIMAL_CONCURRENCY"]),
            )
            app.state.pipeline.start()
            yield
        await claude.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/webhooks/{source}", status_code=202)
    async def receive(source: str, request: Request) -> Response:
        payload = orjson.loads(await request.body())
        event_id = f"evt_{uuid.uuid4().hex}"
        request.app.state.pipeline.submit(payload["repository"]["full_name"], event_id, payload)
        content = orjson.dumps({"event_id": event_id, "status": "queued"})
        return Response(content, 202, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app

"""Response cache: a pipeline with ``cache: {ttl_seconds: N}`` reuses the decision for a
prompt it has already paid for, instead of calling Claude again.

Two prompts are the same when the pipeline, model, system prompt, tools, max_tokens and
user turn are, apart from the user turn's ``received at:`` line (every event has its own
time, so without this no two events would ever match). The key is a SHA-256 of that, under
the pipeline's name, so entries never cross pipelines. Only a reply whose tool calls were
all valid (after the repair turn, if there was one) and that did not stop short is kept; a
hit is decided, checked and stored like a fresh reply (the same tool checks run again on it),
audited with ``cache_hit`` and no cost, and never counted against rate limits or budgets.
Redis being unreachable is a miss, never a failure of the event.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from app.faults import REDIS_ERRORS
from app.llm.client import ClaudeReply, ClaudeRequest
from app.observability.metrics import LLM_CACHE

log = structlog.get_logger(__name__)
_RECEIVED = re.compile(r"^received at: .*$", re.MULTILINE)


def cache_key(prefix: str, pipeline: str, request: ClaudeRequest) -> str:
    body: dict[str, Any] = request.as_api()
    body["messages"] = [
        {**m, "content": _RECEIVED.sub("", m["content"], count=1)}
        if isinstance(m.get("content"), str)
        else m
        for m in body["messages"]
    ]
    digest = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return f"{prefix}:llmcache:{pipeline}:{digest}"


class ResponseCache:
    def __init__(self, redis: Redis, *, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    async def get(self, pipeline: str, request: ClaudeRequest) -> ClaudeReply | None:
        try:
            raw = await self.redis.get(cache_key(self.prefix, pipeline, request))
        except REDIS_ERRORS as exc:
            log.warning("llm_cache_unavailable", pipeline=pipeline, error=type(exc).__name__)
            raw = None
        if raw is None:
            LLM_CACHE.labels(pipeline=pipeline, outcome="miss").inc()
            return None
        kept = orjson.loads(raw)
        LLM_CACHE.labels(pipeline=pipeline, outcome="hit").inc()
        return ClaudeReply(
            model=str(kept["model"]),
            request_id=None,
            stop_reason=kept.get("stop_reason"),
            content=list(kept["content"]),
            latency_ms=0.0,
        )

    async def put(
        self, pipeline: str, request: ClaudeRequest, reply: ClaudeReply, *, ttl_seconds: int
    ) -> None:
        kept = {"model": reply.model, "stop_reason": reply.stop_reason, "content": reply.content}
        try:
            await self.redis.set(
                cache_key(self.prefix, pipeline, request), orjson.dumps(kept), ex=ttl_seconds
            )
        except REDIS_ERRORS as exc:
            log.warning("llm_cache_unavailable", pipeline=pipeline, error=type(exc).__name__)

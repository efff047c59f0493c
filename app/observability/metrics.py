"""Prometheus metrics (default registry). Label values come from bounded sets only:
configured source, model, pipeline and topic names, and fixed outcome words."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

WEBHOOKS_RECEIVED = Counter(
    "eventgate_webhooks_received_total", "Webhook deliveries by outcome", ["source", "outcome"]
)
QUEUE_DEPTH = Gauge("eventgate_queue_depth", "Entries on the partition streams")
LLM_REQUESTS = Counter(
    "eventgate_llm_requests_total", "Claude API attempts by outcome", ["model", "outcome"]
)
LLM_DURATION = Histogram(
    "eventgate_llm_request_duration_seconds",
    "Claude API attempt latency",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80),
)
LLM_TOKENS = Counter("eventgate_llm_tokens_total", "Tokens by type", ["model", "type"])
PUBLISHED = Counter("eventgate_published_total", "SNS publishes by outcome", ["topic", "outcome"])
DEAD_LETTERS = Counter("eventgate_dead_letters_total", "Dead-lettered events", ["stage"])
EVENTS_FINISHED = Counter("eventgate_events_finished_total", "Events by final status", ["status"])
END_TO_END = Histogram(
    "eventgate_end_to_end_seconds",
    "Webhook received → last tool call published",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
)

# LLM call discipline (issue 4).
CIRCUIT_BREAKER_STATE = Gauge(
    "eventgate_circuit_breaker_state",
    "Circuit breaker per model: 0 closed, 1 half-open, 2 open",
    ["model"],
)
LLM_COST = Counter("eventgate_llm_cost_usd_total", "Claude spend in USD", ["pipeline"])
LLM_BUDGET_REMAINING = Gauge(
    "eventgate_llm_budget_remaining",
    "What is left of a pipeline's daily budget (unit: tokens or usd)",
    ["pipeline", "unit"],
)
LLM_RATE_WAIT = Counter(
    "eventgate_llm_rate_limit_wait_seconds_total",
    "Time callers were told to wait by the shared rate limiter",
    ["model"],
)

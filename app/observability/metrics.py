"""Prometheus metrics (default registry). Label values come from bounded sets only:
configured source, model, pipeline and topic names, and fixed outcome words."""

from __future__ import annotations

from typing import TypeVar, cast

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

WEBHOOKS_RECEIVED = Counter(
    "eventgate_webhooks_received_total", "Webhook deliveries by outcome", ["source", "outcome"]
)
QUEUE_DEPTH = Gauge("eventgate_queue_depth", "Entries on the partition streams")
QUEUE_OLDEST_AGE = Gauge(
    "eventgate_queue_oldest_age_seconds", "Age of the oldest entry on the partition streams"
)
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
EVENTS_FINISHED = Counter(
    "eventgate_events_finished_total", "Events by final status, or held", ["status"]
)
END_TO_END = Histogram(
    "eventgate_end_to_end_seconds",
    "Webhook received → last tool call published",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
)

# Sources: noise dropped before the LLM, alert collapse, and the per-tool group-id policy.
EVENTS_FILTERED = Counter(
    "eventgate_events_filtered_total", "Events dropped by a source's filters", ["source", "reason"]
)
ALERTS_COLLAPSED = Counter(
    "eventgate_alerts_collapsed_total",
    "Alert deliveries collapsed into an earlier event (no Claude call)",
    ["source"],
)
GROUP_ID_DISAGREEMENTS = Counter(
    "eventgate_group_id_disagreements_total",
    "Tool calls whose message_group_id differs from the event's group key",
    ["tool", "policy"],
)
LLM_CACHE = Counter(
    "eventgate_llm_cache_total",
    "Response cache lookups of pipelines with a cache: hit (no Claude call) or miss",
    ["pipeline", "outcome"],
)
ESCALATIONS = Counter(
    "eventgate_escalations_total",
    "Events a triage pipeline handed to the pipeline it escalates to",
    ["pipeline", "to"],
)
WINDOWS_CLOSED = Counter(
    "eventgate_windows_closed_total",
    "Windows closed, by the time they were open for (time) or by their last event (count)",
    ["pipeline", "reason"],
)
BATCH_REQUESTS = Counter(
    "eventgate_batch_requests_total",
    "Requests of mode: batch pipelines, by what came of them (submitted, succeeded, errored,"
    " expired, canceled)",
    ["pipeline", "outcome"],
)
SHADOW_DECISIONS = Counter(
    "eventgate_shadow_decisions_total",
    "Shadow candidates' decisions of live events by agreement with the live one "
    "(exact, action, none; error: no decision; skipped: the candidate's queue was full)",
    ["candidate", "agreement"],
)
# Operating metrics.
DEDUP_HITS = Counter(
    "eventgate_dedup_hits_total",
    "Duplicates stopped: delivery (redelivered webhook), processed (event already decided)",
    ["layer"],
)
RETENTION_DELETED = Counter(
    "eventgate_retention_deleted_total", "Rows deleted by the retention job", ["table"]
)
# Claude call discipline: breaker, spend, budgets, rate-limit waits.
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
# Supervised background loops.
TASK_UP = Gauge("eventgate_task_up", "1 while a supervised background loop runs", ["task"])
TASK_RESTARTS = Counter(
    "eventgate_task_restarts_total",
    "Supervised background loops restarted after an unexpected end",
    ["task"],
)

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)
# (metric, label values) -> its child. Label values come from bounded sets (see above); the
# cap only keeps a mistake from growing it for ever.
_CHILDREN: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}
MAX_CHILDREN = 4096


def labelled(metric: _Metric, *values: str) -> _Metric:
    """``metric.labels(*values)`` (values in the metric's label order), each child looked up
    once: ``labels`` checks and converts its arguments and takes a lock on every call, and
    the hot paths call it once per webhook and several times per event."""
    key = (metric, values)
    child = _CHILDREN.get(key)
    if child is None:
        child = metric.labels(*values)
        if len(_CHILDREN) < MAX_CHILDREN:
            _CHILDREN[key] = child
    return cast(_Metric, child)

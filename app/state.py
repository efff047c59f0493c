"""What the app factory builds for a role, in typed parts without optional fields for the
role. Stages never import this: each reaches only what it was given (an endpoint through
``request.app.state.<its object>``, set by the factory)."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.admin.deps import AdminAccess
from app.config import GatewayConfig
from app.console.access import ConsoleAccess
from app.decide.batch_lane import BatchLane
from app.decide.processor import EventProcessor
from app.evaluate.shadow import ShadowRunner
from app.ingest.router import WebhookEntry
from app.ingest.service import IngestService
from app.llm.health import LlmHealth
from app.observability.health import Health
from app.publish.relay import OutboxRelay
from app.queue.backlog import BacklogMonitor
from app.queue.streams import EventQueue
from app.queue.worker import QueueWorker
from app.settings import Settings
from app.supervision import Supervisor


@dataclass
class Shared:
    """Every role: clients, the queue, the supervisor of the background loops, readiness."""

    settings: Settings
    config: GatewayConfig
    role: str
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    redis: Redis
    queue: EventQueue
    backlog: BacklogMonitor
    supervisor: Supervisor
    health: Health


@dataclass
class ApiParts:
    """``api`` and ``serve``: where webhooks enter, the admin API and the console."""

    ingest: IngestService
    webhooks: WebhookEntry
    admin: AdminAccess
    console: ConsoleAccess


@dataclass
class Processing:
    """A worker that calls Claude (built only when a Claude provider is configured)."""

    processor: EventProcessor
    worker: QueueWorker
    shadow: ShadowRunner | None = None  # shadow candidates, when a pipeline has any
    lane: BatchLane | None = None  # the batch lane, when a pipeline has ``mode: batch``


@dataclass
class WorkerParts:
    """``worker`` and ``serve``: deciding (when Claude is configured) and publishing (when a
    topic is), retention."""

    llm_health: LlmHealth
    processing: Processing | None
    relay: OutboxRelay | None


@dataclass
class Running:
    """What a started app holds (``app.state.running``), for the factory's own shutdown and
    for tests; ``api`` and ``worker`` are None in the roles that do not run them."""

    shared: Shared
    api: ApiParts | None
    worker: WorkerParts | None

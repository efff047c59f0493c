"""Everything the lifespan builds, in one typed object. Nothing connects at import time."""

from __future__ import annotations

from dataclasses import dataclass, field

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import GatewayConfig
from app.ingest.budget import BodyBudget
from app.ingest.service import IngestService
from app.llm.client import ClaudeClient
from app.llm.health import LlmHealth
from app.publish.relay import OutboxRelay
from app.publish.sns import SnsPublisher
from app.queue.backlog import BacklogMonitor
from app.queue.streams import EventQueue
from app.queue.worker import QueueWorker
from app.settings import Settings
from app.supervision import Supervisor


@dataclass
class AppState:
    settings: Settings
    config: GatewayConfig
    role: str
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    redis: Redis
    queue: EventQueue
    backlog: BacklogMonitor
    ingest: IngestService
    # Request-body bytes this process holds before they are verified (all requests together).
    body_budget: BodyBudget
    claude: ClaudeClient | None = None
    publisher: SnsPublisher | None = None
    relay: OutboxRelay | None = None
    worker: QueueWorker | None = None
    supervisor: Supervisor = field(default_factory=Supervisor)
    # LLM call discipline (issue 4): Bedrock client, and the auth flag /readyz reads.
    bedrock: ClaudeClient | None = None
    llm_health: LlmHealth = field(default_factory=LlmHealth)

"""SNS errors that pass by themselves (expired or rotating credentials, clock skew,
throttling) leave the row waiting with backoff, whatever HTTP status AWS sends them with;
permanent ones dead-letter. The errors come over real HTTP from a stub endpoint, parsed by
aioboto3 as in production; publishing then resumes against moto."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aioboto3
import orjson
import pytest
from botocore.config import Config
from prometheus_client import REGISTRY
from sqlalchemy import select

from app.publish.sns import OutgoingMessage, Published, Publisher, PublishError, SnsPublisher
from app.store.models import DeadLetterRow, EventRow, OutboxRow
from tests.publish.aws_stub import AwsStub
from tests.publish.support import Sessions, add_event, make_relay
from tests.support import SnsFixture

# (code, the HTTP status AWS answers it with)
TRANSIENT = [
    ("ExpiredToken", 403),
    ("ExpiredTokenException", 400),
    ("RequestExpired", 400),
    ("InvalidClientTokenId", 403),
    ("SignatureDoesNotMatch", 403),
    ("RequestTimeTooSkewed", 403),
    ("Throttling", 400),
    ("ThrottlingException", 400),
    ("Throttled", 400),
    ("TooManyRequestsException", 400),
    ("RequestThrottled", 400),
    ("KMSThrottlingException", 400),
    ("KMSThrottling", 400),
    ("InternalError", 500),
    ("ServiceUnavailable", 503),
]
PERMANENT = [("InvalidParameter", 400), ("AuthorizationError", 403), ("NotFound", 404)]


@pytest.fixture
def stub() -> Iterator[AwsStub]:
    with AwsStub() as server:
        yield server


@pytest.fixture
async def stub_client(stub: AwsStub) -> AsyncIterator[object]:
    # One attempt per publish: botocore's own retries would hide what the relay decides.
    async with aioboto3.Session().client(
        "sns",
        region_name="us-east-1",
        endpoint_url=stub.url,
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    ) as client:
        yield client


class SwitchablePublisher:
    """The publisher of the moment: the stub's until the credentials are "rotated"."""

    def __init__(self, current: Publisher) -> None:
        self.current = current

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        return await self.current.publish_batch(messages)


def _published_total(topic_arn: str, outcome: str) -> float:
    """``eventgate_published_total`` for this test's own topic."""
    labels = {"topic": topic_arn.rsplit(":", 1)[-1], "outcome": outcome}
    return REGISTRY.get_sample_value("eventgate_published_total", labels) or 0.0


async def _state(sessions: Sessions) -> tuple[list[OutboxRow], list[EventRow], list[str]]:
    async with sessions() as session:
        rows = list((await session.scalars(select(OutboxRow).order_by(OutboxRow.id))).all())
        events = list((await session.scalars(select(EventRow).order_by(EventRow.id))).all())
        letters = [d.event_id for d in (await session.scalars(select(DeadLetterRow))).all()]
    return rows, events, letters


@pytest.mark.parametrize(("code", "status"), TRANSIENT)
async def test_transient_error_waits_and_publishes_once_it_passes(
    code: str,
    status: int,
    stub: AwsStub,
    stub_client: object,
    sessions: Sessions,
    sns: SnsFixture,
    sns_client: object,
) -> None:
    await add_event(sessions, "evt_a0", "acme/api", 2, sns.topic_arn)
    stub.error(code, status)
    publisher = SwitchablePublisher(SnsPublisher(stub_client))
    relay = make_relay(sessions, publisher)
    assert await relay.publish_pending() == 0
    assert stub.requests == 1
    assert _published_total(sns.topic_arn, "retry") == 1
    assert _published_total(sns.topic_arn, "dead") == 0
    rows, events, letters = await _state(sessions)
    assert [(r.status, r.attempts) for r in rows] == [("pending", 1), ("pending", 0)]
    assert rows[0].last_error is not None and rows[0].last_error.startswith(f"{code}:")
    assert [e.status for e in events] == ["processing"]
    assert letters == []

    publisher.current = SnsPublisher(sns_client)  # credentials rotated, clock fixed, throttle over
    assert await relay.publish_pending() == 2
    received = sns.receive(sns.fifo_url, expected=2)
    assert [orjson.loads(m["Body"])["sequence"] for m in received] == [0, 1]
    rows, events, letters = await _state(sessions)
    assert [r.status for r in rows] == ["published", "published"]
    assert [e.status for e in events] == ["published"]


@pytest.mark.parametrize(("code", "status"), PERMANENT)
async def test_permanent_error_still_dead_letters(
    code: str, status: int, stub: AwsStub, stub_client: object, sessions: Sessions
) -> None:
    await add_event(sessions, "evt_bad", "acme/api", 1, "arn:aws:sns:us-east-1:1:t.fifo")
    stub.error(code, status)
    assert await make_relay(sessions, SnsPublisher(stub_client)).publish_pending() == 1
    rows, events, letters = await _state(sessions)
    assert [r.status for r in rows] == ["dead"]
    assert [e.status for e in events] == ["dead_lettered"]
    assert letters == ["evt_bad"]


async def test_throttled_entry_of_a_batch_waits_even_when_marked_sender_fault(
    stub: AwsStub, stub_client: object, sessions: Sessions
) -> None:
    topic = "arn:aws:sns:us-east-1:1:t.fifo"
    await add_event(sessions, "evt_x", "acme/x", 1, topic)
    await add_event(sessions, "evt_y", "acme/y", 1, topic)
    stub.batch(successful=[0], failed={1: ("Throttled", True)})
    assert await make_relay(sessions, SnsPublisher(stub_client)).publish_pending() == 1
    rows, events, letters = await _state(sessions)
    assert [(r.event_id, r.status) for r in rows] == [("evt_x", "published"), ("evt_y", "pending")]
    assert [(e.id, e.status) for e in events] == [("evt_x", "published"), ("evt_y", "processing")]
    assert letters == []

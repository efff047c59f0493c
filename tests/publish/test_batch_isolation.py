"""A PublishBatch refused as a whole is not the fault of every entry in it: the relay sends
the entries one by one and dead-letters only those SNS refuses on their own; the other
groups keep their order at the SQS FIFO subscriber. A transient refusal of the whole batch
leaves every group waiting, as any transient error does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aioboto3
import orjson
import pytest
from botocore.config import Config
from sqlalchemy import select

from app.publish.ids import deduplication_id
from app.publish.sns import OutgoingMessage, Published, Publisher, PublishError, SnsPublisher
from app.store.models import DeadLetterRow, EventRow, OutboxRow
from tests.publish.aws_stub import AwsStub
from tests.publish.support import Sessions, add_event, make_relay
from tests.support import SnsFixture

GROUPS = ("acme/g0", "acme/g1", "acme/g2", "acme/g3")


@pytest.fixture
def stub() -> Iterator[AwsStub]:
    with AwsStub() as server:
        yield server


@pytest.fixture
async def stub_client(stub: AwsStub) -> AsyncIterator[object]:
    async with aioboto3.Session().client(
        "sns",
        region_name="us-east-1",
        endpoint_url=stub.url,
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    ) as client:
        yield client


class BatchRefusingPublisher:
    """Refuses every call of more than one entry as a whole (``error``); passes single
    entries on to ``inner``. Records each call's size."""

    def __init__(self, inner: Publisher, error: PublishError) -> None:
        self.inner = inner
        self.error = error
        self.sizes: list[int] = []

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        self.sizes.append(len(messages))
        if len(messages) > 1:
            raise self.error
        return await self.inner.publish_batch(messages)


async def _add_two_per_group(sessions: Sessions, topic_arn: str, bad: str | None = None) -> None:
    """Events ``evt_<g>_0`` then ``evt_<g>_1`` in each group, heads first; ``bad`` gets an
    empty ``source`` attribute, which SNS (and moto) refuse for the whole request."""
    for n in range(2):
        for g, group in enumerate(GROUPS):
            event_id = f"evt_{g}_{n}"
            source = "" if event_id == bad else "github"
            await add_event(sessions, event_id, group, 1, topic_arn, source=source)


def _received(sns: SnsFixture, expected: int) -> dict[str, list[str]]:
    by_group: dict[str, list[str]] = {}
    for message in sns.receive(sns.fifo_url, expected=expected):
        assert message["Attributes"]["MessageDeduplicationId"] == deduplication_id(
            orjson.loads(message["Body"])["event"]["id"], 0
        )
        by_group.setdefault(message["Attributes"]["MessageGroupId"], []).append(
            orjson.loads(message["Body"])["event"]["id"]
        )
    return by_group


async def _statuses(sessions: Sessions) -> tuple[dict[str, str], list[str]]:
    async with sessions() as session:
        events = (await session.scalars(select(EventRow))).all()
        letters = (await session.scalars(select(DeadLetterRow))).all()
    return {e.id: e.status for e in events}, [d.event_id for d in letters]


async def test_one_invalid_entry_dead_letters_alone_and_other_groups_publish_in_order(
    sessions: Sessions, sns: SnsFixture, sns_client: object
) -> None:
    await _add_two_per_group(sessions, sns.topic_arn, bad="evt_1_0")
    relay = make_relay(sessions, SnsPublisher(sns_client))
    assert await relay.publish_pending() == 8
    assert _received(sns, expected=7) == {
        "acme/g0": ["evt_0_0", "evt_0_1"],
        "acme/g1": ["evt_1_1"],
        "acme/g2": ["evt_2_0", "evt_2_1"],
        "acme/g3": ["evt_3_0", "evt_3_1"],
    }
    assert sns.drain_extra(sns.fifo_url) == []
    statuses, letters = await _statuses(sessions)
    assert letters == ["evt_1_0"]
    assert statuses.pop("evt_1_0") == "dead_lettered"
    assert set(statuses.values()) == {"published"}
    async with sessions() as session:
        bad = (
            await session.scalars(select(OutboxRow).where(OutboxRow.event_id == "evt_1_0"))
        ).one()
    assert bad.status == "dead" and bad.last_error is not None
    assert bad.last_error.startswith("InvalidParameter:")


async def test_batch_refused_as_a_whole_publishes_each_entry_on_its_own(
    sessions: Sessions, sns: SnsFixture, sns_client: object
) -> None:
    await _add_two_per_group(sessions, sns.topic_arn)
    refused = PublishError("one entry is invalid", code="InvalidParameter", retryable=False)
    publisher = BatchRefusingPublisher(SnsPublisher(sns_client), refused)
    assert await make_relay(sessions, publisher).publish_pending() == 8
    assert publisher.sizes == [4, 1, 1, 1, 1, 4, 1, 1, 1, 1]
    assert _received(sns, expected=8) == {
        group: [f"evt_{g}_0", f"evt_{g}_1"] for g, group in enumerate(GROUPS)
    }
    statuses, letters = await _statuses(sessions)
    assert letters == []
    assert set(statuses.values()) == {"published"}


async def test_transient_refusal_of_the_whole_batch_holds_every_group(
    sessions: Sessions, sns: SnsFixture, sns_client: object
) -> None:
    await _add_two_per_group(sessions, sns.topic_arn)
    throttled = PublishError("Rate exceeded", code="Throttling", retryable=True)
    publisher = BatchRefusingPublisher(SnsPublisher(sns_client), throttled)
    relay = make_relay(sessions, publisher)
    assert await relay.publish_pending() == 0
    assert publisher.sizes == [4]  # not split: a throttle is not any entry's fault
    statuses, letters = await _statuses(sessions)
    assert letters == []
    assert set(statuses.values()) == {"processing"}
    async with sessions() as session:
        heads = (await session.scalars(select(OutboxRow).where(OutboxRow.attempts > 0))).all()
    assert sorted(r.event_id for r in heads) == [f"evt_{g}_0" for g in range(4)]
    assert all(r.status == "pending" for r in heads)

    publisher.error = PublishError("bad", code="InvalidParameter", retryable=False)
    assert await relay.publish_pending() == 8
    assert _received(sns, expected=8) == {
        group: [f"evt_{g}_0", f"evt_{g}_1"] for g, group in enumerate(GROUPS)
    }


async def test_entries_refused_on_their_own_too_are_each_dead_lettered(
    stub: AwsStub, stub_client: object, sessions: Sessions
) -> None:
    topic = "arn:aws:sns:us-east-1:1:t.fifo"
    for g in range(3):
        await add_event(sessions, f"evt_{g}", f"acme/g{g}", 1, topic)
    stub.error("AuthorizationError", 403)
    assert await make_relay(sessions, SnsPublisher(stub_client)).publish_pending() == 3
    assert stub.requests == 4  # the batch, then each entry alone
    statuses, letters = await _statuses(sessions)
    assert sorted(letters) == ["evt_0", "evt_1", "evt_2"]
    assert set(statuses.values()) == {"dead_lettered"}

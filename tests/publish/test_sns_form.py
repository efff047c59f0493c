"""SNS speaks AWS's query protocol: a PublishBatch goes as a url-encoded form. The gateway
encodes it once per request (``encode_form_once``) where botocore would encode it twice,
once to sign it and once to send it; what arrives and what is signed must not change."""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import aioboto3
import botocore.auth
import botocore.awsrequest
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

import app.publish.sns
from app.publish.sns import OutgoingMessage, Published, SnsPublisher, open_client
from tests.publish.aws_stub import AwsStub

TOPIC = "arn:aws:sns:us-east-1:123456789012:actions.fifo"
KEY, SECRET = "AKIDSTUBSTUBSTUBSTUB", "stub-secret-not-real"
BODIES = [
    '{"tool": "page", "input": {"text": "disk 95% full & rising = bad"}}',
    '{"tool": "page", "input": {"text": "naïve café ✓ — 東京 + more"}}',
    '{"tool": "page", "input": {"text": "line one\\nline two\\ttab ~_.-"}}',
]


@pytest.fixture
def stub() -> Iterator[AwsStub]:
    with AwsStub() as server:
        yield server


@pytest.fixture
async def client(stub: AwsStub) -> AsyncIterator[object]:
    async with aioboto3.Session().client(
        "sns",
        region_name="us-east-1",
        endpoint_url=stub.url,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    ) as sns:
        yield sns


def messages() -> list[OutgoingMessage]:
    return [
        OutgoingMessage(
            topic_arn=TOPIC,
            body=body,
            group_id=f"acme/repo {n}",
            dedup_id=f"evt_{n}-0-1",
            attributes={"tool": "page", "source": "git hub", "event_id": f"evt_{n}"},
        )
        for n, body in enumerate(BODIES)
    ]


async def test_what_arrives_is_the_batch_and_its_signature_covers_those_bytes(
    stub: AwsStub, client: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub.batch(successful=[0, 1, 2], failed={})
    results = await SnsPublisher(client).publish_batch(messages())
    assert all(isinstance(r, Published) for r in results)

    headers, body = stub.received[-1]
    form = dict(urllib.parse.parse_qsl(body.decode("ascii"), strict_parsing=True))
    assert form["Action"] == "PublishBatch" and form["TopicArn"] == TOPIC
    for n, sent in enumerate(messages(), start=1):
        entry = f"PublishBatchRequestEntries.member.{n}"
        assert form[f"{entry}.Message"] == sent.body
        assert form[f"{entry}.MessageGroupId"] == sent.group_id
        assert form[f"{entry}.MessageDeduplicationId"] == sent.dedup_id
        attributes = {
            form[f"{entry}.MessageAttributes.entry.{a}.Name"]: form[
                f"{entry}.MessageAttributes.entry.{a}.Value.StringValue"
            ]
            for a in range(1, 4)
        }
        assert attributes == sent.attributes
    assert int(headers["Content-Length"]) == len(body)

    # Sign the received bytes again, at the request's own time, with the same key:
    # the Authorization header must be the one that came with them.
    authorization = headers["Authorization"]
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    at = datetime.strptime(headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: at)
    again = AWSRequest(
        method="POST",
        url=stub.url + "/",
        data=body,
        headers={name: value for name, value in headers.items() if name.lower() in signed},
    )
    SigV4Auth(Credentials(KEY, SECRET), "sns", "us-east-1").add_auth(again)
    assert again.headers["Authorization"] == authorization


async def test_the_form_is_encoded_once_per_request(
    stub: AwsStub, client: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[int] = []
    real = urllib.parse.urlencode

    def counting(*args: object, **kwargs: object) -> str:
        encoded.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(botocore.awsrequest, "urlencode", counting)
    monkeypatch.setattr(app.publish.sns, "urlencode", counting, raising=False)
    stub.batch(successful=[0, 1, 2], failed={})
    await SnsPublisher(client).publish_batch(messages())
    assert stub.requests == 1
    assert len(encoded) == 1  # botocore alone: twice (the signature's payload, then the send)


async def test_the_gateways_client_leaves_checking_the_parameters_to_sns(
    stub: AwsStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore's check against the API model is off (SNS checks them again): an entry
    that check would refuse before sending (no ``Message``) reaches SNS, whose answer the
    relay reads as for any refused entry."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SNS", stub.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    stub.batch(successful=[], failed={0: ("InvalidParameter", True)})
    async with open_client("us-east-1") as sns:
        reply = await sns.publish_batch(
            TopicArn=TOPIC, PublishBatchRequestEntries=[{"Id": "0", "MessageGroupId": "g"}]
        )
    assert stub.requests == 1
    assert reply["Failed"][0]["Code"] == "InvalidParameter"


async def test_two_publishers_on_one_client_encode_the_form_once(
    stub: AwsStub, client: object
) -> None:
    encoded: list[object] = []
    real = app.publish.sns.encode_form_once

    def counting(request: object, **kwargs: object) -> None:
        encoded.append(request)
        real(request, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app.publish.sns, "encode_form_once", counting)
        SnsPublisher(client)
        publisher = SnsPublisher(client)
    stub.batch(successful=[0, 1, 2], failed={})
    await publisher.publish_batch(messages())
    assert stub.requests == 1 and len(encoded) == 1

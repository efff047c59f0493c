"""SNS FIFO publishing through aioboto3.

PublishError
├── retryable = True     throttling, 5xx, connection errors
└── retryable = False    NotFound, InvalidParameter, AuthorizationError ... (dead-letter)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

PERMANENT_CODES = frozenset(
    {
        "NotFound",
        "InvalidParameter",
        "InvalidParameterValue",
        "AuthorizationError",
        "ValidationError",
        "InvalidSecurity",
        "KMSDisabled",
        "KMSNotFound",
        "KMSAccessDenied",
        "KMSInvalidState",
        "EndpointDisabled",
        "PlatformApplicationDisabled",
    }
)


class PublishError(Exception):
    def __init__(self, message: str, *, code: str, retryable: bool) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class Published:
    message_id: str
    sequence_number: str | None


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    topic_arn: str
    body: str
    group_id: str
    dedup_id: str
    attributes: dict[str, str]


class Publisher(Protocol):
    async def publish(self, message: OutgoingMessage) -> Published: ...


class SnsPublisher:
    """Wraps an aioboto3 SNS client that the caller opened (and will close)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def publish(self, message: OutgoingMessage) -> Published:
        try:
            response = await self.client.publish(
                TopicArn=message.topic_arn,
                Message=message.body,
                MessageGroupId=message.group_id,
                MessageDeduplicationId=message.dedup_id,
                MessageAttributes={
                    name: {"DataType": "String", "StringValue": value}
                    for name, value in message.attributes.items()
                },
            )
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "ClientError"))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            retryable = code not in PERMANENT_CODES and (
                status >= 500 or status in (0, 429) or "Throttl" in code
            )
            raise PublishError(str(exc), code=code, retryable=retryable) from exc
        except BotoCoreError as exc:
            raise PublishError(str(exc), code=type(exc).__name__, retryable=True) from exc
        return Published(response["MessageId"], response.get("SequenceNumber"))

    async def check(self, topic_arn: str) -> None:
        await self.client.get_topic_attributes(TopicArn=topic_arn)

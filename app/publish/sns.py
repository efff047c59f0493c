"""SNS FIFO publishing through aioboto3.

PublishError             returned per entry, or raised when the whole call failed
├── retryable = True     TRANSIENT_CODES (credentials, clock skew, throttling), 5xx, 429,
│                        connection errors: the row waits with backoff
└── retryable = False    NotFound, InvalidParameter, AuthorizationError ... (dead-letter)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import aioboto3
from botocore.config import Config
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

TRANSIENT_CODES = frozenset(
    {
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "Throttled",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestThrottled",
        "RequestThrottledException",
        "KMSThrottling",
        "KMSThrottlingException",
    }
)
"""Codes that pass by themselves, so the row waits with the relay's backoff instead of
being dead-lettered. AWS sends them as 400 or 403, and as a per-entry ``SenderFault``,
which would otherwise read as "this request will never succeed":

- ``ExpiredToken``, ``ExpiredTokenException``: temporary credentials (STS, an instance or
  pod role) ran out; the provider hands out new ones.
- ``RequestExpired``: the request was signed too long before it arrived (a stalled
  process, a slow retry); signing it again fixes it.
- ``InvalidClientTokenId``: credentials in rotation, a key not yet propagated to every
  AWS endpoint, or an old key just revoked; the next fetch of credentials fixes it.
- ``SignatureDoesNotMatch``, ``RequestTimeTooSkewed``: the host's clock is off, which NTP
  corrects (SigV4 signs the time; a skewed clock shows up as either code).
- ``Throttling``, ``ThrottlingException``, ``Throttled``, ``ThrottledException``,
  ``TooManyRequestsException``, ``RequestThrottled``, ``RequestThrottledException``: the
  API's rate limits, spelt differently across AWS; they pass as the rate drops.
- ``KMSThrottling``, ``KMSThrottlingException``: KMS (server-side encryption of the topic)
  throttles the data-key requests SNS makes for us; same as above.
"""


def is_transient(code: str) -> bool:
    """Whether an error with this code passes by itself (see ``TRANSIENT_CODES``); a code
    that names throttling in some other spelling counts as well."""
    return code in TRANSIENT_CODES or "Throttl" in code


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
    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        """One result per message, in order, when SNS answered entry by entry. Raises
        ``PublishError`` when the request failed as a whole: nothing says which entry (if
        any) is at fault, so the caller decides what to retry."""
        ...


ENCODE_FORM_ONCE = "eventgate-encode-form-once"


def open_client(region: str) -> Any:
    """The gateway's SNS client (an async context manager). botocore's check of the
    parameters against the API model is off: ``SnsPublisher`` builds every entry itself,
    SNS checks them again on its side (a refusal is ``InvalidParameter``, per entry or for
    the call), and the check was a twelfth of a PublishBatch's CPU."""
    return aioboto3.Session().client(
        "sns", region_name=region, config=Config(parameter_validation=False)
    )


class SnsPublisher:
    """Wraps an aioboto3 SNS client that the caller opened (and will close)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        # Before the signer, which botocore registers on the same event; once per client,
        # however many publishers wrap it.
        client.meta.events.register_first(
            "request-created.sns", encode_form_once, unique_id=ENCODE_FORM_ONCE
        )

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        """PublishBatch for messages of one topic (≤10); see ``Publisher.publish_batch``."""
        topics = {m.topic_arn for m in messages}
        assert len(topics) == 1 and 0 < len(messages) <= 10
        entries = [
            {
                "Id": str(index),
                "Message": message.body,
                "MessageGroupId": message.group_id,
                "MessageDeduplicationId": message.dedup_id,
                "MessageAttributes": {
                    name: {"DataType": "String", "StringValue": value}
                    for name, value in message.attributes.items()
                },
            }
            for index, message in enumerate(messages)
        ]
        try:
            response = await self.client.publish_batch(
                TopicArn=topics.pop(), PublishBatchRequestEntries=entries
            )
        except ClientError as exc:
            raise _client_error(exc) from exc
        except BotoCoreError as exc:
            raise PublishError(str(exc), code=type(exc).__name__, retryable=True) from exc
        results: list[Published | PublishError] = [
            PublishError("no result for this entry", code="MissingResult", retryable=True)
        ] * len(messages)
        for ok in response.get("Successful", []):
            results[int(ok["Id"])] = Published(ok["MessageId"], ok.get("SequenceNumber"))
        for failed in response.get("Failed", []):
            code = str(failed.get("Code", "Failed"))
            # SenderFault marks a request that will never succeed as sent -- except for the
            # codes that pass by themselves, which AWS marks as the sender's fault too.
            permanent = not is_transient(code) and (
                bool(failed.get("SenderFault")) or code in PERMANENT_CODES
            )
            results[int(failed["Id"])] = PublishError(
                str(failed.get("Message", code)), code=code, retryable=not permanent
            )
        return results

    async def check(self, topic_arn: str) -> None:
        """Raises unless the topic exists and is reachable (for /readyz)."""
        await self.client.get_topic_attributes(TopicArn=topic_arn)


def encode_form_once(request: Any, **_: Any) -> None:
    """SNS speaks AWS's query protocol: the request body is a form, which botocore keeps as
    a dict and url-encodes each time it prepares the request, once to sign it and once to
    send it. A PublishBatch of ten messages is some 16 KB of form and the encoding about
    half a millisecond of CPU, so it is done here once, as botocore's preparer does it
    (each name and value in UTF-8, ``urlencode(..., doseq=True)``), and both use the bytes."""
    if isinstance(request.data, dict):
        fields = [(_utf8(name), _utf8(value)) for name, value in request.data.items()]
        request.data = urlencode(fields, doseq=True).encode("ascii")


def _utf8(value: Any) -> Any:
    return value.encode("utf-8") if isinstance(value, str) else value


def _client_error(exc: ClientError) -> PublishError:
    code = str(exc.response.get("Error", {}).get("Code", "ClientError"))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    retryable = is_transient(code) or (
        code not in PERMANENT_CODES and (status >= 500 or status in (0, 429))
    )
    return PublishError(str(exc), code=code, retryable=retryable)

"""AWS SNS HTTP(S) subscriptions: CloudWatch alarms, S3 event notifications, any topic.

Verification follows AWS's rules: the signing certificate is fetched only over https from an
``sns.<region>.amazonaws.com`` host (and cached by URL), the signature is RSA PKCS#1 v1.5 over
the documented "Name\\nValue\\n" string with SHA1 (SignatureVersion 1) or SHA256 (2), and the
topic must be one of the source's ``topic_arns`` (anyone can point their own, validly signed
topic at a public endpoint). Network access goes through ``SnsHttp`` so tests inject a fake.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
import orjson
import structlog
from cryptography import x509
from cryptography.exceptions import InvalidSignature as CryptoInvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from app.ingest.adapter import Described, Headers, parse_json, resolve_key
from app.ingest.exceptions import InvalidPayload, InvalidSignature, StaleTimestamp
from app.source_config import SourceConfig

log = structlog.get_logger(__name__)
SNS_HOST = re.compile(r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
DEFAULT_MAX_AGE = 3600  # SNS retries an HTTP delivery for up to an hour with custom policies
_SIGNED_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": (
        "Message",
        "MessageId",
        "SubscribeURL",
        "Timestamp",
        "Token",
        "TopicArn",
        "Type",
    ),
}
_SIGNED_FIELDS["UnsubscribeConfirmation"] = _SIGNED_FIELDS["SubscriptionConfirmation"]
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}


class SnsHttp(Protocol):
    async def fetch_certificate(self, url: str) -> bytes: ...

    async def confirm_subscription(self, url: str) -> None: ...


class HttpxSnsHttp:
    """The real edge: short timeouts, no redirects (a redirect could leave the SNS host)."""

    async def fetch_certificate(self, url: str) -> bytes:
        async with httpx.AsyncClient(timeout=10, follow_redirects=False) as client:
            reply = await client.get(url)
            reply.raise_for_status()
            return reply.content

    async def confirm_subscription(self, url: str) -> None:
        async with httpx.AsyncClient(timeout=10, follow_redirects=False) as client:
            (await client.get(url)).raise_for_status()


def check_sns_url(url: str, what: str) -> None:
    """Parsed by httpx, the client that fetches it: what is checked is what is fetched."""
    try:
        parts = httpx.URL(url)
    except httpx.InvalidURL:
        raise InvalidSignature(f"{what} is not a valid URL") from None
    if parts.scheme != "https" or parts.port is not None or parts.userinfo:
        raise InvalidSignature(f"{what} must be an https URL on sns.<region>.amazonaws.com")
    if not SNS_HOST.match(parts.host):
        raise InvalidSignature(f"{what} host is not sns.<region>.amazonaws.com")


class SnsCertificates:
    """Public keys by certificate URL; a small bounded cache (AWS rotates them rarely)."""

    def __init__(self, http: SnsHttp, *, max_entries: int = 32) -> None:
        self.http = http
        self.max_entries = max_entries
        self._keys: dict[str, rsa.RSAPublicKey] = {}

    async def public_key(self, url: str) -> rsa.RSAPublicKey:
        check_sns_url(url, "SigningCertURL")
        if not httpx.URL(url).path.endswith(".pem"):
            raise InvalidSignature("SigningCertURL must point to a .pem certificate")
        if url in self._keys:
            return self._keys[url]
        try:
            pem = await self.http.fetch_certificate(url)
            key = x509.load_pem_x509_certificate(pem).public_key()
        except (httpx.HTTPError, ValueError, OSError) as exc:
            log.warning("sns_certificate_unavailable", url=url, error=type(exc).__name__)
            raise InvalidSignature("the SNS signing certificate could not be loaded") from exc
        if not isinstance(key, rsa.RSAPublicKey):
            raise InvalidSignature("the SNS signing certificate does not hold an RSA key")
        if len(self._keys) >= self.max_entries:
            self._keys.pop(next(iter(self._keys)))
        self._keys[url] = key
        return key


def string_to_sign(message: dict[str, Any]) -> bytes:
    fields = _SIGNED_FIELDS[message["Type"]]
    lines: list[str] = []
    for name in fields:
        if name not in message:
            if name == "Subject":
                continue
            raise InvalidSignature(f"SNS message has no {name}")
        lines += [name, str(message[name])]
    return ("\n".join(lines) + "\n").encode()


class AwsSnsSource:
    def __init__(self, name: str, config: SourceConfig, *, http: SnsHttp | None) -> None:
        self.name = name
        self.config = config
        self.http = http or HttpxSnsHttp()
        self.certificates = SnsCertificates(self.http)
        self.topics = frozenset(config.topic_arns)
        self.max_age = config.tolerance_seconds or DEFAULT_MAX_AGE

    async def verify(self, headers: Headers, body: bytes) -> None:
        message = _message(body)
        if message.get("TopicArn") not in self.topics:
            raise InvalidSignature("TopicArn is not one of this source's topic_arns")
        version = str(message.get("SignatureVersion", ""))
        if version not in _HASHES:
            raise InvalidSignature("SignatureVersion must be 1 or 2")
        try:
            signature = base64.b64decode(str(message.get("Signature", "")), validate=True)
        except binascii.Error as exc:
            raise InvalidSignature("Signature is not base64") from exc
        key = await self.certificates.public_key(str(message.get("SigningCertURL", "")))
        try:
            key.verify(signature, string_to_sign(message), padding.PKCS1v15(), _HASHES[version]())
        except CryptoInvalidSignature:
            raise InvalidSignature("SNS signature does not match the message") from None
        _check_age(str(message.get("Timestamp", "")), self.max_age)

    async def describe(self, headers: Headers, body: bytes) -> list[Described]:
        message = _message(body)
        kind, topic = message["Type"], message["TopicArn"]
        if kind == "SubscriptionConfirmation":
            await self._subscription(message)
            return []
        if kind == "UnsubscribeConfirmation":
            log.info("sns_unsubscribed", source=self.name, topic=topic)
            return []
        payload: dict[str, Any] = {
            k: message[k] for k in ("TopicArn", "Subject", "Timestamp") if k in message
        }
        payload["Message"] = _maybe_json(str(message.get("Message", "")))
        if message.get("MessageAttributes"):
            payload["MessageAttributes"] = message["MessageAttributes"]
        event_type, default_key, firing, resolved = _classify(payload["Message"])
        return [
            Described(
                type=event_type,
                delivery_id=str(message["MessageId"]),
                group_key=resolve_key(payload, self.config.group_key) or default_key or topic,
                payload=payload,
                firing=firing,
                resolved=resolved,
            )
        ]

    async def _subscription(self, message: dict[str, Any]) -> None:
        topic = message["TopicArn"]
        if not self.config.confirm_subscriptions:
            log.warning("sns_subscription_not_confirmed", source=self.name, topic=topic)
            return
        url = str(message.get("SubscribeURL", ""))
        check_sns_url(url, "SubscribeURL")
        await self.http.confirm_subscription(url)
        log.info("sns_subscription_confirmed", source=self.name, topic=topic)


def _message(body: bytes) -> dict[str, Any]:
    # SNS posts JSON with Content-Type text/plain, so the media type is not checked.
    message = parse_json(body)
    if not isinstance(message, dict) or message.get("Type") not in _SIGNED_FIELDS:
        raise InvalidPayload("not an SNS message (Type is not Notification or a confirmation)")
    if not message.get("MessageId") or not message.get("TopicArn"):
        raise InvalidPayload("SNS message has no MessageId or TopicArn")
    return message


def _check_age(timestamp: str, max_age: int) -> None:
    try:
        sent = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidSignature("SNS Timestamp is not an ISO 8601 time") from exc
    if abs((datetime.now(UTC) - sent).total_seconds()) > max_age:
        raise StaleTimestamp(f"SNS Timestamp is more than {max_age}s from now")


def _maybe_json(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _classify(message: Any) -> tuple[str, str | None, tuple[str, ...], tuple[str, ...]]:
    """(event type, default group key, firing, resolved) for the well-known SNS payloads."""
    if isinstance(message, dict) and "AlarmName" in message:
        alarm, state = str(message["AlarmName"]), str(message.get("NewStateValue", "UNKNOWN"))
        firing = (alarm,) if state == "ALARM" else ()
        resolved = (alarm,) if state == "OK" else ()
        return f"cloudwatch.alarm.{state}", f"alarm/{alarm}", firing, resolved
    records = message.get("Records") if isinstance(message, dict) else None
    if isinstance(records, list) and records and isinstance(records[0], dict):
        first = records[0]
        bucket = resolve_key(first, "s3.bucket.name")
        return f"s3.{first.get('eventName', 'event')}", bucket and f"s3/{bucket}", (), ()
    if isinstance(message, dict) and isinstance(message.get("detail-type"), str):
        return str(message["detail-type"]), None, (), ()
    return "sns.notification", None, (), ()

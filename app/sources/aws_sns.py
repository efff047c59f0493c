"""AWS SNS HTTP(S) subscriptions (``type: aws-sns``): CloudWatch alarms, S3 event
notifications, any topic.

Verification follows AWS's rules: the signing certificate is fetched only over https from an
``sns.<region>.amazonaws.com`` host (and cached by URL), the signature is RSA PKCS#1 v1.5 over
the documented "Name\\nValue\\n" string with SHA1 (SignatureVersion 1) or SHA256 (2), and the
topic must be one of the source's ``topic_arns`` (anyone can point their own, validly signed
topic at a public endpoint). Network access goes through ``SnsHttp`` so tests inject a fake.

Everything that can be checked from the message itself (topic, type, signature version and
encoding, timestamp age, certificate URL) is checked before anything is fetched. A
certificate that cannot be fetched (network, DNS, timeout, a 5xx) is answered 503 with
``Retry-After``: SNS retries 5xx deliveries and drops a message on a 4xx. The failure is
remembered for ``FAILURE_TTL_SECONDS`` per URL, so a flood of deliveries during an outage
costs one fetch, not one each.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import structlog
from cryptography import x509
from cryptography.exceptions import InvalidSignature as CryptoInvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from app.payloads import dotted, resolve_key
from app.source_config import SourceConfig
from app.sources.admission import Body, DeferredCheck
from app.sources.base import AdapterDeps, Described, Headers, Lines, SnsHttp, SourceKind, parse_json
from app.sources.exceptions import (
    CertificateUnavailable,
    InvalidPayload,
    InvalidSignature,
    StaleTimestamp,
)

log = structlog.get_logger(__name__)
# sns.<region>.amazonaws.com(.cn): the region part is what makes it AWS's host; a bare
# ``sns.<anything>.amazonaws.com`` also matches S3 virtual-hosted buckets anyone may own.
SNS_HOST = re.compile(r"^sns\.[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]{1,2}\.amazonaws\.com(\.cn)?$")
DEFAULT_MAX_AGE = 3600  # SNS retries an HTTP delivery for up to an hour with custom policies
FAILURE_TTL_SECONDS = 30.0
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
    """Public keys by certificate URL, and recent fetch failures; both small and bounded."""

    def __init__(
        self,
        http: SnsHttp,
        *,
        max_entries: int = 32,
        failure_ttl: float = FAILURE_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.http = http
        self.max_entries = max_entries
        self.failure_ttl = failure_ttl
        self.clock = clock
        self._keys: dict[str, rsa.RSAPublicKey] = {}
        self._failed_until: dict[str, float] = {}

    async def public_key(self, url: str) -> rsa.RSAPublicKey:
        check_certificate_url(url)
        if url in self._keys:
            return self._keys[url]
        self._refuse_while_failing(url)
        try:
            pem = await self.http.fetch_certificate(url)
        except (httpx.TransportError, OSError) as exc:
            raise self._failed(url, exc) from exc
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code >= 500:
                raise self._failed(url, exc) from exc
            log.warning("sns_certificate_refused", url=url, status=exc.response.status_code)
            raise InvalidSignature("the SNS signing certificate URL does not serve one") from exc
        try:
            key = x509.load_pem_x509_certificate(pem).public_key()
        except ValueError as exc:
            raise InvalidSignature("the SNS signing certificate could not be loaded") from exc
        if not isinstance(key, rsa.RSAPublicKey):
            raise InvalidSignature("the SNS signing certificate does not hold an RSA key")
        _bounded_put(self._keys, url, key, self.max_entries)
        return key

    def _refuse_while_failing(self, url: str) -> None:
        until = self._failed_until.get(url)
        if until is None:
            return
        left = until - self.clock()
        if left <= 0:
            del self._failed_until[url]
            return
        raise CertificateUnavailable(
            "the SNS signing certificate could not be fetched; retry later",
            retry_after=math.ceil(left),
        )

    def _failed(self, url: str, exc: Exception) -> CertificateUnavailable:
        log.warning("sns_certificate_unavailable", url=url, error=type(exc).__name__)
        until = self.clock() + self.failure_ttl
        _bounded_put(self._failed_until, url, until, self.max_entries)
        return CertificateUnavailable(
            "the SNS signing certificate could not be fetched; retry later",
            retry_after=math.ceil(self.failure_ttl),
        )


def check_certificate_url(url: str) -> None:
    check_sns_url(url, "SigningCertURL")
    if not httpx.URL(url).path.endswith(".pem"):
        raise InvalidSignature("SigningCertURL must point to a .pem certificate")


def _bounded_put(cache: dict[str, Any], key: str, value: Any, max_entries: int) -> None:
    if key not in cache and len(cache) >= max_entries:
        cache.pop(next(iter(cache)))  # the oldest entry
    cache[key] = value


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
    def __init__(
        self,
        name: str,
        config: SourceConfig,
        *,
        http: SnsHttp | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.config = config
        self.http = http or HttpxSnsHttp()
        self.certificates = SnsCertificates(self.http, clock=clock)
        self.topics = frozenset(config.topic_arns)
        self.max_age = config.tolerance_seconds or DEFAULT_MAX_AGE

    def admit(self, headers: Headers) -> DeferredCheck:
        # SNS signs the body only (its headers say nothing verifiable); an SNS message is
        # small (256 KiB at most), so ``max_body_bytes`` can be set low for this source.
        return DeferredCheck(lambda body: self.verify(headers, body))

    async def verify(self, headers: Headers, body: Body) -> None:
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
        _check_age(str(message.get("Timestamp", "")), self.max_age)
        signed = string_to_sign(message)
        url = str(message.get("SigningCertURL", ""))
        check_certificate_url(url)
        key = await self.certificates.public_key(url)  # the only outbound call
        try:
            key.verify(signature, signed, padding.PKCS1v15(), _HASHES[version]())
        except CryptoInvalidSignature:
            raise InvalidSignature("SNS signature does not match the message") from None

    async def describe(self, headers: Headers, body: Body) -> list[Described]:
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


def _message(body: Body) -> dict[str, Any]:
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


def summary(event_type: str, p: dict[str, Any]) -> Lines:
    message = p.get("Message")
    lines: Lines = [("topic", p.get("TopicArn")), ("subject", p.get("Subject"))]
    if isinstance(message, dict) and "AlarmName" in message:
        state = f"{message.get('OldStateValue')} -> {message.get('NewStateValue')}"
        lines += [("what", f"CloudWatch alarm {message['AlarmName']!r}: {state}")]
        lines += [("severity", "alarm" if message.get("NewStateValue") == "ALARM" else None)]
        lines += [("reason", message.get("NewStateReason")), ("region", message.get("Region"))]
        metric = f"{dotted(message, 'Trigger.Namespace')}/{dotted(message, 'Trigger.MetricName')}"
        lines += [("metric", metric)]
    elif isinstance(message, dict) and isinstance(message.get("Records"), list):
        for record in message["Records"][:SUMMARY_RECORDS]:
            key = f"s3://{dotted(record, 's3.bucket.name')}/{dotted(record, 's3.object.key')}"
            lines.append(("what", f"{record.get('eventName')} {key}"))
    return lines


SUMMARY_RECORDS = 10


def _adapter(name: str, config: SourceConfig, deps: AdapterDeps) -> AwsSnsSource:
    return AwsSnsSource(name, config, http=deps.sns_http)


KIND = SourceKind(
    name="aws-sns",
    keys=frozenset({"topic_arns", "confirm_subscriptions"}),
    needs=("topic_arns",),
    adapter=_adapter,
    summary=summary,
)

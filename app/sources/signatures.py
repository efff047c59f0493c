"""Signature schemes. Every comparison is constant-time (``hmac.compare_digest``).

Each scheme's header step (``*_admission``) checks what the headers show — presence, shape,
timestamp — and returns the ``StreamedMac`` that the body is fed into; ``verify_*`` run both
steps over a complete body.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import re
import time

from app.sources.admission import Body, StreamedMac
from app.sources.exceptions import InvalidSignature, StaleTimestamp

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def hex_text(digest: bytes) -> bytes:
    return digest.hex().encode()


def base64_text(digest: bytes) -> bytes:
    return base64.b64encode(digest)


def github_admission(secrets: list[bytes], header: str | None) -> StreamedMac:
    """``X-Hub-Signature-256: sha256=<hex>`` over the raw body; any secret may match."""
    if not header:
        raise InvalidSignature("missing X-Hub-Signature-256 header")
    scheme, _, signature = header.partition("=")
    given = signature.strip().lower()
    if scheme != "sha256" or not _SHA256_HEX.fullmatch(given):
        raise InvalidSignature("X-Hub-Signature-256 must look like sha256=<hex> (64 digits)")
    return StreamedMac(
        macs=[hmac.new(secret, digestmod=hashlib.sha256) for secret in secrets],
        given=[given.encode()],
        render=hex_text,
    )


def verify_github(secrets: list[bytes], body: Body, header: str | None) -> None:
    check = github_admission(secrets, header)
    check.update(body)
    check.verify()


def verify_bearer(tokens: list[str], header: str | None) -> None:
    if not header:
        raise InvalidSignature("missing Authorization header")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value:
        raise InvalidSignature("Authorization must be 'Bearer <token>'")
    given = value.strip().encode()
    if not any(hmac.compare_digest(given, token.encode()) for token in tokens):
        raise InvalidSignature("bearer token does not match")


def verify_basic(username: str, password: str, header: str | None) -> None:
    if not header:
        raise InvalidSignature("missing Authorization header")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        raise InvalidSignature("Authorization must be 'Basic <credentials>'")
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
    except ValueError as exc:  # binascii.Error, or characters outside ASCII
        raise InvalidSignature("Basic credentials are not base64") from exc
    expected = f"{username}:{password}".encode()
    if not hmac.compare_digest(decoded, expected):
        raise InvalidSignature("basic auth credentials do not match")


def check_timestamp(timestamp: str, *, tolerance_seconds: int, now: float | None = None) -> None:
    """Unix seconds (or milliseconds, told apart by size) within ± the tolerance."""
    try:
        sent = float(timestamp)
    except ValueError as exc:
        raise InvalidSignature("signature timestamp is not a number") from exc
    if not math.isfinite(sent):  # NaN compares false with everything: it would pass
        raise InvalidSignature("signature timestamp is not a finite number")
    if sent > 1e11:  # milliseconds
        sent /= 1000
    current = time.time() if now is None else now
    if abs(current - sent) > tolerance_seconds:
        raise StaleTimestamp(f"signature timestamp is more than {tolerance_seconds}s from now")


def standard_webhooks_key(secret: str) -> bytes:
    """``whsec_<base64>`` secrets carry the key in base64; others are used as they are."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error as exc:
            raise ValueError("whsec_ secret is not valid base64") from exc
    return secret.encode()


def standard_webhooks_admission(
    *,
    keys: list[bytes],
    msg_id: str | None,
    timestamp: str | None,
    signature_header: str | None,
    tolerance_seconds: int,
    now: float | None = None,
) -> StreamedMac:
    """Standard Webhooks: HMAC-SHA256 over ``{id}.{timestamp}.{body}``, ``v1,<b64>`` list."""
    if not msg_id or not timestamp or not signature_header:
        raise InvalidSignature("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        sent = int(timestamp)
    except ValueError as exc:
        raise InvalidSignature("webhook-timestamp is not an integer") from exc
    current = time.time() if now is None else now
    if abs(current - sent) > tolerance_seconds:
        raise StaleTimestamp(f"webhook-timestamp is more than {tolerance_seconds}s away from now")
    given = _v1_signatures(signature_header)
    if not given:
        raise InvalidSignature("webhook-signature has no v1,<base64 HMAC-SHA256> entry")
    prefix = f"{msg_id}.{timestamp}.".encode()
    return StreamedMac(
        macs=[hmac.new(key, prefix, hashlib.sha256) for key in keys],
        given=given,
        render=base64_text,
        failure="no v1 signature matches the body",
    )


def _v1_signatures(header: str) -> list[bytes]:
    """The well-formed ``v1,<base64 of 32 bytes>`` entries, as sent."""
    found = []
    for candidate in header.split():
        version, _, value = candidate.partition(",")
        if version != "v1":
            continue
        try:
            if len(base64.b64decode(value, validate=True)) == hashlib.sha256().digest_size:
                found.append(value.encode())
        except ValueError:  # binascii.Error, or characters outside ASCII
            continue
    return found


def verify_standard_webhooks(
    *,
    keys: list[bytes],
    body: Body,
    msg_id: str | None,
    timestamp: str | None,
    signature_header: str | None,
    tolerance_seconds: int,
    now: float | None = None,
) -> None:
    check = standard_webhooks_admission(
        keys=keys,
        msg_id=msg_id,
        timestamp=timestamp,
        signature_header=signature_header,
        tolerance_seconds=tolerance_seconds,
        now=now,
    )
    check.update(body)
    check.verify()

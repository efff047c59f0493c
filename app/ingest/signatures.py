"""Signature schemes. Every comparison is constant-time (``hmac.compare_digest``)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import time

from app.ingest.exceptions import InvalidSignature, StaleTimestamp


def verify_github(secrets: list[bytes], body: bytes, header: str | None) -> None:
    """``X-Hub-Signature-256: sha256=<hex>`` over the raw body; any secret may match."""
    if not header:
        raise InvalidSignature("missing X-Hub-Signature-256 header")
    scheme, _, signature = header.partition("=")
    if scheme != "sha256" or not signature:
        raise InvalidSignature("X-Hub-Signature-256 must look like sha256=<hex>")
    given = signature.strip().lower().encode()
    for secret in secrets:
        if hmac.compare_digest(hmac.new(secret, body, hashlib.sha256).hexdigest().encode(), given):
            return
    raise InvalidSignature("signature does not match the body")


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


def verify_standard_webhooks(
    *,
    keys: list[bytes],
    body: bytes,
    msg_id: str | None,
    timestamp: str | None,
    signature_header: str | None,
    tolerance_seconds: int,
    now: float | None = None,
) -> None:
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
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = [base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()) for key in keys]
    for candidate in signature_header.split():
        version, _, value = candidate.partition(",")
        if version != "v1":
            continue
        if any(hmac.compare_digest(value.encode(), e) for e in expected):
            return
    raise InvalidSignature("no v1 signature matches the body")

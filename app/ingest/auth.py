"""Credential checks a source may combine: bearer token, basic auth, generic HMAC.

A source configured with several schemes accepts a request that passes any one of them (so a
sender can move from a token to HMAC without downtime). When none passes, the most specific
failure is reported: a stale timestamp over a mismatch over a missing header.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from app.ingest.adapter import Headers
from app.ingest.exceptions import InvalidSignature, StaleTimestamp
from app.ingest.signatures import check_timestamp, verify_basic, verify_bearer
from app.source_config import HmacScheme, SourceConfig

DEFAULT_TOLERANCE = 300
_DIGESTS = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}


@dataclass(frozen=True, slots=True)
class HmacDefaults:
    header: str
    signed_payload: str = "{timestamp}.{body}"


@dataclass(frozen=True, slots=True)
class HmacVerifier:
    """``prefix + encoding(HMAC(key, payload))`` in ``header``; any key may match."""

    keys: list[bytes]
    scheme: HmacScheme
    header: str
    signed_payload: str
    tolerance_seconds: int

    def __call__(self, headers: Headers, body: bytes) -> None:
        given = headers.get(self.header.lower())
        if not given:
            raise InvalidSignature(f"missing {self.header} header")
        signed = body
        if self.scheme.timestamp_header:
            timestamp = headers.get(self.scheme.timestamp_header.lower())
            if not timestamp:
                raise InvalidSignature(f"missing {self.scheme.timestamp_header} header")
            check_timestamp(timestamp, tolerance_seconds=self.tolerance_seconds)
            before, _, after = self.signed_payload.partition("{body}")
            signed = before.format(timestamp=timestamp).encode() + body
            signed += after.format(timestamp=timestamp).encode()
        value = given.strip()
        if self.scheme.prefix:
            if not value.startswith(self.scheme.prefix):
                raise InvalidSignature(f"{self.header} must start with {self.scheme.prefix!r}")
            value = value.removeprefix(self.scheme.prefix)
        digest = _DIGESTS[self.scheme.algorithm]
        for key in self.keys:
            mac = hmac.new(key, signed, digest).digest()
            expected = (
                mac.hex() if self.scheme.encoding == "hex" else base64.b64encode(mac).decode()
            )
            candidate = value.lower() if self.scheme.encoding == "hex" else value
            if hmac.compare_digest(candidate.encode(), expected.encode()):
                return
        raise InvalidSignature("signature does not match the body")


Check = Callable[[Headers, bytes], None]


class Authenticator:
    def __init__(self, checks: list[Check]) -> None:
        if not checks:
            raise ValueError("a source needs at least one credential check")
        self.checks = checks

    def __call__(self, headers: Headers, body: bytes) -> None:
        failures: list[InvalidSignature] = []
        for check in self.checks:
            try:
                check(headers, body)
                return
            except InvalidSignature as exc:
                failures.append(exc)
        raise _most_specific(failures)


def build_authenticator(
    config: SourceConfig, *, hmac_defaults: HmacDefaults | None
) -> Authenticator:
    """Token, basic auth and (when ``hmac_defaults`` is given) HMAC, from what is configured."""
    checks: list[Check] = []
    tokens = config.tokens()
    if tokens:
        checks.append(lambda headers, _body: verify_bearer(tokens, headers.get("authorization")))
    basic = config.basic_auth
    if basic is not None:
        user, password = basic.username, basic.password.get_secret_value()
        checks.append(
            lambda headers, _body: verify_basic(user, password, headers.get("authorization"))
        )
    secrets = config.secrets()
    if secrets and hmac_defaults is not None:
        scheme = config.signature or HmacScheme()
        checks.append(
            HmacVerifier(
                keys=[s.encode() for s in secrets],
                scheme=scheme,
                header=scheme.header or hmac_defaults.header,
                signed_payload=scheme.signed_payload or hmac_defaults.signed_payload,
                tolerance_seconds=config.tolerance_seconds or DEFAULT_TOLERANCE,
            )
        )
    return Authenticator(checks)


def _most_specific(failures: list[InvalidSignature]) -> InvalidSignature:
    """Stale timestamp, then a credential that was checked and wrong, then a malformed
    header, then a missing one: the answer that helps the sender most."""

    def rank(failure: InvalidSignature) -> int:
        if isinstance(failure, StaleTimestamp):
            return 0
        if "match" in failure.message:
            return 1
        return 3 if failure.message.startswith("missing") else 2

    return min(failures, key=rank)

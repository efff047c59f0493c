"""Credential checks a source may combine: bearer token, basic auth, generic HMAC.

A source configured with several schemes accepts a request that passes any one of them (so a
sender can move from a token to HMAC without downtime). Tokens and basic auth are decided from
the headers alone; an HMAC scheme checks its header's shape and signed timestamp there and
its MAC over the body as the body arrives (see ``admission.py``). When no scheme passes, the
most specific failure is reported: a stale timestamp over a mismatch over a missing header.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from app.source_config import HmacScheme, SourceConfig
from app.sources.admission import ADMITTED, Admitted, Body, StreamedMac
from app.sources.base import Headers
from app.sources.exceptions import InvalidSignature, StaleTimestamp
from app.sources.signatures import (
    base64_text,
    check_timestamp,
    hex_text,
    verify_basic,
    verify_bearer,
)

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

    def admit(self, headers: Headers) -> StreamedMac:
        given = headers.get(self.header.lower())
        if not given:
            raise InvalidSignature(f"missing {self.header} header")
        before, after = b"", b""
        if self.scheme.timestamp_header:
            timestamp = headers.get(self.scheme.timestamp_header.lower())
            if not timestamp:
                raise InvalidSignature(f"missing {self.scheme.timestamp_header} header")
            check_timestamp(timestamp, tolerance_seconds=self.tolerance_seconds)
            head, _, tail = self.signed_payload.partition("{body}")
            before = head.format(timestamp=timestamp).encode()
            after = tail.format(timestamp=timestamp).encode()
        value = given.strip()
        if self.scheme.prefix:
            if not value.startswith(self.scheme.prefix):
                raise InvalidSignature(f"{self.header} must start with {self.scheme.prefix!r}")
            value = value.removeprefix(self.scheme.prefix)
        digest = _DIGESTS[self.scheme.algorithm]
        hexadecimal = self.scheme.encoding == "hex"
        candidate = value.lower() if hexadecimal else value
        if not _well_formed(candidate, hexadecimal=hexadecimal, size=digest().digest_size):
            raise InvalidSignature(
                f"{self.header} is not a {self.scheme.encoding} {self.scheme.algorithm} signature"
            )
        return StreamedMac(
            macs=[hmac.new(key, before, digest) for key in self.keys],
            given=[candidate.encode()],
            render=hex_text if hexadecimal else base64_text,
            suffix=after,
        )

    def __call__(self, headers: Headers, body: Body) -> None:
        check = self.admit(headers)
        check.update(body)
        check.verify()


def _well_formed(value: str, *, hexadecimal: bool, size: int) -> bool:
    try:
        raw = bytes.fromhex(value) if hexadecimal else base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        return False
    # fromhex skips spaces; the text itself must be exactly the digest's hex digits.
    return len(raw) == size and (not hexadecimal or len(value) == 2 * size)


Check = Callable[[Headers], Admitted | StreamedMac]


class Authenticator:
    def __init__(self, checks: list[Check]) -> None:
        if not checks:
            raise ValueError("a source needs at least one credential check")
        self.checks = checks

    def admit(self, headers: Headers) -> Admitted | StreamedMac:
        """The first scheme whose header step passes; else the most specific failure."""
        failures: list[InvalidSignature] = []
        for check in self.checks:
            try:
                return check(headers)
            except InvalidSignature as exc:
                failures.append(exc)
        raise _most_specific(failures)

    def __call__(self, headers: Headers, body: Body) -> None:
        admission = self.admit(headers)
        admission.update(body)
        admission.verify()


def build_authenticator(
    config: SourceConfig, *, hmac_defaults: HmacDefaults | None
) -> Authenticator:
    """Token, basic auth and (when ``hmac_defaults`` is given) HMAC, from what is configured."""
    checks: list[Check] = []
    tokens = config.tokens()
    if tokens:

        def bearer(headers: Headers) -> Admitted:
            verify_bearer(tokens, headers.get("authorization"))
            return ADMITTED

        checks.append(bearer)
    basic = config.basic_auth
    if basic is not None:
        user, password = basic.username, basic.password.get_secret_value()

        def basic_auth(headers: Headers) -> Admitted:
            verify_basic(user, password, headers.get("authorization"))
            return ADMITTED

        checks.append(basic_auth)
    secrets = config.secrets()
    if secrets and hmac_defaults is not None:
        scheme = config.signature or HmacScheme()
        verifier = HmacVerifier(
            keys=[s.encode() for s in secrets],
            scheme=scheme,
            header=scheme.header or hmac_defaults.header,
            signed_payload=scheme.signed_payload or hmac_defaults.signed_payload,
            tolerance_seconds=config.tolerance_seconds or DEFAULT_TOLERANCE,
        )
        checks.append(verifier.admit)
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

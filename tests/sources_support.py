"""Helpers for source tests: fixture payloads, a self-made SNS signing certificate, and a
fake SNS network edge (nothing leaves the machine)."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from app.sources.aws_sns import string_to_sign

PAYLOADS = Path(__file__).parent / "fixtures" / "payloads"
CERT_URL = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-test.pem"


def payload(name: str) -> Any:
    return orjson.loads((PAYLOADS / name).read_bytes())


class SnsSigner:
    """Signs SNS messages the way SNS does, with a throwaway RSA key and certificate."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(self.key, hashes.SHA256())
        )
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)

    def sign(
        self,
        message: dict[str, Any],
        *,
        version: str = "1",
        cert_url: str = CERT_URL,
        timestamp: dt.datetime | None = None,
    ) -> dict[str, Any]:
        when = timestamp or dt.datetime.now(dt.UTC)
        signed = {
            **message,
            "Timestamp": when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "SignatureVersion": version,
            "SigningCertURL": cert_url,
        }
        # SignatureVersion 1 is SHA1 by AWS's definition; the tests must sign like SNS does.
        algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()  # noqa: S303
        raw = self.key.sign(string_to_sign(signed), padding.PKCS1v15(), algorithm)
        signed["Signature"] = base64.b64encode(raw).decode()
        return signed


class FakeSnsHttp:
    """Serves ``certificates``; a URL in ``errors`` raises that error (as the real edge would
    for a network failure or an error status); any other URL fails to connect."""

    def __init__(
        self, certificates: dict[str, bytes], *, errors: dict[str, Exception] | None = None
    ) -> None:
        self.certificates = certificates
        self.errors = errors or {}
        self.fetched: list[str] = []
        self.confirmed: list[str] = []

    async def fetch_certificate(self, url: str) -> bytes:
        self.fetched.append(url)
        if url in self.errors:
            raise self.errors[url]
        if url not in self.certificates:
            raise httpx.ConnectError("[Errno -2] Name or service not known")
        return self.certificates[url]

    async def confirm_subscription(self, url: str) -> None:
        self.confirmed.append(url)


def http_status_error(url: str, status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", url)
    response = httpx.Response(status, request=request)
    return httpx.HTTPStatusError(f"{status}", request=request, response=response)

"""Ingest errors, each a 4xx the sender can act on.

AppError
├── UnknownSource 404
├── InvalidSignature 401      (missing or wrong signature / token)
│   └── StaleTimestamp 401    (signed timestamp outside the tolerance)
├── RequestTimeout 408        (the body did not arrive within the read timeout)
├── ClientDisconnected 499    (the sender hung up mid-body: nobody reads the answer)
├── PayloadTooLarge 413
├── UnsupportedMediaType 415
├── InvalidPayload 400        (not JSON, or JSON the source type cannot read)
└── Unavailable 503           (nothing was accepted; retry after ``Retry-After`` seconds)
    ├── BodyBufferFull          (the process holds as many request bodies as it may)
    └── CertificateUnavailable  (SNS: the signing certificate could not be fetched)
"""

from __future__ import annotations

from app.errors import AppError


class UnknownSource(AppError):
    status_code = 404


class InvalidSignature(AppError):
    status_code = 401


class StaleTimestamp(InvalidSignature):
    pass


class RequestTimeout(AppError):
    status_code = 408


class ClientDisconnected(AppError):
    # 499 as nginx logs it ("client closed request"); no client ever receives it.
    status_code = 499


class PayloadTooLarge(AppError):
    status_code = 413


class UnsupportedMediaType(AppError):
    status_code = 415


class InvalidPayload(AppError):
    status_code = 400


class Unavailable(AppError):
    status_code = 503

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after)}


class BodyBufferFull(Unavailable):
    pass


class CertificateUnavailable(Unavailable):
    pass

"""What a delivery itself can get wrong, as the sender is told (raised by source adapters).

AppError
├── InvalidSignature 401        (missing, malformed or wrong signature / token)
│   └── StaleTimestamp 401      (signed timestamp outside the tolerance)
├── InvalidPayload 400          (not JSON, or JSON the source type cannot read)
├── UnsupportedMediaType 415
└── Unavailable 503
    └── CertificateUnavailable  (SNS: the signing certificate could not be fetched; SNS retries)
"""

from __future__ import annotations

from app.errors import AppError, Unavailable


class InvalidSignature(AppError):
    status_code = 401


class StaleTimestamp(InvalidSignature):
    pass


class InvalidPayload(AppError):
    status_code = 400


class UnsupportedMediaType(AppError):
    status_code = 415


class CertificateUnavailable(Unavailable):
    pass

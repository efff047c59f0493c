"""Errors of the ingest endpoint itself (what a delivery gets wrong is in
``app/sources/exceptions.py``).

AppError
├── UnknownSource 404
├── RequestTimeout 408        (the body did not arrive within the read timeout)
├── ClientDisconnected 499    (the sender hung up mid-body: nobody reads the answer)
├── PayloadTooLarge 413
└── Unavailable 503
    └── BodyBufferFull        (the process holds as many request bodies as it may)
"""

from __future__ import annotations

from app.errors import AppError, Unavailable


class UnknownSource(AppError):
    status_code = 404


class RequestTimeout(AppError):
    status_code = 408


class ClientDisconnected(AppError):
    # 499 as nginx logs it ("client closed request"); no client ever receives it.
    status_code = 499


class PayloadTooLarge(AppError):
    status_code = 413


class BodyBufferFull(Unavailable):
    pass

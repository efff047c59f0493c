"""Verification in two steps: what the headers can prove before the body is read, then what
only the body can.

``SourceAdapter.admit(headers)`` runs before a single body byte is read. It raises
``InvalidSignature`` for what the headers alone show to be wrong (no credential, a malformed
signature header, a signed timestamp outside the tolerance, a wrong bearer token or basic-auth
password), so such a request never makes the gateway buffer its body. Otherwise it returns
the ``BodyCheck`` still to pass:

- ``ADMITTED``: the headers carried a valid credential (token, basic auth); nothing left;
- ``StreamedMac``: HMACs fed with each chunk as it arrives, compared once the body is in
  (one pass over the body, never a second copy of it);
- ``DeferredCheck``: nothing checkable before the body (SNS: the certificate URL and the
  signature are in the body); the whole check runs on the complete body.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.sources.exceptions import InvalidSignature

# A request body as read: bytes, or the bytearray it was read into (no copy to bytes).
Body = bytes | bytearray


class BodyCheck(Protocol):
    def update(self, chunk: Body) -> None: ...

    async def finish(self, body: Body) -> None: ...


class Admitted:
    def update(self, chunk: Body) -> None:
        pass

    def verify(self) -> None:
        pass

    async def finish(self, body: Body) -> None:
        pass


ADMITTED = Admitted()


@dataclass(slots=True)
class StreamedMac:
    """``render(HMAC(key, prefix + body + suffix))`` must equal one of ``given``, for any key.

    ``macs`` hold one HMAC per key, already fed with the prefix. Comparisons are
    constant-time (``hmac.compare_digest``) over the rendered text (hex or base64), exactly
    as the sender wrote it."""

    macs: Sequence[hmac.HMAC]
    given: Sequence[bytes]
    render: Callable[[bytes], bytes]
    suffix: bytes = b""
    failure: str = "signature does not match the body"
    _done: bool = field(default=False, init=False)

    def update(self, chunk: Body) -> None:
        for mac in self.macs:
            mac.update(chunk)

    def verify(self) -> None:
        if self._done:
            raise RuntimeError("a StreamedMac verifies once")
        self._done = True
        for mac in self.macs:
            mac.update(self.suffix)
            expected = self.render(mac.digest())
            if any(hmac.compare_digest(candidate, expected) for candidate in self.given):
                return
        raise InvalidSignature(self.failure)

    async def finish(self, body: Body) -> None:
        self.verify()


class DeferredCheck:
    def __init__(self, verify: Callable[[Body], Awaitable[None]]) -> None:
        self._verify = verify

    def update(self, chunk: Body) -> None:
        pass

    async def finish(self, body: Body) -> None:
        await self._verify(body)


async def verify_whole(check: BodyCheck, body: Body) -> None:
    """The check over a body that is already complete (tests, callers with the whole body)."""
    check.update(body)
    await check.finish(body)

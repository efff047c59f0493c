"""What every source type module provides (``SourceKind``), the adapter protocol, and the
body-reading helpers the adapters share.

An adapter verifies one request over the raw body (before anything is parsed), then reads it
into zero or more ``Described`` events: zero means "answer, but queue nothing" (GitHub's ping,
an SNS subscription confirmation), several mean a batch (CloudEvents batch mode, an array of
readings with ``split: true``). ``delivery_id`` is the sender's retry identity: the same
request sent again must describe the same delivery ids, so a retry after a 503 is deduplicated.

Where the delivery id comes from a header the signature does not cover (GitHub's
``X-GitHub-Delivery``, a generic ``delivery_header``, binary CloudEvents' ``ce-id``), anyone
who saw one signed request can send it again under a new id. Such events also carry a
``replay_id``, a digest of what the signature covers, and a match on either is a duplicate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from app.source_config import SourceConfig
from app.sources.admission import Body, BodyCheck
from app.sources.exceptions import InvalidPayload, UnsupportedMediaType

Headers = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Described:
    type: str
    delivery_id: str
    group_key: str
    payload: Any
    # Position in a batch request; None for a single-event request.
    batch_index: int | None = None
    # Alert fingerprints for collapse: firing ones may collapse, resolved ones end a window.
    firing: tuple[str, ...] = ()
    resolved: tuple[str, ...] = ()
    # Digest of the signed material when ``delivery_id`` is not signed (see above).
    replay_id: str | None = None


class Batch(list[Described]):
    """The events of a batch request (CloudEvents batch mode, an array with ``split: true``),
    possibly none: a batch is always answered ``{"events": [...]}``, an empty one too."""


class SourceAdapter(Protocol):
    def admit(self, headers: Headers) -> BodyCheck:
        """Before the body is read: refuse what the headers show is wrong (see
        ``admission.py``); return what the body must still pass."""
        ...

    async def verify(self, headers: Headers, body: Body) -> None:
        """Both steps over a complete body."""
        ...

    async def describe(self, headers: Headers, body: Body) -> list[Described]: ...


def signed_digest(body: Body, *, timestamp: str | None = None) -> str:
    """The identity of a signed request: its body, and the signed timestamp if any (so a
    sender signing the same body again later is a new request, a replay is not)."""
    digest = hashlib.sha256()
    if timestamp is not None:
        digest.update(timestamp.encode() + b"\n")
    digest.update(body)
    return digest.hexdigest()


def media_type(headers: Headers) -> str:
    return headers.get("content-type", "").split(";", 1)[0].strip().lower()


def parse_json(body: Body, media: str = "application/json") -> Any:
    if media and media != "application/json" and not media.endswith("+json"):
        raise UnsupportedMediaType(f"expected application/json, got {media!r}")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidPayload(f"body is not valid JSON: {exc}") from None


class SnsHttp(Protocol):
    """The network edge of the AWS SNS source (certificates, subscription confirmations)."""

    async def fetch_certificate(self, url: str) -> bytes: ...

    async def confirm_subscription(self, url: str) -> None: ...


@dataclass(frozen=True, slots=True)
class AdapterDeps:
    """Network edges some adapters need; tests pass fakes, so nothing leaves the machine."""

    sns_http: SnsHttp | None = None


# Summary lines: (label, value) pairs; the prompt flattens and caps each value.
Lines = list[tuple[str, Any]]


def no_summary(event_type: str, payload: dict[str, Any]) -> Lines:
    return []


def unchanged(payload: Any) -> Any:
    return payload


@dataclass(frozen=True, slots=True)
class SourceKind:
    """Everything eventgate knows about one ``type:`` of source, in that type's module:

    - ``keys``: the config keys it reads beyond the ones every source has, and ``needs``:
      at least one of these must be set (its credentials);
    - ``adapter``: how its deliveries are verified and read into events;
    - ``summary``: the lines a prompt starts with (who, what, where, severity, links);
    - ``slim`` and ``noise``: what of its payloads a prompt leaves out (what the summary says
      already, and keys no decision needs, dropped at any depth);
    - ``alert_fingerprints``: its events carry alert fingerprints, so alert collapse needs
      no ``fingerprint`` path.
    """

    name: str
    keys: frozenset[str]
    needs: tuple[str, ...]
    adapter: Callable[[str, SourceConfig, AdapterDeps], SourceAdapter]
    summary: Callable[[str, dict[str, Any]], Lines] = no_summary
    slim: Callable[[Any], Any] = unchanged
    noise: Callable[[str], bool] | None = None
    alert_fingerprints: bool = False

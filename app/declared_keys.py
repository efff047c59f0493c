"""A tool input cut down to what the tool's JSON schema declares.

A reply must not carry keys the operator's schema never names (a ``topic_arn``, a
``message_group_id``) into a published message. The promises:

- The filter reads the subschemas Draft 2020-12 validation applies, resolved by
  ``referencing`` the way jsonschema resolves them: ``$id`` bases, ``$anchor``s, pointers
  into embedded resources, ``$dynamicRef`` through the dynamic scope. Composed in place:
  ``$ref``/``$dynamicRef``, ``allOf``/``anyOf``/``oneOf``, ``if``/``then``/``else`` and
  ``dependentSchemas`` (a key declared by any of them counts; ``not`` declares nothing).
- An object member is kept when a ``properties`` or matching ``patternProperties`` entry
  declares it or an ``additionalProperties`` (else ``unevaluatedProperties``) schema, ``true``
  included, allows it; its value is then filtered by each of those schemas. An array item
  likewise by ``prefixItems`` at its position, ``items`` after them, else
  ``unevaluatedItems``. An object (array) none of whose schemas names any of those keywords
  is open and kept whole.
- What cannot be read like that raises ``Unfilterable``, never passes unfiltered nor trimmed
  to what was read: a reference that does not resolve within the schema itself (nothing is
  fetched), ``$recursiveRef`` (2020-12 validation ignores it), a ``$schema`` other than
  2020-12, more than ``MAX_PARTS`` schemas composed at one place. ``check_readable`` tries
  every subschema once, so a config can refuse such a schema before any call.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

MAX_PARTS = 64
DIALECT = "https://json-schema.org/draft/2020-12/schema"
_IN_PLACE = ("if", "then", "else")
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_MEMBERS = ("properties", "patternProperties", "additionalProperties", "unevaluatedProperties")
_ITEMS = ("prefixItems", "items", "unevaluatedItems")

Path = tuple[str | int, ...]


class Unfilterable(Exception):
    """The schema cannot be read well enough to tell declared keys from the others."""


class _Place(NamedTuple):
    """A subschema and the resolver validation reads it with (its base URI, dynamic scope)."""

    schema: Any
    resolver: Any  # a referencing Resolver: the package does not export its type


def declared_only(schema: Any, value: Any) -> tuple[Any, list[Path]]:
    """``value`` without what ``schema`` does not declare, and the paths dropped."""
    return _filter([_root(schema)], value, (), {})


def check_readable(schema: Any) -> None:
    """Raise ``Unfilterable`` if any subschema a value could meet cannot be read."""
    todo, seen = [_root(schema)], set()
    while todo:
        place = todo.pop()
        if id(place.schema) in seen:
            continue
        seen.add(id(place.schema))
        for part in _parts([place]):
            resource = DRAFT202012.create_resource(part.schema)
            todo += [_descend(part, sub.contents) for sub in resource.subresources()]


def _root(schema: Any) -> _Place:
    """The schema as validation's root resolver holds it, its embedded resources crawled once
    per schema object: a tool's schema is the configuration's, read for every reply, and
    the crawl cost more than the filter. (Registries and resolvers are immutable.)"""
    cached = _ROOTS.get(id(schema))
    if cached is not None and cached.schema is schema:
        return cached
    resource = DRAFT202012.create_resource(schema)
    uri = resource.id() or ""
    registry: Registry[Any] = Registry().with_resource(uri, resource).crawl()
    place = _Place(schema, registry.resolver(base_uri=uri))
    if len(_ROOTS) >= _ROOTS_KEPT:
        _ROOTS.pop(next(iter(_ROOTS)))
    _ROOTS[id(place.schema)] = place  # holds the schema: its id is not reused meanwhile
    return place


# Roots by ``id`` of their schema, oldest first; a configuration offers a few tools.
_ROOTS: dict[int, _Place] = {}
_ROOTS_KEPT = 256


def _filter(
    places: list[_Place], value: Any, path: Path, memo: dict[Any, list[_Place]]
) -> tuple[Any, list[Path]]:
    """``memo``: the parts of places already read in this input (all items of a list, say)."""
    known = tuple(_key(place) for place in places)
    parts = memo[known] if known in memo else memo.setdefault(known, _parts(places))
    if isinstance(value, dict) and any(k in part.schema for part in parts for k in _MEMBERS):
        out: dict[str, Any] = {}
        dropped: list[Path] = []
        for key, item in value.items():
            if subs := _member_schemas(parts, key):
                out[key], more = _filter(subs, item, (*path, key), memo)
                dropped += more
            else:
                dropped.append((*path, key))
        return out, dropped
    if isinstance(value, list) and any(k in part.schema for part in parts for k in _ITEMS):
        kept: list[Any] = []
        dropped = []
        for index, item in enumerate(value):
            if subs := _item_schemas(parts, index):
                clean, more = _filter(subs, item, (*path, index), memo)
                kept.append(clean)
                dropped += more
            else:
                dropped.append((*path, index))
        return kept, dropped
    return value, []


def _member_schemas(parts: list[_Place], key: str) -> list[_Place]:
    """The schemas validation applies to the member ``key``; none: it is undeclared."""
    subs: list[_Place] = []
    for part in parts:
        properties = _mapping(part.schema, "properties")
        named = [properties[key]] if key in properties else []
        patterns = _mapping(part.schema, "patternProperties")
        named += [sub for pattern, sub in patterns.items() if re.search(pattern, key)]
        if not named and "additionalProperties" in part.schema:
            named = [part.schema["additionalProperties"]]
        subs += [_descend(part, sub) for sub in named if sub is not False]
    return subs or _leftover(parts, "unevaluatedProperties")


def _item_schemas(parts: list[_Place], index: int) -> list[_Place]:
    """The schemas validation applies to the item at ``index``; none: it is undeclared."""
    subs: list[_Place] = []
    for part in parts:
        prefix = part.schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        if index < len(prefix):
            subs.append(_descend(part, prefix[index]))
        elif "items" in part.schema:
            subs.append(_descend(part, part.schema["items"]))
    subs = [sub for sub in subs if sub.schema is not False]
    return subs or _leftover(parts, "unevaluatedItems")


def _leftover(parts: list[_Place], keyword: str) -> list[_Place]:
    return [
        _descend(part, part.schema[keyword])
        for part in parts
        if part.schema.get(keyword, False) is not False
    ]


def _parts(places: list[_Place]) -> list[_Place]:
    """Every object schema that applies in place at these places, references resolved."""
    parts: list[_Place] = []
    seen: set[tuple[int, tuple[str, ...]]] = set()
    for place in places:
        parts += _composed(place, seen)
    return parts


def _composed(place: _Place, seen: set[tuple[int, tuple[str, ...]]]) -> list[_Place]:
    """``place`` and what it composes in place, but what ``seen`` holds; at most MAX_PARTS
    of them, so that a schema ``check_readable`` passed is never refused here."""
    parts: list[_Place] = []
    todo = [place]
    while todo:
        place = todo.pop()
        schema = place.schema
        if not isinstance(schema, dict) or _key(place) in seen:  # true/false declare nothing
            continue
        seen.add(_key(place))
        if len(parts) == MAX_PARTS:
            raise Unfilterable(f"more than {MAX_PARTS} schemas composed at one place")
        _check_dialect(schema)
        parts.append(place)
        for keyword in ("$ref", "$dynamicRef"):
            if isinstance(schema.get(keyword), str):
                todo.append(_lookup(place, keyword))
        subs = [schema[k] for k in _IN_PLACE if k in schema]
        subs += [sub for k in _IN_PLACE_LISTS for sub in _list(schema, k)]
        subs += list(_mapping(schema, "dependentSchemas").values())
        todo += [_descend(place, sub) for sub in subs]
    return parts


def _key(place: _Place) -> tuple[int, tuple[str, ...]]:
    """Equal for places validation reads alike: one subschema in one dynamic scope (a config's
    schema shares no node between two places: interpolation rebuilt it)."""
    return id(place.schema), tuple(uri for uri, _ in place.resolver.dynamic_scope())


def _check_dialect(schema: dict[str, Any]) -> None:
    if "$recursiveRef" in schema:
        raise Unfilterable("$recursiveRef is not read by 2020-12 validation; use $dynamicRef")
    dialect = schema.get("$schema")
    if dialect is not None and str(dialect).rstrip("#") != DIALECT:
        raise Unfilterable(f"$schema {dialect!r}: only {DIALECT} is read")


def _lookup(place: _Place, keyword: str) -> _Place:
    ref = place.schema[keyword]
    try:
        resolved = place.resolver.lookup(ref)
    except (Unresolvable, ValueError) as exc:
        raise Unfilterable(f"{keyword} {ref!r} does not resolve within the schema") from exc
    return _Place(resolved.contents, resolved.resolver)


def _descend(place: _Place, sub: Any) -> _Place:
    """``sub`` as validation enters it from ``place`` (its own ``$id``, if any, is the base)."""
    if not isinstance(sub, dict | bool):
        raise Unfilterable(f"not a schema: {sub!r:.40}")
    resource = DRAFT202012.create_resource(sub)
    return _Place(sub, place.resolver.in_subresource(resource))


def _mapping(schema: dict[str, Any], keyword: str) -> dict[str, Any]:
    value = schema.get(keyword)
    return value if isinstance(value, dict) else {}


def _list(schema: dict[str, Any], keyword: str) -> list[Any]:
    value = schema.get(keyword)
    return value if isinstance(value, list) else []

"""The config file's YAML, read within bounds: a file is a few hundred nodes, so one built
to exhaust the parser is refused before anything walks it.

- Nesting is at most ``MAX_DEPTH`` levels: PyYAML composes (and the config's validation
  walks) recursively, so 100 000 ``[`` would end in a ``RecursionError``.
- Aliases stay usable (``<<: *defaults``), but the document they expand to is at most
  ``MAX_NODES`` nodes and ``MAX_TEXT`` characters of scalars: PyYAML shares an aliased node,
  and everything after it (interpolation, validation) copies it, so nine levels of nine
  aliases (the "billion laughs") would be a billion strings. An alias inside the node it
  names (``&a [*a]``) is refused: it has no end.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 100
MAX_NODES = 200_000
MAX_TEXT = 16 * 1024 * 1024


class UnsafeYaml(ValueError):
    """The document is beyond a bound (``str()`` says which): no config needs it."""


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise UnsafeYaml(f"nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node


def read_yaml(text: str) -> Any:
    """``yaml.safe_load`` within the bounds above; raises ``UnsafeYaml`` past one of them
    and ``yaml.YAMLError`` for text that is not YAML."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _check_expansion(root: Node) -> None:
    """Sizes with aliases expanded, each distinct node measured once (linear in the file,
    however many times a node is aliased). Recursion is bounded by ``MAX_DEPTH``, since
    composing succeeded, except along an alias cycle, which ``open_nodes`` catches."""
    sizes: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()

    def size(node: Node) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise UnsafeYaml("an alias refers to the node that contains it")
        open_nodes.add(key)
        nodes, text = 1, 0
        if isinstance(node, ScalarNode):
            text = len(node.value)
        elif isinstance(node, SequenceNode):
            for child in node.value:
                nodes, text = _add((nodes, text), size(child))
        elif isinstance(node, MappingNode):
            for key_node, value_node in node.value:
                nodes, text = _add((nodes, text), size(key_node))
                nodes, text = _add((nodes, text), size(value_node))
        open_nodes.discard(key)
        sizes[key] = nodes, text
        return nodes, text

    size(root)


def _add(total: tuple[int, int], part: tuple[int, int]) -> tuple[int, int]:
    nodes, text = total[0] + part[0], total[1] + part[1]
    if nodes > MAX_NODES:
        raise UnsafeYaml(f"aliases expand it past {MAX_NODES} nodes")
    if text > MAX_TEXT:
        raise UnsafeYaml(f"aliases expand it past {MAX_TEXT} characters")
    return nodes, text

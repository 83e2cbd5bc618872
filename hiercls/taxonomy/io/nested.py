"""JSON mappings: nested objects (``format="nested"``: ``{"root": {"a": {"x": {}}, "b": ["leaf1", "leaf2"]}}``)
and ``{parent: [children]}`` mappings (``format="children"``)."""

from __future__ import annotations

import json
import logging
import reprlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hiercls._textio import MAX_JSON_DEPTH, dump_json
from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import common
from hiercls.taxonomy.io.common import PathLike

logger = logging.getLogger(__name__)

__all__ = [
    "read_children_json",
    "read_nested_json",
    "taxonomy_from_nested",
    "taxonomy_to_nested",
    "write_children_json",
    "write_nested_json",
]

_Item = tuple[str, Any, Any]  # (name, its children's value, the object or list holding the name)


# ---------------------------------------------------------------------------------------------- nested JSON
def taxonomy_from_nested(
    tree: Mapping[str, Any], *, source: str = "<nested>", virtual_root: str | None = None, **kwargs: Any
) -> Taxonomy:
    """Build from a nested mapping ``{"root": {"a": {"x": {}}, "b": ["leaf1", "leaf2"]}}``.

    A value is a mapping of children, a list of children (strings, or mappings), or ``{}`` / ``[]`` / ``None``
    for a leaf. Equal names anywhere are the same node, so a name under two parents makes a DAG.

    Example:
        >>> taxonomy_from_nested({"r": {"a": ["x", "y"], "b": None}}).names
        ('r', 'a', 'x', 'y', 'b')
    """
    if not isinstance(tree, Mapping):
        raise TaxonomyError(f"expected a JSON object at the top level, got {type(tree).__name__}", source=source)
    if not tree:
        raise TaxonomyError("empty taxonomy: the top-level object has no keys", source=source)
    if virtual_root is None and len(tree) > 1:
        top = list(tree)
        raise TaxonomyError(
            f"the top-level object has {len(top)} keys ({', '.join(map(repr, top[:5]))}), so the "
            "taxonomy has several roots; pass virtual_root='<name>' to join them under a new root",
            source=source,
            line=common.line_of(tree),
        )
    nodes, edges, locations = _walk_nested(tree, source)
    return common.build(source, edges, nodes=nodes, virtual_root=virtual_root, locations=locations, **kwargs)


def _walk_nested(tree: Mapping[str, Any], source: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """The nodes, edges and each edge's location of a nested mapping, depth-first with an explicit stack (a deep
    chain is no RecursionError); ``trail`` is the path of names down to the current node."""
    nodes: list[str] = []
    edges: list[tuple[str, str]] = []
    locations: list[str] = []
    holders: dict[tuple[str, str], Any] = {}
    trail: list[str] = []
    stack: list[tuple[str | None, Iterator[_Item]]] = [(None, _nested_items(tree, tree, trail, source))]
    while stack:
        parent, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
            del trail[-1:]
            continue
        key, value, holder = item
        if not str(key).strip():
            where = "/".join(trail) or "the top level"
            raise TaxonomyError(f"empty node name under {where}", source=source, line=common.line_of(holder))
        key = str(key)
        nodes.append(key)
        if parent is not None:
            if holders.setdefault((parent, key), holder) is not holder:
                continue  # a DAG repeats a shared subtree under each parent: the same edges again, not new ones
            edges.append((parent, key))
            line = common.line_of(holder)
            # Without lines (the fast parse) an edge is located by its last names only: the whole path of every
            # edge took memory quadratic in the depth (3 GB for a 3.9 MB file at 900 levels).
            where = "/".join([*trail[-2:], key]) if len(trail) <= 2 else ".../" + "/".join([*trail[-2:], key])
            locations.append(f"{source}:{line}" if line else f"{source}:{where}")
        if len(trail) >= MAX_JSON_DEPTH:
            raise TaxonomyError(
                f"nesting deeper than {MAX_JSON_DEPTH} levels (under {reprlib.repr('/'.join(trail[:3]))}...); "
                "write a taxonomy this deep as an edge list or hiercls JSON",
                source=source,
                line=common.line_of(holder),
            )
        trail.append(key)
        stack.append((key, _nested_items(value, holder, trail, source)))
    return list(dict.fromkeys(nodes)), edges, locations


def _nested_items(value: Any, container: Any, trail: Sequence[str], source: str) -> Iterator[_Item]:
    """The children under one name: the keys of a mapping, the names and mappings of a list, none for null."""
    if value is None:
        return iter(())
    if isinstance(value, Mapping):
        return ((k, v, value) for k, v in value.items())
    if not isinstance(value, list):
        raise TaxonomyError(
            f"under {'/'.join(trail)}: expected an object, a list, {{}} or null for the children, "
            f"got {reprlib.repr(value)}",
            source=source,
            line=common.line_of(container),
            label=trail[-1],
        )
    items: list[_Item] = []
    for el in value:
        if isinstance(el, str):
            items.append((el, None, value))
        elif isinstance(el, Mapping):
            items.extend((k, v, el) for k, v in el.items())
        else:
            raise TaxonomyError(
                f"under {'/'.join(trail) or 'the top level'}: a list may hold names or objects, got {reprlib.repr(el)}",
                source=source,
                line=common.line_of(value),
            )
    return iter(items)


def read_nested_json(
    path: PathLike, *, virtual_root: str | None = None, name: str | None = None, **kwargs: Any
) -> Taxonomy:
    """Read a nested JSON object (see :func:`taxonomy_from_nested`); errors name the line.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "tree.json")
        >>> _ = open(p, "w").write('{"root": {"animal": ["cat", "dog"], "car": {}}}')
        >>> read_nested_json(p).names
        ('root', 'animal', 'cat', 'dog', 'car')
    """
    name = name or common.base_name(path)
    return common.read_json_taxonomy(
        path, lambda obj: taxonomy_from_nested(obj, source=str(path), virtual_root=virtual_root, name=name, **kwargs)
    )


def taxonomy_to_nested(tax: Taxonomy) -> dict[str, Any]:
    """The nested mapping of ``tax`` (leaves as ``{}``); a DAG node appears under each of its parents."""

    # Iterative (a deep chain is no RecursionError): every node's dict is filled in depth-first order.
    top: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(c, top) for c in reversed(tax.children(0))]
    if tax.virtual_root is None:
        stack = [(0, top)]
    while stack:
        n, holder = stack.pop()
        mine: dict[str, Any] = {}
        holder[tax.names[n]] = mine
        stack.extend((c, mine) for c in reversed(tax.children(n)))
    return top


def write_nested_json(tax: Taxonomy, path: PathLike, *, indent: int | None = 2) -> None:
    """Write the nested JSON object of ``tax`` (a virtual root becomes several top-level keys).

    A DAG is written with each multi-parent subtree repeated under every parent (reading it back merges
    them again). Display names, classes and metadata are not kept (use :func:`write_json` for that).
    """
    common.check_names_read_back(tax.names, path, "nested JSON")
    if not tax.is_tree and tax.num_nodes > 5000:
        logger.warning("writing DAG %r as nested JSON repeats every multi-parent subtree", tax.name)
    if tax.height > MAX_JSON_DEPTH:
        raise TaxonomyError(
            f"taxonomy {tax.name!r} is {tax.height} levels deep; nested JSON is read back to at most {MAX_JSON_DEPTH} "
            "levels: write it as an edge list or hiercls JSON"
        )
    with common.open_write(path) as f:
        dump_json(taxonomy_to_nested(tax), f, ensure_ascii=False, indent=indent)  # iterative: any depth
        f.write("\n")


# ---------------------------------------------------------------------------------------------- children JSON
def is_children_mapping(obj: Any) -> bool:
    """``{parent: [names]}`` with at least two keys and a key that is someone's child (else it is nested)."""
    if not isinstance(obj, Mapping) or len(obj) < 2:
        return False
    if not all(v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)) for v in obj.values()):
        return False
    kids = {x for v in obj.values() if v for x in v}
    return any(k in kids for k in obj)


def read_children_json(
    path: PathLike, *, virtual_root: str | None = None, name: str | None = None, **kwargs: Any
) -> Taxonomy:
    """Read a JSON ``{parent: [children]}`` mapping (:meth:`Taxonomy.from_children`); never unpickles.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "h.json")
        >>> _ = open(p, "w").write('{"root": ["animal", "car"], "animal": ["cat", "dog"]}')
        >>> read_children_json(p).names
        ('root', 'animal', 'cat', 'dog', 'car')
    """
    return common.read_json_taxonomy(path, lambda obj: _from_children(obj, str(path), virtual_root, name, **kwargs))


def _from_children(obj: Any, source: str, virtual_root: str | None, name: str | None, **kwargs: Any) -> Taxonomy:
    if not isinstance(obj, Mapping):
        raise TaxonomyError(f"expected a JSON object parent -> [children], got {type(obj).__name__}", source=source)
    common.check_names([str(k) for k in obj] + [str(c) for v in obj.values() if isinstance(v, list) for c in v], source)
    try:
        return Taxonomy.from_children(obj, virtual_root=virtual_root, name=name or common.base_name(source), **kwargs)
    except TaxonomyError as err:
        raise TaxonomyError(err.reason, source=source, line=err.line, label=err.label) from None


def write_children_json(tax: Taxonomy, path: PathLike, *, indent: int | None = 1) -> None:
    """Write the ``{parent: [children]}`` mapping of every node with children (names only)."""
    common.check_names_read_back(tax.names, path, "children JSON")
    obj = {tax.names[n]: [tax.names[c] for c in tax.children(n)] for n in range(tax.num_nodes) if tax.children(n)}
    if not obj:
        obj = {tax.names[0]: []}
    with common.open_write(path) as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")

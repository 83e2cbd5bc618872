"""networkx node-link JSON (``format="nodelink"``): ``networkx.node_link_data(g, edges="edges")`` or the older
``"links"`` key; lossless when written by :func:`write_node_link`."""

from __future__ import annotations

import difflib
import json
import reprlib
from collections.abc import Mapping
from typing import Any, Literal

from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import common
from hiercls.taxonomy.io.common import PathLike

__all__ = ["read_node_link", "taxonomy_from_node_link", "taxonomy_to_node_link", "write_node_link"]


def taxonomy_from_node_link(
    data: Any, *, source: str = "<node-link>", virtual_root: str | None = None, name: str | None = None, **kwargs: Any
) -> Taxonomy:
    """Build from node-link data (see :func:`read_node_link`).

    Example:
        >>> data = {"nodes": [{"id": "r"}, {"id": "a", "label": "A"}], "edges": [{"source": "r", "target": "a"}]}
        >>> taxonomy_from_node_link(data).display_names
        ('r', 'A')
    """
    key = _check_node_link(data, source)
    graph_attrs = data.get("graph") if isinstance(data.get("graph"), Mapping) else {}
    nodes, display, classes = _node_link_nodes(data["nodes"], source)
    edges, locations = _node_link_edges(data[key], key, nodes, source)
    vr = virtual_root if virtual_root is not None else graph_attrs.get("virtual_root")
    if vr is not None and vr in nodes:
        # Written by write_node_link: drop the stored virtual root, the core re-adds it.
        kept = [k for k, (p, _) in enumerate(edges) if p != vr]
        edges, locations = [edges[k] for k in kept], [locations[k] for k in kept]
        nodes = [n for n in nodes if n != vr]
        classes = None if classes is None else [c for c in classes if c != vr]
        display.pop(vr, None)
    if not nodes:
        raise TaxonomyError("empty node-link data: no nodes", source=source)
    common.check_roots(edges, locations, nodes, vr, source)
    metadata = graph_attrs.get("metadata")
    if not isinstance(metadata, Mapping):
        metadata = {k: v for k, v in graph_attrs.items() if k not in ("name", "virtual_root")}
    kwargs.setdefault("metadata", metadata)
    return common.build(
        source,
        edges,
        nodes=nodes,
        display_names=display or None,
        classes=classes,
        virtual_root=vr,
        name=name or graph_attrs.get("name") or common.base_name(source),
        locations=locations,
        **kwargs,
    )


def _check_node_link(data: Any, source: str) -> str:
    """The key of the edge list (``"edges"`` or ``"links"``) of well-formed node-link data."""
    if not isinstance(data, Mapping):
        raise TaxonomyError(f"node-link data must be a JSON object, got {type(data).__name__}", source=source)
    key = "edges" if "edges" in data else "links" if "links" in data else None
    if not isinstance(data.get("nodes"), list) or key is None or not isinstance(data[key], list):
        raise TaxonomyError(
            'node-link data needs a "nodes" list and an "edges" (or "links") list',
            source=source,
            line=common.line_of(data),
        )
    if data.get("multigraph"):
        raise TaxonomyError(
            "node-link data is a multigraph: a taxonomy has at most one edge per parent/child pair",
            source=source,
            line=common.line_of(data),
        )
    return key


def _node_link_nodes(raw: list[Any], source: str) -> tuple[list[str], dict[str, str], list[str] | None]:
    """Node ids, display names, and the classes (``None`` when no node has an ``is_class`` flag)."""
    first: dict[str, int] = {}
    display: dict[str, str] = {}
    is_class: dict[str, bool] = {}
    for k, nd in enumerate(raw):
        if not isinstance(nd, Mapping) or "id" not in nd:
            raise TaxonomyError(
                f'nodes[{k}] must be an object with an "id", got {reprlib.repr(nd)}',
                source=source,
                line=common.line_of(nd) or common.line_of(raw),
            )
        nid = str(nd["id"])
        if first.setdefault(nid, k) != k:
            raise TaxonomyError(
                f"duplicate node id {reprlib.repr(nid)} (nodes[{first[nid]}] and nodes[{k}])",
                source=source,
                line=common.line_of(nd),
                label=nid,
            )
        shown = next((nd[a] for a in ("display_name", "label", "name") if isinstance(nd.get(a), str)), None)
        if shown is not None:
            display[nid] = shown
        if "is_class" in nd:
            is_class[nid] = bool(nd["is_class"])
    return list(first), display, [n for n, flag in is_class.items() if flag] if is_class else None


def _node_link_edges(
    raw: list[Any], key: str, nodes: list[str], source: str
) -> tuple[list[tuple[str, str]], list[str]]:
    """``(source, target)`` pairs and where each is (``file:line``, or ``file:edges[k]``)."""
    known = set(nodes)
    edges: list[tuple[str, str]] = []
    locations: list[str] = []
    for k, ed in enumerate(raw):
        if not isinstance(ed, Mapping) or "source" not in ed or "target" not in ed:
            raise TaxonomyError(
                f'{key}[{k}] must be an object with "source" and "target", got {reprlib.repr(ed)}',
                source=source,
                line=common.line_of(ed) or common.line_of(raw),
            )
        pair = (str(ed["source"]), str(ed["target"]))
        for end, n in zip(("source", "target"), pair, strict=True):
            if n not in known:
                close = difflib.get_close_matches(n, nodes, n=2)
                hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
                raise TaxonomyError(
                    f'{key}[{k}] {end} {n!r} is not in "nodes"{hint}', source=source, line=common.line_of(ed), label=n
                )
        edges.append(pair)
        locations.append(f"{source}:{common.line_of(ed)}" if common.line_of(ed) else f"{source}:{key}[{k}]")
    return edges, locations


def read_node_link(
    path: PathLike, *, virtual_root: str | None = None, name: str | None = None, **kwargs: Any
) -> Taxonomy:
    """Read networkx node-link JSON (``networkx.node_link_data(g, edges="edges")`` or the older ``"links"``).

    Edges point ``source`` (parent) -> ``target`` (child). A node's ``display_name`` (or ``label``, or
    ``name``) attribute becomes its display name; ``is_class`` flags, when present, give the classes. The
    graph attributes ``name``, ``virtual_root`` and ``metadata`` (written by :func:`write_node_link`) are used.

    Raises:
        TaxonomyError: with the line: an edge naming a node missing from ``"nodes"``, duplicate node ids,
            duplicate edges, cycles, several roots, a multigraph, missing keys.
    """
    source = str(path)
    return common.read_json_taxonomy(
        path, lambda obj: taxonomy_from_node_link(obj, source=source, virtual_root=virtual_root, name=name, **kwargs)
    )


def taxonomy_to_node_link(tax: Taxonomy, *, edges_key: str = "edges") -> dict[str, Any]:
    """Node-link data of ``tax`` in id order; ``networkx.node_link_graph(data, edges=edges_key)`` reads it."""
    cm = tax.class_mask
    return {
        "directed": True,
        "multigraph": False,
        "graph": {
            "name": tax.name,
            "virtual_root": tax.virtual_root,
            "metadata": dict(tax.metadata),
            "fingerprint": tax.fingerprint,
        },
        "nodes": [
            {"id": n, "display_name": d, "is_class": bool(cm[i])}
            for i, (n, d) in enumerate(zip(tax.names, tax.display_names, strict=True))
        ],
        edges_key: [{"source": p, "target": c} for p, c in tax.edge_list(names=True)],
    }


def write_node_link(
    tax: Taxonomy, path: PathLike, *, edges_key: Literal["edges", "links"] = "edges", indent: int | None = 1
) -> None:
    """Write networkx node-link JSON (lossless: display names, classes, virtual root, metadata are kept)."""
    common.check_names_read_back(tax.names, path, "node-link JSON")
    if edges_key not in ("edges", "links"):
        raise ValueError(f"edges_key must be 'edges' or 'links'; got {edges_key!r}")
    with common.open_write(path) as f:
        json.dump(taxonomy_to_node_link(tax, edges_key=edges_key), f, ensure_ascii=False, indent=indent)
        f.write("\n")

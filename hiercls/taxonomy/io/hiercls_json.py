"""The hiercls JSON format (``format="json"``): lossless (node order, display names, classes, virtual root,
metadata), one edge per line, gzip-compressed for ``.gz``."""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping
from typing import Any

from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io.common import (
    PathLike,
    build,
    check_names_read_back,
    line_of,
    open_write,
    read_json_file,
    with_json_lines,
)

JSON_FORMAT_ID = "hiercls.taxonomy"
JSON_FORMAT_VERSION = 1

__all__ = ["JSON_FORMAT_ID", "JSON_FORMAT_VERSION", "read_json", "taxonomy_from_dict", "taxonomy_to_dict", "write_json"]


def taxonomy_to_dict(tax: Taxonomy) -> dict[str, Any]:
    """The hiercls JSON object of ``tax`` (what :func:`write_json` writes)."""
    out: dict[str, Any] = {
        "format": JSON_FORMAT_ID,
        "version": JSON_FORMAT_VERSION,
        "name": tax.name,
        "metadata": dict(tax.metadata),
        "nodes": list(tax.names),
    }
    if tax.display_names != tax.names:
        out["display_names"] = list(tax.display_names)
    out["classes"] = [tax.names[i] for i in tax.classes]
    out["virtual_root"] = tax.virtual_root
    out["fingerprint"] = tax.fingerprint
    out["edges"] = [list(e) for e in tax.edge_list(names=True)]
    return out


def write_json(tax: Taxonomy, path: PathLike) -> None:
    """Write the lossless hiercls JSON format (gzip-compressed when ``path`` ends in ``.gz``).

    The object is ``{"format": "hiercls.taxonomy", "version": 1, "name", "metadata", "nodes" (names in id
    order), "display_names" (omitted when equal to the names), "classes", "virtual_root", "fingerprint",
    "edges" ([parent, child] in the taxonomy's edge order)}``. Output is deterministic (gzip ``mtime=0``),
    one edge per line.

    Raises:
        TypeError: ``tax.metadata`` is not JSON-serialisable.

    Example:
        >>> import tempfile, os
        >>> tax = Taxonomy([("r", "a"), ("r", "b")], display_names={"a": "Alpha"}, name="ab")
        >>> p = os.path.join(tempfile.mkdtemp(), "ab.json")
        >>> write_json(tax, p)
        >>> back = read_json(p)
        >>> back.fingerprint == tax.fingerprint, back.display_names, back.name
        (True, ('r', 'Alpha', 'b'), 'ab')
    """
    check_names_read_back(tax.names, path, "hiercls JSON")
    obj = taxonomy_to_dict(tax)
    edges = obj.pop("edges")
    try:
        head = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    except TypeError as err:
        raise TypeError(f"taxonomy {tax.name!r}: metadata must be JSON-serialisable: {err}") from None
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    with open_write(path) as f:
        f.write(head[:-1])
        f.write(',"edges":[')
        f.write(",\n".join(map(encode, edges)))
        f.write("]}\n")


def _expect(cond: bool, msg: str, source: str, obj: Any = None, label: str | None = None) -> None:
    if not cond:
        raise TaxonomyError(msg, source=source, line=line_of(obj), label=label)


def taxonomy_from_dict(obj: Mapping[str, Any], *, source: str = "<dict>") -> Taxonomy:
    """Rebuild a taxonomy from :func:`taxonomy_to_dict`'s object (see :func:`write_json` for the keys)."""
    _expect(isinstance(obj, Mapping), f"expected a JSON object, got {type(obj).__name__}", source)
    fmt = obj.get("format")
    _expect(
        fmt == JSON_FORMAT_ID,
        f'not a hiercls taxonomy file: "format" is {reprlib.repr(fmt)}, expected {JSON_FORMAT_ID!r} '
        "(for other JSON layouts pass format='nested' or 'nodelink')",
        source,
        obj,
    )
    version = obj.get("version")
    _expect(
        isinstance(version, int) and 1 <= version <= JSON_FORMAT_VERSION,
        f"unsupported hiercls taxonomy version {reprlib.repr(version)} (this hiercls reads 1..{JSON_FORMAT_VERSION}; "
        "newer files need a newer hiercls)",
        source,
        obj,
    )
    nodes = obj.get("nodes")
    _expect(
        isinstance(nodes, list) and all(isinstance(n, str) for n in nodes),
        '"nodes" must be a list of node-name strings',
        source,
        nodes if isinstance(nodes, list) else obj,
    )
    edges_raw = obj.get("edges", [])
    _expect(isinstance(edges_raw, list), '"edges" must be a list of [parent, child] pairs', source, obj)
    edges: list[tuple[str, str]] = []
    edge_locs: list[str] = []
    for k, e in enumerate(edges_raw):
        _expect(
            isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e),
            f"edges[{k}] must be a [parent, child] pair of strings, got {reprlib.repr(e)}",
            source,
            e,
        )
        edges.append((e[0], e[1]))
        edge_locs.append(f"{source}:{line_of(e)}" if line_of(e) else source)
    display = obj.get("display_names")
    if display is not None:
        _expect(
            isinstance(display, list) and len(display) == len(nodes) and all(isinstance(d, str) for d in display),
            f'"display_names" must be a list of {len(nodes)} strings (one per node)',
            source,
            display,
        )
    classes = obj.get("classes")
    _expect(
        classes is None or (isinstance(classes, list) and all(isinstance(c, str) for c in classes)),
        '"classes" must be a list of node names',
        source,
        classes,
    )
    vr = obj.get("virtual_root")
    _expect(vr is None or isinstance(vr, str), '"virtual_root" must be a string or null', source, obj)
    metadata = obj.get("metadata") or {}
    _expect(isinstance(metadata, Mapping), '"metadata" must be an object', source, obj)

    node_list = list(nodes)
    disp_map = dict(zip(nodes, display, strict=True)) if display is not None else None
    if vr is not None:
        # The core adds the virtual root and its edges itself; give it what it was given originally.
        _expect(
            bool(node_list) and node_list[0] == vr, f"virtual_root {vr!r} must be the first node", source, nodes, vr
        )
        node_list = node_list[1:]
        kept = [k for k, e in enumerate(edges) if e[0] != vr]
        edges, edge_locs = [edges[k] for k in kept], [edge_locs[k] for k in kept]
        if classes is not None:
            classes = [c for c in classes if c != vr]
        if disp_map is not None:
            disp_map.pop(vr, None)
    tax = build(
        source,
        edges,
        nodes=node_list,
        display_names=disp_map,
        classes=classes,
        virtual_root=vr,
        name=obj.get("name") or None,
        metadata=metadata,
        locations=edge_locs,
    )
    stored = obj.get("fingerprint")
    if stored is not None and stored != tax.fingerprint:
        raise TaxonomyError(
            f"fingerprint mismatch: the file says {stored[:12]}..., the rebuilt taxonomy is "
            f"{tax.fingerprint[:12]}... (the file was edited by hand, or the nodes are not in id "
            'order); remove "fingerprint" to accept the new node order',
            source=source,
        )
    return tax


def read_json(path: PathLike) -> Taxonomy:
    """Read the hiercls JSON format written by :func:`write_json` (``.json`` or ``.json.gz``).

    Raises:
        TaxonomyError: not a hiercls file, a newer version, malformed fields (with the line), or an invalid
            taxonomy; a stored fingerprint that does not match the rebuilt taxonomy.
    """
    obj, text = read_json_file(path)
    return with_json_lines(lambda o: taxonomy_from_dict(o, source=str(path)), obj, text, str(path))

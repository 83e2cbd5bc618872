"""The hiercls JSON format (``format="json"``): lossless (node order, display names, classes, virtual root,
metadata), one edge per line, gzip-compressed for ``.gz``."""

from __future__ import annotations

import hashlib
import json
import reprlib
from collections.abc import Mapping
from typing import Any

from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import common
from hiercls.taxonomy.io.common import PathLike

JSON_FORMAT_ID = "hiercls.taxonomy"
JSON_FORMAT_VERSION = 1

__all__ = [
    "JSON_FORMAT_ID",
    "JSON_FORMAT_VERSION",
    "display_names_sha256",
    "read_json",
    "taxonomy_from_dict",
    "taxonomy_to_dict",
    "write_json",
]


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
    out["display_names_sha256"] = display_names_sha256(tax)
    out["edges"] = [list(e) for e in tax.edge_list(names=True)]
    return out


def display_names_sha256(tax: Taxonomy) -> str:
    """SHA-256 of the ``[node name, display name]`` pairs sorted by node name: what the file stores to detect
    display names edited by hand.

    The fingerprint leaves display names out on purpose (it is the label space, which checkpoints and data are
    matched by); this digest covers what every printed prediction shows. Pairs, not a list in id order: a new
    node order is the fingerprint's business, a node shown under another name is this one's.

    Example:
        >>> a = Taxonomy([("r", "a"), ("r", "b")], display_names={"a": "Alpha", "b": "Beta"})
        >>> b = Taxonomy([("r", "a"), ("r", "b")], display_names={"a": "Beta", "b": "Alpha"})
        >>> a.fingerprint == b.fingerprint, display_names_sha256(a) == display_names_sha256(b)
        (True, False)
    """
    payload = json.dumps(
        sorted(zip(tax.names, tax.display_names, strict=True)), separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def write_json(tax: Taxonomy, path: PathLike) -> None:
    """Write the lossless hiercls JSON format (gzip-compressed when ``path`` ends in ``.gz``).

    The object is ``{"format": "hiercls.taxonomy", "version": 1, "name", "metadata", "nodes" (names in id
    order), "display_names" (omitted when equal to the names), "classes", "virtual_root", "fingerprint",
    "display_names_sha256" (:func:`display_names_sha256`), "edges" ([parent, child] in the taxonomy's edge
    order)}``. Output is deterministic (gzip ``mtime=0``),
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
    common.check_names_read_back(tax.names, path, "hiercls JSON")
    obj = taxonomy_to_dict(tax)
    edges = obj.pop("edges")
    try:
        head = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    except TypeError as err:
        raise TypeError(f"taxonomy {tax.name!r}: metadata must be JSON-serialisable: {err}") from None
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    with common.open_write(path) as f:
        f.write(head[:-1])
        f.write(',"edges":[')
        f.write(",\n".join(map(encode, edges)))
        f.write("]}\n")


def _strings(value: Any, size: int | None = None) -> bool:
    """``value`` is a list of strings (of ``size`` entries when given)."""
    return isinstance(value, list) and all(isinstance(x, str) for x in value) and size in (None, len(value))


def taxonomy_from_dict(obj: Mapping[str, Any], *, source: str = "<dict>") -> Taxonomy:
    """Rebuild a taxonomy from :func:`taxonomy_to_dict`'s object (see :func:`write_json` for the keys)."""

    def expect(ok: bool, msg: str, where: Any = None, label: str | None = None) -> None:
        if not ok:
            raise TaxonomyError(msg, source=source, line=common.line_of(obj if where is None else where), label=label)

    expect(isinstance(obj, Mapping), f"expected a JSON object, got {type(obj).__name__}")
    fmt, version = obj.get("format"), obj.get("version")
    expect(
        fmt == JSON_FORMAT_ID,
        f'not a hiercls taxonomy file: "format" is {reprlib.repr(fmt)}, expected {JSON_FORMAT_ID!r} '
        "(for other JSON layouts pass format='nested' or 'nodelink')",
    )
    expect(
        isinstance(version, int) and 1 <= version <= JSON_FORMAT_VERSION,
        f"unsupported hiercls taxonomy version {reprlib.repr(version)} (this hiercls reads 1..{JSON_FORMAT_VERSION}; "
        "newer files need a newer hiercls)",
    )
    nodes, edges, display = obj.get("nodes"), obj.get("edges", []), obj.get("display_names")
    classes, vr, metadata = obj.get("classes"), obj.get("virtual_root"), obj.get("metadata") or {}
    expect(_strings(nodes), '"nodes" must be a list of node-name strings', nodes if isinstance(nodes, list) else obj)
    expect(isinstance(edges, list), '"edges" must be a list of [parent, child] pairs')
    for k, e in enumerate(edges):
        expect(_strings(e, 2), f"edges[{k}] must be a [parent, child] pair of strings, got {reprlib.repr(e)}", e)
    size = len(nodes)
    shown = f'"display_names" must be a list of {size} strings (one per node)'
    expect(display is None or _strings(display, size), shown, display)
    expect(classes is None or _strings(classes), '"classes" must be a list of node names', classes)
    expect(vr is None or isinstance(vr, str), '"virtual_root" must be a string or null')
    expect(isinstance(metadata, Mapping), '"metadata" must be an object')
    expect(vr is None or nodes[:1] == [vr], f"virtual_root {vr!r} must be the first node", nodes, vr)
    # The core adds the virtual root and its edges itself: give it what it was given originally.
    edges = [e for e in edges if vr is None or e[0] != vr]
    tax = common.build(
        source,
        [(p, c) for p, c in edges],
        nodes=nodes[1:] if vr is not None else nodes,
        display_names=None if display is None else {n: d for n, d in zip(nodes, display, strict=True) if n != vr},
        classes=None if classes is None else [c for c in classes if c != vr],
        virtual_root=vr,
        name=obj.get("name") or None,
        metadata=metadata,
        locations=[f"{source}:{common.line_of(e)}" if common.line_of(e) else source for e in edges],
    )
    stored, stored_shown = obj.get("fingerprint"), obj.get("display_names_sha256")
    expect(stored is None or isinstance(stored, str), '"fingerprint" must be a string')
    expect(stored_shown is None or isinstance(stored_shown, str), '"display_names_sha256" must be a string')
    if stored is not None and stored != tax.fingerprint:
        raise TaxonomyError(
            f"fingerprint mismatch: the file says {stored[:12]}..., the rebuilt taxonomy is "
            f"{tax.fingerprint[:12]}... (the file was edited by hand, or the nodes are not in id "
            'order); remove "fingerprint" to accept the new node order',
            source=source,
        )
    if stored_shown is not None and stored_shown != display_names_sha256(tax):
        raise TaxonomyError(
            f'display names mismatch: "display_names_sha256" says {stored_shown[:12]}..., the display names in the '
            f"file hash to {display_names_sha256(tax)[:12]}...: the display names were edited after the file was "
            'written (they are what every printed prediction shows); remove "display_names_sha256" to accept the '
            "new display names",
            source=source,
        )
    return tax


def read_json(path: PathLike) -> Taxonomy:
    """Read the hiercls JSON format written by :func:`write_json` (``.json`` or ``.json.gz``).

    Raises:
        TaxonomyError: not a hiercls file, a newer version, malformed fields (with the line), or an invalid
            taxonomy; a stored fingerprint that does not match the rebuilt taxonomy, or a stored
            ``display_names_sha256`` that does not match its display names (edited by hand).
    """
    return common.read_json_taxonomy(path, lambda obj: taxonomy_from_dict(obj, source=str(path)))

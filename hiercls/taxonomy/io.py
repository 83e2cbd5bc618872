r"""Reading and writing taxonomies in the formats hierarchical-classification projects use.

Formats (``format=`` names for :func:`read_taxonomy` / :func:`write_taxonomy`):

* ``"json"``: the hiercls format (lossless: node order, display names, classes, virtual root, metadata).
* ``"edges"``: an edge list, one ``parent<TAB|comma|spaces>child`` per line, ``#`` comments.
* ``"tsv"``: HiAGM-style ``parent<TAB>child1<TAB>child2...`` lines (HiAGM names its root ``Root``).
* ``"children"``: a JSON ``{parent: [children]}`` mapping (:meth:`Taxonomy.from_children`).
* ``"nested"``: a nested JSON object ``{"root": {"a": {"x": {}}, "b": ["leaf1", "leaf2"]}}``.
* ``"nodelink"``: networkx node-link JSON (``networkx.node_link_data(g, edges="edges")``, or ``"links"``).
* ``"paths"``: label paths such as ``Science/Physics/Optics``, one per line (or a JSON list of paths).
* ``"folders"``: a directory tree (an ``ImageFolder``-style dataset): the folders are the nodes.

Every text file may be gzip-compressed (``.gz``). Readers raise :class:`TaxonomyError` naming the file,
the line and the label at fault.

Example:
    >>> import tempfile, os
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("root", "car")], name="toy")
    >>> d = tempfile.mkdtemp()
    >>> write_taxonomy(tax, os.path.join(d, "toy.json.gz"))
    >>> read_taxonomy(os.path.join(d, "toy.json.gz")) == tax
    True
    >>> write_taxonomy(tax, os.path.join(d, "toy.tsv"))
    >>> open(os.path.join(d, "toy.tsv")).read().splitlines()
    ['root\tanimal\tcar', 'animal\tcat']
"""

from __future__ import annotations

import contextlib
import difflib
import gzip
import inspect
import io
import json
import logging
import os
import reprlib
import shutil
import tempfile
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hiercls._registry import Registry
from hiercls._textio import LinedList, TextFileError, atomic_write, decode_text, dump_json, parse_json
from hiercls._textio import umask as _umask
from hiercls.taxonomy.core import Taxonomy, TaxonomyError

logger = logging.getLogger(__name__)

Format = Literal["json", "edges", "tsv", "children", "nested", "nodelink", "paths", "folders"]
JSON_FORMAT_ID = "hiercls.taxonomy"
JSON_FORMAT_VERSION = 1

PathLike = str | os.PathLike

__all__ = [
    "FORMATS",
    "TAXONOMY_FORMATS",
    "TaxonomyFormat",
    "check_names",
    "detect_format",
    "read_children_json",
    "read_edge_list",
    "read_folders",
    "read_json",
    "read_label_paths",
    "read_nested_json",
    "read_node_link",
    "read_taxonomy",
    "read_tsv",
    "taxonomy_from_label_paths",
    "taxonomy_from_nested",
    "write_children_json",
    "write_edge_list",
    "write_folders",
    "write_json",
    "write_label_paths",
    "write_nested_json",
    "write_node_link",
    "write_taxonomy",
    "write_tsv",
]


# ---------------------------------------------------------------------------------------------- file helpers
def _read_bytes(path: PathLike) -> bytes:
    p = Path(path)
    if p.is_dir():
        raise TaxonomyError("is a folder, not a file (use format='folders' to read a folder tree)", source=str(p))
    data = p.read_bytes()  # FileNotFoundError is the right error for a missing file
    if data[:2] == b"\x1f\x8b":  # gzip magic, whatever the extension says
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise TaxonomyError(f"corrupt gzip file: {err}", source=str(p)) from None
    return data


def _read_text(path: PathLike) -> str:
    """The file's text (gunzipped when compressed); non-UTF-8 bytes are an error naming line and offset."""
    data = _read_bytes(path)
    try:
        return decode_text(data, str(path), "taxonomy file")
    except TextFileError as err:
        raise TaxonomyError(err.reason, source=err.source, line=err.line) from None


@contextlib.contextmanager
def _open_write(path: PathLike) -> Iterator[io.TextIOBase]:
    """A UTF-8 text stream onto ``path`` (gzipped for ``.gz``), written atomically: the file appears only
    complete (a temporary file renamed into place), and a failure leaves ``path`` as it was."""
    p = Path(path)
    with atomic_write(p, "wb") as raw:
        gz = None
        if str(p).endswith(".gz"):
            # mtime=0 and no file name in the header: the same taxonomy always gives the same bytes (diffable).
            gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9)
        text = io.TextIOWrapper(gz or raw, encoding="utf-8", newline="\n")
        yield text
        text.flush()
        text.detach()  # leave the raw file open for atomic_write's fsync and rename
        if gz is not None:
            gz.close()  # writes the gzip trailer; a GzipFile on a fileobj leaves it open


def _base_name(path: PathLike) -> str:
    name = Path(path).name
    for suffix in (".gz", ".json", ".tsv", ".txt", ".csv", ".edges", ".edgelist", ".paths", ".taxonomy"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name or "taxonomy"


def _data_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` of the lines that carry data (``#`` comments and blank lines dropped)."""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        yield lineno, line


def _check_roots(
    edges: Sequence[tuple[str, str]],
    locations: Sequence[str],
    nodes: Iterable[str],
    virtual_root: str | None,
    source: str,
    declared: Mapping[str, str] | None = None,
) -> None:
    """A clearer error than the core's for the usual cause of several roots: a parent that is never a child."""
    if virtual_root is not None:
        return
    children = {c for _, c in edges}
    first_loc: dict[str, str] = dict(declared or {})
    for (p, _), loc in zip(edges, locations, strict=True):
        first_loc.setdefault(p, loc)
    roots = [n for n in dict.fromkeys([*nodes, *first_loc]) if n not in children]
    if len(roots) <= 1:
        return
    main = max(roots, key=lambda r: sum(1 for p, _ in edges if p == r))
    stray = next(r for r in roots if r != main)
    close = difflib.get_close_matches(stray, sorted(children | set(first_loc)), n=2)
    close = [c for c in close if c != stray]
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    if declared and stray in declared and any(ch.isspace() or ch == "," for ch in stray.strip()):
        hint += " (a single-name line containing spaces: is the delimiter of this line wrong?)"
    shown = ", ".join(f"{r!r}" + (f" at {first_loc[r]}" if r in first_loc else "") for r in roots[:5])
    loc = first_loc.get(stray, f"{source}:")
    src, _, line = loc.rpartition(":")
    raise TaxonomyError(
        f"{stray!r}{hint} is never connected to the rest of the taxonomy: it has no parent "
        f"itself, so the taxonomy has {len(roots)} roots ({shown}{' ...' if len(roots) > 5 else ''}); "
        "fix the name or pass virtual_root='<name>' to join the roots under a new root",
        source=src or source,
        line=int(line) if line.isdigit() else None,
        label=stray,
    )


_INVISIBLE = frozenset(("Cc", "Cf", "Zs", "Zl", "Zp"))  # controls, format characters (zero-width...), spaces


def _name_key(name: str) -> str:
    """What a reader sees of ``name``: NFC-normalised, without invisible characters or surrounding spaces."""
    if name.isascii() and name.isprintable():
        return name.strip()
    text = unicodedata.normalize("NFC", name)
    return "".join(ch for ch in text if unicodedata.category(ch) not in _INVISIBLE or ch == " ").strip()


def check_names(names: Iterable[str], source: str, locations: Mapping[str, str | None] | None = None) -> None:
    """Refuse names that are only invisible characters, and distinct names that look the same.

    Two names that differ only in Unicode normalisation (``"é"`` as one code point or as ``e`` + accent) or in
    invisible characters (zero-width spaces, control characters) would silently become two nodes; the error
    names both (``repr`` shows the difference) and where each comes from.

    Raises:
        TaxonomyError: naming the names and their ``file:line``.

    Example:
        >>> check_names(["caf\u00e9", "cafe\u0301"], "t.tsv", {"caf\u00e9": "t.tsv:2", "cafe\u0301": "t.tsv:5"})
        Traceback (most recent call last):
        ...
        hiercls.taxonomy.core.TaxonomyError: t.tsv:5: labels 'caf...' (at t.tsv:2) and 'caf...' (at t.tsv:5) differ
        only in Unicode normalisation or invisible characters ('caf\\xe9' vs 'cafe\\u0301'): they would be two
        different nodes; write them the same way (NFC) or give them distinct names
    """
    locations = locations or {}
    seen: dict[str, str] = {}

    def line_of(name: str) -> int | None:
        loc = locations.get(name) or ""
        tail = loc.rpartition(":")[2]
        return int(tail) if tail.isdigit() else None

    for name in names:
        key = _name_key(name)
        if not key:
            raise TaxonomyError(
                f"label {name!r} is only invisible or whitespace characters; give the node a visible name",
                source=source,
                line=line_of(name),
                label=name,
            )
        other = seen.setdefault(key, name)
        if other != name:
            where_a = f" (at {locations[other]})" if locations.get(other) else ""
            where_b = f" (at {locations[name]})" if locations.get(name) else ""
            raise TaxonomyError(
                f"labels '{other}'{where_a} and '{name}'{where_b} differ only in Unicode normalisation or invisible "
                f"characters ({other!a} vs {name!a}): they would be two different nodes; write them the "
                "same way (NFC) or give them distinct names",
                source=source,
                line=line_of(name),
                label=name,
            )


def _check_names_read_back(names: Iterable[str], path: PathLike, fmt: str) -> None:
    """Refuse to write names that :func:`check_names` refuses on reading (a name of only invisible characters,
    two names that look the same), so that every file a writer produces reads back: the error names the label."""
    try:
        check_names(names, str(path))
    except TaxonomyError as err:
        raise TaxonomyError(
            f"cannot be written as {fmt}: reading the file back would refuse it: {err.reason}",
            source=str(path),
            label=err.label,
        ) from None


def _build(source: str, edges: Sequence[tuple[str, str]], **kwargs: Any) -> Taxonomy:
    """``Taxonomy(edges, **kwargs)``, with the file named in errors that have no location of their own, after
    :func:`check_names` on every name."""
    locs: dict[str, str | None] = {}
    for (p, c), loc in zip(edges, kwargs.get("locations") or [None] * len(edges), strict=False):
        locs.setdefault(p, loc)
        locs.setdefault(c, loc)
    check_names([*(kwargs.get("nodes") or ()), *locs], source, locs)
    try:
        return Taxonomy(edges, **kwargs)
    except TaxonomyError as err:
        if err.source is not None:
            raise
        raise TaxonomyError(err.reason, source=source, line=err.line, label=err.label) from None


# ---------------------------------------------------------------------------------------------- JSON positions
def _json_with_lines(text: str, source: str = "<json>") -> Any:
    """Parse JSON tagging every object and array with its start line (iterative: any nesting depth).

    Only used to say where a problem is, after the fast parse found one.
    """
    try:
        return parse_json(text, source, lines=True)
    except TextFileError as err:
        raise TaxonomyError(err.reason, source=err.source, line=err.line) from None


class _DuplicateKey(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey
    return out


def _load_json(text: str, source: str) -> Any:
    """JSON with the C parser; a duplicate key or a nesting too deep for it goes to the iterative parser, which
    names the line of the duplicate (``json.loads`` alone keeps the last value without a word)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as err:
        raise TaxonomyError(f"invalid JSON: {err.msg} (column {err.colno})", source=source, line=err.lineno) from None
    except (_DuplicateKey, RecursionError):
        pass
    try:
        return parse_json(text, source)
    except TextFileError as err:
        raise TaxonomyError(err.reason, source=err.source, line=err.line) from None


def _line_of(obj: Any) -> int | None:
    return getattr(obj, "line", None)


# ---------------------------------------------------------------------------------------------- hiercls JSON
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
    _check_names_read_back(tax.names, path, "hiercls JSON")
    obj = taxonomy_to_dict(tax)
    edges = obj.pop("edges")
    try:
        head = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    except TypeError as err:
        raise TypeError(f"taxonomy {tax.name!r}: metadata must be JSON-serialisable: {err}") from None
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    with _open_write(path) as f:
        f.write(head[:-1])
        f.write(',"edges":[')
        f.write(",\n".join(map(encode, edges)))
        f.write("]}\n")


def _expect(cond: bool, msg: str, source: str, obj: Any = None, label: str | None = None) -> None:
    if not cond:
        raise TaxonomyError(msg, source=source, line=_line_of(obj), label=label)


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
        edge_locs.append(f"{source}:{_line_of(e)}" if _line_of(e) else source)
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
    tax = _build(
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
    source = str(path)
    text = _read_text(path)
    obj = _load_json(text, source)
    try:
        return taxonomy_from_dict(obj, source=source)
    except TaxonomyError as err:
        if err.line is not None:
            raise
    # The fast parse keeps no positions: parse again, slowly, so the same error can name its line.
    return taxonomy_from_dict(_json_with_lines(text, source), source=source)


# ---------------------------------------------------------------------------------------------- edge list
def _split_fields(line: str, delimiter: str | None) -> list[str]:
    if delimiter is None or delimiter == "whitespace":
        return line.split()
    return [f.strip() for f in line.split(delimiter)]


def _sniff_delimiter(lines: Sequence[tuple[int, str]]) -> str | None:
    sample = [ln for _, ln in lines]
    if any("\t" in ln for ln in sample):
        return "\t"
    if any("," in ln for ln in sample):
        return ","
    return None  # runs of spaces


def read_edge_list(
    path: PathLike,
    *,
    delimiter: str | None = "auto",
    virtual_root: str | None = None,
    name: str | None = None,
    **kwargs: Any,
) -> Taxonomy:
    """Read ``parent child`` lines (tab, comma or spaces between; ``#`` comments and blank lines ignored).

    A line with a single name declares a node (e.g. the root of a one-node taxonomy, or to fix sibling
    order). A first line ``parent,child`` (any delimiter, any case) is taken as a header and skipped.

    Args:
        path: the file (``.gz`` allowed).
        delimiter: ``"auto"`` (tab if any line has one, else comma if any line has one, else runs of
            spaces), ``None`` for runs of whitespace, or a literal delimiter such as ``"\\t"``.
        virtual_root: join several roots under a new root of this name.
        name: the taxonomy's name (default: the file name without extensions).
        **kwargs: passed to :class:`Taxonomy` (``classes=``, ``display_names=``, ``metadata=``).

    Raises:
        TaxonomyError: with ``file:line``: a line with three or more fields, an empty field, a self-loop,
            a duplicate edge, a cycle, a parent never connected to the root, an empty file.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "tree.edges")
        >>> _ = open(p, "w").write("# parent child\\nroot animal\\nanimal cat\\nroot car\\n")
        >>> read_edge_list(p).names
        ('root', 'animal', 'cat', 'car')
    """
    source = str(path)
    lines = list(_data_lines(_read_text(path)))
    if delimiter == "auto":
        delimiter = _sniff_delimiter(lines)
    edges: list[tuple[str, str]] = []
    locations: list[str] = []
    nodes: list[str] = []
    declared: dict[str, str] = {}  # single-name lines
    for k, (lineno, line) in enumerate(lines):
        fields = _split_fields(line, delimiter)
        if k == 0 and [f.lower() for f in fields] == ["parent", "child"]:
            continue
        shown = "tab" if delimiter == "\t" else "whitespace" if delimiter is None else repr(delimiter)
        if len(fields) > 2:
            raise TaxonomyError(
                f"expected 'parent child' ({shown} between), got {len(fields)} fields: {line.strip()!r}"
                " (use format='tsv' for 'parent child1 child2 ...' lines)",
                source=source,
                line=lineno,
            )
        if any(not f for f in fields):
            raise TaxonomyError(
                f"empty field in {line!r}: expected 'parent{delimiter or ' '}child'", source=source, line=lineno
            )
        nodes.extend(fields)  # first appearance, declarations and edges alike, orders the siblings
        if len(fields) == 1:
            declared.setdefault(fields[0], f"{source}:{lineno}")
            continue
        edges.append((fields[0], fields[1]))
        locations.append(f"{source}:{lineno}")
    if not edges and not nodes:
        raise TaxonomyError("empty edge list: no 'parent child' lines", source=source)
    nodes = list(dict.fromkeys(nodes))
    _check_roots(edges, locations, nodes, virtual_root, source, declared)
    return _build(
        source,
        edges,
        nodes=nodes,
        virtual_root=virtual_root,
        name=name or _base_name(path),
        locations=locations,
        **kwargs,
    )


def _check_writable_names(tax: Taxonomy, forbidden: str, fmt: str) -> None:
    for n in tax.names:
        reasons = [f"it contains {ch!r}" for ch in forbidden if ch in n]
        if not n or n.strip() != n:
            reasons.append("it is empty or has leading/trailing spaces")
        if n.startswith("#"):
            reasons.append("it starts with '#' (read back as a comment)")
        if reasons:
            raise TaxonomyError(f"node name {n!r} cannot be written as {fmt}: {reasons[0]}; use format='json'", label=n)


def write_edge_list(tax: Taxonomy, path: PathLike, *, delimiter: str = "\t") -> None:
    """Write one ``parent<delimiter>child`` line per edge, ordered so that reading it back gives the same ids.

    A ``parent<delimiter>child`` header comes first. Lines come in child-id order, each child's parents in
    their order (so ``to_tree("first")`` is kept); the roots joined by a virtual root are written as
    single-name lines instead of edges from the virtual root (read back with the same ``virtual_root=``).
    Display names and classes are not kept.
    """
    _check_names_read_back(tax.names, path, "an edge list")
    if delimiter not in ("\t", ",", " "):
        raise ValueError(f"delimiter must be a tab, a comma or a space; got {delimiter!r}")
    # With spaces between fields a comma in a name would make the reader sniff commas as the delimiter.
    _check_writable_names(tax, "\t\n\r" + delimiter + ("," if delimiter == " " else ""), "an edge list")
    names = tax.names
    vr = tax.virtual_root
    with _open_write(path) as f:
        # The header fixes the delimiter the reader sniffs even when no edge line shows it (a single node).
        f.write(f"parent{delimiter}child\n")
        if tax.num_nodes == 1:
            f.write(names[0] + "\n")
        for n in range(1, tax.num_nodes):
            ps = tax.parents(n)
            if vr is not None and ps == (0,):
                f.write(names[n] + "\n")
                continue
            for p in ps:
                f.write(f"{names[p]}{delimiter}{names[n]}\n")


# ---------------------------------------------------------------------------------------------- HiAGM TSV
def read_tsv(path: PathLike, *, virtual_root: str | None = None, name: str | None = None, **kwargs: Any) -> Taxonomy:
    """Read HiAGM-style ``parent<TAB>child1<TAB>child2...`` lines (HiAGM's root is called ``Root``).

    A parent may appear on several lines (its children are appended). ``#`` comments are ignored.

    Raises:
        TaxonomyError: with ``file:line``: a line with only a parent, an empty field (two tabs in a row),
            duplicate children, cycles, a parent never connected to the root, an empty file.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "rcv1.taxonomy")
        >>> _ = open(p, "w").write("Root\\tCCAT\\tECAT\\nCCAT\\tC15\\n")
        >>> read_tsv(p).names
        ('Root', 'CCAT', 'C15', 'ECAT')
    """
    source = str(path)
    edges: list[tuple[str, str]] = []
    locations: list[str] = []
    for lineno, line in _data_lines(_read_text(path)):
        fields = line.rstrip().split("\t")
        if len(fields) == 1:
            raise TaxonomyError(
                f"line has only a parent ({fields[0].strip()!r}): expected "
                "'parent<TAB>child1<TAB>child2...' (are the fields separated by spaces instead of "
                "tabs?)",
                source=source,
                line=lineno,
                label=fields[0].strip(),
            )
        stripped = [f.strip() for f in fields]
        if any(not f for f in stripped):
            col = stripped.index("") + 1
            raise TaxonomyError(
                f"empty field {col} (two tabs in a row or a blank name) in {line!r}", source=source, line=lineno
            )
        parent, children = stripped[0], stripped[1:]
        for c in children:
            edges.append((parent, c))
            locations.append(f"{source}:{lineno}")
    if not edges:
        raise TaxonomyError("empty taxonomy file: no 'parent<TAB>children' lines", source=source)
    nodes = list(dict.fromkeys(n for e in edges for n in e))
    _check_roots(edges, locations, nodes, virtual_root, source)
    return _build(
        source,
        edges,
        nodes=nodes,
        virtual_root=virtual_root,
        name=name or _base_name(path),
        locations=locations,
        **kwargs,
    )


def write_tsv(tax: Taxonomy, path: PathLike) -> None:
    """Write ``parent<TAB>children...`` lines: for a tree one line per internal node in id order (HiAGM's layout).

    A DAG is written in child-id order (a parent may then have several lines) so that the ids and each
    child's parent order come back. A virtual root is written as a real root. Display names and classes are
    not kept.
    """
    _check_names_read_back(tax.names, path, "TSV")
    _check_writable_names(tax, "\t\n\r", "TSV")
    if tax.num_nodes == 1:
        raise TaxonomyError(
            f"taxonomy {tax.name!r} is a single node; TSV cannot hold it (use format='edges' or 'json')"
        )
    with _open_write(path) as f:
        if tax.is_tree:
            for n in range(tax.num_nodes):
                kids = tax.children(n)
                if kids:
                    f.write("\t".join([tax.names[n], *(tax.names[c] for c in kids)]) + "\n")
            return
        # A DAG: lines in child-id order (runs of children of one parent share a line), so that reading
        # back sees the nodes in id order and every child's parents in their order.
        run: list[str] = []
        for n in range(1, tax.num_nodes):
            for p in tax.parents(n):
                if run and run[0] != tax.names[p]:
                    f.write("\t".join(run) + "\n")
                    run = []
                run = run or [tax.names[p]]
                run.append(tax.names[n])
        f.write("\t".join(run) + "\n")


# ---------------------------------------------------------------------------------------------- nested JSON
_MAX_NESTING = 10000
"""Deepest nested-JSON taxonomy read or written (deeper ones: an edge list or hiercls JSON)."""


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
    edges: list[tuple[str, str]] = []
    locations: list[str] = []
    nodes: list[str] = []
    seen: dict[tuple[str, str], Any] = {}

    def where(obj: Any, trail: Sequence[str]) -> str:
        line = _line_of(obj)
        return f"{source}:{line}" if line else f"{source}:" + "/".join(trail)

    def items_of(value: Any, container: Any, trail: list[str]) -> list[tuple[str, Any, Any]]:
        if value is None:
            return []
        if isinstance(value, Mapping):
            return [(k, v, value) for k, v in value.items()]
        if isinstance(value, list):
            items = []
            for el in value:
                if isinstance(el, str):
                    items.append((el, None, value))
                elif isinstance(el, Mapping):
                    items.extend((k, v, el) for k, v in el.items())
                else:
                    raise TaxonomyError(
                        f"under {'/'.join(trail) or 'the top level'}: a list may hold names or objects, "
                        f"got {reprlib.repr(el)}",
                        source=source,
                        line=_line_of(value),
                    )
            return items
        raise TaxonomyError(
            f"under {'/'.join(trail)}: expected an object, a list, {{}} or null for the children, "
            f"got {reprlib.repr(value)}",
            source=source,
            line=_line_of(container),
            label=trail[-1],
        )

    if not isinstance(tree, Mapping):
        raise TaxonomyError(f"expected a JSON object at the top level, got {type(tree).__name__}", source=source)
    # Depth-first with an explicit stack (a deep chain is no RecursionError); ``trail`` is the path of the stack.
    trail: list[str] = []
    stack: list[tuple[str | None, Iterator[tuple[str, Any, Any]]]] = [(None, iter(items_of(tree, tree, [])))]
    while stack:
        parent, it = stack[-1]
        item = next(it, None)
        if item is None:
            stack.pop()
            if trail:
                trail.pop()
            continue
        key, child_value, holder = item
        if not str(key).strip():
            raise TaxonomyError(
                f"empty node name under {'/'.join(trail) or 'the top level'}", source=source, line=_line_of(holder)
            )
        key = str(key)
        nodes.append(key)
        if parent is not None:
            first_holder = seen.get((parent, key))
            if first_holder is not None and first_holder is not holder:
                # A DAG repeats a shared subtree under each parent: the same edges again, not new ones.
                continue
            seen[(parent, key)] = holder
            edges.append((parent, key))
            locations.append(where(holder, [*trail, key]))
        if len(trail) >= _MAX_NESTING:
            raise TaxonomyError(
                f"nesting deeper than {_MAX_NESTING} levels (under {reprlib.repr('/'.join(trail[:3]))}...); "
                "write a taxonomy this deep as an edge list or hiercls JSON",
                source=source,
                line=_line_of(holder),
            )
        trail.append(key)
        stack.append((key, iter(items_of(child_value, holder, trail))))
    if not nodes:
        raise TaxonomyError("empty taxonomy: the top-level object has no keys", source=source)
    nodes = list(dict.fromkeys(nodes))
    if virtual_root is None:
        top = [k for k in tree]
        if len(top) > 1:
            raise TaxonomyError(
                f"the top-level object has {len(top)} keys ({', '.join(map(repr, top[:5]))}), so the "
                "taxonomy has several roots; pass virtual_root='<name>' to join them under a new root",
                source=source,
                line=_line_of(tree),
            )
    return _build(source, edges, nodes=nodes, virtual_root=virtual_root, locations=locations, **kwargs)


def _parse_json_file(path: PathLike) -> tuple[Any, str]:
    text = _read_text(path)
    return _load_json(text, str(path)), text


def _with_json_lines(build: Any, obj: Any, text: str) -> Taxonomy:
    """Run ``build(obj)``; on an error without a line, build again from a line-tagged parse to locate it."""
    try:
        return build(obj)
    except TaxonomyError as err:
        if err.line is not None:
            raise
    return build(_json_with_lines(text))


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
    obj, text = _parse_json_file(path)
    name = name or _base_name(path)
    return _with_json_lines(
        lambda o: taxonomy_from_nested(o, source=str(path), virtual_root=virtual_root, name=name, **kwargs), obj, text
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
    _check_names_read_back(tax.names, path, "nested JSON")
    if not tax.is_tree and tax.num_nodes > 5000:
        logger.warning("writing DAG %r as nested JSON repeats every multi-parent subtree", tax.name)
    if tax.height > _MAX_NESTING:
        raise TaxonomyError(
            f"taxonomy {tax.name!r} is {tax.height} levels deep; nested JSON is read back to at most {_MAX_NESTING} "
            "levels: write it as an edge list or hiercls JSON"
        )
    with _open_write(path) as f:
        dump_json(taxonomy_to_nested(tax), f, ensure_ascii=False, indent=indent)  # iterative: any depth
        f.write("\n")


# ---------------------------------------------------------------------------------------------- node-link
def _taxonomy_from_node_link(
    data: Any, source: str, virtual_root: str | None, name: str | None, **kwargs: Any
) -> Taxonomy:
    if not isinstance(data, Mapping):
        raise TaxonomyError(f"node-link data must be a JSON object, got {type(data).__name__}", source=source)
    nodes_raw = data.get("nodes")
    key = "edges" if "edges" in data else "links" if "links" in data else None
    if not isinstance(nodes_raw, list) or key is None or not isinstance(data[key], list):
        raise TaxonomyError(
            'node-link data needs a "nodes" list and an "edges" (or "links") list', source=source, line=_line_of(data)
        )
    if data.get("multigraph"):
        raise TaxonomyError(
            "node-link data is a multigraph: a taxonomy has at most one edge per parent/child pair",
            source=source,
            line=_line_of(data),
        )
    graph_attrs = data.get("graph") or {}
    if not isinstance(graph_attrs, Mapping):
        graph_attrs = {}
    nodes: list[str] = []
    display: dict[str, str] = {}
    classes: list[str] = []
    any_class_flag = False
    seen: dict[str, int] = {}
    for k, nd in enumerate(nodes_raw):
        if not isinstance(nd, Mapping) or "id" not in nd:
            raise TaxonomyError(
                f'nodes[{k}] must be an object with an "id", got {reprlib.repr(nd)}',
                source=source,
                line=_line_of(nd) or _line_of(nodes_raw),
            )
        nid = str(nd["id"])
        if nid in seen:
            raise TaxonomyError(
                f"duplicate node id {reprlib.repr(nid)} (nodes[{seen[nid]}] and nodes[{k}])",
                source=source,
                line=_line_of(nd),
                label=nid,
            )
        seen[nid] = k
        nodes.append(nid)
        for attr in ("display_name", "label", "name"):
            if isinstance(nd.get(attr), str):
                display[nid] = nd[attr]
                break
        if "is_class" in nd:
            any_class_flag = True
            if nd["is_class"]:
                classes.append(nid)
    edges: list[tuple[str, str]] = []
    locations: list[str] = []
    for k, ed in enumerate(data[key]):
        if not isinstance(ed, Mapping) or "source" not in ed or "target" not in ed:
            raise TaxonomyError(
                f'{key}[{k}] must be an object with "source" and "target", got {reprlib.repr(ed)}',
                source=source,
                line=_line_of(ed) or _line_of(data[key]),
            )
        p, c = str(ed["source"]), str(ed["target"])
        for end, n in (("source", p), ("target", c)):
            if n not in seen:
                close = difflib.get_close_matches(n, nodes, n=2)
                hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
                raise TaxonomyError(
                    f'{key}[{k}] {end} {n!r} is not in "nodes"{hint}', source=source, line=_line_of(ed), label=n
                )
        edges.append((p, c))
        loc_line = _line_of(ed)
        locations.append(f"{source}:{loc_line}" if loc_line else f"{source}:{key}[{k}]")
    vr = virtual_root if virtual_root is not None else graph_attrs.get("virtual_root")
    if vr is not None and vr in seen:
        # Written by write_node_link: drop the stored virtual root, the core re-adds it.
        edges_keep = [k for k, (p, _) in enumerate(edges) if p != vr]
        edges, locations = [edges[k] for k in edges_keep], [locations[k] for k in edges_keep]
        nodes = [n for n in nodes if n != vr]
        classes = [c for c in classes if c != vr]
        display.pop(vr, None)
    if not nodes:
        raise TaxonomyError("empty node-link data: no nodes", source=source)
    _check_roots(edges, locations, nodes, vr, source)
    meta = (
        graph_attrs.get("metadata")
        if isinstance(graph_attrs.get("metadata"), Mapping)
        else {k: v for k, v in graph_attrs.items() if k not in ("name", "virtual_root")}
    )
    kwargs.setdefault("metadata", meta)
    return _build(
        source,
        edges,
        nodes=nodes,
        display_names=display or None,
        classes=classes if any_class_flag else None,
        virtual_root=vr,
        name=name or graph_attrs.get("name") or _base_name(source),
        locations=locations,
        **kwargs,
    )


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
    obj, text = _parse_json_file(path)
    return _with_json_lines(lambda o: _taxonomy_from_node_link(o, str(path), virtual_root, name, **kwargs), obj, text)


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
    _check_names_read_back(tax.names, path, "node-link JSON")
    if edges_key not in ("edges", "links"):
        raise ValueError(f"edges_key must be 'edges' or 'links'; got {edges_key!r}")
    with _open_write(path) as f:
        json.dump(taxonomy_to_node_link(tax, edges_key=edges_key), f, ensure_ascii=False, indent=indent)
        f.write("\n")


# ---------------------------------------------------------------------------------------------- children JSON
def _is_children_mapping(obj: Any) -> bool:
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
    obj, _ = _parse_json_file(path)
    if not isinstance(obj, Mapping):
        raise TaxonomyError(f"expected a JSON object parent -> [children], got {type(obj).__name__}", source=str(path))
    names = [str(k) for k in obj] + [str(c) for v in obj.values() if isinstance(v, list) for c in v]
    check_names(names, str(path))
    try:
        return Taxonomy.from_children(obj, virtual_root=virtual_root, name=name or _base_name(path), **kwargs)
    except TaxonomyError as err:
        raise TaxonomyError(err.reason, source=str(path), line=err.line, label=err.label) from None


def write_children_json(tax: Taxonomy, path: PathLike, *, indent: int | None = 1) -> None:
    """Write the ``{parent: [children]}`` mapping of every node with children (names only)."""
    _check_names_read_back(tax.names, path, "children JSON")
    obj = {tax.names[n]: [tax.names[c] for c in tax.children(n)] for n in range(tax.num_nodes) if tax.children(n)}
    if not obj:
        obj = {tax.names[0]: []}
    with _open_write(path) as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")


# ---------------------------------------------------------------------------------------------- label paths
def taxonomy_from_label_paths(
    paths: Iterable[str | Sequence[str]],
    *,
    separator: str = "/",
    root: str = "root",
    source: str = "<paths>",
    line_numbers: Sequence[int] | None = None,
    **kwargs: Any,
) -> Taxonomy:
    """Build from label paths: ``"Science/Physics/Optics"`` strings, or lists such as ``["Science", "Physics"]``.

    Every prefix of a path is a node, named by its full path joined with ``separator`` (so ``"Physics"``
    under two parents stays two nodes) and displayed by its last component. When the paths start with
    several top-level components they are joined under a virtual root called ``root``. Classes are the
    nodes that end a path (hiclass's convention that a sample's label path may stop at an internal node).

    Example:
        >>> tax = taxonomy_from_label_paths(["Science/Physics/Optics", "Science/Biology", "Arts/Physics"])
        >>> tax.names
        ('root', 'Science', 'Science/Physics', 'Science/Physics/Optics', 'Science/Biology', 'Arts', 'Arts/Physics')
        >>> tax.display_names[6], tax.virtual_root
        ('Physics', 'root')
    """
    if not separator:
        raise ValueError("separator must be a non-empty string")
    root = kwargs.pop("virtual_root", None) or root  # the only root these readers can add
    edges: dict[tuple[str, str], str] = {}
    nodes: dict[str, str] = {}
    ends: dict[str, None] = {}
    for k, p in enumerate(paths):
        line = line_numbers[k] if line_numbers is not None else k + 1
        where = f"{source}:{line}"
        if isinstance(p, str):
            parts = [s.strip() for s in p.strip().split(separator)]
        elif isinstance(p, Sequence) and all(isinstance(s, str | int) for s in p):
            parts = [str(s).strip() for s in p]
            # hiclass pads ragged paths with "" (or the string "nan") on the right.
            while parts and parts[-1] in ("", "nan"):
                parts.pop()
        else:
            raise TaxonomyError(
                f"a label path must be a string or a list of strings, got {reprlib.repr(p)}", source=source, line=line
            )
        if not parts or any(not s for s in parts):
            raise TaxonomyError(
                f"empty component in label path {reprlib.repr(p)} (separator {separator!r})", source=source, line=line
            )
        for j, part in enumerate(parts):
            if not isinstance(p, str) and separator in part:
                raise TaxonomyError(
                    f"component {part!r} of {p!r} contains the separator {separator!r}; choose another separator=",
                    source=source,
                    line=line,
                    label=part,
                )
            full = separator.join(parts[: j + 1])
            nodes.setdefault(full, part)
            if j:
                edges.setdefault((separator.join(parts[:j]), full), where)
        ends[separator.join(parts)] = None
    if not nodes:
        raise TaxonomyError("no label paths", source=source)
    children = {c for _, c in edges}
    top = [n for n in nodes if n not in children]
    vr = root if len(top) > 1 else None
    if vr is not None and vr in nodes:
        raise TaxonomyError(
            f"root name {root!r} is also a label; pass root='<another name>'", source=source, label=root
        )
    kwargs.setdefault("classes", list(ends))
    return _build(
        source,
        list(edges),
        nodes=list(nodes),
        display_names=nodes,
        virtual_root=vr,
        locations=list(edges.values()),
        **kwargs,
    )


def read_label_paths(
    path: PathLike, *, separator: str = "/", root: str = "root", name: str | None = None, **kwargs: Any
) -> Taxonomy:
    """Read label paths, one per line (``Science/Physics/Optics``), or a JSON list of paths / path lists.

    See :func:`taxonomy_from_label_paths` for the node names, the root and the classes.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "labels.paths")
        >>> _ = open(p, "w").write("Animal/Cat\\nAnimal/Dog\\nVehicle\\n")
        >>> read_label_paths(p).names
        ('root', 'Animal', 'Animal/Cat', 'Animal/Dog', 'Vehicle')
    """
    source = str(path)
    text = _read_text(path)
    name = name or _base_name(path)
    if text.lstrip().startswith("["):
        obj = _load_json(text, source)
        if not isinstance(obj, list):
            raise TaxonomyError("expected a JSON list of label paths", source=source)
        return _with_json_lines(
            lambda o: taxonomy_from_label_paths(
                o,
                separator=separator,
                root=root,
                source=source,
                name=name,
                line_numbers=[_line_of(el) or 1 for el in o] if isinstance(o, LinedList) else None,
                **kwargs,
            ),
            obj,
            text,
        )
    lines = list(_data_lines(text))
    if not lines:
        raise TaxonomyError("empty file: no label paths", source=source)
    return taxonomy_from_label_paths(
        [ln for _, ln in lines],
        separator=separator,
        root=root,
        source=source,
        line_numbers=[n for n, _ in lines],
        name=name,
        **kwargs,
    )


def _tree_or_fail(tax: Taxonomy, fmt: str) -> None:
    if not tax.is_tree:
        raise TaxonomyError(
            f"taxonomy {tax.name!r} is a DAG; {fmt} can only hold trees: write "
            "tax.to_tree('first') or use format='json' / 'nodelink' / 'edges'"
        )


def label_paths(tax: Taxonomy, *, separator: str | None = "/", nodes: Iterable[int] | None = None) -> list[Any]:
    """The label path of each node (default: the leaves) from display names, without a virtual root.

    ``separator=None`` gives lists of components instead of joined strings.
    """
    _tree_or_fail(tax, "label paths")
    skip = 1 if tax.virtual_root is not None else 0
    ids = tax.leaves if nodes is None else nodes
    out: list[Any] = []
    for n in ids:
        parts = [tax.display_names[i] for i in tax.path(int(n))[skip:]]
        out.append(parts if separator is None else separator.join(parts))
    return out


def write_label_paths(tax: Taxonomy, path: PathLike, *, separator: str = "/") -> None:
    """Write one label path per leaf, plus one per internal class that no leaf path would restore as a class.

    Components are display names (for a taxonomy read from label paths or folders that is exactly the
    input). Trees only; a virtual root is not written. Reading back gives the same shape and display names,
    and the same fingerprint when the names were already full paths.
    """
    _tree_or_fail(tax, "label paths")
    for d in tax.display_names:
        if separator in d or "\n" in d or not d.strip() or d.strip() != d:
            raise TaxonomyError(
                f"display name {d!r} cannot be a label-path component with separator {separator!r}", label=d
            )
    cm = tax.class_mask
    skip_root = tax.virtual_root is not None
    # Every node is a prefix of some leaf path; internal nodes are written too when they are classes
    # (so that reading back gives the same classes).
    ids = [n for n in range(tax.num_nodes) if tax.is_leaf[n] or (cm[n] and not (skip_root and n == 0))]
    if not skip_root and tax.num_nodes > 1 and not cm[0]:
        ids = [n for n in ids if n != 0]
    with _open_write(path) as f:
        for line in label_paths(tax, separator=separator, nodes=ids):
            f.write(line + "\n")


# ---------------------------------------------------------------------------------------------- folders
def read_folders(
    path: PathLike,
    *,
    root: str = "root",
    classes: Literal["files", "all"] = "files",
    follow_symlinks: bool = True,
    name: str | None = None,
    **kwargs: Any,
) -> Taxonomy:
    """Read a folder tree (an ImageFolder-style dataset) as a taxonomy.

    Every non-hidden sub-folder is a node named by its path relative to ``path`` with ``/`` (so equal
    folder names under different parents stay distinct) and displayed by its own name; ``path`` itself is
    the root, named ``root``. Files are samples, not nodes: with ``classes="files"`` (default) a folder that
    directly holds at least one non-hidden file is a class, and when no folder holds files (a bare
    skeleton) every folder is; ``classes="all"`` makes every folder a class. Hidden folders and files
    (``.name``) are ignored. Symlinked folders are followed (a link back into its own ancestry is an error).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> for sub in ("animal/cat", "animal/dog", "vehicle"):
        ...     os.makedirs(os.path.join(d, sub))
        >>> _ = open(os.path.join(d, "animal/cat/1.jpg"), "w").close()
        >>> tax = read_folders(d)
        >>> tax.names, [tax.names[c] for c in tax.classes]
        (('root', 'animal', 'animal/cat', 'animal/dog', 'vehicle'), ['animal/cat'])
    """
    base = Path(path)
    if not base.is_dir():
        if base.exists():
            raise TaxonomyError("not a folder (format='folders' reads a directory tree)", source=str(base))
        raise FileNotFoundError(f"no such folder: {base}")
    if classes not in ("files", "all"):
        raise ValueError(f"classes must be 'files' or 'all'; got {classes!r}")
    edges: list[tuple[str, str]] = []
    nodes = [root]
    display = {root: base.resolve().name or root}
    with_files: list[str] = []

    def entries_of(folder: Path, rel: str) -> Iterator[os.DirEntry[str]]:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as err:
            raise TaxonomyError(f"cannot list folder: {err.strerror}", source=str(folder)) from None
        has_file = False
        for e in entries:
            if e.name.startswith("."):
                continue
            if e.is_dir(follow_symlinks=follow_symlinks):
                yield e
            elif e.is_file(follow_symlinks=True):
                has_file = True
        if has_file and rel:
            with_files.append(rel)

    # Depth-first with an explicit stack of open folders (a deep tree is no RecursionError); ``chain`` holds the
    # real paths of the open folders, to catch symlink loops.
    chain = [os.path.realpath(base)]
    stack = [("", entries_of(base, ""))]
    while stack:
        rel, it = stack[-1]
        e = next(it, None)
        if e is None:
            stack.pop()
            chain.pop()
            continue
        child = f"{rel}/{e.name}" if rel else e.name
        real = os.path.realpath(e.path)
        if real in chain:
            raise TaxonomyError(f"symlinked folder loops back to its ancestor {real}", source=e.path, label=child)
        nodes.append(child)
        display[child] = e.name
        edges.append((rel or root, child))
        chain.append(real)
        stack.append((child, entries_of(Path(e.path), child)))
    if root in nodes[1:]:
        raise TaxonomyError(
            f"a top-level folder is called {root!r}, the root's name; pass root='<another name>'",
            source=str(base),
            label=root,
        )
    cls: list[str] | None = with_files if (classes == "files" and with_files) else None
    if cls is not None:
        order = {n: i for i, n in enumerate(nodes)}
        cls.sort(key=order.__getitem__)
    return _build(
        str(base), edges, nodes=nodes, display_names=display, classes=cls, name=name or base.resolve().name, **kwargs
    )


def write_folders(tax: Taxonomy, path: PathLike, *, exist_ok: bool = False) -> None:
    """Create one empty folder per node under ``path`` (the root), named by display names. Trees only.

    Reading the skeleton back with :func:`read_folders` gives the same shape and display names (every folder
    a class, since there are no files).
    """
    _tree_or_fail(tax, "a folder tree")
    for d in tax.display_names[1:]:
        if "/" in d or "\\" in d or d in (".", "..") or d.startswith(".") or not d.strip() or "\0" in d:
            raise TaxonomyError(f"display name {d!r} cannot be a folder name", label=d)
    base = Path(path)
    if base.exists() and not exist_ok:
        raise FileExistsError(f"{base}: already exists; remove it or write elsewhere")
    if base.exists() and not base.is_dir():
        raise FileExistsError(f"{base}: is a file, not a folder to write the tree into")
    base.parent.mkdir(parents=True, exist_ok=True)
    # Build the tree in a temporary sibling and rename it into place: a failure leaves no half tree. Into an
    # existing folder (exist_ok=True) the rename cannot replace it, so the folders are added where they are.
    target = base if base.exists() else Path(tempfile.mkdtemp(dir=base.parent, prefix=f".{base.name}.", suffix=".tmp"))
    try:
        for n in range(1, tax.num_nodes):
            # two siblings with one display name must fail here, not merge into one folder
            folder = target.joinpath(*[tax.display_names[i] for i in tax.path(n)[1:]])
            try:
                folder.mkdir(exist_ok=exist_ok and target == base)
            except OSError as err:
                raise type(err)(
                    err.errno,
                    f"cannot write {base}: the folder of node {tax.names[n]!r} (depth {tax.depth[n]}, "
                    f"{len(str(folder))} characters of path): {err.strerror}",
                ) from None
        if target != base:
            os.chmod(target, 0o777 & ~_umask())
            os.replace(target, base)
    except BaseException:
        if target != base:
            shutil.rmtree(target, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------- front door
_EXT_FORMATS = {
    ".tsv": "tsv",
    ".taxonomy": "tsv",
    ".hier": "tsv",
    ".csv": "edges",
    ".edges": "edges",
    ".edgelist": "edges",
    ".txt": None,
    ".paths": "paths",
}


def _json_kind(obj: Any) -> str:
    if isinstance(obj, Mapping):
        if obj.get("format") == JSON_FORMAT_ID:
            return "json"
        if (
            isinstance(obj.get("nodes"), list)
            and ("edges" in obj or "links" in obj)
            and ("directed" in obj or all(isinstance(n, Mapping) for n in obj["nodes"][:10]))
        ):
            return "nodelink"
        return "children" if _is_children_mapping(obj) else "nested"
    if isinstance(obj, list):
        return "paths"
    return "json"


def detect_format(path: PathLike) -> str:
    """The format of ``path`` from its extension (``.gz`` ignored) and, for ``.json``/``.txt``, its content.

    Example:
        >>> detect_format("rcv1.taxonomy"), detect_format("tree.csv"), detect_format("labels.paths")
        ('tsv', 'edges', 'paths')
    """
    p = Path(path)
    if p.is_dir():
        return "folders"
    name = p.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    ext = os.path.splitext(name)[1]
    if ext in _EXT_FORMATS and _EXT_FORMATS[ext] is not None:
        return _EXT_FORMATS[ext]
    if ext in (".yaml", ".yml"):
        raise TaxonomyError(
            f"a {ext} file is not a taxonomy format hiercls reads (YAML would be misread as an edge list); "
            f"convert it to JSON (nested {{parent: {{child: {{}}}}}} or {{parent: [children]}}) or an edge list, "
            f"or pass format= one of {', '.join(FORMATS)} if it really is one",
            source=str(p),
        )
    if not p.exists():
        if ext == ".json":
            return "json"
        raise FileNotFoundError(f"no such file: {p}")
    text = _read_text(p)
    head = text.lstrip()[:1]
    if head == "{" and f'"format":"{JSON_FORMAT_ID}"' in text[:200].replace(" ", ""):
        return "json"  # written by write_json: no need to parse it here
    if ext == ".json" or head in ("{", "["):
        return _json_kind(_load_json(text, str(p)))
    lines = [ln for _, ln in _data_lines(text)][:500]
    if not lines:
        return "edges"
    if any(len(ln.rstrip().split("\t")) > 2 for ln in lines):
        return "tsv"
    if all(len(ln.split()) == 1 and "\t" not in ln and "," not in ln for ln in lines) and any(
        "/" in ln for ln in lines
    ):
        return "paths"
    return "edges"


@dataclass(frozen=True)
class TaxonomyFormat:
    """How one file format is read (``reader(path, **options)``) and written (``writer(tax, path, **options)``)."""

    reader: Callable[..., Taxonomy]
    writer: Callable[..., None]


TAXONOMY_FORMATS: Registry[TaxonomyFormat] = Registry("taxonomy format")
"""Every file format of :func:`read_taxonomy` / :func:`write_taxonomy` by name (with aliases)."""
for _name, _reader, _writer, _aliases in (
    ("json", read_json, write_json, ("hiercls",)),
    ("edges", read_edge_list, write_edge_list, ("edgelist", "edge_list")),
    ("tsv", read_tsv, write_tsv, ("hiagm",)),
    ("children", read_children_json, write_children_json, ()),
    ("nested", read_nested_json, write_nested_json, ()),
    ("nodelink", read_node_link, write_node_link, ("node_link",)),
    ("paths", read_label_paths, write_label_paths, ("label_paths",)),
    ("folders", read_folders, write_folders, ("folder",)),
):
    TAXONOMY_FORMATS.register(_name, TaxonomyFormat(_reader, _writer), aliases=_aliases)
FORMATS = tuple(name for name, _ in TAXONOMY_FORMATS.items())
"""The format names, in the order the documentation lists them."""


_TAXONOMY_OPTIONS = ("classes", "display_names", "metadata", "name", "virtual_root")


def _check_reader_options(fmt: str, kwargs: Mapping[str, Any]) -> None:
    own = [p for p in inspect.signature(TAXONOMY_FORMATS[fmt].reader).parameters if p not in ("path", "kwargs")]
    allowed = dict.fromkeys([*own, *_TAXONOMY_OPTIONS])
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise ValueError(f"format {fmt!r} takes no option {unknown[0]!r}; its options are {', '.join(allowed)}")


def _check_format(fmt: str) -> str:
    return TAXONOMY_FORMATS.canonical(fmt)


def read_taxonomy(path: PathLike, format: str | None = None, **kwargs: Any) -> Taxonomy:
    """Read a taxonomy file or folder in any supported format (detected when ``format`` is ``None``).

    Args:
        path: a file (``.gz`` allowed) or a folder.
        format: one of ``json``, ``edges``, ``tsv``, ``children``, ``nested``, ``nodelink``, ``paths``,
            ``folders``. A ``.json`` file is read by its content: hiercls JSON, node-link, a
            ``{parent: [children]}`` mapping (two or more keys, list values, some key a child) or nested.
        **kwargs: passed to the reader (``virtual_root=``, ``separator=``, ``name=``...).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "t.csv")
        >>> _ = open(p, "w").write("parent,child\\nroot,a\\nroot,b\\n")
        >>> read_taxonomy(p).names
        ('root', 'a', 'b')
    """
    fmt = _check_format(format) if format is not None else detect_format(path)
    logger.debug("reading %s as %s", path, fmt)
    if fmt != "json":
        _check_reader_options(fmt, kwargs)
    if fmt == "json" and format is None:
        # ".json" files may be nested or node-link too: decide on the content.
        obj, text = _parse_json_file(path)
        kind = _json_kind(obj)
        if kind != "json":
            _check_reader_options(kind, kwargs)
            return TAXONOMY_FORMATS[kind].reader(path, **kwargs)
        if kwargs:
            raise ValueError(f"read_json takes no options; got {', '.join(kwargs)}")
        try:
            return taxonomy_from_dict(obj, source=str(path))
        except TaxonomyError as err:
            if err.line is not None:
                raise
        return taxonomy_from_dict(_json_with_lines(text, str(path)), source=str(path))
    if fmt == "json" and kwargs:
        raise ValueError(f"read_json takes no options; got {', '.join(kwargs)}")
    return TAXONOMY_FORMATS[fmt].reader(path, **kwargs)


def _format_for_writing(path: PathLike) -> str:
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    ext = os.path.splitext(name)[1]
    if ext == ".json":
        return "json"
    if _EXT_FORMATS.get(ext):
        return _EXT_FORMATS[ext]
    if ext == ".txt":
        return "edges"
    if not ext:
        return "folders"
    raise ValueError(
        f"cannot tell the format of {str(path)!r} from its extension; pass format= one of {', '.join(FORMATS)}"
    )


def write_taxonomy(tax: Taxonomy, path: PathLike, format: str | None = None, **kwargs: Any) -> None:
    """Write ``tax`` in ``format`` (default from the extension: ``.json[.gz]`` hiercls JSON, ``.tsv`` HiAGM,
    ``.csv``/``.edges``/``.txt`` edge list, ``.paths`` label paths, no extension a folder tree).

    For ``.csv`` the edge list is comma-separated.
    """
    fmt = _check_format(format) if format is not None else _format_for_writing(path)
    if fmt == "edges" and "delimiter" not in kwargs and str(path).lower().removesuffix(".gz").endswith(".csv"):
        kwargs["delimiter"] = ","
    TAXONOMY_FORMATS[fmt].writer(tax, path, **kwargs)

"""What every taxonomy format shares: reading a (gzipped) file, writing one atomically, JSON with line numbers,
and the checks that make an error name the file, the line and the label at fault."""

from __future__ import annotations

import contextlib
import difflib
import gzip
import io
import os
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hiercls._textio import TextFileError, atomic_write, decode_text, max_read_bytes, parse_json, read_bytes
from hiercls.taxonomy.core import Taxonomy, TaxonomyError

PathLike = str | os.PathLike

LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
"""Every character ``str.splitlines`` (the line-based readers) ends a line at: a writer of a line-based format
refuses names holding one, which would read back split in two."""

__all__ = [
    "LINE_BREAKS",
    "PathLike",
    "base_name",
    "build",
    "check_names",
    "check_names_read_back",
    "check_paths_read_back",
    "check_roots",
    "data_lines",
    "line_of",
    "load_json",
    "open_write",
    "read_file_text",
    "read_json_taxonomy",
    "tree_or_fail",
]


def read_file_text(path: PathLike) -> str:
    """The file's text (gunzipped when compressed, whatever the extension says), read by
    :func:`hiercls._textio.read_bytes`: regular files only, at most the read limit (2 GiB decompressed by
    default); non-UTF-8 bytes are an error naming line and offset."""
    p = Path(path)
    if p.is_dir():
        raise TaxonomyError("is a folder, not a file (use format='folders' to read a folder tree)", source=str(p))
    try:
        return decode_text(read_bytes(p, "taxonomy file"), str(p), "taxonomy file")
    except TextFileError as err:
        raise TaxonomyError(err.reason, source=err.source, line=err.line) from None


@contextlib.contextmanager
def open_write(path: PathLike) -> Iterator[io.TextIOBase]:
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


def base_name(path: PathLike) -> str:
    name = Path(path).name
    for suffix in (".gz", ".json", ".tsv", ".txt", ".csv", ".edges", ".edgelist", ".paths", ".taxonomy"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name or "taxonomy"


def data_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` of the lines that carry data (``#`` comments and blank lines dropped)."""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        yield lineno, line


def check_roots(
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


def check_names_read_back(names: Iterable[str], path: PathLike, fmt: str) -> None:
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


def check_paths_read_back(tax: Taxonomy, separator: str, path: PathLike, fmt: str, *, skip_root: bool) -> None:
    """:func:`check_names_read_back` for the formats that name a node by its path of display names (label paths,
    folder trees): two siblings whose display names look the same to :func:`check_names` would be refused on
    reading. The error names the second node's display name. Trees only (ids in top-down order).

    A path holds every name above its node, so the paths of a deep chain grow with the square of its depth: a
    taxonomy whose paths exceed the read limit (the reader would refuse the file) is refused first, before any
    path is built."""
    size = [0] * tax.num_nodes  # bytes of each node's path
    for n in range(int(skip_root), tax.num_nodes):
        above = size[int(tax.parent[n])] if n else 0
        size[n] = above + (len(separator) if above else 0) + len(tax.display_names[n].encode("utf-8"))
    limit = max_read_bytes()
    if sum(size) + tax.num_nodes > limit:
        deepest = max(range(tax.num_nodes), key=size.__getitem__)
        raise TaxonomyError(
            f"cannot be written as {fmt}: its paths of display names take {sum(size) + tax.num_nodes} bytes (the "
            f"path of {tax.display_names[deepest]!r} alone {size[deepest]}), over the read limit of {limit} bytes "
            "of the reader; write it as an edge list or hiercls JSON",
            source=str(path),
            label=tax.display_names[deepest],
        )
    key: list[str] = [""] * tax.num_nodes
    for n in range(tax.num_nodes):
        above = key[int(tax.parent[n])] if n else ""
        key[n] = (
            ""
            if n == 0 and skip_root
            else f"{above}{separator}{tax.display_names[n]}"
            if above
            else tax.display_names[n]
        )
    node_of: dict[str, int] = {}
    for n in range(int(skip_root), tax.num_nodes):
        if node_of.setdefault(key[n], n) != n:
            d = tax.display_names[n]
            raise TaxonomyError(
                f"cannot be written as {fmt}: two children of {tax.names[int(tax.parent[n])]!r} have the display "
                f"name {d!r}, so they would read back as one node; give them distinct display names",
                source=str(path),
                label=d,
            )
    try:
        check_names(key[int(skip_root) :], str(path))
    except TaxonomyError as err:
        d = tax.display_names[node_of[err.label]] if err.label in node_of else err.label
        raise TaxonomyError(
            f"cannot be written as {fmt}: the display name {d!r} would be refused on reading back: {err.reason}",
            source=str(path),
            label=d,
        ) from None


def build(source: str, edges: Sequence[tuple[str, str]], **kwargs: Any) -> Taxonomy:
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


# ---------------------------------------------------------------------------------------------- JSON
def load_json(text: str, source: str, *, lines: bool = False) -> Any:
    """:func:`hiercls._textio.parse_json` (duplicate keys refused), its errors as :class:`TaxonomyError`."""
    try:
        return parse_json(text, source, lines=lines)
    except TextFileError as err:
        raise TaxonomyError(err.reason, source=err.source, line=err.line) from None


def line_of(obj: Any) -> int | None:
    """The line a JSON object or array starts on, when it was parsed with ``lines=True``."""
    return getattr(obj, "line", None)


def read_json_taxonomy(path: PathLike, make: Callable[[Any], Taxonomy]) -> Taxonomy:
    """``make(the JSON of path)``; an error without a line is made again from a line-tagged parse, to say where
    it is (the fast parse keeps no positions)."""
    source, text = str(path), read_file_text(path)
    try:
        return make(load_json(text, source))
    except TaxonomyError as err:
        if err.line is not None:
            raise
    return make(load_json(text, source, lines=True))


def tree_or_fail(tax: Taxonomy, fmt: str) -> None:
    if not tax.is_tree:
        raise TaxonomyError(
            f"taxonomy {tax.name!r} is a DAG; {fmt} can only hold trees: write "
            "tax.to_tree('first') or use format='json' / 'nodelink' / 'edges'"
        )

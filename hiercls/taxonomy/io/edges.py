"""Line formats: edge lists (``format="edges"``: ``parent<TAB|comma|spaces>child`` per line) and HiAGM TSV
(``format="tsv"``: ``parent<TAB>child1<TAB>child2...``); ``#`` comments and blank lines are skipped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import common
from hiercls.taxonomy.io.common import PathLike

__all__ = ["read_edge_list", "read_tsv", "write_edge_list", "write_tsv"]


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
    lines = list(common.data_lines(common.read_file_text(path)))
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
    return _from_lines(path, edges, locations, nodes, virtual_root, name, declared, **kwargs)


def _from_lines(
    path: PathLike,
    edges: list[tuple[str, str]],
    locations: list[str],
    nodes: list[str],
    virtual_root: str | None,
    name: str | None,
    declared: dict[str, str],
    **kwargs: Any,
) -> Taxonomy:
    """The taxonomy of a line format's edges, nodes in order of first appearance (siblings keep the file's order)."""
    nodes = list(dict.fromkeys(nodes))
    common.check_roots(edges, locations, nodes, virtual_root, str(path), declared)
    name = name or common.base_name(path)
    return common.build(
        str(path), edges, nodes=nodes, virtual_root=virtual_root, name=name, locations=locations, **kwargs
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
    common.check_names_read_back(tax.names, path, "an edge list")
    if delimiter not in ("\t", ",", " "):
        raise ValueError(f"delimiter must be a tab, a comma or a space; got {delimiter!r}")
    # With spaces between fields a comma in a name would make the reader sniff commas as the delimiter.
    _check_writable_names(
        tax, "\t" + common.LINE_BREAKS + delimiter + ("," if delimiter == " " else ""), "an edge list"
    )
    names = tax.names
    vr = tax.virtual_root
    with common.open_write(path) as f:
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
    for lineno, line in common.data_lines(common.read_file_text(path)):
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
    nodes = [n for e in edges for n in e]
    return _from_lines(path, edges, locations, nodes, virtual_root, name, {}, **kwargs)


def write_tsv(tax: Taxonomy, path: PathLike) -> None:
    """Write ``parent<TAB>children...`` lines: for a tree one line per internal node in id order (HiAGM's layout).

    A DAG is written in child-id order (a parent may then have several lines) so that the ids and each
    child's parent order come back. A virtual root is written as a real root. Display names and classes are
    not kept.
    """
    common.check_names_read_back(tax.names, path, "TSV")
    _check_writable_names(tax, "\t" + common.LINE_BREAKS, "TSV")
    if tax.num_nodes == 1:
        raise TaxonomyError(
            f"taxonomy {tax.name!r} is a single node, {tax.names[0]!r}; TSV cannot hold it (use format='edges' or "
            "'json')",
            label=tax.names[0],
        )
    with common.open_write(path) as f:
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

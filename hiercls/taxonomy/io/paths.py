"""Label paths (``format="paths"``): ``Science/Physics/Optics``, one per line, or a JSON list of paths."""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Sequence
from typing import Any

from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import common
from hiercls.taxonomy.io.common import PathLike

__all__ = ["label_paths", "read_label_paths", "taxonomy_from_label_paths", "write_label_paths"]


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
    return common.build(
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
    text = common.read_file_text(path)
    name = name or common.base_name(path)
    if text.lstrip().startswith("["):
        return common.read_json_taxonomy(
            path,
            lambda obj: taxonomy_from_label_paths(
                obj if isinstance(obj, list) else _not_a_list(source),
                separator=separator,
                root=root,
                source=source,
                name=name,
                line_numbers=[common.line_of(el) or 1 for el in obj] if common.line_of(obj) is not None else None,
                **kwargs,
            ),
        )
    lines = list(common.data_lines(text))
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


def label_paths(tax: Taxonomy, *, separator: str | None = "/", nodes: Iterable[int] | None = None) -> list[Any]:
    """The label path of each node (default: the leaves) from display names, without a virtual root.

    ``separator=None`` gives lists of components instead of joined strings.
    """
    common.tree_or_fail(tax, "label paths")
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
    common.tree_or_fail(tax, "label paths")
    for d in tax.display_names:
        if separator in d or any(ch in d for ch in common.LINE_BREAKS) or not d.strip() or d.strip() != d:
            raise TaxonomyError(
                f"display name {d!r} cannot be a label-path component with separator {separator!r}", label=d
            )
    cm = tax.class_mask
    skip_root = tax.virtual_root is not None
    common.check_paths_read_back(tax, separator, path, "label paths", skip_root=skip_root)
    # Every node is a prefix of some leaf path; internal nodes are written too when they are classes
    # (so that reading back gives the same classes).
    ids = [n for n in range(tax.num_nodes) if tax.is_leaf[n] or (cm[n] and not (skip_root and n == 0))]
    if not skip_root and tax.num_nodes > 1 and not cm[0]:
        ids = [n for n in ids if n != 0]
    with common.open_write(path) as f:
        for line in label_paths(tax, separator=separator, nodes=ids):
            f.write(line + "\n")


def _not_a_list(source: str) -> list[Any]:
    raise TaxonomyError("expected a JSON list of label paths", source=source)

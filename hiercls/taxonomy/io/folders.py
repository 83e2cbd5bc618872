"""Folder trees (``format="folders"``, an ImageFolder-style dataset): the folders are the nodes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from hiercls._textio import atomic_dir
from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import common
from hiercls.taxonomy.io.common import PathLike

__all__ = ["read_folders", "write_folders"]


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
    rel_edges, with_files = _walk_folders(base, follow_symlinks)
    if not rel_edges:
        raise TaxonomyError(
            "the folder has no sub-folders, so no classes: an empty taxonomy (each class is a sub-folder)",
            source=str(base),
        )
    nodes = [root, *(c for _, c in rel_edges)]
    if root in nodes[1:]:
        raise TaxonomyError(
            f"a top-level folder is called {root!r}, the root's name; pass root='<another name>'",
            source=str(base),
            label=root,
        )
    display = {root: base.resolve().name or root, **{c: c.rpartition("/")[2] for _, c in rel_edges}}
    cls = None
    if classes == "files" and with_files:
        order = {n: i for i, n in enumerate(nodes)}
        cls = sorted(with_files, key=order.__getitem__)
    return common.build(
        str(base),
        [(p or root, c) for p, c in rel_edges],
        nodes=nodes,
        display_names=display,
        classes=cls,
        name=name or base.resolve().name,
        **kwargs,
    )


def _walk_folders(base: Path, follow_symlinks: bool) -> tuple[list[tuple[str, str]], list[str]]:
    """``(parent, child)`` folder pairs by path relative to ``base`` (``""`` is ``base``) in depth-first order,
    and the folders that directly hold a file."""
    edges: list[tuple[str, str]] = []
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
        edges.append((rel, child))
        chain.append(real)
        stack.append((child, entries_of(Path(e.path), child)))
    return edges, with_files


def write_folders(tax: Taxonomy, path: PathLike, *, exist_ok: bool = False) -> None:
    """Create one empty folder per node under ``path`` (the root), named by display names. Trees only.

    Reading the skeleton back with :func:`read_folders` gives the same shape and display names (every folder
    a class, since there are no files).
    """
    common.tree_or_fail(tax, "a folder tree")
    if tax.num_nodes == 1:
        raise TaxonomyError(
            f"taxonomy {tax.name!r} is its root {tax.names[0]!r} alone: an empty folder, which reads back as nothing",
            label=tax.names[0],
        )
    for d in tax.display_names[1:]:
        if "/" in d or "\\" in d or d in (".", "..") or d.startswith(".") or not d.strip() or "\0" in d:
            raise TaxonomyError(f"display name {d!r} cannot be a folder name", label=d)
    common.check_paths_read_back(tax, "/", path, "a folder tree", skip_root=True)
    base = Path(path)
    if base.exists() and not exist_ok:
        raise FileExistsError(f"{base}: already exists; remove it or write elsewhere")
    if base.exists() and not base.is_dir():
        raise FileExistsError(f"{base}: is a file, not a folder to write the tree into")
    if base.exists():  # exist_ok: a folder cannot be replaced in one rename, so the folders are added in place
        _make_folders(tax, base, base, exist_ok=True)
    else:  # built in a temporary sibling and renamed into place: a failure leaves no half tree
        with atomic_dir(base) as tmp:
            _make_folders(tax, tmp, base, exist_ok=False)


def _make_folders(tax: Taxonomy, target: Path, base: Path, *, exist_ok: bool) -> None:
    for n in range(1, tax.num_nodes):
        # two siblings with one display name must fail here, not merge into one folder
        folder = target.joinpath(*[tax.display_names[i] for i in tax.path(n)[1:]])
        try:
            folder.mkdir(exist_ok=exist_ok)
        except OSError as err:
            raise type(err)(
                err.errno,
                f"cannot write {base}: the folder of node {tax.names[n]!r} (depth {tax.depth[n]}, "
                f"{len(str(folder))} characters of path): {err.strerror}",
            ) from None

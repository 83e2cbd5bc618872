"""The taxonomies shipped with hiercls (``imagenet1k``, ``cifar100``, ``brats``...) and one loader for any taxonomy.

Shipped taxonomies are hiercls JSON files (``<name>.json.gz`` or ``<name>.json``) in the package
``hiercls.taxonomies`` (the checkout's top-level ``taxonomies/`` folder, mapped by pyproject.toml).

Example:
    >>> names = [entry["name"] for entry in list_taxonomies()]
    >>> isinstance(names, list)
    True
"""

from __future__ import annotations

import difflib
import gzip
import json
import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from hiercls._textio import package_data_dirs
from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import read_json, read_taxonomy

logger = logging.getLogger(__name__)

__all__ = ["list_taxonomies", "load_taxonomy", "shipped_taxonomy_dirs", "taxonomy_path"]

_SUFFIXES = (".json.gz", ".json")


def shipped_taxonomy_dirs() -> list[Path]:
    """Folders searched for shipped taxonomies: the installed ``hiercls.taxonomies`` package, then the checkout's
    ``taxonomies/`` folder (for an editable install or a source tree), without duplicates."""
    return package_data_dirs("hiercls.taxonomies", "taxonomies")


def _shipped_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in shipped_taxonomy_dirs():
        for p in sorted(d.iterdir()):
            for suffix in _SUFFIXES:
                if p.name.endswith(suffix) and not p.name.startswith("."):
                    # .json.gz comes first in _SUFFIXES, so a name matched as .json.gz is not re-matched as .json
                    found.setdefault(p.name[: -len(suffix)], p)
                    break
    return found


def taxonomy_path(name: str) -> Path:
    """Path of the shipped taxonomy ``name``.

    Raises:
        TaxonomyError: no shipped taxonomy has that name (the message lists those available).
    """
    files = _shipped_files()
    if name in files:
        return files[name]
    available = sorted(files)
    close = difflib.get_close_matches(name, available, n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    listed = ", ".join(available) if available else "none are installed"
    raise TaxonomyError(
        f"unknown taxonomy {name!r}{hint} (shipped taxonomies: {listed}; or pass a file path)", label=name
    )


@lru_cache(maxsize=32)
def _load_shipped(path: str, mtime_ns: int) -> Taxonomy:
    return read_json(path)


def _looks_like_path(name: str) -> bool:
    return os.sep in name or "/" in name or "." in os.path.basename(name) or os.path.exists(name)


def load_taxonomy(name_or_path: str | os.PathLike, **kwargs: Any) -> Taxonomy:
    """A shipped taxonomy by name (``"imagenet1k"``, ``"cifar100"``, ``"brats"``...) or any file or folder
    that :func:`~hiercls.taxonomy.io.read_taxonomy` reads.

    Shipped taxonomies are cached (taxonomies are immutable, so the same object is returned each time).

    Args:
        name_or_path: a shipped name (see :func:`list_taxonomies`) or a path.
        **kwargs: passed to :func:`~hiercls.taxonomy.io.read_taxonomy` for paths (``format=``,
            ``virtual_root=``, ``separator=``...).

    Raises:
        TaxonomyError: an unknown name (listing the shipped ones) or an invalid file.
        FileNotFoundError: a path that does not exist.
        ValueError: options for a shipped name, or options the file's format does not take.
    """
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or (_looks_like_path(text) and text not in _shipped_files()):
        if not os.path.exists(text):
            raise FileNotFoundError(
                f"no such taxonomy file or folder: {text!r} (shipped taxonomies: "
                f"{', '.join(sorted(_shipped_files())) or 'none'})"
            )
        return read_taxonomy(text, **kwargs)
    path = taxonomy_path(text)
    if kwargs:
        raise ValueError(f"options {', '.join(kwargs)} only apply to files, not to the shipped taxonomy {text!r}")
    return _load_shipped(str(path), path.stat().st_mtime_ns)


def _header(path: Path) -> dict[str, Any]:
    """The JSON fields before ``"edges"`` (write_json puts the edges last), without parsing the whole file."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        head = f.read(1 << 16)
        while '"edges":' not in head:
            more = f.read(1 << 20)
            if not more:
                return json.loads(head)
            head += more
    cut = head.index('"edges":')
    try:
        quick = json.loads(head[:cut].rstrip().rstrip(",") + "}")
        if isinstance(quick, dict) and "nodes" in quick:
            return quick
    except ValueError:
        pass
    # Not laid out by write_json ("edges" first, or an "edges" key inside metadata): parse all of it.
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def list_taxonomies() -> list[dict[str, Any]]:
    """The shipped taxonomies: ``name``, one-line ``description``, ``nodes``, ``leaves``, ``classes``,
    ``kind`` (``"tree"`` or ``"dag"``), ``path``.

    Counts come from the file's header and its ``metadata`` (``counts`` / ``leaves`` / ``edges``) when stored
    there; otherwise the taxonomy is loaded to count them.
    """
    out = []
    for name, path in sorted(_shipped_files().items()):
        try:
            head = _header(path)
        except (OSError, ValueError) as err:
            logger.warning("cannot read shipped taxonomy %s: %s", path, err)
            continue
        meta = head.get("metadata") or {}
        counts = meta.get("counts") if isinstance(meta.get("counts"), dict) else {}
        nodes = len(head.get("nodes") or [])
        entry: dict[str, Any] = {
            "name": name,
            "description": str(meta.get("description", "")).split("\n")[0],
            "nodes": nodes,
            "classes": len(head.get("classes") or []),
        }
        leaves = counts.get("leaves", meta.get("leaves"))
        edges = counts.get("edges", meta.get("edges"))
        if isinstance(leaves, int) and isinstance(edges, int):
            # Every non-root node has at least one parent: a tree has exactly nodes - 1 edges.
            entry["leaves"], entry["kind"] = leaves, "tree" if edges == nodes - 1 else "dag"
        else:
            tax = load_taxonomy(name)
            entry["leaves"], entry["kind"] = tax.num_leaves, "tree" if tax.is_tree else "dag"
        for key in ("source", "version"):
            if key in meta:
                entry[key] = meta[key]
        entry["path"] = str(path)
        out.append(entry)
    return out

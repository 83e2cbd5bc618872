"""The front door: every taxonomy file format by name (:data:`TAXONOMY_FORMATS`), format detection, and
:func:`read_taxonomy` / :func:`write_taxonomy`."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hiercls._registry import Registry
from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import common
from hiercls.taxonomy.io.common import PathLike
from hiercls.taxonomy.io.edges import read_edge_list, read_tsv, write_edge_list, write_tsv
from hiercls.taxonomy.io.folders import read_folders, write_folders
from hiercls.taxonomy.io.hiercls_json import JSON_FORMAT_ID, read_json, write_json
from hiercls.taxonomy.io.nested import (
    is_children_mapping,
    read_children_json,
    read_nested_json,
    write_children_json,
    write_nested_json,
)
from hiercls.taxonomy.io.node_link import read_node_link, write_node_link
from hiercls.taxonomy.io.paths import read_label_paths, write_label_paths

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "TAXONOMY_FORMATS", "TaxonomyFormat", "detect_format", "read_taxonomy", "write_taxonomy"]


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
        return "children" if is_children_mapping(obj) else "nested"
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
    ext = _extension(p)
    if _EXT_FORMATS.get(ext):
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
    text = common.read_file_text(p)
    head = text.lstrip()[:1]
    if head == "{" and f'"format":"{JSON_FORMAT_ID}"' in text[:200].replace(" ", ""):
        return "json"  # written by write_json: no need to parse it here
    if ext == ".json" or head in ("{", "["):
        return _json_kind(common.load_json(text, str(p)))
    lines = [ln for _, ln in common.data_lines(text)][:500]
    if not lines:
        return "edges"
    if any(len(ln.rstrip().split("\t")) > 2 for ln in lines):
        return "tsv"
    if all(len(ln.split()) == 1 and "\t" not in ln and "," not in ln for ln in lines) and any(
        "/" in ln for ln in lines
    ):
        return "paths"
    return "edges"


_TAXONOMY_OPTIONS = ("classes", "display_names", "metadata", "name", "virtual_root")


def _check_reader_options(fmt: str, kwargs: Mapping[str, Any]) -> None:
    params = inspect.signature(TAXONOMY_FORMATS[fmt].reader).parameters
    allowed = [p for p in params if p not in ("path", "kwargs")]
    if "kwargs" in params:  # passed on to Taxonomy
        allowed = list(dict.fromkeys([*allowed, *_TAXONOMY_OPTIONS]))
    unknown = [k for k in kwargs if k not in allowed]
    if unknown and not allowed:
        raise ValueError(f"format {fmt!r} takes no options; got {', '.join(unknown)}")
    if unknown:
        raise ValueError(f"format {fmt!r} takes no option {unknown[0]!r}; its options are {', '.join(allowed)}")


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
    fmt = TAXONOMY_FORMATS.canonical(format) if format is not None else detect_format(path)
    logger.debug("reading %s as %s", path, fmt)
    _check_reader_options(fmt, kwargs)
    return TAXONOMY_FORMATS[fmt].reader(path, **kwargs)


def _extension(path: PathLike) -> str:
    return os.path.splitext(Path(path).name.lower().removesuffix(".gz"))[1]


def _format_for_writing(path: PathLike) -> str:
    fmt = _EXT_FORMATS.get(_extension(path)) or {".json": "json", ".txt": "edges", "": "folders"}.get(_extension(path))
    if fmt is None:
        raise ValueError(
            f"cannot tell the format of {str(path)!r} from its extension; pass format= one of {', '.join(FORMATS)}"
        )
    return fmt


def write_taxonomy(tax: Taxonomy, path: PathLike, format: str | None = None, **kwargs: Any) -> None:
    """Write ``tax`` in ``format`` (default from the extension: ``.json[.gz]`` hiercls JSON, ``.tsv`` HiAGM,
    ``.csv``/``.edges``/``.txt`` edge list, ``.paths`` label paths, no extension a folder tree).

    For ``.csv`` the edge list is comma-separated.
    """
    fmt = TAXONOMY_FORMATS.canonical(format) if format is not None else _format_for_writing(path)
    if fmt == "edges" and "delimiter" not in kwargs and _extension(path) == ".csv":
        kwargs["delimiter"] = ","
    TAXONOMY_FORMATS[fmt].writer(tax, path, **kwargs)

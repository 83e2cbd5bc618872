"""Saved probabilities and labels from files: the input of ``hiercls decode`` and ``hiercls evaluate --probs``.

``load_probabilities`` reads ``.npy`` / ``.npz`` / ``.pt`` (never a pickle); ``load_labels`` reads node ids
(``.npy`` ...) or a text/CSV file of node names, label paths or ids.
"""

from __future__ import annotations

import csv
import io
import math
import os
import pickle  # for its exception class only: nothing here unpickles
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from hiercls._checks import to_numpy
from hiercls._textio import max_read_bytes, over_read_limit, read_text, regular_file_size
from hiercls.data.labels import LabelEncoder
from hiercls.taxonomy import Taxonomy, TaxonomyError, node_id_array

__all__ = ["load_labels", "load_probabilities"]

_ARRAY_KEYS = ("probs", "node_probs", "probabilities", "leaf_probs", "scores", "arr_0")
_LABEL_KEYS = ("labels", "targets", "y", "y_true", "arr_0")


def _pick(obj: Mapping[str, Any], keys: Sequence[str], key: str | None, path: str, what: str) -> Any:
    names = list(obj.keys())
    if key is not None:
        if key not in obj:
            raise ValueError(f"{path}: no array named {key!r} (has: {', '.join(map(str, names)) or 'nothing'})")
        return obj[key]
    if len(names) == 1:
        return obj[names[0]]
    for k in keys:
        if k in obj:
            return obj[k]
    raise ValueError(
        f"{path}: holds several arrays ({', '.join(map(str, names))}); say which {what} with key= (one of the names)"
    )


def _declared_bytes(f: IO[bytes], size: int, source: str) -> int:
    """Bytes of the array a ``.npy`` stream of ``size`` bytes declares in its header (shape x item size), or
    ``size`` for a stream that is no ``.npy`` array. numpy allocates the declared array before reading it, so a
    header declaring more than the stream holds is refused here (a 100-byte file could ask for terabytes)."""
    if f.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
        return size
    f.seek(0)
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read_header(f)
    declared = math.prod(shape) * dtype.itemsize
    if declared > size - f.tell():
        raise ValueError(
            f"{source}: the header declares an array of shape {list(shape)} ({declared} bytes of {dtype}) but the "
            f"file holds {size - f.tell()} bytes of data; the file is truncated or damaged"
        )
    return declared


def _check_read_limit(p: Path, what: str) -> None:
    """Refuse, before numpy or torch reads anything, a file that is not regular or over the read limit: a ``.npy``
    by the array its header declares, a zip (``.npz``, ``.pt``) by the sum of its members' uncompressed sizes
    (zipfile never inflates a member past its recorded size, so a zip bomb is refused without decompressing)."""
    size, limit = regular_file_size(p, f"{what} file"), max_read_bytes()
    with open(p, "rb") as f:
        is_zip = f.read(4) in (b"PK\x03\x04", b"PK\x05\x06")  # numpy's and torch's test: a zip's first bytes
    if is_zip:
        with zipfile.ZipFile(p) as z:
            members = z.infolist()
            total = sum(m.file_size for m in members)
            if total > limit:
                raise over_read_limit(f"its {len(members)} members expand to {total} bytes", limit, str(p))
            for m in members:
                with z.open(m) as f:
                    _declared_bytes(f, m.file_size, f"{p} (member {m.filename})")
    else:
        with open(p, "rb") as f:
            declared = _declared_bytes(f, size, str(p))
        if declared > limit:
            raise over_read_limit(f"its array holds {declared} bytes", limit, str(p))


def _load_array(path: str | os.PathLike, key: str | None, keys: Sequence[str], what: str) -> np.ndarray:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    suffix = p.suffix.lower()
    try:
        _check_read_limit(p, what)
        if suffix == ".npy":
            return np.load(p, allow_pickle=False)
        if suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                return np.asarray(_pick(dict(z.items()), keys, key, str(p), what))
        if suffix in (".pt", ".pth"):
            obj = torch.load(p, map_location="cpu", weights_only=True)
            if isinstance(obj, Mapping):
                obj = _pick(obj, keys, key, str(p), what)
            if isinstance(obj, (list, tuple)) and obj and hasattr(obj[0], "detach"):
                obj = torch.cat([o.reshape(-1, *o.shape[-1:]) if o.ndim else o.reshape(1) for o in obj])
            return to_numpy(obj)
    except (ValueError, OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        # refused pickles too; the read limit's and the header's errors name the file already
        if isinstance(err, ValueError) and str(err).startswith(str(p)):
            raise
        raise ValueError(f"{p}: cannot read {what} ({type(err).__name__}: {err})") from err
    raise ValueError(f"{p}: unsupported {what} file type {suffix or '(none)'!r}; expected .npy, .npz or .pt")


def load_probabilities(path: str | os.PathLike, *, key: str | None = None) -> np.ndarray:
    """Saved probabilities ``[B, N]`` (node or leaf) from ``.npy``, ``.npz`` or ``.pt`` (tensor or dict of tensors).

    Args:
        path: the file.
        key: the array to take from an ``.npz`` or a ``.pt`` dict (default: the only one, or the first of
            ``probs``, ``node_probs``, ``probabilities``, ``leaf_probs``, ``scores``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: unknown format, unreadable file, ambiguous key, not a 2-D float array, or empty.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); f = os.path.join(d, "p.npy")
        >>> np.save(f, np.eye(2, dtype=np.float32))
        >>> load_probabilities(f).shape
        (2, 2)
    """
    arr = _load_array(path, key, _ARRAY_KEYS, "probabilities")
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{path}: probabilities must be numeric; got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{path}: probabilities must be a 2-D array [samples, nodes]; got shape {list(arr.shape)}")
    if arr.size == 0:
        raise ValueError(f"{path}: holds no probabilities (shape {list(arr.shape)}); expected [samples, nodes]")
    return arr


def load_labels(
    path: str | os.PathLike, taxonomy: Taxonomy, *, key: str | None = None, column: str | int | None = None
) -> np.ndarray:
    """Labels as node ids ``[B]`` (``-1`` = ignore) from a saved array or a text file.

    * ``.npy`` / ``.npz`` / ``.pt``: integer node ids (or an array of node-name strings).
    * any other file: one label per line, as a node name, a label path (``animal/cat``, also ``>`` or ``|``
      separated; every step must be a parent-child chain) or a node id (``-1`` = ignore), read by
      :class:`hiercls.data.LabelEncoder` with ``label_format="auto"``. ``.csv`` / ``.tsv`` files take the
      column named ``label`` (or ``column``), else the last one. Blank lines and lines starting with ``#`` are
      skipped.

    Raises:
        FileNotFoundError: no such file.
        TaxonomyError: an unknown label, naming the file and line.
        ValueError: an id out of range, a malformed array, or no labels at all.

    Example:
        >>> import tempfile, os
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> f = os.path.join(tempfile.mkdtemp(), "labels.txt")
        >>> _ = open(f, "w").write("x\\na/y\\nb\\n")
        >>> load_labels(f, tax).tolist()
        [2, 3, 4]
    """
    p = Path(path)
    if not p.exists():  # a FIFO or a device is refused by name below, not called missing
        raise FileNotFoundError(f"{p}: no such file")
    if p.suffix.lower() in (".npy", ".npz", ".pt", ".pth"):
        arr = _load_array(p, key, _LABEL_KEYS, "labels").ravel()
        if arr.size == 0:
            raise ValueError(f"{p}: holds no labels (an empty array)")
        return label_ids(arr, taxonomy, source=str(p))
    text = read_text(p, "label file")
    rows = _csv_rows(p, text, column) if p.suffix.lower() in (".csv", ".tsv") else _line_rows(text)
    if not rows:
        raise ValueError(f"{p}: no labels (the file is empty or holds only blank and '#' comment lines)")
    encoder = LabelEncoder(taxonomy)
    return np.array([_encode(encoder, label, str(p), line) for line, label in rows], dtype=np.int64)


def label_ids(labels: Any, taxonomy: Taxonomy, *, source: str = "labels") -> np.ndarray:
    """Node ids ``[B]`` (``-1`` = ignore) from an array or list of node ids, or of node names / label paths.

    Raises:
        TaxonomyError: an unknown label name (``source`` named).
        ValueError: node sets or another shape than ``[B]``, non-integer ids, or an id outside the taxonomy.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> label_ids(["x", "a/y", "b"], tax).tolist(), label_ids(np.array([2, -1]), tax).tolist()
        ([2, 3, 4], [2, -1])
    """
    arr = np.asarray(to_numpy(labels))
    if arr.ndim != 1:
        raise ValueError(f"{source} must be one node id or name per sample [B]; got shape {list(arr.shape)}")
    if arr.dtype.kind in "US":
        encoder = LabelEncoder(taxonomy)
        return np.array([_encode(encoder, str(name), source, None) for name in arr.tolist()], dtype=np.int64)
    if np.issubdtype(arr.dtype, np.floating) and np.all(arr == np.round(arr)):  # ids saved as floats (np.savetxt)
        arr = arr.astype(np.int64)
    return node_id_array(arr, taxonomy, name=source, allow_ignore=True)


def _line_rows(text: str) -> list[tuple[int, str]]:
    """``(line number, label)`` of the lines that are neither blank nor ``#`` comments."""
    rows = [(i, line.strip()) for i, line in enumerate(text.splitlines(), start=1)]
    return [(i, s) for i, s in rows if s and not s.startswith("#")]


def _csv_rows(p: Path, text: str, column: str | int | None) -> list[tuple[int, str]]:
    """``(line number, label)`` of a CSV/TSV file's label column (``column``, else ``label``, else the last)."""
    reader = list(csv.reader(io.StringIO(text), delimiter="\t" if p.suffix.lower() == ".tsv" else ","))
    col = column if isinstance(column, int) else -1
    start = 0
    if reader:
        header = [h.strip() for h in reader[0]]
        wanted = column if isinstance(column, str) else "label"
        if wanted in header:
            col, start = header.index(wanted), 1
        elif isinstance(column, str):
            raise ValueError(f"{p}: no column {column!r} in header {header}")
    rows: list[tuple[int, str]] = []
    for i, fields in enumerate(reader[start:], start=start + 1):
        if not fields or not "".join(fields).strip() or fields[0].startswith("#"):
            continue
        if not -len(fields) <= col < len(fields):
            raise TaxonomyError(f"row has {len(fields)} fields, no column {col}", source=str(p), line=i)
        rows.append((i, fields[col].strip()))
    return rows


def _encode(encoder: LabelEncoder, label: str, source: str, line: int | None) -> int:
    if label.strip() == "-1":  # the ignore label
        return -1
    return encoder.encode(label, "auto", source=source, line=line)

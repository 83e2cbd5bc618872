"""Text datasets: CSV / JSONL files with a text column and a label column (path, name or node id)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from hiercls._textio import TextFileError, decode_text
from hiercls.data.labels import LabelEncoder, LabelFormat
from hiercls.taxonomy import Taxonomy, TaxonomyError

logger = logging.getLogger(__name__)

__all__ = ["HierTextDataset"]


class HierTextDataset(Dataset):
    """``(text, node_id)`` pairs for a taxonomy.

    Args:
        texts: the texts.
        targets: node id of each text's label.
        taxonomy: the taxonomy the ids refer to.

    Example:
        >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("root", "car")])
        >>> ds = HierTextDataset(["a purring pet", "a vehicle"], [2, 3], tax)
        >>> ds[1]
        ('a vehicle', 3)
    """

    def __init__(
        self,
        texts: Sequence[str],
        targets: Sequence[int] | np.ndarray,
        taxonomy: Taxonomy,
        *,
        source: str | None = None,
    ) -> None:
        if len(texts) != len(targets):
            raise ValueError(f"texts has {len(texts)} entries but targets has {len(targets)}")
        self.texts = list(texts)
        self.targets = np.asarray(targets, dtype=np.int64)
        if self.targets.size and (self.targets.min() < -1 or self.targets.max() >= taxonomy.num_nodes):
            bad = int(self.targets[(self.targets < -1) | (self.targets >= taxonomy.num_nodes)][0])
            raise TaxonomyError(
                f"target {bad} is not a node id of taxonomy {taxonomy.name!r} "
                f"([0, {taxonomy.num_nodes}), or -1 to ignore)",
                source=source,
                label=str(bad),
            )
        self.taxonomy = taxonomy
        self.source = source

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.texts[index], int(self.targets[index])

    def subset(self, indices: Iterable[int]) -> HierTextDataset:
        """A new dataset with the samples at ``indices``."""
        idx = np.asarray(list(indices), dtype=np.int64)
        return HierTextDataset([self.texts[i] for i in idx], self.targets[idx], self.taxonomy, source=self.source)

    # ------------------------------------------------------------------ readers
    @classmethod
    def from_csv(
        cls,
        path: str | os.PathLike[str],
        text_column: str,
        label_column: str,
        taxonomy: Taxonomy,
        *,
        label_format: LabelFormat = "path",
        separator: str = "/",
        delimiter: str = ",",
        encoding: str = "utf-8",
    ) -> HierTextDataset:
        """Read a CSV (or TSV with ``delimiter="\\t"``) file with a header row.

        Args:
            path: the file.
            text_column: header of the text column.
            label_column: header of the label column.
            taxonomy: the taxonomy labels refer to.
            label_format: ``"path"`` (``animal/cat``, with ``separator``), ``"name"`` or ``"id"``.
            separator: separator of label paths.
            delimiter: field delimiter.
            encoding: text encoding.

        Raises:
            FileNotFoundError: no such file.
            ValueError: a missing column, a row with the wrong number of fields or an empty text/label
                (the message names the file and line).
            TaxonomyError: an unknown label (file, line and label named).

        Example:
            >>> import tempfile
            >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("root", "car")])
            >>> p = Path(tempfile.mkdtemp()) / "d.csv"
            >>> _ = p.write_text('text,label\\n"meows, purrs",animal/cat\\nhonks,car\\n')
            >>> HierTextDataset.from_csv(p, "text", "label", tax).targets.tolist()
            [2, 3]
        """
        path = Path(path)
        src = str(path)
        encoder = LabelEncoder(taxonomy, separator=separator)
        texts: list[str] = []
        targets: list[int] = []
        with _open(path, encoding) as f:
            reader = csv.reader(f, delimiter=delimiter)
            try:
                header = next(reader)
            except StopIteration:
                raise ValueError(
                    f"{src}: empty file (expected a header row with {text_column!r} and {label_column!r})"
                ) from None
            except csv.Error as err:
                raise ValueError(f"{src}:1: malformed CSV header: {err}") from None
            header = [h.strip().lstrip("\ufeff") for h in header]
            for col in (text_column, label_column):
                if col not in header:
                    raise ValueError(f"{src}:1: no column {col!r} in the header (columns: {', '.join(header)})")
            ti, li = header.index(text_column), header.index(label_column)
            start = 1
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as err:
                    raise ValueError(f"{src}:{reader.line_num}: malformed CSV: {err}") from None
                line, start = start + 1, reader.line_num  # a quoted field may span lines: report the first
                if not row or all(not c.strip() for c in row):
                    continue  # blank line
                if len(row) != len(header):
                    raise ValueError(f"{src}:{line}: {len(row)} fields but the header has {len(header)}")
                text, label = row[ti], row[li].strip()
                _check_text_label(text, label, src, line, text_column, label_column)
                targets.append(encoder.encode(label, label_format, source=src, line=line))
                texts.append(text)
        _check_not_empty(texts, src)
        return cls(texts, targets, taxonomy, source=src)

    @classmethod
    def from_jsonl(
        cls,
        path: str | os.PathLike[str],
        text_column: str,
        label_column: str,
        taxonomy: Taxonomy,
        *,
        label_format: LabelFormat = "path",
        separator: str = "/",
        encoding: str = "utf-8",
    ) -> HierTextDataset:
        """Read a JSON-lines file: one object per line with ``text_column`` and ``label_column`` keys.

        A label may also be a list of names (``["animal", "cat"]``) when ``label_format="path"``.

        Raises:
            FileNotFoundError: no such file.
            ValueError: invalid JSON, a line that is not an object, a missing key, an empty text/label
                (file and line named).
            TaxonomyError: an unknown label (file, line and label named).

        Example:
            >>> import tempfile
            >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("root", "car")])
            >>> p = Path(tempfile.mkdtemp()) / "d.jsonl"
            >>> _ = p.write_text('{"t": "meows", "y": ["animal", "cat"]}\\n{"t": "honks", "y": "car"}\\n')
            >>> HierTextDataset.from_jsonl(p, "t", "y", tax).targets.tolist()
            [2, 3]
        """
        path = Path(path)
        src = str(path)
        encoder = LabelEncoder(taxonomy, separator=separator)
        texts: list[str] = []
        targets: list[int] = []
        with _open(path, encoding) as f:
            for line, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{src}:{line}: invalid JSON ({err.msg} at column {err.colno})") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"{src}:{line}: expected a JSON object, got {type(obj).__name__}")
                for col in (text_column, label_column):
                    if col not in obj:
                        raise ValueError(f"{src}:{line}: no key {col!r} (keys: {', '.join(map(str, obj))})")
                text, label = obj[text_column], obj[label_column]
                if not isinstance(text, str):
                    raise ValueError(f"{src}:{line}: {text_column!r} must be a string, got {type(text).__name__}")
                if isinstance(label, list):
                    if label_format != "path" or not all(isinstance(x, str) for x in label):
                        raise ValueError(
                            f"{src}:{line}: a list label needs label_format='path' and string items; got {label!r}"
                        )
                    label = separator.join(label)
                elif isinstance(label, bool) or not isinstance(label, (str, int)):
                    raise ValueError(
                        f"{src}:{line}: {label_column!r} must be a string or an integer, got {type(label).__name__}"
                    )
                if isinstance(label, int) and label_format != "id":
                    label = str(label)
                _check_text_label(text, str(label).strip(), src, line, text_column, label_column)
                targets.append(encoder.encode(label, label_format, source=src, line=line))
                texts.append(text)
        _check_not_empty(texts, src)
        return cls(texts, targets, taxonomy, source=src)


def _open(path: Path, encoding: str) -> Any:
    """The file's text as a stream (``newline=""`` for csv); a wrong encoding names the file, line and offset."""
    if not path.is_file():
        raise FileNotFoundError(f"text dataset file {str(path)!r} does not exist")
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise ValueError(f"{path}: corrupt gzip file ({err})") from None
    if encoding.lower().replace("-", "").replace("_", "") in ("utf8", "utf8sig"):
        text = decode_text(data, str(path), "text dataset file")
    else:
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as err:
            line = data.count(b"\n", 0, err.start) + 1
            raise TextFileError(
                f"not {encoding} text: byte 0x{data[err.start]:02x} at offset {err.start} cannot be decoded; "
                "pass the file's encoding= (or re-encode it as UTF-8)",
                source=str(path),
                line=line,
            ) from None
    return io.StringIO(text, newline="")


def _check_text_label(text: str, label: str, src: str, line: int, text_column: str, label_column: str) -> None:
    if not text.strip():
        raise ValueError(f"{src}:{line}: empty text in column {text_column!r}")
    if not label:
        raise ValueError(f"{src}:{line}: empty label in column {label_column!r}")


def _check_not_empty(texts: list[str], src: str) -> None:
    if not texts:
        raise ValueError(f"{src}: no samples (the file has no data rows)")
    logger.info("%s: %d samples", src, len(texts))

"""Text datasets: CSV / JSONL files with a text column and a label column (path, name or node id), or a label
set column (any number of labels per row) for multi-label hierarchical text classification."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from hiercls._checks import check_choice
from hiercls._textio import TextFileError, decode_text, read_bytes
from hiercls.data.labels import LabelEncoder, LabelFormat
from hiercls.taxonomy import Taxonomy, TaxonomyError

logger = logging.getLogger(__name__)

__all__ = ["HierTextDataset", "TextRow", "raise_csv_field_limit", "read_text_rows", "text_rows"]


class HierTextDataset(Dataset):
    """``(text, node_id)`` pairs for a taxonomy, or ``(text, multi-hot [N])`` pairs for label sets.

    Args:
        texts: the texts.
        targets: node id of each text's label; with ``multilabel=True`` a collection of node ids per text
            (its label set, any number of labels).
        taxonomy: the taxonomy the ids refer to.
        multilabel: each target is a label set; items are then ``(text, y)`` with ``y`` the ancestor-closed
            0/1 float tensor ``[N]`` of the set (:meth:`LabelEncoder.multi_hot`), which the models' collate
            stacks into ``[B, N]``.
        source: where the data came from (named in errors).

    Example:
        >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("root", "car")])
        >>> ds = HierTextDataset(["a purring pet", "a vehicle"], [2, 3], tax)
        >>> ds[1]
        ('a vehicle', 3)
        >>> ml = HierTextDataset(["a cat in a car"], [[2, 3]], tax, multilabel=True)
        >>> ml[0][1].int().tolist(), ml.label_sets[0].tolist()
        ([1, 1, 1, 1], [2, 3])
    """

    def __init__(
        self,
        texts: Sequence[str],
        targets: Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
        taxonomy: Taxonomy,
        *,
        multilabel: bool = False,
        source: str | None = None,
    ) -> None:
        if len(texts) != len(targets):
            raise ValueError(f"texts has {len(texts)} entries but targets has {len(targets)}")
        self.texts = list(texts)
        self.taxonomy = taxonomy
        self.source = source
        self.multilabel = bool(multilabel)
        self.label_sets: list[np.ndarray] = []
        if self.multilabel:
            for i, t in enumerate(targets):
                ids = np.asarray(t, dtype=np.int64).reshape(-1)
                if ids.size == 0 or ids.min() < 0 or ids.max() >= taxonomy.num_nodes:
                    raise TaxonomyError(
                        f"label set {ids.tolist()} of sample {i} is empty or has ids outside "
                        f"[0, {taxonomy.num_nodes}) of taxonomy {taxonomy.name!r}",
                        source=source,
                        label=str(ids.tolist()),
                    )
                self.label_sets.append(ids)
            # One node per sample for code that wants a single label (samplers, summaries): the first label.
            self.targets = np.asarray([s[0] for s in self.label_sets], dtype=np.int64)
            self._encoder = LabelEncoder(taxonomy)
            return
        self.targets = np.asarray(targets, dtype=np.int64)
        if self.targets.ndim != 1:
            raise ValueError(
                f"targets must be one node id per text; got shape {list(self.targets.shape)} "
                "(pass multilabel=True for label sets)"
            )
        if self.targets.size and (self.targets.min() < -1 or self.targets.max() >= taxonomy.num_nodes):
            bad = int(self.targets[(self.targets < -1) | (self.targets >= taxonomy.num_nodes)][0])
            raise TaxonomyError(
                f"target {bad} is not a node id of taxonomy {taxonomy.name!r} "
                f"([0, {taxonomy.num_nodes}), or -1 to ignore)",
                source=source,
                label=str(bad),
            )

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[str, Any]:
        if self.multilabel:
            return self.texts[index], self._encoder.multi_hot([self.label_sets[index]])[0]
        return self.texts[index], int(self.targets[index])

    def subset(self, indices: Iterable[int]) -> HierTextDataset:
        """A new dataset with the samples at ``indices``."""
        idx = np.asarray(list(indices), dtype=np.int64)
        targets: Any = [self.label_sets[i] for i in idx] if self.multilabel else self.targets[idx]
        return HierTextDataset(
            [self.texts[i] for i in idx], targets, self.taxonomy, multilabel=self.multilabel, source=self.source
        )

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
        multilabel: bool = False,
        label_set_separator: str = "|",
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
            multilabel: the label cell holds a label *set*: any number of labels separated by
                ``label_set_separator`` (``CCAT/C15|ECAT/E11``); items are multi-hot (see the class).
            label_set_separator: separator between the labels of a set (default ``|``; it must differ from
                ``separator`` and from ``delimiter``).

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
            >>> _ = p.write_text('text,labels\\na cat in a car,animal/cat|car\\n')
            >>> HierTextDataset.from_csv(p, "text", "labels", tax, multilabel=True).label_sets[0].tolist()
            [2, 3]
        """
        path = Path(path)
        src = str(path)
        encoder = LabelEncoder(taxonomy, separator=separator)
        if multilabel and label_set_separator == delimiter:
            raise ValueError(f"label_set_separator {label_set_separator!r} must differ from the delimiter")
        texts: list[str] = []
        targets: list[Any] = []
        with _open(path, encoding) as f:
            raise_csv_field_limit(len(f.getvalue()))
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
                if multilabel:
                    targets.append(
                        encoder.encode_set(
                            label, label_format, set_separator=label_set_separator, source=src, line=line
                        )
                    )
                else:
                    targets.append(encoder.encode(label, label_format, source=src, line=line))
                texts.append(text)
        _check_not_empty(texts, src)
        return cls(texts, targets, taxonomy, multilabel=multilabel, source=src)

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
        multilabel: bool = False,
    ) -> HierTextDataset:
        """Read a JSON-lines file: one object per line with ``text_column`` and ``label_column`` keys.

        A label may also be a list of names (``["animal", "cat"]``) when ``label_format="path"``. With
        ``multilabel=True`` the label is a *set*: a list of labels (``["CCAT/C15", "ECAT/E11"]``; an item may
        itself be a list of names, a path) or a single label; items are then multi-hot (see the class).

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
            >>> _ = p.write_text('{"t": "a cat in a car", "y": ["animal/cat", "car"]}\\n')
            >>> HierTextDataset.from_jsonl(p, "t", "y", tax, multilabel=True).label_sets[0].tolist()
            [2, 3]
        """
        path = Path(path)
        with _open(path, encoding) as f:
            return cls.from_records(
                _json_objects(f, str(path)),
                text_column,
                label_column,
                taxonomy,
                source=str(path),
                label_format=label_format,
                separator=separator,
                multilabel=multilabel,
            )

    @classmethod
    def from_records(
        cls,
        records: Iterable[tuple[int, Mapping[str, Any]]],
        text_column: str,
        label_column: str,
        taxonomy: Taxonomy,
        *,
        source: str,
        label_format: LabelFormat = "path",
        separator: str = "/",
        multilabel: bool = False,
    ) -> HierTextDataset:
        """Rows ``(line or row number, mapping)`` read as :meth:`from_jsonl` reads its objects (the same checks;
        errors name ``source`` and the number).

        Example:
            >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("root", "car")])
            >>> rows = enumerate([{"t": "meows", "y": "animal/cat"}, {"t": "honks", "y": "car"}], start=1)
            >>> HierTextDataset.from_records(rows, "t", "y", tax, source="rows").targets.tolist()
            [2, 3]
        """
        src = source
        encoder = LabelEncoder(taxonomy, separator=separator)
        texts: list[str] = []
        targets: list[Any] = []
        for line, obj in records:
            for col in (text_column, label_column):
                if col not in obj:
                    raise ValueError(f"{src}:{line}: no key {col!r} (keys: {', '.join(map(str, obj))})")
            text, label = obj[text_column], obj[label_column]
            if not isinstance(text, str):
                raise ValueError(f"{src}:{line}: {text_column!r} must be a string, got {type(text).__name__}")
            if multilabel:
                if not text.strip():
                    raise ValueError(f"{src}:{line}: empty text in column {text_column!r}")
                if isinstance(label, list) and not label:
                    raise ValueError(f"{src}:{line}: empty label set in column {label_column!r}")
                targets.append(encoder.encode_set(label, label_format, source=src, line=line))
                texts.append(text)
                continue
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
        return cls(texts, targets, taxonomy, multilabel=multilabel, source=src)


def _open(path: Path, encoding: str) -> Any:
    """The file's text as a stream (``newline=""`` for csv); a wrong encoding names the file, line and offset."""
    if not path.exists():
        raise FileNotFoundError(f"text dataset file {str(path)!r} does not exist")
    data = read_bytes(path, "text dataset file", gunzip=path.suffix == ".gz")  # bounded; regular files only
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


def _json_objects(lines: Any, src: str, *, strict: bool = True) -> Any:
    """``(line number, object)`` for every non-blank line of a JSON-lines file; other values are errors (with
    ``strict=False`` their message takes the object's place)."""
    for line, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            obj = f"invalid JSON ({err.msg} at column {err.colno})"
        else:
            if not isinstance(obj, dict):
                obj = f"expected a JSON object, got {type(obj).__name__}"
        if isinstance(obj, str) and strict:
            raise ValueError(f"{src}:{line}: {obj}")
        yield line, obj


@dataclass(frozen=True)
class TextRow:
    """One record of an input file: the line it starts on, its text, and why it cannot be used (``""``: it can)."""

    line: int
    text: str
    problem: str = ""


def raise_csv_field_limit(size: int) -> None:
    """Let the csv module read a field as long as ``size`` characters (its default stops at 131,072): the limit
    follows the data, since no field is longer than the file holding it."""
    if csv.field_size_limit() <= size:
        csv.field_size_limit(min(size + 1, 2**31 - 1))  # C long on every platform


def text_rows(path: str | os.PathLike[str], text_column: str = "text", *, encoding: str = "utf-8") -> list[TextRow]:
    """Every record of a CSV (header row) or JSON-lines file, in file order, usable or not.

    A row whose number of fields is not the header's, a JSON line that is not an object or lacks the key, a
    text that is not a string or is empty: each is a :class:`TextRow` with its ``problem``, so that the caller
    refuses it or leaves it out with its line named. Blank lines are not records.

    Raises:
        FileNotFoundError: no such file. ValueError: the header lacks ``text_column``, or the CSV is malformed
            (an unclosed quote: no later row can be trusted); file and line named.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "t.csv"
        >>> _ = p.write_text("id,text\\n1,a cat\\n2\\n3,\\n")
        >>> [(r.line, r.text, r.problem) for r in text_rows(p)]
        [(2, 'a cat', ''), (3, '', '1 field but the header has 2'), (4, '', "empty text in column 'text'")]
    """
    path = Path(path)
    with _open(path, encoding) as f:
        if path.name.lower().endswith((".csv", ".csv.gz")):
            return _csv_rows(f, str(path), text_column)
        return [_json_row(line, obj, text_column) for line, obj in _json_objects(f, str(path), strict=False)]


def _csv_rows(f: Any, src: str, text_column: str) -> list[TextRow]:
    raise_csv_field_limit(len(f.getvalue()))
    reader = csv.reader(f)
    try:
        header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
    except csv.Error as err:
        raise ValueError(f"{src}:1: malformed CSV header: {err}") from None
    if text_column not in header:
        raise ValueError(f"{src}:1: no column {text_column!r} in the header (columns: {', '.join(header)})")
    col, rows, start = header.index(text_column), [], reader.line_num
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as err:
            raise ValueError(f"{src}:{reader.line_num}: malformed CSV: {err}") from None
        line, start = start + 1, reader.line_num  # a quoted field may span lines: the row's first line
        if not row:
            continue  # a blank line
        if len(row) != len(header):
            fields = f"{len(row)} field{'s' if len(row) != 1 else ''}"
            rows.append(TextRow(line, "", f"{fields} but the header has {len(header)}"))
        elif not row[col].strip():
            rows.append(TextRow(line, "", f"empty text in column {text_column!r}"))
        else:
            rows.append(TextRow(line, row[col].strip()))


def _json_row(line: int, obj: Any, text_column: str) -> TextRow:
    if isinstance(obj, str):  # _json_objects' message for a line it cannot read
        return TextRow(line, "", obj)
    if text_column not in obj:
        return TextRow(line, "", f"expected a JSON object with key {text_column!r}")
    text = obj[text_column]
    if not isinstance(text, str):
        return TextRow(line, "", f"{text_column!r} must be a string, got {type(text).__name__}")
    if not text.strip():
        return TextRow(line, "", f"empty text under key {text_column!r}")
    return TextRow(line, text.strip())


def read_text_rows(
    path: str | os.PathLike[str], text_column: str = "text", *, encoding: str = "utf-8", on_error: str = "fail"
) -> list[str]:
    """The ``text_column`` values of a CSV (header row) or JSON-lines file, in file order (:func:`text_rows`).

    For inputs without labels (``hiercls predict``). A record that cannot be used (a short row, an empty text)
    is an error naming its line; ``on_error="skip"`` leaves such records out (with a warning giving their number
    and the first of them).

    Raises:
        FileNotFoundError: no such file. ValueError: a missing column/key, invalid JSON, a short row, an empty or
            non-string text (file and line named), or no texts at all.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "t.jsonl"
        >>> _ = p.write_text('{"text": "a cat"}\\n\\n{"text": "a dog", "id": 2}\\n')
        >>> read_text_rows(p)
        ['a cat', 'a dog']
    """
    on_error = check_choice(on_error, ("fail", "skip"), "on_error")
    src, rows = str(path), text_rows(path, text_column, encoding=encoding)
    bad = [r for r in rows if r.problem]
    if bad and on_error == "fail":
        raise ValueError(f"{src}:{bad[0].line}: {bad[0].problem} (on_error='skip' leaves such rows out)")
    if bad:
        logger.warning(
            "%s: left out %d of %d rows; the first at line %d: %s",
            src,
            len(bad),
            len(rows),
            bad[0].line,
            bad[0].problem,
        )
    texts = [r.text for r in rows if not r.problem]
    _check_not_empty(texts, src)
    return texts

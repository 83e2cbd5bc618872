"""Labels -> node ids: names, label paths (``animal/cat``) or ids, and ancestor-closed multi-hot targets."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import torch

from hiercls.taxonomy import Taxonomy, TaxonomyError

LabelFormat = Literal["name", "path", "id", "auto"]

__all__ = ["PATH_SEPARATORS", "LabelEncoder", "LabelFormat"]

PATH_SEPARATORS = ("/", ">", "|")
"""Separators ``label_format="auto"`` recognises in a label path (``animal/cat``, ``animal > cat``)."""


class LabelEncoder:
    """Turn labels given against ``taxonomy`` into node ids and multi-hot targets.

    Args:
        taxonomy: the taxonomy labels refer to.
        separator: separator of label paths (``"animal/cat"``).

    A label *path* lists node names from the top down; the root may be included or left out, and a path may
    also be a tail of the full path (``cat``, ``animal/cat`` and ``root/animal/cat`` are the same node, since
    names are unique). Every step must be a child of the previous one. ``label_format="auto"`` takes a node
    name, else a label path (the encoder's separator or one of :data:`PATH_SEPARATORS`), else a node id. Errors
    are :class:`TaxonomyError` naming the label and, when given, where it came from (``source``/``line``).

    Example:
        >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("animal", "dog"), ("root", "car")])
        >>> enc = LabelEncoder(tax)
        >>> enc.encode("animal/cat", "path"), enc.encode("car"), enc.encode(3, "id")
        (2, 4, 3)
        >>> enc.encode("animal > dog", "auto"), enc.encode("4", "auto")
        (3, 4)
        >>> enc.multi_hot([[2], [1, 4]]).int().tolist()
        [[1, 1, 1, 0, 0], [1, 1, 0, 0, 1]]
    """

    def __init__(self, taxonomy: Taxonomy, *, separator: str = "/") -> None:
        if not isinstance(taxonomy, Taxonomy):
            raise TypeError(f"taxonomy must be a hiercls Taxonomy; got {type(taxonomy).__name__}")
        if not separator:
            raise ValueError("separator must be a non-empty string")
        self.taxonomy = taxonomy
        self.separator = separator

    def encode(
        self,
        label: str | int,
        label_format: LabelFormat = "name",
        *,
        source: str | None = None,
        line: int | None = None,
    ) -> int:
        """Node id of one label.

        Raises:
            TaxonomyError: unknown name, a path that does not follow the taxonomy's edges, an id out of range
                or a node that is not a class (``taxonomy.class_mask``).
        """
        tax = self.taxonomy
        if label_format == "id":
            node = self._parse_id(label, source, line)
        elif label_format == "name":
            node = self._lookup(str(label).strip(), source, line)
        elif label_format == "path":
            node = self._parse_path(str(label), source, line)
        elif label_format == "auto":
            node = self._parse_auto(label, source, line)
        else:
            raise ValueError(f"label_format must be 'name', 'path', 'id' or 'auto'; got {label_format!r}")
        if not tax.class_mask[node]:
            raise TaxonomyError(
                f"label {label!r} is node {tax.name_of(node)!r}, which is not a class of taxonomy {tax.name!r}",
                source=source,
                line=line,
                label=str(label),
            )
        return node

    def encode_set(
        self,
        labels: str | int | Sequence[Any],
        label_format: LabelFormat = "name",
        *,
        set_separator: str | None = None,
        source: str | None = None,
        line: int | None = None,
    ) -> list[int]:
        """Node ids of a label *set* (a multi-label sample), in first-seen order without repeats.

        Args:
            labels: a list of labels (each as :meth:`encode` takes it; with ``label_format="path"`` or ``"auto"``
                an item may also be a list of names, the path's components), or one string holding several labels
                separated by ``set_separator`` (a CSV cell such as ``"animal/cat|car"``), or a single label.
            label_format: the format of each label (see :meth:`encode`).
            set_separator: separator between the labels of a string; ``None`` reads the string as one label.
                It is split on first, so it must differ from the path separator (the encoder's
                ``separator``).
            source, line: where the labels came from (named in errors).

        Raises:
            TaxonomyError: an unknown label (named with ``source``/``line``), or an empty set.
            ValueError: ``set_separator`` equal to the path separator.

        Example:
            >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("animal", "dog"), ("root", "car")])
            >>> enc = LabelEncoder(tax)
            >>> enc.encode_set(["animal/cat", "car"], "path"), enc.encode_set("cat|car|cat", set_separator="|")
            ([2, 4], [2, 4])
            >>> enc.encode_set([["animal", "dog"], "car"], "path")
            [3, 4]
        """
        if set_separator is not None and (not set_separator or set_separator == self.separator):
            raise ValueError(
                f"set_separator must be a non-empty string other than the path separator {self.separator!r}; "
                f"got {set_separator!r}"
            )
        if isinstance(labels, str):
            items: list[Any] = labels.split(set_separator) if set_separator is not None else [labels]
        elif isinstance(labels, (int, np.integer)) and not isinstance(labels, bool):
            items = [labels]
        elif isinstance(labels, (list, tuple)):
            items = list(labels)
        else:
            raise TaxonomyError(
                f"a label set must be a list of labels or a string; got {type(labels).__name__}",
                source=source,
                line=line,
                label=str(labels),
            )
        out: dict[int, None] = {}
        for item in items:
            fmt = label_format
            if isinstance(item, (list, tuple)):
                if label_format not in ("path", "auto") or not all(isinstance(x, str) for x in item):
                    raise TaxonomyError(
                        f"label {item!r}: a list inside a label set is a path of names and needs "
                        "label_format='path' (or 'auto')",
                        source=source,
                        line=line,
                        label=str(item),
                    )
                item, fmt = self.separator.join(item), "path"
            elif isinstance(item, bool) or not isinstance(item, (str, int, np.integer)):
                raise TaxonomyError(
                    f"label {item!r} in a label set must be a string or an integer, not {type(item).__name__}",
                    source=source,
                    line=line,
                    label=str(item),
                )
            if isinstance(item, str) and not item.strip():
                raise TaxonomyError(
                    f"empty label in the label set {labels!r}", source=source, line=line, label=str(labels)
                )
            out.setdefault(self.encode(item, fmt, source=source, line=line), None)
        if not out:
            raise TaxonomyError("empty label set", source=source, line=line, label=str(labels))
        return list(out)

    def multi_hot(self, label_sets: Sequence[Iterable[int]]) -> torch.Tensor:
        """Ancestor-closed ``[B, N]`` float 0/1 targets from node-id sets (a sample with several labels).

        Raises:
            TaxonomyError: an id out of range.
        """
        n = self.taxonomy.num_nodes
        rows, cols = [], []
        for b, nodes in enumerate(label_sets):
            for node in nodes:
                if not 0 <= int(node) < n:
                    raise TaxonomyError(f"node id {node} of sample {b} is out of range [0, {n})", label=str(node))
                rows.append(b)
                cols.append(int(node))
        out = np.zeros((len(label_sets), n), dtype=np.float32)
        if rows:
            anc = self.taxonomy.ancestors_sparse[cols]  # closes each label under its ancestors
            r = np.repeat(np.asarray(rows), np.diff(anc.indptr))
            out[r, anc.indices] = 1.0
        return torch.from_numpy(out)

    def path_of(self, node: int) -> str:
        """The label path (root left out) of ``node``, the inverse of ``encode(..., "path")`` on trees."""
        ids = self.taxonomy.path(int(node))
        return self.separator.join(self.taxonomy.name_of(i) for i in ids[1:]) or self.taxonomy.name_of(0)

    # ------------------------------------------------------------------ parsing
    def _lookup(self, name: str, source: str | None, line: int | None) -> int:
        try:
            return self.taxonomy.index(name)
        except TaxonomyError as err:  # re-raised with the location of the label
            raise TaxonomyError(err.reason, source=source, line=line, label=name) from None

    def _parse_id(self, label: str | int, source: str | None, line: int | None) -> int:
        try:
            node = int(str(label).strip()) if not isinstance(label, (int, np.integer)) else int(label)
        except ValueError:
            raise TaxonomyError(
                f"label {label!r} is not an integer node id", source=source, line=line, label=str(label)
            ) from None
        if not 0 <= node < self.taxonomy.num_nodes:
            raise TaxonomyError(
                f"node id {node} is out of range [0, {self.taxonomy.num_nodes}) for taxonomy {self.taxonomy.name!r}",
                source=source,
                line=line,
                label=str(label),
            )
        return node

    def _parse_auto(self, label: str | int, source: str | None, line: int | None) -> int:
        if isinstance(label, (int, np.integer)):
            return self._parse_id(label, source, line)
        text = str(label).strip()
        if text in self.taxonomy:
            return self.taxonomy.index(text)
        for sep in (self.separator, *PATH_SEPARATORS):
            if sep in text:
                return self._parse_path(text, source, line, sep)
        if text.isdigit():
            return self._parse_id(text, source, line)
        return self._lookup(text, source, line)  # raises, with close-name suggestions

    def _parse_path(self, label: str, source: str | None, line: int | None, separator: str | None = None) -> int:
        tax = self.taxonomy
        sep = separator or self.separator
        parts = [p.strip() for p in label.strip().strip(sep).split(sep)]
        if not parts or any(not p for p in parts):
            raise TaxonomyError(f"label path {label!r} has an empty component", source=source, line=line, label=label)
        ids = [self._lookup(p, source, line) for p in parts]
        for a, b in itertools.pairwise(ids):
            if a not in tax.parents(b):
                raise TaxonomyError(
                    f"label path {label!r}: {tax.name_of(b)!r} is not a child of {tax.name_of(a)!r}",
                    source=source,
                    line=line,
                    label=label,
                )
        return ids[-1]

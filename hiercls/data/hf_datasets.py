"""Text data sets from local Hugging Face ``datasets`` files: Parquet, Arrow, or a ``save_to_disk`` folder.

The ``hf_datasets`` data set kind (``data.dataset: hf_datasets``) reads one split's file with the ``datasets``
package (an optional dependency, imported when such a data set is built) and labels its rows as
:meth:`hiercls.data.HierTextDataset.from_jsonl` labels its objects (node names, label paths, ids or label sets).
Nothing is downloaded: the files are local.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hiercls.data.labels import LabelFormat
from hiercls.data.text import HierTextDataset
from hiercls.taxonomy import Taxonomy

__all__ = ["hf_text_dataset", "load_hf_table"]


def load_hf_table(path: str | os.PathLike[str], split: str | None = None) -> Any:
    """A ``datasets.Dataset`` of a local ``.parquet`` or ``.arrow`` file, or of a ``save_to_disk`` folder (a
    ``DatasetDict`` folder gives its ``split``).

    Raises:
        FileNotFoundError: no such file or folder.
        ImportError: the ``datasets`` package is not installed.
        ValueError: another file type, or a split the folder does not hold.
    """
    try:
        import datasets  # optional dependency: only this data set kind needs it
    except ImportError as err:
        raise ImportError(
            f"data.dataset 'hf_datasets' needs the 'datasets' package (pip install datasets): {err}"
        ) from err

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"data.options: {str(p)!r} does not exist")
    if p.is_dir():
        table = datasets.load_from_disk(str(p))
        if isinstance(table, datasets.DatasetDict):
            if split not in table:
                raise ValueError(f"data.options: {str(p)!r} holds splits {sorted(table)}, not {split!r}")
            table = table[split]
        return table
    if p.suffix == ".parquet":
        # Read by pyarrow (a dependency of datasets) into memory: Dataset.from_parquet would write a cache copy.
        import pyarrow.parquet

        return datasets.Dataset(datasets.table.InMemoryTable(pyarrow.parquet.read_table(str(p))))
    if p.suffix == ".arrow":
        return datasets.Dataset.from_file(str(p), in_memory=True)
    raise ValueError(f"data.options: {str(p)!r}: expected a .parquet or .arrow file or a save_to_disk folder")


def hf_text_dataset(
    path: str | os.PathLike[str],
    text_column: str,
    label_column: str,
    taxonomy: Taxonomy,
    *,
    split: str | None = None,
    label_format: LabelFormat = "path",
    separator: str = "/",
    multilabel: bool = False,
) -> HierTextDataset:
    """The rows of a local Parquet/Arrow table as a :class:`HierTextDataset` (errors name the file and row).

    Raises:
        ValueError: a missing column (naming the columns there), or a row as :meth:`HierTextDataset.from_jsonl`
            refuses it (file and 1-based row named).
    """
    table = load_hf_table(path, split)
    for col in (text_column, label_column):
        if col not in table.column_names:
            raise ValueError(f"{path}: no column {col!r} (columns: {', '.join(table.column_names)})")
    rows = table.select_columns([text_column, label_column])
    return HierTextDataset.from_records(
        enumerate(rows, start=1),
        text_column,
        label_column,
        taxonomy,
        source=str(path),
        label_format=label_format,
        separator=separator,
        multilabel=multilabel,
    )

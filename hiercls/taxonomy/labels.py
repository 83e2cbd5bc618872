"""Node ids from what users pass for nodes: ids or names, in NumPy arrays, torch tensors or lists.

The one conversion behind every place that takes nodes (the metrics' labels and ``labels=``, the decoders'
candidates and predictions, the conformal calibrators' labels, label files): names are looked up in one dict,
ids are checked against the taxonomy, and an error names the parameter, the position and the value (with close
names for an unknown one).

Example:
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("r", "b")])
    >>> node_id_array(["x", "b"], tax, name="labels").tolist()
    [2, 3]
    >>> node_id_array([2, -1], tax, name="y_true", allow_ignore=True, rows=2).tolist()
    [2, -1]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hiercls._checks import to_numpy
from hiercls.taxonomy.core import Taxonomy, TaxonomyError

__all__ = ["check_node_ids", "names_to_ids", "node_id_array", "unknown_label"]


def unknown_label(value: Any, taxonomy: Taxonomy, where: str) -> TaxonomyError:
    """The :class:`TaxonomyError` of :meth:`Taxonomy.index` for a label that is no node name (with close matches),
    prefixed by ``where``, its position."""
    text = str(value)
    try:
        taxonomy.index(text)
    except TaxonomyError as err:
        return TaxonomyError(f"{where}: {err.reason}", label=text)
    raise ValueError(f"{where}: {text!r} is a node name of taxonomy {taxonomy.name!r}")  # a caller's mistake


def names_to_ids(values: Sequence[Any] | np.ndarray, taxonomy: Taxonomy, name: str) -> np.ndarray:
    """Node ids of node names (:meth:`Taxonomy.ids`, one dict look-up each); an unknown label raises
    :class:`TaxonomyError` naming its position (``name[i]``) and close matches."""
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    try:
        return taxonomy.ids(seq)
    except (TaxonomyError, TypeError):
        pass
    for i, v in enumerate(seq):  # a label that is no name (or no str): name the first one
        if str(v) not in taxonomy:
            raise unknown_label(v, taxonomy, f"{name}[{i}]")
    return taxonomy.ids([str(v) for v in seq])  # names given as other objects


def check_node_ids(ids: np.ndarray, taxonomy: Taxonomy, name: str, *, allow_ignore: bool = False) -> np.ndarray:
    """``ids`` (int64) when every one is a node id of ``taxonomy`` (or ``-1`` with ``allow_ignore``).

    Raises:
        TaxonomyError: (a ``ValueError``) naming the first bad entry, ``name[i] = value``, and the valid range.
    """
    n, low = taxonomy.num_nodes, -1 if allow_ignore else 0
    bad = (ids < low) | (ids >= n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        hint = " (-1 marks ignored samples only in the true labels)" if ids[i] == -1 else ""
        if hint and name == "preds":
            hint = hint[:-1] + "; update() takes (preds, target), the predictions first)"
        raise TaxonomyError(
            f"{name}[{i}] = {int(ids[i])} is not a node id of taxonomy {taxonomy.name!r}; expected "
            f"ids in [{low}, {n}){hint}"
        )
    return ids


def node_id_array(
    values: Any, taxonomy: Taxonomy, *, name: str, allow_ignore: bool = False, rows: int | None = None
) -> np.ndarray:
    """Node ids ``int64`` of ``values``: node ids or node names, as a NumPy array, a torch tensor (any device) or a
    list.

    Args:
        values: the nodes.
        taxonomy: the taxonomy they belong to.
        name: the parameter, for messages.
        allow_ignore: accept ``-1`` (a sample left out), kept in the result.
        rows: one node per sample of a batch of this size: ``values`` must then be ``[rows]``; without it any
            shape is read as a flat list of nodes.

    Raises:
        ValueError: another shape than ``[rows]``, or neither integers nor names.
        TaxonomyError: an unknown name or an id outside the taxonomy, naming its position.
    """
    arr = np.asarray(to_numpy(values, name=name))
    if rows is None:
        arr = arr.ravel()
    elif arr.shape != (rows,):
        raise ValueError(f"{name} must hold one node id or name per sample, shape [{rows}]; got {list(arr.shape)}")
    if arr.dtype.kind in "USO":
        return names_to_ids(arr, taxonomy, name)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integer node ids or node names; got dtype {arr.dtype}")
    return check_node_ids(arr.astype(np.int64, copy=False), taxonomy, name, allow_ignore=allow_ignore)

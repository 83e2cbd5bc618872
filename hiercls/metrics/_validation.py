"""Input conversion and checks shared by every metric.

Labels arrive as node ids ``[B]``, node names, ragged collections of ids/names (multi-label), or 0/1 node
sets ``[B, N]`` (numpy, torch on any device, or scipy sparse). They become a :class:`Labels` on the host: either
one node id per sample or an ancestor-closed boolean CSR matrix ``[B, N]``. Torch tensors are copied to the host
here (labels are small: ``B`` ids, or the sets' non-zeros); every metric then has one NumPy implementation. The
CSR form is what lets a million samples on a 21k-node taxonomy fit in memory (each row holds only the nodes of
the sample's label paths).
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeVar

import numpy as np
import scipy.sparse as sp
import torch

from hiercls._checks import check_choice, to_numpy
from hiercls.taxonomy import Taxonomy
from hiercls.taxonomy.core import check_taxonomy
from hiercls.taxonomy.labels import check_node_ids, names_to_ids, unknown_label

__all__ = ["Labels", "UndefinedMetricWarning", "prepare_pair", "to_labels"]

F = TypeVar("F", bound=Callable[..., Any])


class UndefinedMetricWarning(UserWarning):
    """A ratio was 0/0 and ``zero_division="warn"`` replaced it by 0 (as scikit-learn does)."""


def ancestors_int32(taxonomy: Taxonomy) -> sp.csr_matrix:
    """``ancestors_sparse`` as int32: products of int8 matrices overflow once 128 descendants are summed."""
    cache = taxonomy.namespace_cache(__name__)
    if "anc32" not in cache:
        cache["anc32"] = taxonomy.ancestors_sparse.astype(np.int32)
    return cache["anc32"]


@dataclass(frozen=True)
class Labels:
    """One batch of labels on the host: ``ids`` (one node per sample) or ``sets`` (closed CSR ``[B, N]``)."""

    ids: np.ndarray | None
    sets: sp.csr_matrix | None
    num_nodes: int

    def __len__(self) -> int:
        return len(self.ids) if self.ids is not None else self.sets.shape[0]

    @property
    def is_ids(self) -> bool:
        return self.ids is not None

    def as_sets(self, taxonomy: Taxonomy) -> sp.csr_matrix:
        """Ancestor-closed node sets (the rows of the ancestor matrix for id labels)."""
        if self.sets is not None:
            return self.sets
        return taxonomy.ancestors_sparse[self.ids].astype(bool)

    def select(self, mask: np.ndarray) -> Labels:
        if self.ids is not None:
            return Labels(self.ids[mask], None, self.num_nodes)
        return Labels(None, self.sets[np.flatnonzero(mask)], self.num_nodes)


def close_sets(sets: sp.csr_matrix, taxonomy: Taxonomy) -> sp.csr_matrix:
    """Add every ancestor (through all parents on a DAG) of every node in each row."""
    closed = (sets.astype(np.int32) @ ancestors_int32(taxonomy)).astype(bool).tocsr()
    closed.sort_indices()
    return closed


def nonempty(labels: Labels | np.ndarray) -> None:
    """Refuse a batch without samples (an empty input, or every ``y_true`` ignored)."""
    if len(labels) == 0:
        raise ValueError("no samples to score (empty input, or every y_true is -1)")


def _sparse_sets(m: Any, taxonomy: Taxonomy, name: str, close: bool) -> sp.csr_matrix:
    n = taxonomy.num_nodes
    m = sp.csr_matrix(m)
    if m.ndim != 2 or m.shape[1] != n:
        raise ValueError(
            f"{name} is a sparse matrix of shape {m.shape}; expected [B, {n}] node sets for "
            f"taxonomy {taxonomy.name!r} ({n} nodes)"
        )
    bad = ~np.isin(m.data, (0, 1))
    if bad.any():
        raise ValueError(f"{name} node sets must hold only 0/1 values; found {m.data[bad][0].item()!r}")
    m = m.astype(bool)
    m.eliminate_zeros()
    if close:
        return close_sets(m, taxonomy)
    m.sort_indices()
    return m


def _dense_sets(y: np.ndarray, name: str) -> sp.csr_matrix:
    """Boolean CSR of a dense 0/1 ``[B, N]`` array, checking that the non-zeros are ones.

    ``flatnonzero`` is an order of magnitude faster than the 2-D ``nonzero`` behind
    ``scipy.sparse.csr_matrix(dense)``, and only the non-zeros need checking.
    """
    b, n = y.shape
    y = np.ascontiguousarray(y)
    flat = np.flatnonzero(y)
    if y.dtype.kind != "b":
        bad = y.ravel()[flat] != 1
        if bad.any():
            r, c = divmod(int(flat[np.flatnonzero(bad)[0]]), n)
            raise ValueError(
                f"{name}[{r}, {c}] = {y[r, c].item()!r}; node sets must hold only 0/1 (threshold "
                "probabilities with a decoder first)"
            )
    rows, cols = np.divmod(flat, n)
    indptr = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=b), out=indptr[1:])
    return sp.csr_matrix((np.ones(len(cols), dtype=bool), cols, indptr), shape=(b, n))


def _ragged_ids(flat: list[Any], owner: np.ndarray, taxonomy: Taxonomy, name: str) -> np.ndarray:
    """Node ids of the members of ragged per-sample collections (``owner``: the sample of each member)."""
    values = np.asarray(flat) if flat else np.zeros(0, dtype=np.int64)
    if values.dtype.kind in "US":
        uniq, inverse = np.unique(values, return_inverse=True)
        unknown = [v for v in uniq.tolist() if v not in taxonomy]
        if unknown:
            raise unknown_label(unknown[0], taxonomy, f"{name}[{int(owner[np.flatnonzero(values == unknown[0])[0]])}]")
        return taxonomy.ids(uniq.tolist())[inverse.ravel()]
    if values.dtype.kind in "iu":
        ids = values.astype(np.int64)
        bad = (ids < 0) | (ids >= taxonomy.num_nodes)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{name}[{int(owner[j])}] contains node id {int(ids[j])}; expected ids in [0, {taxonomy.num_nodes}) "
                f"for taxonomy {taxonomy.name!r}"
            )
        return ids
    j = next(
        (j for j, v in enumerate(flat) if isinstance(v, bool | float) or not isinstance(v, numbers.Integral | str)), 0
    )
    raise TypeError(
        f"{name}[{int(owner[j])}] contains {flat[j]!r} ({type(flat[j]).__name__}); expected node "
        "names or ids (not a mix)"
    )


def _ragged_sets(rows: list[Any], taxonomy: Taxonomy, name: str) -> sp.csr_matrix:
    rows = [np.asarray(r).ravel().tolist() if isinstance(r, np.ndarray) else list(r) for r in rows]
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    flat = list(chain.from_iterable(rows))
    ids = _ragged_ids(flat, np.repeat(np.arange(len(rows)), lengths), taxonomy, name)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    m = sp.csr_matrix((np.ones(len(ids), dtype=bool), ids, indptr), shape=(len(rows), taxonomy.num_nodes))
    m.sum_duplicates()
    return m


def _nested(y: list[Any] | tuple[Any, ...], taxonomy: Taxonomy, name: str, close: bool) -> Labels | np.ndarray:
    """A list of per-sample collections (ragged node sets), of ``[N]`` 0/1 rows, or of scalars (an array)."""
    if not (len(y) and all(isinstance(r, list | tuple | set | frozenset | np.ndarray | torch.Tensor) for r in y)):
        return np.asarray(y)
    rows = [to_numpy(r, passthrough=True) for r in y]
    if all(not isinstance(r, set | frozenset) and len(r) == taxonomy.num_nodes for r in rows):
        dense = np.asarray(rows)  # every row has N entries: a [B, N] 0/1 node-set matrix written as nested lists
        if dense.ndim == 2 and dense.dtype.kind in "biuf":
            return dense
    m = _ragged_sets(rows, taxonomy, name)
    return Labels(None, close_sets(m, taxonomy) if close else m, taxonomy.num_nodes)


def _array_labels(y: np.ndarray, taxonomy: Taxonomy, name: str, close: bool, allow_ignore: bool) -> Labels:
    n = taxonomy.num_nodes
    if y.ndim == 1 and y.size == 0:
        y = y.astype(np.int64)  # an empty batch (np.asarray([]) is float)
    if y.ndim == 0:
        raise ValueError(f"{name} must have a batch dimension: [B] node ids or [B, {n}] node sets; got a scalar")
    if y.dtype.kind in "USO":
        if y.ndim != 1:
            raise ValueError(f"{name} holds names with shape {y.shape}; expected one name per sample, shape [B]")
        return Labels(names_to_ids(y, taxonomy, name), None, n)
    if y.ndim == 1:
        if y.dtype.kind in "iu":
            ids = check_node_ids(y.astype(np.int64, copy=False), taxonomy, name, allow_ignore=allow_ignore)
            return Labels(ids, None, n)
        if y.dtype.kind == "f" and y.size and np.array_equal(y, np.round(y)):
            raise TypeError(
                f"{name} has dtype {y.dtype}; node ids must be integers (cast with .long() / "
                ".astype(int)), node sets must be 2-D [B, N]"
            )
        raise TypeError(
            f"{name} has dtype {y.dtype} and shape {y.shape}; expected integer node ids [B] or [B, {n}] node sets"
        )
    if y.ndim == 2 and y.shape[1] == n:
        if y.dtype.kind not in "biuf":
            raise TypeError(f"{name} node sets have dtype {y.dtype}; expected bool or 0/1 numbers")
        m = _dense_sets(y, name)
        return Labels(None, close_sets(m, taxonomy) if close else m, n)
    hint = f" for taxonomy {taxonomy.name!r} ({n} nodes): is it the right taxonomy?" if y.ndim == 2 else ""
    raise ValueError(f"{name} has shape {tuple(y.shape)}; expected [B] node ids or [B, {n}] node sets{hint}")


def to_labels(y: Any, taxonomy: Taxonomy, *, name: str, close: bool = True, allow_ignore: bool = False) -> Labels:
    """Convert ``y`` to host :class:`Labels`, validating shape, dtype, ids and names.

    Torch tensors (on any device) are copied to the host: the labels of a batch are small next to what scored
    them, and every metric has one NumPy implementation.

    Args:
        y: node ids ``[B]`` (int), node names ``[B]`` (str), a list of per-sample collections of ids or
            names (multi-label), or 0/1 node sets ``[B, N]`` (bool/int/float numpy or torch, or scipy sparse).
        taxonomy: the taxonomy the labels refer to.
        name: parameter name for error messages (``"y_true"``, ``"y_pred"``).
        close: add all ancestors to node sets (id labels are closed by construction).
        allow_ignore: accept ``-1`` ids (samples to ignore); the caller drops them.

    Raises:
        TaxonomyError: unknown label names.
        ValueError: wrong shape, out-of-range ids, values other than 0/1 in a node set.
        TypeError: unsupported input type or dtype.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("r", "b")])
        >>> to_labels(["x", "b"], tax, name="y_true").ids.tolist()
        [2, 3]
        >>> to_labels([["x", "b"]], tax, name="y_true").sets.toarray().astype(int).tolist()  # closed
        [[1, 1, 1, 1]]
    """
    if isinstance(y, list | tuple) and y and isinstance(y[0], str):
        return Labels(names_to_ids(y, taxonomy, name), None, taxonomy.num_nodes)  # no detour through an array
    y = to_numpy(y, passthrough=True, name=name)
    if sp.issparse(y):
        return Labels(None, _sparse_sets(y, taxonomy, name, close), taxonomy.num_nodes)
    if isinstance(y, list | tuple):
        y = _nested(y, taxonomy, name, close)
        if isinstance(y, Labels):
            return y
    if not isinstance(y, np.ndarray):
        raise TypeError(
            f"{name} must be node ids, node names or node sets (numpy, torch, list or scipy sparse); "
            f"got {type(y).__name__}"
        )
    return _array_labels(y, taxonomy, name, close, allow_ignore)


def check_weights(sample_weight: Any, n: int) -> np.ndarray | None:
    """``None`` or a float64 ``[n]`` array of finite non-negative weights (tensors are copied to the host)."""
    if sample_weight is None:
        return None
    w = np.asarray(to_numpy(sample_weight, name="sample_weight"), dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"sample_weight has shape {w.shape}; expected ({n},), one weight per sample")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("sample_weight must be finite and non-negative")
    return w


def prepare_pair(
    y_true: Any,
    y_pred: Any,
    taxonomy: Taxonomy,
    sample_weight: Any = None,
    *,
    close: bool = True,
    close_pred: bool | None = None,
    return_keep: bool = False,
    names: tuple[str, str] = ("y_true", "y_pred"),
) -> Any:
    """Validate a ``(y_true, y_pred)`` pair, drop samples whose target is ``-1``, return weights aligned.

    Returns ``(t, p, w)`` (host :class:`Labels` and float64 weights or ``None``); with ``return_keep`` also the
    boolean mask of the samples kept (to align other per-sample inputs). ``names`` are the parameter names the
    errors use (the stateful metrics' ``("target", "preds")``).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("r", "b")])
        >>> t, p, w = prepare_pair([1, -1, 2], ["a", "a", "b"], tax)
        >>> t.ids.tolist(), p.ids.tolist(), w
        ([1, 2], [1, 2], None)
    """
    check_taxonomy(taxonomy)
    t = to_labels(y_true, taxonomy, name=names[0], close=close, allow_ignore=True)
    p = to_labels(y_pred, taxonomy, name=names[1], close=close if close_pred is None else close_pred)
    if len(t) != len(p):
        raise ValueError(f"{names[0]} has {len(t)} samples but {names[1]} has {len(p)}")
    w = check_weights(sample_weight, len(t))
    keep = t.ids >= 0 if t.is_ids else np.ones(len(t), dtype=bool)
    if not keep.all():
        t, p = t.select(keep), p.select(keep)
        w = None if w is None else w[keep]
    return (t, p, w, keep) if return_keep else (t, p, w)


def tensor_device(*xs: Any) -> torch.device | None:
    """The device of the first torch tensor among ``xs`` (``None`` without one): where array results go back."""
    return next((x.device for x in xs if isinstance(x, torch.Tensor)), None)


def to_device(x: np.ndarray, device: torch.device | None) -> Any:
    """``x`` as a tensor on ``device``, or unchanged when ``device`` is ``None`` (NumPy in, NumPy out)."""
    return x if device is None else torch.from_numpy(np.ascontiguousarray(x)).to(device)


def check_zero_division(zero_division: Any) -> Any:
    if isinstance(zero_division, str):
        return check_choice(zero_division, ("warn",), "zero_division")
    if isinstance(zero_division, numbers.Real) and (math.isnan(zero_division) or zero_division in (0, 1)):
        return float(zero_division)
    raise ValueError(f"zero_division must be 'warn', 0.0, 1.0 or nan; got {zero_division!r}")


def divide(num: Any, den: Any, zero_division: Any) -> tuple[Any, Any]:
    """``(num / den with zero_division where den == 0, the 0/0 mask)``, never warning (``"warn"`` fills 0)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    zero = den == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / np.where(zero, 1.0, den)
    if zero.any():
        out = np.where(zero, 0.0 if zero_division == "warn" else zero_division, out)
    return (out if out.ndim else float(out)), zero


def warn_undefined(what: str, zero_division: Any, stacklevel: int = 3) -> None:
    """The one :class:`UndefinedMetricWarning` of an undefined metric (only under ``zero_division="warn"``)."""
    if zero_division == "warn":
        warnings.warn(
            f"{what} is ill-defined (0/0) and set to 0.0; pass zero_division to choose the value",
            UndefinedMetricWarning,
            stacklevel=stacklevel + 1,
        )


def safe_divide(num: Any, den: Any, zero_division: Any, what: str, *, warn: bool = True) -> Any:
    """``num / den`` elementwise with ``zero_division`` where ``den == 0`` (``"warn"``: 0 and one warning, unless
    ``warn=False``: the caller warns once for the metric)."""
    out, zero = divide(num, den, zero_division)
    if warn and zero.any():
        warn_undefined(what, zero_division, stacklevel=3)
    return out


def weighted_sum(values: Any, w: np.ndarray | None) -> float:
    """``Σ w·values`` (``Σ values`` without weights) as a float."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.sum() if w is None else values @ w)


def weight_total(n: int, w: np.ndarray | None) -> float:
    """The number of samples, or the sum of their weights."""
    return float(n) if w is None else float(w.sum())


def renamed_keyword(old: str, new: str) -> Callable[[F], F]:
    """Accept the keyword ``old`` for ``new`` for one more release, with a :class:`FutureWarning`.

    Example:
        >>> @renamed_keyword("scores", "y_score")
        ... def f(y_true, y_score=None):
        ...     return y_score
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always")
        ...     f([1], scores=[2]), w[0].category.__name__
        ([2], 'FutureWarning')
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{fn.__qualname__}() got both {new}= and its deprecated name {old}=; pass {new}=")
                warnings.warn(
                    f"{fn.__qualname__}(): {old}= is deprecated and will be removed in the next release; "
                    f"pass {new}= (scikit-learn's name)",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap

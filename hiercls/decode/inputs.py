"""What every decoder does with its input and output, and the one tie rule.

Input: node probabilities ``[B, N]`` (or leaf probabilities ``[B, L]``), a NumPy array, a torch tensor on any
device or nested lists. Every decoder computes on the host: a tensor is read there (a CPU tensor without a copy),
float16/bfloat16 as float32, and its result goes back to the tensor's device. The rules compare in float64.

Tie rule (:data:`TIE_RTOL`): two values of a rule's objective are tied when they differ by at most
``TIE_RTOL * max(1, |best|)``; among tied nodes the smallest id wins, among tied sets the smallest set. Any
summation order then gives the same answers, except for values within round-off of that margin.

Example:
    >>> first_best(np.array([[0.3, 0.5, 0.5 - 1e-12, 0.1]]))  # 1 and 2 tie: the smaller index
    array([1])
    >>> first_best(np.array([[2.0, 1.0, 1.0 + 1e-10]]), minimize=True)
    array([1])
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from hiercls._checks import check_dense
from hiercls.decode.checks import (
    LEAF,
    NODE,
    OFF,
    SCORES,
    check_label_mass,
    check_rows,
    dtype_eps,
    jit,
    kernel_array,
    mode_edges,
    probability_checks_enabled,
    raise_row_error,
    row_tolerances,
)
from hiercls.taxonomy import Taxonomy, check_taxonomy

__all__ = [
    "CHUNK_ELEMENTS",
    "LOWEST_KEY",
    "TIE_RTOL",
    "Batch",
    "chunked",
    "first_best",
    "index_tensor",
    "key_value",
    "label_distribution",
    "order_key",
    "prepare",
    "restore_ids",
    "restore_sets",
    "restore_values",
    "tie_floor",
]

TIE_RTOL = 1e-9
"""Relative margin of the tie rule: ``v`` ties with the best ``best`` when ``v >= best - TIE_RTOL * max(1, |best|)``
(``v <= best + ...`` for costs). Far above float64 round-off of the rules' sums, far below any real difference."""

CHUNK_ELEMENTS = 1 << 20
"""Rows x nodes per block of the NumPy formulations (:func:`chunked`): float64 work arrays near 8 MB."""

F = TypeVar("F", bound=Callable[..., Any])

# First row of the block being decoded, so that errors of a block name the caller's row.
_ROW_OFFSET: contextvars.ContextVar[int] = contextvars.ContextVar("hiercls_decode_row_offset", default=0)


def tie_floor(best: Any) -> Any:
    """The least value tied with ``best`` (a maximum): ``best - TIE_RTOL * max(1, |best|)``; for a minimum
    ``2 * best - tie_floor(best)`` is the largest tied value. Scalars or arrays."""
    return best - TIE_RTOL * np.maximum(1.0, np.abs(best))


LOWEST_KEY = -(2**63)
"""The least :func:`order_key` (below that of ``-inf``): the start of a kernel's maximum, the key of a non-candidate."""


@jit
def order_key(v: float) -> int:
    """An int64 that orders as the float64 ``v`` does: its IEEE bits, a negative's magnitude bits flipped.

    The kernels take maxima over keys because the compiler vectorises integer maximum reductions and not float
    ones (it would need fast-math, which numba does not pass on to them); :func:`key_value` inverts it.
    """
    k = np.float64(v).view(np.int64)
    return k ^ ((k >> 63) & 0x7FFFFFFFFFFFFFFF)


@jit
def key_value(k: int) -> float:
    """The float64 whose :func:`order_key` is ``k``."""
    return np.int64(k ^ ((k >> 63) & 0x7FFFFFFFFFFFFFFF)).view(np.float64)


def first_best(values: np.ndarray, *, minimize: bool = False, mask: np.ndarray | None = None) -> np.ndarray:
    """Per row of ``values [B, K]``, the first column tied with the row's best (:data:`TIE_RTOL`), int64 ``[B]``.

    ``mask [K]`` (bool) restricts the candidates; rows without a finite candidate give 0.
    """
    v = np.asarray(values, dtype=np.float64)
    if minimize:
        v = -v
    if mask is not None:
        v = np.where(mask[None, :], v, -np.inf)
    if not v.shape[0]:
        return np.zeros(0, dtype=np.int64)
    best = v.max(1, keepdims=True)
    return np.argmax(v >= tie_floor(best), axis=1).astype(np.int64)


@dataclass
class Batch:
    """A decoder's input on the host, as the kernels take it, and what is needed to hand results back.

    Attributes:
        x: ``[B, W]`` float32 or float64 (any memory layout): node probabilities, or the node marginals of leaf
            probabilities (then already checked: ``mode`` is ``OFF``).
        taxonomy: the taxonomy.
        mode: the row check the decoder's kernel applies (:mod:`hiercls.decode.checks`).
        eps: the input dtype's round-off per summed term (:func:`~hiercls.decode.checks.dtype_eps`).
        device, dtype: the input tensor's device and dtype (``None`` for NumPy input).
        leaf: float64 leaf probabilities ``[B, L]`` when given as such.
        name: the parameter name for messages.
    """

    x: np.ndarray
    taxonomy: Taxonomy
    mode: int
    eps: float
    device: Any = None
    dtype: Any = None
    leaf: np.ndarray | None = None
    name: str = "probs"
    row_offset: int = 0
    _label: np.ndarray | None = field(default=None, repr=False)

    @property
    def is_torch(self) -> bool:
        return self.device is not None

    @property
    def node(self) -> np.ndarray:
        """Node probabilities ``[B, N]`` as float64 (a view when they are)."""
        return np.asarray(self.x, dtype=np.float64)

    @property
    def label(self) -> np.ndarray:
        """The probability that the label is exactly each node, ``[B, N]`` float64 (:func:`label_distribution`)."""
        if self._label is None and self.leaf is not None:  # the leaf probabilities are the distribution
            self._label = np.zeros(self.x.shape)
            self._label[:, self.taxonomy.leaves] = self.leaf
        elif self._label is None:
            self._label = label_distribution(self.node, self.taxonomy, eps=self.eps, row_offset=self.row_offset)
        return self._label

    def check_args(self, *, scores: bool = False) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """``(mode, child, parent, tol)``: the row check's arguments for this input (a kernel's first four)."""
        mode = SCORES if scores and self.mode == NODE else self.mode
        child, parent = mode_edges(self.taxonomy, mode)
        return mode, child, parent, row_tolerances(self.taxonomy, mode, self.eps, decoder=True)

    def raise_if(self, err: np.ndarray, *, scores: bool = False) -> None:
        """Raise the error a kernel reported in ``err = (row, code, position)``, if any."""
        if err[1]:
            mode, _, _, tol = self.check_args(scores=scores)
            raise_row_error(err, self.x, self.taxonomy, mode, tol, self.name, self.row_offset)

    def check(self, *, scores: bool = False) -> None:
        """Run the row check alone (the decoders whose rule is not a kernel)."""
        err = np.zeros(3, dtype=np.int64)
        if self.x.size:
            check_rows(self.x, *self.check_args(scores=scores), err)
        self.raise_if(err, scores=scores)


def _host_array(probs: Any, name: str) -> tuple[np.ndarray, Any, Any, float]:
    """``probs`` as a NumPy array, with the tensor's device and dtype (``None`` for other input) and its eps."""
    if isinstance(probs, torch.Tensor):
        t = check_dense(probs, name).detach()
        device, dtype = t.device, t.dtype
        if dtype.is_complex:
            raise TypeError(f"{name} must be a real array or tensor; got dtype {dtype}")
        if dtype in (torch.float16, torch.bfloat16) or not dtype.is_floating_point:
            t = t.to(torch.float32 if dtype != torch.int64 and dtype != torch.int32 else torch.float64)
        arr = t.cpu().resolve_conj().resolve_neg().numpy()
        return arr, device, dtype, dtype_eps(dtype)
    if sp.issparse(probs):
        raise TypeError(f"{name} is a scipy sparse matrix; pass a dense array ({name}.toarray())")
    arr = np.asarray(probs)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool
    ):
        raise TypeError(f"{name} must be a numeric array or tensor; got dtype {arr.dtype}")
    return arr, None, None, dtype_eps(arr.dtype)


def _check_shape(shape: tuple[int, ...], taxonomy: Taxonomy, leaf_probs: bool, name: str, given: list[int]) -> None:
    """Refuse a ``[B, width]`` array of the wrong width (``given``: the caller's shape, for the message)."""
    width = taxonomy.num_leaves if leaf_probs else taxonomy.num_nodes
    if len(shape) == 2 and shape[1] == width:
        return
    what = "leaf probabilities [B, num_leaves]" if leaf_probs else "node probabilities [B, num_nodes]"
    hint = ""
    if not leaf_probs and len(shape) == 2 and shape[1] == taxonomy.num_leaves:
        hint = "; it matches the number of leaves: pass leaf_probs=True"
    raise ValueError(f"{name} must be {what} = [B, {width}] for taxonomy {taxonomy.name!r}; got shape {given}{hint}")


def prepare(
    probs: Any,
    taxonomy: Taxonomy,
    *,
    leaf_probs: bool = False,
    name: str = "probs",
    scores: bool = False,
    check: bool = True,
    exact: bool = True,
) -> Batch:
    """Validate the shape of ``probs`` against ``taxonomy`` and hand it over as a :class:`Batch` on the host.

    Args:
        probs: node probabilities ``[B, N]`` (or ``[N]`` for one sample), or leaf probabilities ``[B, L]``
            with ``leaf_probs=True`` (in the order of ``taxonomy.leaves``). NumPy array, torch tensor (any
            device) or nested lists; integers and booleans are read as probabilities 0/1.
        taxonomy: the taxonomy the probabilities are indexed by.
        leaf_probs: ``probs`` holds leaf probabilities (checked here, then marginalised up the taxonomy).
        name: parameter name used in error messages.
        scores: ``probs`` may be independent per-node scores in ``[0, 1]`` (a child may exceed its parent).
        check: run the row check now (decoders whose kernel checks each row itself pass ``False``).
        exact: kept for callers of earlier versions; every rule compares in float64.

    Raises:
        TypeError: ``taxonomy`` is not a Taxonomy, or ``probs`` is not numeric.
        ValueError: wrong shape, NaN/inf or negative probabilities.
        ProbabilityError: not probabilities of ``taxonomy`` (see :func:`~hiercls.decode.check_probabilities`);
            only NaN, inf and negatives inside ``probability_checks(False)`` (``decode(..., check=False)``).
    """
    del exact
    taxonomy = check_taxonomy(taxonomy)
    arr, device, dtype, eps = _host_array(probs, name)
    x = kernel_array(arr[None, :] if arr.ndim == 1 else arr)
    _check_shape(tuple(x.shape), taxonomy, leaf_probs, name, list(np.shape(arr)))
    on = probability_checks_enabled()
    offset = _ROW_OFFSET.get()
    if not leaf_probs:
        batch = Batch(x, taxonomy, (SCORES if scores else NODE) if on else OFF, eps, device, dtype, None, name, offset)
        if check:
            batch.check()
        return batch
    Batch(x, taxonomy, LEAF if on else OFF, eps, name=name, row_offset=offset).check()
    leaf = np.clip(np.asarray(x, dtype=np.float64), 0.0, None)
    node = np.ascontiguousarray(taxonomy.marginals(leaf), dtype=np.float64)
    return Batch(node, taxonomy, OFF, eps, device, dtype, leaf, name, offset)


def chunked(fn: F | None = None, *, scale: int = 1) -> Any:
    """Run ``fn(probs, taxonomy, ...)`` on row blocks of at most ``CHUNK_ELEMENTS * scale`` values and concatenate
    the results (for the NumPy formulations, whose work arrays grow with the block); errors name the caller's rows.
    """
    if fn is None:
        return functools.partial(chunked, scale=scale)

    @functools.wraps(fn)
    def wrapper(probs: Any, *args: Any, **kwargs: Any) -> Any:
        shape = tuple(probs.shape) if hasattr(probs, "shape") else ()
        rows = shape[0] if len(shape) == 2 else 0
        step = max(16, CHUNK_ELEMENTS * scale // max(1, shape[-1] if shape else 1))
        if rows <= step:
            return fn(probs, *args, **kwargs)
        parts = []
        for s in range(0, rows, step):
            token = _ROW_OFFSET.set(_ROW_OFFSET.get() + s)
            try:
                parts.append(fn(probs[s : s + step], *args, **kwargs))
            finally:
                _ROW_OFFSET.reset(token)
        return _concat(parts)

    return wrapper


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], tuple):
        return tuple(_concat([p[i] for p in parts]) for i in range(len(parts[0])))
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return np.concatenate(parts)


def _child_sum_matrix(taxonomy: Taxonomy) -> sp.csr_matrix:
    """``C[c, u] = 1`` for every child ``c`` of ``u`` (a tree): ``P @ C`` sums each node's children."""
    cache = taxonomy.namespace_cache(__name__)
    if "child_sum" not in cache:
        n = taxonomy.num_nodes
        cache["child_sum"] = sp.csr_matrix((np.ones(n - 1), (np.arange(1, n), taxonomy.parent[1:])), shape=(n, n))
    return cache["child_sum"]


def label_distribution(
    node: np.ndarray, taxonomy: Taxonomy, *, eps: float = 2.0**-23, row_offset: int = 0
) -> np.ndarray:
    """Probability that the label is exactly each node, float64 ``[B, N]``, from node probabilities ``node``.

    On a tree ``p(n) = P(n) - sum of P(children)``; on a DAG the unit-triangular system ``P = p @ A`` (``A`` the
    ancestor matrix) is solved. Negatives beyond round-off are refused (:func:`~hiercls.decode.checks.
    check_label_mass`, when the checks are on), round-off negatives clipped to 0.
    """
    node = np.asarray(node, dtype=np.float64)
    if node.shape[0] == 0 or taxonomy.num_nodes == 1:
        return node.copy()
    if taxonomy.is_tree:
        out = node - node @ _child_sum_matrix(taxonomy)
    else:
        a_t = taxonomy.ancestors_sparse.T.tocsr().astype(np.float64)
        out = np.asarray(spla.spsolve_triangular(a_t, node.T, lower=False)).T.copy()
    check_label_mass(out, taxonomy, node, eps=eps, row_offset=row_offset)
    return np.maximum(out, 0.0, out=out)


def index_tensor(taxonomy: Taxonomy, key: Any, values: np.ndarray, device: Any) -> Any:
    """A cached torch copy of a per-taxonomy index or weight array on ``device``."""
    cache = taxonomy.namespace_cache(__name__)
    k = ("tensor", key, str(device))
    if k not in cache:
        cache[k] = torch.as_tensor(np.array(values), device=device)
    return cache[k]


def restore_ids(ids: np.ndarray, batch: Batch) -> Any:
    """Node ids ``[B]`` as int64, a tensor on the input's device for a tensor input."""
    ids = np.asarray(ids, dtype=np.int64)
    return torch.from_numpy(ids).to(batch.device) if batch.is_torch else ids


def restore_sets(sets: np.ndarray, batch: Batch) -> Any:
    """Boolean node sets ``[B, N]``, a tensor on the input's device for a tensor input."""
    sets = np.asarray(sets, dtype=bool)
    return torch.from_numpy(sets).to(batch.device) if batch.is_torch else sets


def restore_values(values: np.ndarray, batch: Batch) -> Any:
    """Float values ``[B, ...]``: float64 NumPy, or a tensor of the input's float dtype (float32 for integer
    tensors) on its device."""
    if not batch.is_torch:
        return np.asarray(values, dtype=np.float64)
    dtype = batch.dtype if batch.dtype.is_floating_point else torch.float32
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(batch.device, dtype)

"""The decoders' fast path for row-major node probabilities on trees: the compiled kernels of :mod:`._kernels`.

A head's output ``[B, N]`` (NumPy, or a CPU tensor viewed as NumPy) with contiguous float32/float64 rows is decoded
row by row by one compiled kernel that checks each row and applies the rule while the row is in cache. Anything
else (node-major arrays, leaf probabilities, DAGs, other dtypes, a missing numba) takes the NumPy path, and so does
an input in which some row fails the kernel's check: the NumPy path then names the culprit, or decodes a row that
only its float64 formulation accepts. Both paths compare in the same precision and sum in the same order.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from hiercls._checks import _EPS32, PROBABILITY_ATOL, probability_checks_enabled
from hiercls.taxonomy import Taxonomy

__all__ = ["ROW_KERNELS", "Rows", "bottom_up_order", "indices", "kernel_rows", "table"]

ROW_KERNELS = True
"""Decode row-major tree inputs with the compiled kernels. The tests switch it off to compare with the NumPy path."""

_NEGATIVE = -1e-6  # the decoders refuse values below this whether or not the checks are on (see _common._validate)


@functools.cache
def _kernels() -> ModuleType | None:
    """The kernel module, imported (and numba with it) on first use; ``None`` when numba is not installed."""
    try:
        from hiercls.decode import _kernels as kernels
    except ImportError:  # numba missing: the NumPy path decodes everything, only slower
        return None
    return kernels


def table(taxonomy: Taxonomy, key: Any, make: Callable[[], np.ndarray]) -> np.ndarray:
    """A per-taxonomy kernel table, built once by ``make()`` and kept in the taxonomy's cache."""
    cache = taxonomy.namespace_cache(__name__)
    if key not in cache:
        cache[key] = make()
    return cache[key]


def indices(taxonomy: Taxonomy, key: Any, values: Any) -> np.ndarray:
    """Node ids ``values`` as a cached ``np.uint32`` kernel table (unsigned: no wrap-around test per index)."""
    return table(taxonomy, key, lambda: np.asarray(values, dtype=np.uint32))


def bottom_up_order(taxonomy: Taxonomy) -> np.ndarray:
    """The non-root nodes of a tree, deepest level first and by id within a level (``_kernels.label_mass_rows``)."""
    return indices(taxonomy, "bottom_up", np.lexsort((np.arange(taxonomy.num_nodes), -taxonomy.depth))[:-1])


def _parents(taxonomy: Taxonomy) -> np.ndarray:
    return indices(taxonomy, "parent", np.maximum(taxonomy.parent, 0))


@dataclass(frozen=True)
class Rows:
    """A validated-shape, C-contiguous float ``[B, N]`` input and the arguments of the kernels' row check."""

    x: np.ndarray
    taxonomy: Taxonomy
    tensor: bool
    check: tuple[Any, ...]

    def ids(self, kernel: str, *tables: Any) -> Any:
        """Node ids ``[B]`` from the kernel ``kernel`` (int64; a CPU tensor for a tensor input), or ``None`` when a
        row fails the check (the caller then takes the NumPy path)."""
        return self._run(kernel, tables, np.empty(self.x.shape[0], dtype=np.int64))

    def sets(self, kernel: str, *tables: Any) -> Any:
        """Boolean node sets ``[B, N]`` from ``kernel``, or ``None`` as :meth:`ids`."""
        return self._run(kernel, tables, np.empty(self.x.shape, dtype=bool))

    def passes(self) -> bool:
        """Whether every row passes the kernels' check (what each kernel verifies before its rule)."""
        return _kernels().check_rows(self.x, *self.check, self.x[:0, 0]) < 0

    def value(self, v: float) -> Any:
        """``v`` in the input's dtype: the kernels compare as NumPy compares an array with a Python float."""
        return self.x.dtype.type(v)

    def restore(self, out: np.ndarray) -> Any:
        """A kernel's output in the input's framework (a CPU tensor for a tensor input)."""
        if self.tensor:
            import torch

            return torch.from_numpy(out)
        return out

    def _run(self, kernel: str, tables: tuple[Any, ...], out: np.ndarray) -> Any:
        if getattr(_kernels(), kernel)(self.x, *self.check, *tables, out) >= 0:
            return None
        return self.restore(out)


def kernel_rows(probs: Any, taxonomy: Any, *, leaf_probs: bool = False, scores: bool = False) -> Rows | None:
    """``probs`` ready for the kernels, or ``None`` when the NumPy path must decode it.

    The kernels take node probabilities (``scores``: independent per-node scores) of a tree with at least two
    nodes, as a float32/float64 NumPy array or CPU tensor with contiguous rows, ``[B, N]`` with ``B >= 1`` or one
    row ``[N]``. The check mirrors :func:`hiercls._checks.check_probabilities` (``kind="node"``/``"scores"``) with
    the decoders' negative-value refusal, or only the refusals that stay with the checks off.
    """
    if leaf_probs or not ROW_KERNELS or not isinstance(taxonomy, Taxonomy) or not taxonomy.is_tree:
        return None
    tensor = False
    if type(probs) is not np.ndarray:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(probs, torch.Tensor) or probs.device.type != "cpu":
            return None
        if probs.dtype not in (torch.float32, torch.float64) or probs.is_conj() or probs.is_neg():
            return None
        probs, tensor = probs.detach().numpy(), True
    x = probs[None, :] if probs.ndim == 1 else probs
    n = taxonomy.num_nodes
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] != n or n < 2:
        return None
    if x.dtype not in (np.float32, np.float64) or not x.flags.c_contiguous or _kernels() is None:
        return None
    kernels = _kernels()
    dt = x.dtype.type
    if probability_checks_enabled():
        mode = kernels.CHECK_SCORES if scores else kernels.CHECK_NODE
        lo = max(dt(-PROBABILITY_ATOL), dt(_NEGATIVE))
    else:
        mode, lo = kernels.CHECK_OFF, dt(_NEGATIVE)
    hi = dt(1.0 + PROBABILITY_ATOL) if mode != kernels.CHECK_OFF else np.finfo(dt).max  # max: refuses inf, NaN
    root_tol = PROBABILITY_ATOL + _EPS32 * taxonomy.num_leaves
    check = (_parents(taxonomy), mode, lo, hi, dt(PROBABILITY_ATOL), root_tol)
    return Rows(x=x, taxonomy=taxonomy, tensor=tensor, check=check)

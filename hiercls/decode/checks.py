"""Probability checks: the decoders, the evaluator and the CLI refuse arrays that are not probabilities of the taxonomy.

One row check, :func:`check_row`, a plain numba function: every decoder's kernel calls it on each row before its
rule (the row is then read once), and :func:`check_probabilities` runs it alone. The tolerance follows the input's
precision: ``atol`` plus the dtype's machine epsilon (at least float32's, ``2**-23``) once per summed term, so that
float16 and bfloat16 node probabilities of a head under mixed precision pass, and float64 is held to float32's
round-off at worst.

Example:
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> check_probabilities([[1.0, 0.6, 0.3, 0.3, 0.4]], tax).shape
    (1, 5)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import numba
import numpy as np
import torch

from hiercls._checks import check_choice, check_finite_number, to_numpy

__all__ = [
    "NO_EDGES",
    "PROBABILITY_ATOL",
    "ProbabilityError",
    "check_label_mass",
    "check_probabilities",
    "check_row",
    "dtype_eps",
    "edges",
    "jit",
    "mode_edges",
    "probabilities_named",
    "probability_checks",
    "probability_checks_enabled",
    "raise_row_error",
    "row_tolerances",
]

PROBABILITY_ATOL = 1e-4
"""Default absolute tolerance of :func:`check_probabilities` (float32 heads are exact to ~1e-6)."""

NEGATIVE_FLOOR = -1e-6
"""Values below this are refused even with the checks off (``decode(..., check=False)``)."""

EPS32 = 2.0**-23
"""The least round-off slack per summed term: float32's epsilon."""

# Modes of check_row: what a row must satisfy.
OFF, SCORES, NODE, LEAF = 0, 1, 2, 3
# Codes it returns (0: the row passes), with the position they name.
NONFINITE, RANGE, ROOT, EDGE, LEAF_SUM, LABEL_MASS = 1, 2, 3, 4, 5, 6

_CHECK_PROBS: contextvars.ContextVar[bool] = contextvars.ContextVar("hiercls_check_probabilities", default=True)


def jit(fn: Callable[..., Any]) -> Any:
    """``numba.njit`` with the on-disk cache (``cache=True``); where no cache can be written (a read-only install
    without a user cache folder) numba refuses the cache, and the function is compiled in each process instead."""
    options = {"nogil": True, "error_model": "numpy"}  # NumPy's inf/nan on division: no exception paths to compile
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(**options)(fn)


class ProbabilityError(ValueError):
    """Probabilities that break the node-probability contract (docs/architecture.md), naming row and node."""


@contextlib.contextmanager
def probability_checks(enabled: bool) -> Iterator[None]:
    """Turn the probability checks of every decoder on or off inside a ``with`` block (thread- and task-local).

    ``hiercls.decode.decode(..., check=False)`` uses it; NaN/inf and negative values are refused either way.

    Example:
        >>> with probability_checks(False):
        ...     probability_checks_enabled()
        False
        >>> probability_checks_enabled()
        True
    """
    token = _CHECK_PROBS.set(bool(enabled))
    try:
        yield
    finally:
        _CHECK_PROBS.reset(token)


@contextlib.contextmanager
def probabilities_named(name: str) -> Iterator[None]:
    """Inside the block, probability errors about ``probs`` name ``name`` instead (a file the array came from).

    Example:
        >>> with probabilities_named("val_probs.npy"):
        ...     raise ProbabilityError("probs: row 0: ...")
        Traceback (most recent call last):
        ...
        hiercls.decode.checks.ProbabilityError: val_probs.npy: row 0: ...
    """
    try:
        yield
    except ProbabilityError as err:
        msg = str(err)
        if msg.startswith("probs: "):
            raise ProbabilityError(f"{name}: {msg[len('probs: ') :]}") from None
        raise


def probability_checks_enabled() -> bool:
    """Whether the decoders check their input (see :func:`probability_checks`)."""
    return _CHECK_PROBS.get()


def dtype_eps(dtype: Any) -> float:
    """Round-off slack per summed term for values of ``dtype`` (NumPy or torch): its epsilon, at least ``2**-23``.

    Example:
        >>> dtype_eps(np.float16), dtype_eps(np.float64) == 2.0**-23
        (0.0009765625, True)
    """
    if isinstance(dtype, torch.dtype):  # bfloat16 has no NumPy twin
        eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    else:
        dt = np.dtype(dtype)
        eps = float(np.finfo(dt).eps) if np.issubdtype(dt, np.floating) else 0.0
    return max(float(eps), EPS32)


def edges(taxonomy: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(child, parent)`` uint32 of every edge (half the index bytes of the row check, and no negative-index
    wrap-around in the kernels), cached; children in increasing id order (on a tree ``1..N-1``)."""
    cache = taxonomy.namespace_cache(__name__)
    if "edges" not in cache:
        if taxonomy.is_tree:
            child = np.arange(1, taxonomy.num_nodes, dtype=np.uint32)
            parent = np.asarray(taxonomy.parent[1:], dtype=np.uint32)
        else:
            child = np.repeat(np.arange(taxonomy.num_nodes), np.diff(taxonomy.parent_ptr)).astype(np.uint32)
            parent = np.asarray(taxonomy.parent_idx, dtype=np.uint32)
        cache["edges"] = (child, parent)
    return cache["edges"]


NO_EDGES = np.zeros(0, dtype=np.uint32)
"""An empty edge table, of :func:`edges`'s dtype (one kernel signature for rows with and without edges)."""


def mode_edges(taxonomy: Any, mode: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(child, parent)`` tables :func:`check_row` reads in ``mode``: :func:`edges` for ``NODE``, else empty."""
    return edges(taxonomy) if mode == NODE else (NO_EDGES, NO_EDGES)


def row_tolerances(
    taxonomy: Any, mode: int, eps: float, atol: float = PROBABILITY_ATOL, *, decoder: bool = False
) -> np.ndarray:
    """``[lo, hi, edge, sum]`` for :func:`check_row`: the value range, a child's excess over its parent and the
    deviation of a sum (the root, a leaf row) from 1. With the checks off only NaN, inf and values below
    ``NEGATIVE_FLOOR`` are refused; ``decoder``: values below it are refused with the checks on too."""
    if mode == OFF:
        return np.array([NEGATIVE_FLOOR, np.finfo(np.float64).max, np.inf, np.inf])
    lo = NEGATIVE_FLOOR if decoder else -(atol + eps)
    return np.array([lo, 1.0 + atol + eps, atol + eps, atol + eps * max(1, taxonomy.num_leaves)])


@jit
def check_row(x: Any, mode: int, child: Any, parent: Any, tol: Any) -> tuple[int, int]:
    """``(code, position)`` of the first fault of one row ``x`` (``(0, 0)`` when it passes).

    The range first (NaN fails both comparisons), then by ``mode``: ``NODE`` the root and every edge
    ``(child[e], parent[e])`` (position ``e``), ``LEAF`` the row sum, ``SCORES`` nothing more. Each test is a
    screening pass in float32 against bounds loosened by a millionth (no float64 conversion per value, and no
    branch: the compiler vectorises it) and, only where it flags a row, the exact pass in float64 that names the
    fault. An edge's excess ``x[child] - x[parent]`` is taken in the row's dtype (the difference of two float32
    values in ``[0, 1]`` near the tolerance is exact or within ``1e-11``). Unsigned index tables (:func:`edges`)
    spare the gathers numba's negative-index wrap-around.
    """
    lo, hi, edge = tol[0], tol[1], tol[2]
    lo32, hi32 = np.float32(lo + abs(lo) * 1e-6), np.float32(min(hi - abs(hi) * 1e-6, 3e38))  # inf is flagged
    bad = False
    for j in range(x.shape[0]):
        v = x[j]
        bad |= (v < lo32) | (v > hi32) | (v != v)
    if bad:
        for j in range(x.shape[0]):
            v = np.float64(x[j])
            if not np.isfinite(v):
                return NONFINITE, j
            if not (v >= lo and v <= hi):
                return RANGE, j
    if mode == NODE:
        if abs(np.float64(x[0]) - 1.0) > tol[3]:
            return ROOT, 0
        e = _edge_fault(x, child, parent, edge)
        if e >= 0:
            return EDGE, e
    elif mode == LEAF:
        s = 0.0
        for j in range(x.shape[0]):
            s += np.float64(x[j])
        if abs(s - 1.0) > tol[3]:
            return LEAF_SUM, 0
    return 0, 0


@jit
def _edge_fault(x: Any, child: Any, parent: Any, edge: float) -> int:
    """The first edge ``e`` with ``x[child[e]] - x[parent[e]] > edge`` (-1 when none): the float32 screening pass of
    :func:`check_row`, then the exact one."""
    edge32 = np.float32(edge * (1.0 - 1e-6))
    bad = False
    if child.shape[0] > 0 and child[0] == 1 and child[-1] == child.shape[0]:  # a tree: children 1..N-1, no load
        for e in range(parent.shape[0]):
            bad |= x[e + 1] - x[parent[e]] > edge32
    else:
        for e in range(parent.shape[0]):
            bad |= x[child[e]] - x[parent[e]] > edge32
    if bad:
        for e in range(child.shape[0]):
            if np.float64(x[child[e]] - x[parent[e]]) > edge:
                return e
    return -1


@jit
def check_rows(x: Any, mode: int, child: Any, parent: Any, tol: Any, err: Any) -> None:
    """:func:`check_row` on every row; the first failing row's ``(row, code, position)`` goes to ``err``."""
    for b in range(x.shape[0]):
        code, pos = check_row(x[b], mode, child, parent, tol)
        if code:
            err[0], err[1], err[2] = b, code, pos
            return


def _node(taxonomy: Any, n: int, what: str = "node") -> str:
    return f"{what} {taxonomy.names[int(n)]!r} (id {int(n)})"


def _fail(name: str, row: int, what: str, hint: str = "") -> ProbabilityError:
    tail = "; pass check=False (CLI: --no-check) to skip this check"
    return ProbabilityError(f"{name}: row {row}: {what}{hint}{tail}")


def raise_row_error(
    err: np.ndarray, x: np.ndarray, taxonomy: Any, mode: int, tol: np.ndarray, name: str, row_offset: int = 0
) -> None:
    """Raise the error that ``err = (row, code, position)`` of a kernel describes (nothing when ``code`` is 0).

    ``x`` is the checked ``[B, W]`` array (leaf columns for ``mode=LEAF``); messages number its rows from
    ``row_offset``. With the checks off (``mode=OFF``) the refusals are plain ``ValueError`` s; a negative value
    inside the checks' tolerance is one too.
    """
    r, code, pos = (int(v) for v in err)
    if not code:
        return
    x, row = x[r : r + 1], r + row_offset  # the failing row alone, named by its caller's number
    r = 0
    value = float(x[r, pos]) if code in (NONFINITE, RANGE) else 0.0
    col = int(taxonomy.leaves[pos]) if mode == LEAF and code in (NONFINITE, RANGE) else pos
    what = "leaf" if mode == LEAF else "node"
    if code == NONFINITE:
        if mode == OFF:
            raise ValueError(f"{name} contains NaN or infinite values")
        raise _fail(name, row, f"{_node(taxonomy, col, what)} is {value}, expected a finite probability")
    if code == RANGE:
        if -tol[2] <= value < 0:  # inside the checks' tolerance, or the checks are off: a plain refusal
            raise ValueError(f"{name} contains negative probabilities (min {value:.3g})")
        raise _fail(
            name,
            row,
            f"{_node(taxonomy, col, what)} has P = {value:.6g}, expected a value in [0, 1]",
            " (logits or scores instead of probabilities?)",
        )
    if code == ROOT:
        raise _fail(
            name,
            row,
            f"the {_node(taxonomy, 0, 'root')} has P = {float(x[r, 0]):.6g}, expected 1 (within {tol[3]:.2g})",
            " (node probabilities always give the root probability 1)",
        )
    if code == EDGE:
        c, u = (int(a[pos]) for a in edges(taxonomy))
        raise _fail(
            name,
            row,
            f"{_node(taxonomy, c)} has P = {float(x[r, c]):.6g} > {float(x[r, u]):.6g} = P of its parent "
            f"{_node(taxonomy, u)}",
            " (a node is never more likely than its parent)",
        )
    if code == LEAF_SUM:
        total = float(np.asarray(x[r], dtype=np.float64).sum())
        raise _fail(
            name,
            row,
            f"leaf probabilities sum to {total:.6g}, expected 1 (within {tol[3]:.2g})",
            " (node probabilities given as leaf probabilities, or scores not normalised?)",
        )
    _label_mass_error(x[r], taxonomy, row, pos, name)


def _label_mass_error(
    values: Any, taxonomy: Any, row: int, n: int, name: str = "probs", deficit: float | None = None
) -> None:
    """Raise the label-mass error of node ``n`` in row ``row`` (``values``: that row's node probabilities)."""
    kids = "children" if taxonomy.is_tree else "descendants"
    values = np.asarray(values, dtype=np.float64)
    if deficit is None:  # a tree: the children's sum is recomputed for the message
        deficit = float(values[np.asarray(taxonomy.children(n), dtype=np.int64)].sum()) - float(values[n])
    own = float(values[n])
    raise _fail(
        name,
        row,
        f"the {kids} of {_node(taxonomy, n)} sum to {own + deficit:.6g} > {own:.6g} = P of the node",
        " (this decoder needs single-label node probabilities, a parent >= the sum of its children; multi-label"
        " probabilities such as those of the multilabel and nested_sigmoid heads go with threshold, majority or"
        " top_down)",
    )


def label_mass_tolerance(taxonomy: Any, eps: float, atol: float = PROBABILITY_ATOL) -> np.ndarray:
    """Per node, how far below 0 its label probability (``P(n)`` minus its children's) may fall: round-off of
    ``children + 1`` terms."""
    return atol + eps * (np.asarray(taxonomy.num_children, dtype=np.float64) + 1.0)


def check_label_mass(label: np.ndarray, taxonomy: Any, probs: Any, *, eps: float = EPS32, row_offset: int = 0) -> None:
    """Refuse node probabilities whose label distribution ``label [B, N]`` (before clipping) is negative beyond
    round-off (:func:`label_mass_tolerance`); ``probs`` are the node probabilities it came from, for the message.
    Skipped outside :func:`probability_checks`.

    Only the rules that read the label distribution need single-label probabilities and call it: ``bayes_node``,
    ``crm`` and ``optimal_hfbeta`` (and the expected costs and hF-beta values). The rules that compare node
    probabilities only (``argmax_leaf``, ``top_down``, ``threshold``, ``majority``, ``plurality``,
    ``max_info``, ``info_gain``, ``hie``) decode multi-label probabilities too.

    Raises:
        ProbabilityError: naming the row, the node and how much its children (descendants) exceed it.
    """
    if not _CHECK_PROBS.get() or label.size == 0:
        return
    bad = label < -label_mass_tolerance(taxonomy, eps)[None, :]
    if bad.any():
        r, n = (int(v) for v in np.argwhere(bad)[0])
        _label_mass_error(np.asarray(probs)[r], taxonomy, r + row_offset, n, deficit=-float(label[r, n]))


def check_probabilities(
    probs: Any,
    taxonomy: Any,
    *,
    kind: str = "node",
    atol: float = PROBABILITY_ATOL,
    name: str = "probs",
    row_offset: int = 0,
) -> np.ndarray:
    """``probs`` as a 2-D NumPy array if it holds probabilities of ``taxonomy``, else an error naming row and node.

    ``kind="node"``: node probabilities ``[B, N]``: finite, in ``[0, 1]``, ``P(root) = 1`` and no node more
    likely than any of its parents (every edge, trees and DAGs). ``kind="leaf"``: leaf probabilities ``[B, L]``
    (order of ``taxonomy.leaves``): finite, in ``[0, 1]``, each row summing to 1. ``kind="scores"``: independent
    per-node scores ``[B, N]`` (e.g. raw sigmoids before C-HMCNN's coherent decoding): finite and in ``[0, 1]``.
    Every comparison allows ``atol`` plus the dtype's round-off (:func:`dtype_eps`) per summed term.

    Args:
        probs: ``[B, N]`` / ``[B, L]`` (or one row), NumPy, torch or nested lists.
        taxonomy: the taxonomy the columns are indexed by.
        kind: ``"node"``, ``"leaf"`` or ``"scores"``.
        atol: absolute tolerance of every comparison.
        name: what to call ``probs`` in the message (a file name, a parameter).
        row_offset: added to the row numbers in messages (for row blocks of a larger array).

    Raises:
        ProbabilityError: (a ``ValueError``) naming the row, the node (name and id), the value found and the
            value expected.
        ValueError: wrong shape or ``kind``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> check_probabilities([[1.0, 0.2, 0.3, 0.0, 0.8]], tax)
        Traceback (most recent call last):
        ...
        hiercls.decode.checks.ProbabilityError: probs: row 0: node 'x' (id 2) has P = 0.3 > 0.2 = P of its parent
        node 'a' (id 1) (a node is never more likely than its parent); pass check=False (CLI: --no-check) to skip
        this check
        >>> check_probabilities([[0.5, 0.3, 2.2]], tax, kind="leaf")
        Traceback (most recent call last):
        ...
        hiercls.decode.checks.ProbabilityError: probs: row 0: leaf 'b' (id 4) has P = 2.2, expected a value in
        [0, 1] (logits or scores instead of probabilities?); pass check=False (CLI: --no-check) to skip this check
    """
    kind = check_choice(kind, ("node", "leaf", "scores"), "kind")
    atol = check_finite_number(atol, "atol", minimum=0.0)
    eps = dtype_eps(getattr(probs, "dtype", np.float64))
    arr = to_numpy(probs, name=name)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool
    ):
        raise TypeError(f"{name} must be a numeric array or tensor; got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    width = taxonomy.num_leaves if kind == "leaf" else taxonomy.num_nodes
    if arr.ndim != 2 or arr.shape[1] != width:
        raise ValueError(f"{name} must be {kind} probabilities [B, {width}]; got shape {list(np.shape(arr))}")
    mode = {"node": NODE, "leaf": LEAF, "scores": SCORES}[kind]
    x = kernel_array(arr)
    tol = row_tolerances(taxonomy, mode, eps, atol)
    err = np.zeros(3, dtype=np.int64)
    child, parent = mode_edges(taxonomy, mode)
    check_rows(x, mode, child, parent, tol, err)
    raise_row_error(err, x, taxonomy, mode, tol, name, row_offset)
    return arr


def kernel_array(arr: np.ndarray) -> np.ndarray:
    """``arr`` as the kernels take it: float32 (float16, booleans) or float64 (the rest) in native byte order."""
    small = arr.dtype == bool or (np.issubdtype(arr.dtype, np.floating) and arr.dtype.itemsize <= 4)
    dt = np.dtype(np.float32 if small else np.float64)
    return arr if arr.dtype == dt else arr.astype(dt)

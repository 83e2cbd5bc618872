"""Validators shared by every public function: one message form for every parameter.

Each check returns the validated (and normalised) value or raises with the parameter's name, what was
expected and what was received, in the style of scikit-learn's parameter validation.

Example:
    >>> check_beta(2)
    2.0
    >>> check_beta(-1)
    Traceback (most recent call last):
    ...
    ValueError: beta must be a finite number >= 0; got -1
    >>> check_choice("micro", ("micro", "macro"), "average")
    'micro'
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import math
import numbers
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = [
    "PROBABILITY_ATOL",
    "ProbabilityError",
    "check_beta",
    "check_choice",
    "check_finite_number",
    "check_label_mass",
    "check_probabilities",
    "did_you_mean",
    "probabilities_named",
    "probability_checks",
    "probability_checks_enabled",
    "to_numpy",
]


def did_you_mean(name: Any, options: Iterable[str], n: int = 3) -> str:
    """``" (did you mean 'x'?)"`` for the close matches of ``name`` among ``options``, or ``""``."""
    close = difflib.get_close_matches(str(name), list(options), n=n)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


def check_choice(value: Any, choices: Iterable[Any], name: str) -> Any:
    """``value`` if it is one of ``choices``.

    Raises:
        ValueError: naming ``name``, the close matches and every allowed value.
    """
    choices = list(choices)
    if value in choices:
        return value
    hint = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
    raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}{hint}")


def check_finite_number(value: Any, name: str, *, minimum: float | None = None, strict: bool = False) -> float:
    """``value`` as a float if it is a real, finite number (not a bool) ``>= minimum`` (``> minimum`` if strict).

    Raises:
        ValueError: naming ``name`` and the bound.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        raise ValueError(f"{name} must be a finite number{bound}; got {value!r}")
    return float(value)


def check_beta(beta: Any, name: str = "beta") -> float:
    """The β of an F-β score or decoder: a finite number ``>= 0`` (β = 0 is precision, as in scikit-learn)."""
    return check_finite_number(beta, name, minimum=0.0)


def to_numpy(x: Any, *, passthrough: bool = False) -> Any:
    """A NumPy array of ``x``: torch tensors detached and copied to the host (float16/bfloat16 as float32);
    NumPy arrays and scipy sparse matrices unchanged; anything else through ``np.asarray``, or returned as is
    with ``passthrough=True`` (ragged label lists, sets of names, which ``np.asarray`` would mangle)."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.dtype.is_floating_point and x.element_size() < 4:  # numpy has no bfloat16
            x = x.float()
        return x.numpy()
    if passthrough or isinstance(x, np.ndarray) or hasattr(x, "tocsr"):
        return x
    return np.asarray(x)


# ---------------------------------------------------------------------------------------------------------------
# Probability checks: decoders, metrics and the CLI refuse arrays that are not probabilities of the taxonomy.

PROBABILITY_ATOL = 1e-4
"""Default absolute tolerance of :func:`check_probabilities` (float32 heads are exact to ~1e-6)."""

_EPS32 = 2.0**-23  # float32 round-off per summed term: sums of many float32 terms get this much slack per term
_CHECK_PROBS: contextvars.ContextVar[bool] = contextvars.ContextVar("hiercls_check_probabilities", default=True)
_BLOCK_ELEMENTS = 1 << 17


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
        hiercls._checks.ProbabilityError: val_probs.npy: row 0: ...
    """
    try:
        yield
    except ProbabilityError as err:
        msg = str(err)
        if msg.startswith("probs: "):
            raise ProbabilityError(f"{name}: {msg[len('probs: ') :]}") from None
        raise


def probability_checks_enabled() -> bool:
    """Whether :func:`check_probabilities` runs inside the decoders (see :func:`probability_checks`)."""
    return _CHECK_PROBS.get()


def _node(taxonomy: Any, n: int, what: str = "node") -> str:
    return f"{what} {taxonomy.names[int(n)]!r} (id {int(n)})"


def _fail(name: str, row: int, what: str, hint: str = "") -> ProbabilityError:
    tail = "; pass check=False (CLI: --no-check) to skip this check"
    return ProbabilityError(f"{name}: row {row}: {what}{hint}{tail}")


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
    (order of ``taxonomy.leaves``): finite, in ``[0, 1]``, each row summing to 1. Sums are compared with an extra
    float32 round-off slack of ``2**-23`` per summed term. ``kind="scores"``: independent per-node scores
    ``[B, N]`` (e.g. raw sigmoids before C-HMCNN's coherent decoding): finite and in ``[0, 1]`` only.

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
        >>> check_probabilities([[1.0, 0.6, 0.3, 0.3, 0.4]], tax).shape
        (1, 5)
        >>> check_probabilities([[1.0, 0.2, 0.3, 0.0, 0.8]], tax)
        Traceback (most recent call last):
        ...
        hiercls._checks.ProbabilityError: probs: row 0: node 'x' (id 2) has P = 0.3 > 0.2 = P of its parent node 'a'
        (id 1) (a node is never more likely than its parent); pass check=False (CLI: --no-check) to skip this check
        >>> check_probabilities([[0.5, 0.3, 2.2]], tax, kind="leaf")
        Traceback (most recent call last):
        ...
        hiercls._checks.ProbabilityError: probs: row 0: leaf 'b' (id 4) has P = 2.2, expected a value in [0, 1]
        (logits or scores instead of probabilities?); pass check=False (CLI: --no-check) to skip this check
    """
    kind = check_choice(kind, ("node", "leaf", "scores"), "kind")
    atol = check_finite_number(atol, "atol", minimum=0.0)
    arr = to_numpy(probs)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool
    ):
        raise TypeError(f"{name} must be a numeric array or tensor; got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    width = taxonomy.num_leaves if kind == "leaf" else taxonomy.num_nodes
    if arr.ndim != 2 or arr.shape[1] != width:
        raise ValueError(f"{name} must be {kind} probabilities [B, {width}]; got shape {list(np.shape(arr))}")
    _scan_probabilities(arr, taxonomy, kind, atol, name, row_offset)
    return arr


def _edges(taxonomy: Any) -> tuple[Any, np.ndarray]:
    """``(children, parents)`` of every edge, cached: on a tree ``slice(1, None)`` and the parents of nodes 1..N-1
    (ids are a pre-order, so node ``n`` has the parent ``parent[n] < n``): one gather checks every edge."""
    cache = taxonomy.namespace_cache(__name__)
    if "edges" not in cache:
        if taxonomy.is_tree:
            cache["edges"] = (slice(1, None), np.asarray(taxonomy.parent[1:], dtype=np.intp))
        else:
            child = np.repeat(np.arange(taxonomy.num_nodes), np.diff(taxonomy.parent_ptr)).astype(np.intp)
            cache["edges"] = (child, np.asarray(taxonomy.parent_idx, dtype=np.intp))
    return cache["edges"]


def _node_major(arr: np.ndarray) -> bool:
    """Whether ``arr [B, W]`` is laid out node by node (Fortran order, e.g. :meth:`Taxonomy.marginals`' NumPy
    output): then its transpose is scanned, whose rows are contiguous."""
    return arr.ndim == 2 and arr.shape[0] > 1 and arr.shape[1] > 1 and arr.strides[0] < arr.strides[1]


def _scan_probabilities(arr: np.ndarray, taxonomy: Any, kind: str, atol: float, name: str, row_offset: int) -> float:
    """The checks of :func:`check_probabilities` on a 2-D array; returns its minimum (``inf`` when empty).

    A fast pass decides (range by min/max, which propagate NaN; the root; every edge by one gather); only a block
    that fails it is scanned again by :func:`_check_block`, in its original row blocks, which names the culprit.
    Both passes apply the same comparisons in the same precision, so they refuse exactly the same arrays.
    """
    width = arr.shape[1]
    cols = np.asarray(taxonomy.leaves) if kind == "leaf" else np.arange(width)
    edges = None
    if kind == "node" and taxonomy.num_nodes > 1:
        edges = _edges(taxonomy)
    n_edges = 0 if edges is None else len(edges[1])
    step = max(1, _BLOCK_ELEMENTS // max(width, n_edges, 1))
    dtype = arr.dtype if arr.dtype in (np.float32, np.float64) else np.float64
    node_major = _node_major(arr)
    # Fast-pass blocks: a whole number of detail blocks (so a failure is reported exactly as before); wide enough
    # in node-major layout that each transposed row is a long contiguous run.
    fast = step * max(1, (2048 if node_major else 8 * _BLOCK_ELEMENTS // max(width, 1)) // step)
    low = np.inf
    for start in range(0, arr.shape[0], fast):
        block = np.asarray(arr[start : start + fast], dtype=dtype)
        ok, mn = _fast_block(block.T if node_major else block, taxonomy, kind, atol, edges, node_major)
        low = min(low, mn)
        if ok and kind != "leaf":  # leaf sums: the detailed pass, whose summation order is the reference
            continue
        edges_full = None
        if kind == "node" and taxonomy.num_nodes > 1:
            edges_full = (
                np.repeat(np.arange(taxonomy.num_nodes), np.diff(taxonomy.parent_ptr)),
                np.asarray(taxonomy.parent_idx),
            )
        for s in range(0, block.shape[0], step):
            _check_block(block[s : s + step], taxonomy, kind, atol, name, row_offset + start + s, cols, edges_full)
    return float(low)


def _fast_block(
    x: np.ndarray, taxonomy: Any, kind: str, atol: float, edges: Any, node_major: bool
) -> tuple[bool, float]:
    """Whether a block passes the checks (``x``: ``[b, W]``, or ``[W, b]`` when ``node_major``), and its minimum."""
    if x.size == 0:
        return True, np.inf
    mn, mx = x.min(), x.max()
    if not (mn >= -atol and mx <= 1.0 + atol):  # NaN fails both
        return False, float(mn)
    if kind == "scores":
        return True, float(mn)
    if kind == "leaf":
        return True, float(mn)
    root = x[0] if node_major else x[:, 0]
    if (np.abs(root.astype(np.float64) - 1.0) > atol + _EPS32 * taxonomy.num_leaves).any():
        return False, float(mn)
    if edges is None:
        return True, float(mn)
    child, parent = edges
    if node_major:
        gap = x[parent]
        np.subtract(x[child], gap, out=gap)
    else:
        gap = np.take(x, parent, axis=1)
        np.subtract(x[:, child] if isinstance(child, slice) else np.take(x, child, axis=1), gap, out=gap)
    return bool(gap.max() <= atol), float(mn)


def _check_block(
    p: np.ndarray, taxonomy: Any, kind: str, atol: float, name: str, row0: int, cols: np.ndarray, edges: Any
) -> None:
    what = "leaf" if kind == "leaf" else "node"

    def where(mask: np.ndarray) -> tuple[int, int]:
        r, c = np.argwhere(mask)[0]
        return int(r), int(c)

    # One pass for NaN, inf and the range (NaN fails every comparison); the details only when something fails.
    ok = (p >= -atol) & (p <= 1.0 + atol)
    if not ok.all():
        r, c = where(~ok)
        value = float(p[r, c])
        if not np.isfinite(value):
            raise _fail(name, row0 + r, f"{_node(taxonomy, cols[c], what)} is {value}, expected a finite probability")
        raise _fail(
            name,
            row0 + r,
            f"{_node(taxonomy, cols[c], what)} has P = {value:.6g}, expected a value in [0, 1]",
            " (logits or scores instead of probabilities?)",
        )
    if kind == "scores":
        return
    if kind == "leaf":
        total = p.sum(1, dtype=np.float64)
        tol = atol + _EPS32 * p.shape[1]
        bad = np.abs(total - 1.0) > tol
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise _fail(
                name,
                row0 + r,
                f"leaf probabilities sum to {total[r]:.6g}, expected 1 (within {tol:.2g})",
                " (node probabilities given as leaf probabilities, or scores not normalised?)",
            )
        return
    root_tol = atol + _EPS32 * taxonomy.num_leaves
    bad = np.abs(p[:, 0].astype(np.float64) - 1.0) > root_tol
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise _fail(
            name,
            row0 + r,
            f"the {_node(taxonomy, 0, 'root')} has P = {float(p[r, 0]):.6g}, expected 1 (within {root_tol:.2g})",
            " (node probabilities always give the root probability 1)",
        )
    if edges is None:
        return
    child, parent = edges
    bad = np.take(p, child, axis=1) - np.take(p, parent, axis=1) > atol  # np.take: far faster than p[:, idx]
    if bad.any():
        r, e = where(bad)
        c, u = int(child[e]), int(parent[e])
        raise _fail(
            name,
            row0 + r,
            f"{_node(taxonomy, c)} has P = {float(p[r, c]):.6g} > {float(p[r, u]):.6g} = P of its parent "
            f"{_node(taxonomy, u)}",
            " (a node is never more likely than its parent)",
        )


def check_label_mass(
    label: np.ndarray,
    taxonomy: Any,
    probs: Any = None,
    *,
    node_major: bool = False,
    atol: float = PROBABILITY_ATOL,
    row_offset: int = 0,
    nodes: np.ndarray | None = None,
) -> None:
    """Refuse node probabilities whose label distribution (``P(n)`` minus its children's mass) is negative.

    The decoders that read the probability that the label is exactly ``n`` (``optimal_hfbeta``, ``bayes_node``,
    ``crm``, ``plurality``, ...) need single-label node probabilities: on a tree a parent at least the sum of its
    children. ``label`` is the distribution before clipping, ``[B, N]`` (``[N, B]`` with ``node_major``), ``probs``
    the node probabilities ``[B, N]`` it came from (for the message); ``nodes`` the node id of each of
    ``label``'s node positions when they are permuted (e.g. depth-major), ids in order by default; a
    negative entry below ``-(atol + 2**-23 * (children + 1))`` is an error. Skipped outside
    :func:`probability_checks`.

    Raises:
        ProbabilityError: naming the row, the node and how much its children exceed it.
    """
    if not _CHECK_PROBS.get() or label.size == 0:
        return
    lab = label.T if node_major else label
    nc = np.asarray(taxonomy.num_children, dtype=np.float64)
    tol = atol + _EPS32 * (nc + 1.0)
    if nodes is not None:
        tol = tol[nodes]
    bad = lab < -tol[None, :]
    if not bad.any():
        return
    r, j = (int(v) for v in np.argwhere(bad)[0])
    n = j if nodes is None else int(nodes[j])
    deficit = -float(lab[r, j])
    kids = "children" if taxonomy.is_tree else "descendants"
    if probs is not None:
        own = float(np.asarray(probs)[r, n])
        what = f"the {kids} of {_node(taxonomy, n)} sum to {own + deficit:.6g} > {own:.6g} = P of the node"
    else:
        what = f"the {kids} of {_node(taxonomy, n)} hold {deficit:.6g} more probability than the node itself"
    raise _fail(
        "probs",
        row_offset + r,
        what,
        " (this decoder needs single-label node probabilities, a parent >= the sum of its children; multi-label"
        " probabilities such as those of the multilabel and nested_sigmoid heads go with threshold, majority or"
        " top_down)",
    )

"""The pieces every calibrator shares: the split-conformal quantile, the greedy chain and label handling.

The *greedy chain* of a sample descends from the root to the most probable child, level after level, until a
leaf: ``v_0 = root, v_1, ..., v_L``. Its node probabilities, made non-increasing by a running minimum (a
consistent posterior already is), are the *chain masses* ``m_0 >= m_1 >= ... >= m_L``. Each node of the chain
covers the subtree below it, so the subtrees shrink along the chain: this nesting is what the split-conformal
argument needs (:mod:`hiercls.conformal.calibrators`).

Example:
    >>> import numpy as np
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> path, mass = greedy_chain(np.array([[1.0, 0.7, 0.3, 0.4, 0.3]]), tax)
    >>> path.tolist(), mass.tolist()  # r -> a (0.7) -> y (0.4)
    ([[0, 1, 3]], [[1.0, 0.7, 0.4]])
    >>> conformal_quantile(np.array([0.3, 0.1, 0.2, 0.4]), 0.2)  # rank ceil(5 * 0.8) = 4 of 4
    0.4
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hiercls.decode.inputs import CHUNK_ELEMENTS, tie_floor
from hiercls.taxonomy import Taxonomy

__all__ = [
    "RANK_SLACK",
    "chain_cover_depth",
    "check_alpha",
    "conformal_quantile",
    "conformal_rank",
    "greedy_chain",
]

RANK_SLACK = 1e-9
"""Subtracted from ``(n + 1)(1 - alpha)`` before rounding up, so that float round-off of an exact integer (e.g.
``1000 * 0.9``) does not raise the rank by one; :class:`~hiercls.conformal.RiskConformal` uses the same slack."""


def check_alpha(alpha: Any) -> float:
    """``alpha`` as a float in ``(0, 1)``, or a ValueError naming it."""
    a = float(alpha)
    if not (0.0 < a < 1.0):
        raise ValueError(f"alpha must be a miscoverage level in (0, 1); got {alpha!r}")
    return a


def conformal_rank(n: int, alpha: float) -> int:
    """``ceil((n + 1)(1 - alpha))``: the rank (1-based, ascending) of the calibration score that is the threshold.

    A rank above ``n`` means the threshold is infinite (too few calibration samples for ``alpha``).
    """
    return math.ceil((n + 1) * (1.0 - check_alpha(alpha)) - RANK_SLACK)


def conformal_quantile(scores: Any, alpha: float) -> float:
    """The split-conformal threshold: the ``ceil((n + 1)(1 - alpha))``-th smallest of the ``n`` scores.

    This is the empirical quantile at level ``ceil((n + 1)(1 - alpha)) / n`` taken as an order statistic (no
    interpolation). ``inf`` when that rank exceeds ``n`` (fewer than ``1 / alpha - 1`` scores).

    Raises:
        ValueError: no scores, or ``alpha`` outside ``(0, 1)``.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    if s.size == 0:
        raise ValueError("scores: no calibration scores (fit or update the calibrator with labelled samples first)")
    k = conformal_rank(s.size, alpha)
    if k > s.size:
        return math.inf
    return float(np.partition(s, k - 1)[k - 1])


def _best_child(x: np.ndarray, cur: np.ndarray, taxonomy: Taxonomy) -> np.ndarray:
    """Per row of ``x``, the most probable child of node ``cur`` (ties: the smaller id, the decoders' tie rule);
    -1 where ``cur`` is -1 or a leaf. Only the families on the chains are read."""
    ptr, idx = taxonomy.child_ptr, taxonomy.child_idx
    out = np.full(len(cur), -1, dtype=np.int64)
    rows = np.flatnonzero(cur >= 0)
    rows = rows[ptr[cur[rows] + 1] > ptr[cur[rows]]]
    if rows.size == 0:
        return out
    first, count = ptr[cur[rows]], np.diff(ptr)[cur[rows]]
    seg = np.concatenate([[0], np.cumsum(count)[:-1]])
    pos = np.arange(int(count.sum()))
    kids = idx[np.repeat(first - seg, count) + pos]  # every child of each row's node, one run per row
    vals = x[np.repeat(rows, count), kids]
    best = np.maximum.reduceat(vals, seg)
    tied = vals >= np.repeat(tie_floor(best), count)  # child_idx runs are ascending: the first tied is the smallest
    out[rows] = kids[np.minimum.reduceat(np.where(tied, pos, pos.size), seg)]
    return out


def greedy_chain(node: np.ndarray, taxonomy: Taxonomy) -> tuple[np.ndarray, np.ndarray]:
    """The greedy chain of every row and its masses.

    Args:
        node: float64 node probabilities ``[B, N]`` (checked by the caller).
        taxonomy: a tree or a DAG (on a DAG the chain follows child edges, so its subtrees still nest).

    Returns:
        ``path [B, H + 1]`` int64 (``-1`` past the chain's leaf) and ``mass [B, H + 1]`` float64, the running
        minimum of the chain's probabilities (``0`` past the leaf); ``H`` is the taxonomy's height.
    """
    b = node.shape[0]
    height = taxonomy.height
    path = np.full((b, height + 1), -1, dtype=np.int64)
    mass = np.zeros((b, height + 1))
    rows = np.arange(b)
    path[:, 0] = 0
    mass[:, 0] = node[:, 0]
    for k in range(1, height + 1):
        nxt = _best_child(node, path[:, k - 1], taxonomy)
        path[:, k] = nxt
        mass[:, k] = np.where(nxt >= 0, node[rows, np.maximum(nxt, 0)], 0.0)
    np.minimum.accumulate(mass, axis=1, out=mass)
    return path, mass


def chain_cover_depth(path: np.ndarray, labels: np.ndarray, taxonomy: Taxonomy) -> np.ndarray:
    """Per row, the position ``d`` of the deepest chain node that is an ancestor of the label (or the label):
    the chain's nodes ``0..d`` cover the label, those below do not (``[B]`` int64)."""
    if taxonomy.is_tree:
        return ((taxonomy.paths[labels] == path) & (path >= 0)).sum(1) - 1
    table = taxonomy.ancestor_table  # ancestors-or-self, -1 padding in front
    out = np.empty(len(labels), dtype=np.int64)
    step = max(1, CHUNK_ELEMENTS // max(1, table.shape[1] * path.shape[1]))
    for lo in range(0, len(labels), step):
        p = path[lo : lo + step]
        hit = (table[labels[lo : lo + step]][:, :, None] == p[:, None, :]).any(1) & (p >= 0)
        out[lo : lo + step] = hit.sum(1) - 1  # the covering positions are a prefix of the chain
    return out

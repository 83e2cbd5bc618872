"""The nested sequence of at-most-``r``-node sets behind :class:`~hiercls.conformal.SetConformal` (trees).

A sample's sequence starts at ``{root}`` and refines it step by step, greedily: each step applies the cheapest
of these moves (cost = the probability mass it removes from the covered set):

* *descend* a node ``v`` of the set: replace it by its most probable children, as many as the budget ``r``
  allows (all of them when it does); cost ``P(v) - sum of the kept children``;
* *drop* a node of the set (when the set has more than one): cost ``P(v)``.

Ties: the smaller cost, then the node with the smaller id, then descending before dropping. The sequence ends
at a single leaf. Every set has at most ``r`` nodes, every set contains the next one, and the covered mass
``mu_j`` after step ``j`` never increases. Each node records ``drop[u]``, the step at which it leaves the covered
set, so the set after step ``j`` is ``{u : drop[u] > j}``.

Example:
    >>> import numpy as np
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("r", "b"), ("r", "c")])
    >>> drop, mu = refine_sequence(np.array([[1.0, 0.5, 0.3, 0.2]]), tax, r=3)
    >>> drop.tolist(), mu.round(6).tolist()  # {a, b, c} (free), then drop c, then b: APS's nested prefixes
    ([[1, 4, 3, 2]], [[1.0, 1.0, 0.8, 0.5]])
"""

from __future__ import annotations

import numpy as np

from hiercls.taxonomy import Taxonomy

__all__ = ["refine_sequence", "set_predictions"]


def _row_sequence(p: np.ndarray, ptr: np.ndarray, idx: np.ndarray, r: int) -> tuple[list, list, list[float]]:
    """One row: the steps at which nodes leave as points (descended) and as subtrees (dropped), and the masses."""
    points: list[tuple[int, int]] = []
    subtrees: list[tuple[int, int]] = []
    mu = [float(p[0])]
    reps = [0]
    ranked: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # node -> children by probability, their running sums
    step = 0
    while True:
        best = None  # (cost, node, kind, number of children kept)
        for v in sorted(reps):
            if ptr[v + 1] > ptr[v]:
                if v not in ranked:
                    kids = idx[ptr[v] : ptr[v + 1]]
                    order = kids[np.argsort(-p[kids], kind="stable")]
                    ranked[v] = (order, np.cumsum(p[order]))
                j = min(len(ranked[v][0]), r - len(reps) + 1)
                cost = max(float(p[v]) - float(ranked[v][1][j - 1]), 0.0)
                if best is None or cost < best[0]:
                    best = (cost, v, 0, j)
            if len(reps) > 1 and (best is None or float(p[v]) < best[0]):
                best = (float(p[v]), v, 1, 0)
        if best is None:
            return points, subtrees, mu
        step += 1
        cost, v, kind, j = best
        reps.remove(v)
        if kind == 0:
            order = ranked[v][0]
            points.append((v, step))
            subtrees.extend((int(c), step) for c in order[j:])
            reps.extend(int(c) for c in order[:j])
        else:
            subtrees.append((v, step))
        mu.append(min(mu[-1], mu[-1] - cost))


def refine_sequence(node: np.ndarray, taxonomy: Taxonomy, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row's refinement sequence.

    Args:
        node: float64 node probabilities ``[B, N]`` of a tree.
        taxonomy: the tree.
        r: the most nodes per set.

    Returns:
        ``drop [B, N]`` int64, the step at which each node leaves the covered set (``M`` = never), and
        ``mu [B, M]`` float64, the covered mass after each step (``mu[:, 0]`` the root's; ``0`` past the end).
    """
    b, n = node.shape
    ptr, idx = taxonomy.child_ptr, taxonomy.child_idx
    rows = [_row_sequence(node[i], ptr, idx, r) for i in range(b)]
    width = max((len(m) for _, _, m in rows), default=1)
    never = width
    point = np.full((b, n), never, dtype=np.int64)
    whole = np.full((b, n), never, dtype=np.int64)
    mu = np.zeros((b, width))
    for i, (points, subtrees, masses) in enumerate(rows):
        mu[i, : len(masses)] = masses
        for v, s in points:
            point[i, v] = s
        for v, s in subtrees:
            whole[i, v] = s
    parent = taxonomy.parent
    for level in taxonomy.levels[1:]:  # a dropped subtree takes its descendants with it
        whole[:, level] = np.minimum(whole[:, level], whole[:, parent[level]])
    return np.minimum(point, whole), mu


def set_predictions(drop: np.ndarray, mu: np.ndarray, q: float, taxonomy: Taxonomy) -> np.ndarray:
    """Boolean ``[B, N]``: the nodes of each row's smallest set whose mass exceeds ``q`` (the root when none)."""
    j = (mu[:, 1:] > q).sum(1)  # the masses fall along the sequence: those above q are a prefix
    covered = drop > j[:, None]
    top = covered.copy()
    top[:, 1:] &= ~covered[:, taxonomy.parent[1:]]
    return top

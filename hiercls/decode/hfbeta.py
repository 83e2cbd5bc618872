r"""The exact Bayes-optimal decoder for expected hierarchical F-beta over ancestor-closed node sets.

Setting and convention
----------------------
The label ``y`` is a single node (a leaf or an internal node) with ``p(y)`` the probability that the label is
exactly ``y``. ``Y`` is the set of ancestors-or-self of ``y`` and ``S`` a predicted ancestor-closed set. With
``include_root=False`` (default) the root is left out of both sets, so ``|Y| = depth(y)`` on a tree;
with ``include_root=True`` it is counted in both. Then

.. math:: hF_\beta(S, y) = \frac{(1+\beta^2)\,|S\cap Y|}{\beta^2 |Y| + |S|}

with the convention ``hF = 1`` when both sets are empty (the label is the root and only the root is predicted)
and ``0`` for any other ``0/0`` (``beta = 0``, empty prediction). Sets returned by the decoders always
contain the root node; it is simply not counted when ``include_root=False``.

Why the algorithm is exact
--------------------------
Write ``q_m(n) = P(n in Y and |Y| = m)``. For ``|S| = k`` the objective is linear in ``S``:

.. math:: E[hF_\beta(S)] = \sum_{n\in S} w_k(n), \qquad w_k(n) = (1+\beta^2)\sum_m \frac{q_m(n)}{\beta^2 m + k}.

*Monotonicity.* If ``a`` is an ancestor of ``n`` then ``{n in Y, |Y| = m}`` is contained in ``{a in Y, |Y| = m}``
for every ``m`` (the label size does not depend on which of its ancestors we look at), so
``q_m(a) >= q_m(n)`` for each ``m`` separately and ``w_k(a) >= w_k(n)`` for every ``k``. (This holds on DAGs too.)

*Top-k is ancestor-closed.* Sort the nodes by ``w_k`` descending, ties by node id ascending (ids are
topological, so an ancestor precedes its descendants among equal weights). Every ancestor of a node sorts
before it, so the first ``k`` nodes form an ancestor-closed set; being the unconstrained maximum-weight
``k``-subset, it is optimal among ancestor-closed sets of size ``k``. The optimum is therefore
``max_k V_k`` with ``V_k`` = sum of the ``k`` largest ``w_k`` (and the empty set, worth ``P(|Y| = 0)``).
The floating-point weights are computed so that this order survives round-off: ``q`` is a difference of
prefix sums of non-negative numbers (monotone under round-to-nearest) and ``w`` accumulates the same products
in the same order for every node.

*Safe pruning of the size k.* Two bounds hold for every ``k' >= k``. First, ``|S cap Y| <= min(k', m)``:

.. math:: V_{k'} \le \bar U(k) = (1+\beta^2)\sum_m P(|Y| = m)\,\frac{m}{\beta^2 m + \max(k, m)},

non-increasing in ``k`` and valid on every tree, balanced or not (it uses the actual label-size
distribution, not a depth assumed uniform). Second, ``w_{k'}(n) <= (1+\beta^2) P(n) / (\beta^2 + k')`` (a counted
node's labels have ``|Y| >= 1``), so ``V_{k'} <= (1+\beta^2) SP(k') / (\beta^2 + k')`` with ``SP`` the sum of the
``k'`` largest ``P``; with ``SP(k') <= SP(k) + (k' - k) P_{(k+1)}`` the right side is monotone in ``k'`` and its
supremum is the larger of its value at ``k`` and ``(1+\beta^2) P_{(k+1)}``. Once the smaller bound is at most the
best value found, no larger set can do better and the search over ``k`` stops.

*Safe pruning of the candidate nodes.* Let ``C`` be the nodes with ``P(n) > tau`` (an ancestor-closed set,
since ``P`` only grows towards the root), where ``tau`` is the largest ``P`` outside ``C``. Every node
outside has ``w_k(n) <= u_k = (1+\beta^2) tau / (\beta^2 + k)``. A size ``k`` is settled when either
``u_k`` is at most the ``k``-th largest weight inside ``C`` (then the top-``k`` sum over ``C`` is the global
one) or the relaxation that lets any number of outside nodes in at weight ``u_k`` (the sum of the ``k``
largest of ``max(w, u_k)``) is at most the best value (then size ``k`` cannot win). The decoder checks this
for every ``k`` below the stopping size; samples that fail are re-solved with 4x more candidates, ending
(rarely) with every node, where it holds trivially. A node with ``P(n) = 0`` has zero weight, and dropping it
from a set keeps the set closed and never lowers the objective (same numerators, smaller denominator), so
zero-probability nodes never matter. The result is exact on every input; the candidate sets only decide
how fast. ``P`` here is re-summed from the clipped label probabilities, so the argument holds even when the
input node probabilities are slightly inconsistent (float32 round-off).

*Deep trees and flat rows: branch and bound over the size.* Trees of height 48 or more, and rows the candidates
cannot narrow (more than 256 needed, or ties at ``tau``), use :class:`_SizeSearch`: ``V_k`` is evaluated
exactly at a few sizes (``w_k`` of every node from one prefix sum, O(N); on a chain, whose top-``k`` set is its
first ``k`` nodes, O(depth) from the label mass by depth), and every interval ``(a, b)`` of sizes between two
evaluated ones is bounded from above by the convexity of ``1/(c + k)`` in ``k`` together with the concavity of
top-``k`` sums (and on chains by a box bound from prefix sums of the label mass), capped by :math:`\bar U`.
Intervals whose bound falls to the best value are dropped, the others split where their bound peaks, until
none is left: exact, like the rest. Rows whose labels all have one size (a star, leaf labels at one depth) keep
one node order for every ``k`` and are solved from one sort.

*Trees, node-major blocks.* Trees of height below 48 whose nodes have at most 2,048 children are decoded by
:func:`_tree_block` in blocks of rows, in either memory layout: one gather makes a block node-major in
depth-major order, the label probabilities are one sparse product and the prefix sums whole-row additions.
Candidates grow top-down (children of candidates with ``P~`` above a fraction of the total), so they are
ancestor-closed by construction, and the children left out bound every outside node by depth: labels below a
node at depth ``d`` have ``|Y| >= d`` (``d + 1`` with the root), so ``w_k(n) <= (1+\beta^2) P~(f) / (\beta^2 d_f
+ k)`` for its first outside ancestor-or-self ``f`` (see :func:`_solve`). Rows not certified go to the row path
above, so the result is the same exact optimum.

Cost: one pass of prefix sums over ``[B, N]`` plus ``O(c * H * K)`` per sample for ``c`` candidates, label
depths ``H`` and sizes ``K`` searched, vectorised over the batch; the size search costs O(N) per evaluated size
(O(depth) on a chain) for a few tens of sizes, O(N log N) for single-size rows. Measured (bench/bench_worstcase.py):
a 10,000-node chain and a 100,000-child star decode 100 samples in well under a second for realistic
posteriors. DAGs use dense per-depth sums over all nodes (fine for DAGs of a few thousand nodes).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np
import scipy.sparse as sp

from hiercls._checks import check_beta
from hiercls.decode.checks import check_label_mass
from hiercls.decode.inputs import Batch, chunked, label_distribution, prepare, restore_sets, restore_values
from hiercls.decode.registry import register_decoder
from hiercls.taxonomy import Taxonomy

logger = logging.getLogger(__name__)

__all__ = ["expected_hfbeta", "optimal_hfbeta"]

_K_BLOCK = 16
_CHUNK = 256
_MAX_ELEMENTS = 1 << 23  # bound on the [rows, candidates, depths] work arrays of the fallback levels
_DEEP_HEIGHT = 48  # trees with more depths use _tree_rows_deep (no [candidates, depths] arrays)
_SEARCH_FROM = 256  # rows needing more candidates go to _SizeSearch over every node
_FRACTIONS = (0.05, 0.005, 0.0005)  # threshold rounds: nodes with P~ above these fractions of the row's mass


def _label_sizes(taxonomy: Taxonomy, include_root: bool) -> np.ndarray:
    """``|Y|`` of every node as a label under the root convention."""
    cache = taxonomy.namespace_cache(__name__)
    key = ("label_sizes", include_root)
    if key not in cache:
        if taxonomy.is_tree:  # depth + 1 ancestors-or-self; no N x depth ancestor matrix on deep trees
            counts = np.asarray(taxonomy.depth, dtype=np.int64) + 1
        else:
            counts = np.diff(taxonomy.ancestors_sparse.indptr).astype(np.int64)  # ancestors-or-self, root included
        cache[key] = counts - (0 if include_root else 1)
    return cache[key]


def expected_hfbeta(
    sets: Any,
    probs: Any,
    taxonomy: Taxonomy,
    beta: float = 1.0,
    *,
    include_root: bool = False,
    leaf_probs: bool = False,
) -> Any:
    """Exact expected hF-beta of predicted node sets under the label distribution implied by ``probs``.

    Args:
        sets: boolean node sets ``[B, N]`` (any set is accepted; hF is meant for ancestor-closed ones).
        probs: node probabilities ``[B, N]``, or leaf probabilities ``[B, L]`` with ``leaf_probs=True``.
        taxonomy: the taxonomy.
        beta: the F-beta weight (``beta > 1`` favours recall, i.e. deeper predictions).
        include_root: count the root in every set (see the module docstring for the convention).
        leaf_probs: ``probs`` holds leaf probabilities.

    Returns:
        ``[B]`` expected scores (NumPy, or torch on the input's device when ``probs`` is a tensor).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> probs = np.array([[1.0, 0.8, 0.5, 0.3, 0.2]])
        >>> s = np.array([[True, True, False, False, False]])  # predict {a}
        >>> round(float(expected_hfbeta(s, probs, tax)[0]), 4)  # 0.5*2/3 + 0.3*2/3 + 0.2*0
        0.5333
    """
    b2 = check_beta(beta) ** 2
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs)
    s = _as_sets(sets, taxonomy, batch.node.shape[0])
    s[:, 0] = include_root
    p = batch.label
    inter = _path_counts(s, taxonomy)  # [B, N]: |S cap Y_y| for every label y
    size = s.sum(1).astype(np.float64)[:, None]
    ly = _label_sizes(taxonomy, include_root).astype(np.float64)[None, :]
    denom = b2 * ly + size
    both_empty = (ly == 0) & (size == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        hf = np.where(denom > 0, (1 + b2) * inter / np.where(denom > 0, denom, 1.0), 0.0)
    hf = np.where(both_empty, 1.0, hf)
    return restore_values((p * hf).sum(1), batch)


def _path_counts(s: np.ndarray, taxonomy: Taxonomy) -> np.ndarray:
    """``|S cap Y_y|`` for every set row and label ``y``: members among the ancestors-or-self of ``y``.

    On a tree (pre-order ids) ``n`` is an ancestor-or-self of ``y`` iff ``n <= y < n + size(n)``, so the count is
    a prefix sum of ``+1`` at each member and ``-1`` where its subtree ends: O(N) per row, where the ancestor
    matrix has N * depth entries (50 million on a 10,000-node chain). DAGs use the ancestor matrix.
    """
    if not taxonomy.is_tree:
        return np.asarray(taxonomy.ancestors_sparse.astype(np.float64).dot(s.T.astype(np.float64))).T
    n = taxonomy.num_nodes
    cache = taxonomy.namespace_cache(__name__)
    if "subtree_end_csr" not in cache:
        ends = np.arange(n) + np.asarray(taxonomy.subtree_size, dtype=np.int64)
        cache["subtree_end_csr"] = sp.csr_matrix((np.ones(n), (np.arange(n), ends)), shape=(n, n + 1))
    step = np.zeros((s.shape[0], n + 1))
    step[:, :n] = s
    step -= np.asarray(cache["subtree_end_csr"].T.dot(s.T.astype(np.float64))).T
    return np.cumsum(step, axis=1)[:, :n]


def _as_sets(sets: Any, taxonomy: Taxonomy, batch_size: int) -> np.ndarray:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(sets, torch.Tensor):
        sets = sets.detach().cpu().numpy()
    s = np.asarray(sets)
    if s.ndim == 1:
        s = s[None, :]
    if s.shape != (batch_size, taxonomy.num_nodes):
        raise ValueError(
            f"sets must be boolean node sets [B, N] = [{batch_size}, {taxonomy.num_nodes}]; got shape {list(s.shape)}"
        )
    return s.astype(bool, copy=True)


# ---------------------------------------------------------------------------------------------- the solver
def _search_weights(q: np.ndarray, lv: np.ndarray, ks: np.ndarray, b2: float) -> np.ndarray:
    """``w_k(n)`` for every candidate and every ``k`` in ``ks``: ``[rows, len(ks), c]``.

    Used for the search values only; the final selection recomputes the weights of the chosen size with a
    fixed summation order (see :func:`_solve`), which is what keeps the chosen set ancestor-closed.
    """
    coef = (1.0 + b2) / (b2 * lv[None, :].astype(np.float64) + ks[:, None].astype(np.float64))  # [K, M]
    coef[:, lv == 0] = 0.0
    # [K, M] @ [rows, M, c] on the transposed view: numpy's own small-matrix loop, no BLAS threads, and the
    # result comes out in the [rows, K, c] layout the sorts want (10x faster than a flat GEMM plus a transpose).
    return np.matmul(coef, q.transpose(0, 2, 1))


def _upper_bound(r: np.ndarray, lv: np.ndarray, ks: np.ndarray, b2: float) -> np.ndarray:
    """:math:`\\bar U(k)` for every row and every ``k`` in ``ks``: ``[rows, len(ks)]``."""
    lvf = lv.astype(np.float64)
    big = np.maximum(ks[:, None].astype(np.float64), lvf[None, :])  # [K, M]
    frac = np.where(lvf[None, :] > 0, lvf[None, :] / (b2 * lvf[None, :] + big), 0.0)
    return (1.0 + b2) * np.einsum("gm,km->gk", r, frac)  # no BLAS threads for a [G, M] x [M, K] product


def _mass_bound(p_sorted: np.ndarray, nvalid: np.ndarray, tau: np.ndarray, ks: np.ndarray, b2: float) -> np.ndarray:
    """A second bound on every ``V_{k'}``, ``k' >= k``, from the node probabilities alone: ``[rows, len(ks)]``.

    ``w_{k'}(n) <= (1+b2) P(n) / (b2 + k')`` (labels below a counted node have ``|Y| >= 1``), so
    ``V_{k'} <= (1+b2) SP(k') / (b2 + k')`` with ``SP`` the sum of the ``k'`` largest ``P``, and
    ``SP(k') <= SP(k) + (k' - k) P_(k+1)``. The right side is monotone in ``k'``, so its supremum over
    ``k' >= k`` is the larger of its value at ``k`` and its limit ``(1+b2) P_(k+1)``.
    """
    g, c = p_sorted.shape
    sp = np.concatenate([np.zeros((g, 1)), np.cumsum(p_sorted, axis=1)], axis=1)  # sp[:, j] = top-j sum
    kk = np.minimum(ks[None, :], nvalid[:, None])  # [G, K]
    top = np.take_along_axis(sp, kk, axis=1) + (ks[None, :] - kk) * tau[:, None]
    nxt_idx = np.minimum(ks[None, :], c - 1)
    nxt = np.where(ks[None, :] < nvalid[:, None], np.take_along_axis(p_sorted, nxt_idx, axis=1), tau[:, None])
    return (1.0 + b2) * np.maximum(top / (b2 + ks[None, :]), nxt)


def _solve(
    q: np.ndarray,
    lv: np.ndarray,
    valid: np.ndarray,
    r: np.ndarray,
    p_empty: np.ndarray | None,
    tau: np.ndarray,
    b2: float,
    tau_depth: np.ndarray | None = None,
    max_k: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best value, best size, certificate and chosen candidates for rows of candidate weights.

    ``q`` is ``[G, c, M]`` (``q[:, j, m]`` the probability that candidate ``j`` is on a label path of size
    ``lv[m]``), candidates sorted by node id with the invalid ones last; ``r`` ``[G, M]`` the label-size
    distribution; ``p_empty`` the value of the empty prediction (``None`` when the root is counted);
    ``tau`` the largest node probability outside the candidates; ``tau_depth`` ``[G, M]`` (optional, trees), the
    largest ``P~`` of the outside nodes whose parent is a candidate, by depth ``m`` (0 where none).

    With ``tau_depth`` the outside weights are bounded by depth: every label at or below an outside node ``n``
    has ``|Y| >= lv[depth(n)]``, so ``w_k(n) <= (1+b2) P~(n) / (b2 lv[depth(n)] + k)``; and ``n`` has an
    ancestor-or-self ``f`` outside whose parent is a candidate (candidates are ancestor-closed and hold the root),
    with ``P~(n) <= P~(f)`` and ``depth(n) >= depth(f)``. Hence ``w_k(n) <= (1+b2) max_m tau_depth[m] /
    (b2 lv[m] + k)``, at most the depth-free bound ``(1+b2) tau / (b2 + k)``.

    Sizes are searched up to ``max(c, max_k)``; past ``c`` no size is feasible within the candidates and the
    relaxation counts the missing nodes at the outside bound, which lets the bounds settle sizes beyond the
    candidates without padding ``q``.

    A size ``k`` is settled when the top-``k`` sum over the candidates is provably the global one
    (``exact``: no outside node can beat the ``k``-th candidate weight) or when even the relaxation that lets
    outside nodes in at their upper bound stays at or below the best value (``relaxed``).
    """
    g, c, _ = q.shape
    kmax = max(c, int(max_k))
    nvalid = valid.sum(1)
    best = np.full(g, -np.inf) if p_empty is None else p_empty.astype(np.float64).copy()
    best_k = np.zeros(g, dtype=np.int64)
    exact = np.zeros((g, max(kmax, 1)), dtype=bool)
    relaxed = np.full((g, max(kmax, 1)), np.inf)
    # Candidate probabilities, capped below by tau: outside nodes may be up to tau, so these bound the top sums.
    p_sorted = np.maximum(-np.sort(-np.where(valid, q.sum(2), 0.0), axis=1), tau[:, None])
    active = np.flatnonzero(nvalid > 0)
    k0 = 1
    while active.size and k0 <= kmax:
        k1 = min(kmax, k0 + _K_BLOCK - 1)
        ks = np.arange(k0, k1 + 1)
        kc = np.minimum(ks, c) - 1  # past c: infeasible, the relaxation adds (k - c) outside nodes
        extra = np.maximum(ks - c, 0)
        # [A, K, c]: sorts and prefix sums run along the contiguous last axis.
        w = np.where(valid[active][:, None, :], _search_weights(q[active], lv, ks, b2), -1.0)
        w_sorted = -np.sort(-w, axis=2)
        cols = np.arange(len(ks))
        value = np.cumsum(w_sorted, axis=2)[:, cols, kc]  # [A, K]
        kth = w_sorted[:, cols, kc]
        feasible = ks[None, :] <= nvalid[active][:, None]
        value = np.where(feasible, value, -np.inf)
        t = tau[active][:, None]
        if tau_depth is None:
            outside = (1.0 + b2) * t / (b2 + ks[None, :])  # [A, K]
        else:
            den = b2 * lv[None, None, :].astype(np.float64) + ks[None, :, None]  # >= k >= 1
            outside = (1.0 + b2) * (tau_depth[active][:, None, :] / den).max(2)
        ex = np.where(feasible, outside <= kth, t == 0)
        exact[active, k0 - 1 : k1] = ex
        loose = np.flatnonzero(~ex.all(1))  # the relaxation only matters where a size is not settled exactly
        if loose.size:
            relaxed[active[loose], k0 - 1 : k1] = (
                np.cumsum(np.maximum(w_sorted[loose], outside[loose, :, None]), axis=2)[:, cols, kc]
                + extra[None, :] * outside[loose]
            )
        block_best = value.max(1)
        block_arg = value.argmax(1)  # first maximum: the smallest size wins ties
        better = block_best > best[active]
        best[active[better]] = block_best[better]
        best_k[active[better]] = ks[block_arg[better]]
        nxt = np.array([k1 + 1])
        bound = np.minimum(
            _upper_bound(r[active], lv, nxt, b2)[:, 0],
            _mass_bound(p_sorted[active], nvalid[active], tau[active], nxt, b2)[:, 0],
        )
        done = (bound <= best[active]) | ((k1 + 1 > nvalid[active]) & (tau[active] == 0))
        active = active[~done]
        k0 = k1 + 1

    # Certificate: every size below the first k whose bound falls under the best must be settled.
    all_k = np.arange(1, kmax + 2)
    ub = np.minimum(_upper_bound(r, lv, all_k, b2), _mass_bound(p_sorted, nvalid, tau, all_k, b2))  # [G, c+1]
    below = ub <= best[:, None]
    k_hat = np.where(below.any(1), below.argmax(1) + 1, kmax + 2)
    need = k_hat - 1
    settled = exact[:, :kmax] | (relaxed[:, :kmax] <= best[:, None])
    prefix_ok = np.cumprod(np.concatenate([np.ones((g, 1), dtype=bool), settled], axis=1), axis=1).astype(bool)
    certified = prefix_ok[np.arange(g), np.minimum(need, kmax)] & ((need <= kmax) | (tau == 0))

    chosen = np.zeros((g, c), dtype=bool)
    pick = np.flatnonzero(best_k > 0)
    if pick.size:
        kk = best_k[pick]
        coef = (1.0 + b2) / (b2 * lv[None, :].astype(np.float64) + kk[:, None].astype(np.float64))  # [P, M]
        w = np.zeros((pick.size, c))
        qp = q[pick]
        for m in range(q.shape[2]):
            if lv[m] > 0:
                w += qp[:, :, m] * coef[:, m, None]
        w[~valid[pick]] = -1.0
        # Fixed summation order per node: w stays monotone along ancestry in floating point, and the stable
        # sort keeps id order among ties, so every ancestor of a chosen node is chosen.
        order = np.argsort(-w, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(c)[None, :].repeat(pick.size, 0), axis=1)
        chosen[pick] = rank < kk[:, None]
    return best, best_k, certified, chosen


# ---------------------------------------------------------------------------------------------- trees
def tree_tables(taxonomy: Taxonomy) -> dict[str, np.ndarray]:
    """Per-taxonomy tables of the tree decoder (DFS order, depth segments, subtree ranges), cached."""
    cache = taxonomy.namespace_cache(__name__)
    if "hf_tree" not in cache:
        n = taxonomy.num_nodes
        depth = taxonomy.depth
        size = taxonomy.subtree_size
        ids = np.arange(n)
        order = np.lexsort((ids, depth))  # depth-major, ids ascending within a depth
        sorted_depth = depth[order]
        h = int(depth.max())
        seg_lo = np.searchsorted(sorted_depth, np.arange(h + 1), side="left")
        seg_hi = np.searchsorted(sorted_depth, np.arange(h + 1), side="right")
        lo = np.empty((n, h + 1), dtype=np.int64)
        hi = np.empty((n, h + 1), dtype=np.int64)
        for m in range(h + 1):
            level = order[seg_lo[m] : seg_hi[m]]
            # On a pre-order tree the descendants of n at depth m are the level's ids in [n, n + size).
            lo[:, m] = seg_lo[m] + np.searchsorted(level, ids)
            hi[:, m] = seg_lo[m] + np.searchsorted(level, ids + size)
        cache["hf_tree"] = {
            "order": order,
            "seg_lo": seg_lo,
            "seg_hi": seg_hi,
            "lo": lo,
            "hi": hi,
            "size": size.astype(np.int64),
            "ends": ids + size.astype(np.int64),
            "preorder_is_depth_major": bool(np.array_equal(order, ids)),
        }
    return cache["hf_tree"]


def _select_candidates(ptil: np.ndarray, first: int, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ancestor-closed candidates ``{P > tau}`` (at most ``c`` counted nodes), sorted by id; invalid last."""
    g, n = ptil.shape
    counted = ptil[:, first:]
    if c < counted.shape[1]:
        part = np.argpartition(-counted, c - 1, axis=1)[:, :c]
        vals = np.take_along_axis(counted, part, axis=1)
        tau = vals[:, c - 1].copy()
        valid = vals > tau[:, None]
        ids = part + first
    else:
        ids = np.broadcast_to(np.arange(first, n), counted.shape)
        valid = counted > 0
        tau = np.zeros(g)
    key = np.where(valid, ids, n)
    key.sort(axis=1)
    width = max(int((key < n).sum(1).max(initial=0)), 1)
    key = key[:, :width]
    valid = key < n
    return np.where(valid, key, 0), valid, tau


def _tree_rows(
    node: np.ndarray, leaf: np.ndarray | None, taxonomy: Taxonomy, b2: float, include_root: bool, c0: int
) -> tuple[np.ndarray, np.ndarray]:
    tab = tree_tables(taxonomy)
    g, n = node.shape
    first = 0 if include_root else 1
    off = 1 if include_root else 0
    h = tab["lo"].shape[1] - 1
    lv = np.arange(h + 1) + off  # label size of a label at depth m
    # Row-major [G, N]: the prefix sums run along contiguous rows (numpy's cumsum along axis 0 is several times
    # slower), and every gather below takes the same columns from each row.
    # label probability P(n) - sum of P(children), made row-major: one transposing copy makes both prefix sums
    # below run along contiguous rows, 3x faster than along the node-major axis 0.
    pt = _label_rows(node, taxonomy, leaf)
    # P~(n), the node probabilities re-summed from the clipped label probabilities: exactly monotone along
    # ancestry (differences of a non-decreasing prefix sum), so {P~ > tau} is ancestor-closed.
    cs = np.zeros((g, n + 1))
    np.cumsum(pt, axis=1, out=cs[:, 1:])
    ptil = np.take(cs, tab["ends"], axis=1)  # [G, N]; np.take beats fancy indexing on rows
    ptil -= cs[:, :n]
    cs_dm = cs  # reused: the prefix sums in depth-major order (the same ones when pre-order is depth-major)
    if not tab["preorder_is_depth_major"]:  # cs is not needed past P~: overwrite it
        np.cumsum(np.take(pt, tab["order"], axis=1), axis=1, out=cs_dm[:, 1:])
    r = cs_dm[:, tab["seg_hi"]] - cs_dm[:, tab["seg_lo"]]  # [G, h+1] label mass by depth
    p_empty = None if include_root else r[:, 0]
    flat_dm = cs_dm.ravel()

    sets = np.zeros((g, n), dtype=bool)
    sets[:, 0] = True
    values = np.zeros(g)

    def solve_rows(rows: np.ndarray, cand: np.ndarray, valid: np.ndarray, tau: np.ndarray, full: bool) -> np.ndarray:
        base = (rows * cs_dm.shape[1])[:, None, None]  # flat gathers: cheaper than 2-D fancy indexing
        q = np.take(flat_dm, base + tab["hi"][cand]) - np.take(flat_dm, base + tab["lo"][cand])  # [R, w, h+1]
        q[~valid] = 0.0
        best, _best_k, ok, chosen = _solve(q, lv, valid, r[rows], None if p_empty is None else p_empty[rows], tau, b2)
        if full and not ok.all():  # pragma: no cover - impossible by the proof; fail loudly, never silently
            raise RuntimeError("optimal_hfbeta: certificate failed with every candidate node")
        done = rows[ok]
        values[done] = best[ok]
        rr, jj = np.nonzero(chosen[ok])
        sets[done[rr], cand[ok][rr, jj]] = True
        return rows[~ok]

    # Threshold rounds: the nodes above a fraction of the row's mass (an ancestor-closed set, found with one
    # comparison instead of a partition), rows grouped by how many there are so that narrow rows stay narrow.
    # Rows whose certificate fails try the next, 10x lower fraction, as long as at most c0 nodes pass it (a
    # flat tail below a few large nodes, common on wide trees); the others go to the top-c rounds below.
    def threshold_round(rows_in: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        counted = ptil[rows_in, first:]
        above = counted > (fraction * ptil[rows_in, :1])
        count = above.sum(1)
        tau0 = np.where(above, 0.0, counted).max(1, initial=0.0)
        fits = np.flatnonzero(count <= c0)
        width_of = np.maximum(8 * ((count[fits] + 7) // 8), 1)
        failed = []
        for width in np.unique(width_of):
            sel = fits[width_of == width]
            rr, cc = np.nonzero(above[sel])
            rank = np.arange(rr.size) - np.repeat(np.cumsum(count[sel]) - count[sel], count[sel])
            cand = np.zeros((sel.size, int(width)), dtype=np.int64)
            valid = np.zeros((sel.size, int(width)), dtype=bool)
            cand[rr, rank] = cc + first
            valid[rr, rank] = True
            failed.append(solve_rows(rows_in[sel], cand, valid, tau0[sel], False))
        too_many = rows_in[count > c0]
        return (np.concatenate(failed) if failed else np.zeros(0, dtype=np.int64)), too_many

    pending_parts = []
    retry = np.arange(g)
    for fraction in _FRACTIONS:
        if not retry.size:
            break
        retry, too_many = threshold_round(retry, fraction)
        pending_parts.append(too_many)
    pending_parts.append(retry)
    pending = np.concatenate(pending_parts)
    c = min(c0, n - first)

    def search_rows(rows: np.ndarray) -> None:
        # The weights of every node per size (O(N) each) beat [candidates, sizes] arrays for many candidates.
        search = _SizeSearch(np.ascontiguousarray(pt[rows]), taxonomy, b2, include_root, r=r[rows], ptil=ptil[rows])
        search.run(search.first_guess())
        sets[rows] = search.sets()
        values[rows] = search.best

    while pending.size:
        if c > _SEARCH_FROM:
            search_rows(pending)
            break
        full = c >= n - first
        rows_per_step = pending.size if not full else max(1, _MAX_ELEMENTS // max(1, (n - first) * (h + 1)))
        failed = []
        for s in range(0, pending.size, rows_per_step):
            rows = pending[s : s + rows_per_step]
            cand, valid, tau = _select_candidates(ptil[rows], first, c)
            # Ties at tau keep most nodes out (a flat row): more candidates would not help, the search does.
            tied = (valid.sum(1) < c // 4) & (not full)
            if tied.any():
                search_rows(rows[tied])
                rows, cand, valid, tau = rows[~tied], cand[~tied], valid[~tied], tau[~tied]
            failed.append(solve_rows(rows, cand, valid, tau, full))
        pending = np.concatenate(failed) if failed else np.zeros(0, dtype=np.int64)
        if pending.size:
            logger.debug("optimal_hfbeta: %d rows need more than %d candidates", pending.size, c)
        c = min(c * 4, n - first)
    return sets, values


# ---------------------------------------------------------------------------------------------- trees, node-major
_BLOCK_WIDTH = 40  # sizes searched at least (past the candidates: bounds only), where the bounds usually settle
_BLOCK_ELEMENTS = 1 << 20  # rows x nodes per block of _tree_block (float64 node-major work arrays of ~8 MB)
_BLOCK_FRACTIONS = (0.1, 0.02, 0.005, 0.0005)  # _tree_block's rounds: fewer first candidates, cheaper sorts
_BLOCK_MAX_CHILDREN = 2048  # wider nodes (stars) make the top-down candidate growth list every child per row


def _block_path(taxonomy: Taxonomy) -> bool:
    """Whether :func:`_tree_block` decodes this tree: not deep (the size search) and no very wide node."""
    return (
        taxonomy.is_tree
        and taxonomy.height + 1 <= _DEEP_HEIGHT
        and int(np.max(taxonomy.num_children, initial=0)) <= _BLOCK_MAX_CHILDREN
    )


def _block_tables(taxonomy: Taxonomy) -> dict[str, Any]:
    """Depth-major tables of :func:`_tree_block`: children as csr and as position ranges, per-level csr, cached."""
    cache = taxonomy.namespace_cache(__name__)
    if "hf_block" not in cache:
        tab = tree_tables(taxonomy)
        n = taxonomy.num_nodes
        order, lo, hi, seg_lo, seg_hi = tab["order"], tab["lo"], tab["hi"], tab["seg_lo"], tab["seg_hi"]
        h = lo.shape[1] - 1
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        parent_pos = pos[np.asarray(taxonomy.parent, dtype=np.int64)[order[1:]]]  # order[0] is the root
        # Children sums in depth-major positions; csr sums each row's children in ascending id order, as
        # label_distribution_t does, so the label probabilities are the same numbers.
        child = sp.csr_matrix((np.ones(n - 1), (parent_pos, np.arange(1, n))), shape=(n, n))
        child.sort_indices()
        levels = [child[seg_lo[d] : seg_hi[d], seg_lo[d + 1] : seg_hi[d + 1]].tocsr() for d in range(h)]
        depth_dm = np.asarray(taxonomy.depth, dtype=np.int64)[order]
        cstart = np.zeros(n, dtype=np.int64)
        cend = np.zeros(n, dtype=np.int64)
        inner = depth_dm < h
        # On a pre-order tree the children of a node are one contiguous run of the next depth's positions.
        cstart[inner] = lo[order[inner], depth_dm[inner] + 1]
        cend[inner] = hi[order[inner], depth_dm[inner] + 1]
        bs = max(8, int(np.sqrt(n)))
        cache["hf_block"] = {
            "order": order,
            "child": child,
            "levels": levels,
            "seg_lo": seg_lo,
            "seg_hi": seg_hi,
            "lo": lo,
            "hi": hi,
            "cstart": cstart,
            "cend": cend,
            "bs": bs,
            "nb": -(-n // bs),
            "h": h,
        }
    return cache["hf_block"]


def _tree_block(
    node: np.ndarray, taxonomy: Taxonomy, b2: float, include_root: bool, c0: int, row0: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Trees from node probabilities ``[G, N]`` in either memory layout: node-major, depth-major work arrays.

    One gather makes the block node-major in depth-major order (a view's rows for Fortran-order input), where
    the label probabilities are one sparse product, ``P~`` one sparse product per level and the prefix sums
    whole-row additions. Candidates are grown top-down, children of candidates with ``P~`` above a fraction of
    the total: ancestor-closed by construction, and the children left out give the depth-wise bound on every
    outside node (see :func:`_solve`). Rows the threshold rounds do not certify go to :func:`_tree_rows`.
    """
    tab = _block_tables(taxonomy)
    g, n = node.shape
    order, bs, nb, h = tab["order"], tab["bs"], tab["nb"], tab["h"]
    off = 1 if include_root else 0
    lv = np.arange(h + 1) + off
    a = np.zeros((nb * bs, g))
    a[:n] = node.T[order]
    a[:n] -= tab["child"] @ a[:n]
    label = np.empty((g, n))
    label[:, order] = a[:n].T
    check_label_mass(label, taxonomy, node, row_offset=row0)
    del label
    np.maximum(a, 0.0, out=a)
    sl, sh = tab["seg_lo"], tab["seg_hi"]
    ptil = a[:n].copy()  # P~ bottom-up: p(n) + the children's P~, sums of non-negatives, monotone along ancestry
    for d in range(h - 1, -1, -1):
        ptil[sl[d] : sh[d]] += tab["levels"][d] @ ptil[sl[d + 1] : sh[d + 1]]
    cs = prefix_sums_t(a, block=bs)
    del a
    r = np.ascontiguousarray((cs[sh] - cs[sl]).T)  # [G, h+1] label mass by depth (= q of the root)
    p_empty = None if include_root else r[:, 0]
    csf, ptf = cs.ravel(), ptil.ravel()
    lo, hi, cstart, cend = tab["lo"], tab["hi"], tab["cstart"], tab["cend"]
    sets = np.zeros((g, n), dtype=bool)
    sets[:, 0] = True
    values = np.zeros(g)
    rows_in = np.arange(g)
    for fraction in _BLOCK_FRACTIONS:
        if not rows_in.size:
            break
        m_rows = rows_in.size
        thr = fraction * ptil[0, rows_in]
        tau_depth = np.zeros((m_rows, h + 1))
        count = np.zeros(m_rows, dtype=np.int64)
        pr, pj = np.arange(m_rows), np.zeros(m_rows, dtype=np.int64)  # (row, depth-major position) pairs
        kept_r, kept_j = ([pr], [pj]) if include_root else ([], [])
        depth = 0
        while pr.size:
            cnt = cend[pj] - cstart[pj]
            total = int(cnt.sum())
            if total == 0:
                break
            depth += 1
            rr = np.repeat(pr, cnt)
            cj = np.repeat(cstart[pj] - (np.cumsum(cnt) - cnt), cnt) + np.arange(total)
            v = ptf[cj * g + rows_in[rr]]
            keep = v > thr[rr]
            out = ~keep
            np.maximum.at(tau_depth[:, depth], rr[out], v[out])
            pr, pj = rr[keep], cj[keep]
            count += np.bincount(pr, minlength=m_rows)
            fit = count[pr] <= c0  # rows past c0 candidates stop growing (and go to _tree_rows)
            pr, pj = pr[fit], pj[fit]
            kept_r.append(pr)
            kept_j.append(pj)
        tau = tau_depth.max(1)
        key = np.sort(np.concatenate(kept_r) * n + order[np.concatenate(kept_j)])  # by row, then node id
        kr, kid = key // n, key % n
        per_row = np.bincount(kr, minlength=m_rows)
        rank = np.arange(kr.size) - (np.cumsum(per_row) - per_row)[kr]
        fits = np.flatnonzero(count <= c0)
        width_of = np.maximum(8 * ((per_row + 7) // 8), 8)  # a row's own count: layout-independent
        failed = [rows_in[count > c0]]
        local = np.full(m_rows, -1)
        for width in np.unique(width_of[fits]).tolist():
            sel = fits[width_of[fits] == width]
            local[:] = -1
            local[sel] = np.arange(sel.size)
            mine = local[kr] >= 0
            li, ri, ids = local[kr[mine]], rank[mine], kid[mine]
            cand = np.zeros((sel.size, width), dtype=np.int64)
            valid = np.zeros((sel.size, width), dtype=bool)
            cand[li, ri] = ids
            valid[li, ri] = True
            col = rows_in[sel][li][:, None]
            q = np.zeros((sel.size, width, h + 1))
            q[li, ri] = np.take(csf, hi[ids] * g + col) - np.take(csf, lo[ids] * g + col)
            rows = rows_in[sel]
            best, _best_k, ok, chosen = _solve(
                q,
                lv,
                valid,
                r[rows],
                None if p_empty is None else p_empty[rows],
                tau[sel],
                b2,
                tau_depth[sel],
                max_k=_BLOCK_WIDTH,
            )
            done = rows[ok]
            values[done] = best[ok]
            cr, cc = np.nonzero(chosen[ok])
            sets[done[cr], cand[ok][cr, cc]] = True
            failed.append(rows[~ok])
        rows_in = np.sort(np.concatenate(failed))
    if rows_in.size:
        sets[rows_in], values[rows_in] = _tree_rows(node[rows_in], None, taxonomy, b2, include_root, c0)
    return sets, values


_BB_ELEMENTS = 1 << 16  # bound on the [pairs, N] work arrays of the size search


def _label_mass_by_depth(pt: np.ndarray, taxonomy: Taxonomy) -> np.ndarray:
    """``r[g, m]``: label mass at depth ``m`` (one prefix sum in depth-major order, O(N) per row)."""
    cache = taxonomy.namespace_cache(__name__)
    if "depth_segments" not in cache:
        depth = taxonomy.depth
        order = np.argsort(depth, kind="stable")
        bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
        cache["depth_segments"] = (order, bounds)
    order, bounds = cache["depth_segments"]
    cs = np.zeros((pt.shape[0], pt.shape[1] + 1))
    np.cumsum(pt[:, order], axis=1, out=cs[:, 1:])
    return cs[:, bounds[1:]] - cs[:, bounds[:-1]]


class _SizeSearch:
    """Exact ``max_k V_k`` by branch and bound over intervals of the size ``k`` (trees, full rows).

    One *evaluation* at ``(row, k)`` computes ``w_k`` for every node (a prefix sum in pre-order, O(N)), and from
    it ``V_k`` (the sum of the ``k`` largest), the ``k``-th largest ``kth_k`` and the ``(k+1)``-th ``nxt_k``. On a
    chain the top-``k`` set is the first ``k`` counted nodes and all three are sums over the label depths, O(depth).

    *Interval bound.* For ``a < k < b``, ``1/(c + k)`` is convex in ``k``, so ``w_k <= l w_a + (1-l) w_b`` with
    ``l = (b-k)/(b-a)``, and a top-``k`` sum is subadditive: ``V_k <= l T_a(k) + (1-l) T_b(k)`` with ``T_x(k)``
    the sum of the ``k`` largest ``w_x``. ``T_x`` is concave in ``k``, so ``T_a(k) <= V_a + (k-a) nxt_a`` and
    ``T_b(k) <= V_b - (b-k) kth_b``. The bound is the maximum over ``k`` of the resulting concave quadratic,
    capped by :math:`\\bar U(a+1)`; it is exact to second order in ``b - a``, so few bisections settle a flat
    optimum. Beyond the largest evaluated size ``a`` the bound is :math:`\\bar U(a+1)` (sizes double until it
    falls to the best value).
    """

    def __init__(
        self,
        pt: np.ndarray,
        taxonomy: Taxonomy,
        b2: float,
        include_root: bool,
        r: np.ndarray | None = None,
        ptil: np.ndarray | None = None,
    ) -> None:
        self.pt = pt
        self.b2 = b2
        g, n = pt.shape
        self.n = n
        self.first = 0 if include_root else 1
        off = 1 if include_root else 0
        depth = taxonomy.depth
        self.lv = (np.arange(int(depth.max()) + 1) + off).astype(np.float64)  # label size by depth
        self.lsize = (depth + off).astype(np.float64)
        self.ids = np.arange(n)
        self.ends = self.ids + np.asarray(taxonomy.subtree_size, dtype=np.int64)
        self.chain = taxonomy.num_leaves == 1 and n > 1  # node i at depth i: top-k = the first k counted nodes
        self.cnt = n - self.first
        if r is None:
            r = pt if self.chain else _label_mass_by_depth(pt, taxonomy)  # a chain's node i is its depth i
        self.r = r
        self._ptil = ptil
        self.off = off
        if self.chain:
            self.rcum = np.zeros((g, self.lv.size + 1))
            np.cumsum(self.r, axis=1, out=self.rcum[:, 1:])
        self.best = np.full(g, -np.inf) if include_root else self.r[:, 0].copy()
        self.best_k = np.zeros(g, dtype=np.int64)
        self.evaluations = 0
        self.single_rows: dict[int, np.ndarray] = {}  # chosen nodes of the rows solved by _single_size

    @property
    def ptil(self) -> np.ndarray:
        """``P~``: node probabilities re-summed from the label probabilities (exactly monotone along ancestry)."""
        if self._ptil is None:
            cs = np.zeros((self.pt.shape[0], self.n + 1))
            np.cumsum(self.pt, axis=1, out=cs[:, 1:])
            self._ptil = cs[:, self.ends] - cs[:, self.ids]
        return self._ptil

    def first_guess(self) -> np.ndarray:
        """Counted nodes with ``P~`` above half the root's: the majority path, a good first size to try."""
        p = self.ptil
        return np.maximum((p[:, self.first :] > 0.5 * p[:, :1]).sum(1), 1)

    # ------------------------------------------------------------------ exact values and bounds
    def weights(self, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """``w_k`` of every node for each ``(row, k)`` pair, ``[P, N]``; the uncounted root gets ``-inf``."""
        coef = np.where(self.lsize[None, :] > 0, (1.0 + self.b2) / (self.b2 * self.lsize[None, :] + ks[:, None]), 0.0)
        cs = np.zeros((rows.size, self.n + 1))
        np.cumsum(self.pt[rows] * coef, axis=1, out=cs[:, 1:])
        w = cs[:, self.ends] - cs[:, self.ids]  # subtree sums: monotone along ancestry in floating point
        w[:, : self.first] = -np.inf
        return w

    def evaluate(self, rows: np.ndarray, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``V_k``, ``kth_k`` and ``nxt_k`` (0 when ``k`` is every counted node) for each pair."""
        self.evaluations += rows.size
        value = np.empty(rows.size)
        kth = np.empty(rows.size)
        nxt = np.zeros(rows.size)
        kf = ks.astype(np.float64)
        if self.chain:
            lv = self.lv[None, :]
            step = max(1, _BB_ELEMENTS // self.lv.size)
            m = self.lv.size
            for s in range(0, rows.size, step):
                sl = slice(s, s + step)
                k = kf[sl, None]
                rc = self.r[rows[sl]] * ((1.0 + self.b2) / (self.b2 * lv + k))  # k >= 1: no 0/0 at size 0
                value[sl] = (rc * np.minimum(lv, k)).sum(1)
                # w_k of the node at depth d is the label mass at depths >= d times its coefficient: one reduceat
                # over [row start, row start + d) and [row start + d, next row start) pairs.
                d = ks[sl] - 1 + self.first
                start = np.arange(d.size) * m
                sums = np.add.reduceat(rc.ravel(), np.stack([start, start + d], 1).ravel())
                kth[sl] = sums[1::2]
                more = ks[sl] < self.cnt
                nxt[sl] = np.where(more, np.maximum(kth[sl] - rc[np.arange(d.size), d], 0.0), 0.0)
            return value, kth, nxt
        n = self.n
        step = max(1, _BB_ELEMENTS // n)
        for s in range(0, rows.size, step):
            w = self.weights(rows[s : s + step], kf[s : s + step])
            for i, k in enumerate(ks[s : s + step].tolist()):
                j = s + i
                if k < self.cnt:
                    part = np.partition(w[i], (n - k - 1, n - k))
                    nxt[j] = part[n - k - 1]
                else:
                    part = np.partition(w[i], n - k)
                value[j] = part[n - k :].sum()
                kth[j] = part[n - k]
        return value, kth, nxt

    def upper(self, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """:math:`\\bar U(k)` for each pair: bounds ``V_{k'}`` for every ``k' >= k``."""
        out = np.empty(rows.size)
        lv = self.lv[None, :]
        step = max(1, _BB_ELEMENTS // self.lv.size)
        for s in range(0, rows.size, step):
            sl = slice(s, s + step)
            big = np.maximum(ks[sl, None].astype(np.float64), lv)
            frac = lv / (self.b2 * lv + big)  # big >= k >= 1
            out[sl] = (1.0 + self.b2) * (self.r[rows[sl]] * frac).sum(1)
        return out

    # ------------------------------------------------------------------ the search
    def run(self, k0: np.ndarray) -> None:
        """Search every row; ``k0`` is a first guess of the best size per row (a speed knob only)."""
        g = self.pt.shape[0]
        if self.cnt <= 0 or g == 0:
            return
        single = np.flatnonzero((self.r[:, 1 - self.off :] > 0).sum(1) == 1)
        if single.size:
            self._single_size(single)
        rest = np.ones(g, dtype=bool)
        rest[single] = False
        ev: dict[tuple[int, int], tuple[float, float, float, float]] = {}
        k0 = np.where(rest, np.clip(k0, 1, self.cnt), 0)
        if not rest.any():
            return
        todo_rows = np.concatenate([np.flatnonzero(rest), np.flatnonzero(k0 > 1)])
        todo_ks = np.concatenate([np.ones(int(rest.sum()), dtype=np.int64), k0[k0 > 1]])
        # Open intervals of sizes: (row, a, b) with a < k < b unknown; b = -1 for the tail a < k <= cnt.
        new_iv: list[tuple[int, int, int]] = [(r, 1, int(k0[r])) for r in range(g) if k0[r] > 2]
        new_iv += [(r, int(k0[r]), -1) for r in range(g) if 0 < k0[r] < self.cnt]
        open_iv: list[tuple[int, int, int]] = []
        open_bound: list[float] = []
        open_split: list[int] = []
        while True:
            if todo_rows.size:
                value, kth, nxt = self.evaluate(todo_rows, todo_ks)
                for r, k, v, t, x in zip(todo_rows.tolist(), todo_ks.tolist(), value, kth, nxt, strict=True):
                    ev[(r, k)] = (float(v), float(t), float(x), float(v) - k * float(x))
                # Ties go to the smaller size (the empty set, k = 0, is the smallest).
                order = np.lexsort((todo_ks, todo_rows))
                for r, k, v in zip(todo_rows[order].tolist(), todo_ks[order].tolist(), value[order], strict=True):
                    if v > self.best[r] or (v == self.best[r] and 0 < k < self.best_k[r]):
                        self.best[r] = v
                        self.best_k[r] = k
            if new_iv:
                open_iv += new_iv
                bound, split = self._bounds(new_iv, ev)
                open_bound += bound.tolist()
                open_split += split.tolist()
            if not open_iv:
                break
            best = self.best
            rows_l, ks_l = [], []
            new_iv = []
            for (r, a, b), bd, m in zip(open_iv, open_bound, open_split, strict=True):
                bk = self.best_k[r]
                if bd < best[r] or (bd == best[r] and a >= bk):  # nothing inside beats (or ties smaller) the best
                    continue
                if b < 0:  # the tail: double the largest evaluated size
                    m = min(max(2 * a, a + 1), self.cnt)
                    if m - a >= 2:
                        new_iv.append((r, a, m))
                    if m < self.cnt:
                        new_iv.append((r, m, -1))
                else:
                    if m - a >= 2:
                        new_iv.append((r, a, m))
                    if b - m >= 2:
                        new_iv.append((r, m, b))
                rows_l.append(r)
                ks_l.append(m)
            open_iv, open_bound, open_split = [], [], []
            todo_rows = np.asarray(rows_l, dtype=np.int64)
            todo_ks = np.asarray(ks_l, dtype=np.int64)
            if not todo_rows.size and not new_iv:
                break

    def _single_size(self, rows: np.ndarray) -> None:
        """Rows whose labels all have one size ``m`` (a star, leaf labels at one depth): all sizes at once.

        Then ``w_k(n) = (1+b2) P(n) / (b2 m + k)`` keeps one order for every ``k``, so one sort of ``P`` gives
        ``V_k = (1+b2) SP(k) / (b2 m + k)`` for every ``k`` (``SP(k)`` the sum of the ``k`` largest ``P``).
        """
        n, first = self.n, self.first
        step = max(1, _BB_ELEMENTS // n)
        for s in range(0, rows.size, step):
            rr = rows[s : s + step]
            ptil = self.ptil[rr, first:]
            lo = 1 - self.off  # the root's label (size 0 without the root) weighs nothing in w
            m = self.lv[lo + np.argmax(self.r[rr, lo:] > 0, axis=1)]
            order = np.argsort(-ptil, axis=1, kind="stable")  # ties: smaller id, so ancestors first
            top = np.cumsum(np.take_along_axis(ptil, order, axis=1), axis=1)
            ks = np.arange(1, n - first + 1, dtype=np.float64)
            value = (1.0 + self.b2) * top / (self.b2 * m[:, None] + ks[None, :])
            k = np.argmax(value, axis=1)  # first maximum: the smallest size wins ties
            v = value[np.arange(rr.size), k]
            better = v > self.best[rr]
            self.best[rr[better]] = v[better]
            self.best_k[rr[better]] = k[better] + 1
            for i in np.flatnonzero(better).tolist():
                self.single_rows[int(rr[i])] = order[i, : k[i] + 1] + first

    def _bounds(
        self, ivs: list[tuple[int, int, int]], ev: dict[tuple[int, int], tuple[float, float, float, float]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Upper bound of ``V_k`` inside each interval, and the size to evaluate next when it does not prune."""
        rows = np.fromiter((iv[0] for iv in ivs), dtype=np.int64, count=len(ivs))
        a = np.fromiter((iv[1] for iv in ivs), dtype=np.int64, count=len(ivs))
        b = np.fromiter((iv[2] for iv in ivs), dtype=np.int64, count=len(ivs))
        ea = np.array([ev[(r, k)] for r, k in zip(rows.tolist(), a.tolist(), strict=True)]).reshape(-1, 4)
        tail = b < 0
        eb = np.array(
            [ev[(r, k)] if k >= 0 else (0.0, 0.0, 0.0, 0.0) for r, k in zip(rows.tolist(), b.tolist(), strict=True)]
        ).reshape(-1, 4)
        length = np.where(tail, 1, b - a).astype(np.float64)
        dv = eb[:, 0] - ea[:, 0]
        d = np.maximum(ea[:, 2] - eb[:, 1], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(d > 0, (dv + d * length) / (2 * d), np.where(dv > 0, length - 1, 1.0))
        t = np.clip(t, 1.0, np.maximum(length - 1, 1.0))
        bound = np.where(tail, np.inf, ea[:, 0] + dv * t / length + d * t * (length - t) / length)
        if self.chain:
            # Box bound: labels at sizes <= a count as at k = a (the head of V_a, ``V_a - a nxt_a``), labels at
            # sizes > b as at k = b (the tail of V_b plus the size-b labels), those in between at hF 1.
            top = np.where(tail, self.lv.size, np.minimum(b - self.off + 1, self.lv.size))
            between = self.rcum[rows, top] - self.rcum[rows, np.minimum(a - self.off + 1, self.lv.size)]
            box = ea[:, 3] + between + np.where(tail, 0.0, eb[:, 0] - eb[:, 3])
            bound = np.minimum(bound, box)
        # U-bar costs O(depth) per pair: only where the interval bound alone does not prune.
        need = np.flatnonzero(bound >= self.best[rows])
        if need.size:
            bound[need] = np.minimum(bound[need], self.upper(rows[need], a[need] + 1))
        # Split where the bound peaks (near the optimum when V has a kink there), kept off the ends so that every
        # split removes at least an eighth of the interval.
        margin = np.maximum(1, (b - a) // 8)
        split = np.where(tail, -1, a + np.clip(np.rint(t).astype(np.int64), margin, b - a - margin))
        return bound, split

    def sets(self) -> np.ndarray:
        """The chosen sets: the top-``best_k`` nodes of ``w_best_k``, ties to the smaller id (ancestors first)."""
        g = self.pt.shape[0]
        out = np.zeros((g, self.n), dtype=bool)
        out[:, 0] = True
        pick = np.flatnonzero(self.best_k > 0)
        single = self.single_rows
        for r, chosen in single.items():
            out[r, chosen] = True
        pick = np.array([r for r in pick.tolist() if r not in single], dtype=np.int64)
        if self.chain:
            for r in pick.tolist():
                out[r, : self.first + int(self.best_k[r])] = True
            return out
        step = max(1, _BB_ELEMENTS // self.n)
        for s in range(0, pick.size, step):
            rows = pick[s : s + step]
            ks = self.best_k[rows]
            w = self.weights(rows, ks.astype(np.float64))
            for i, (r, k) in enumerate(zip(rows.tolist(), ks.tolist(), strict=True)):
                kth = np.partition(w[i], self.n - k)[self.n - k]
                above = w[i] > kth
                ties = np.flatnonzero(w[i] == kth)[: k - int(above.sum())]  # smallest ids: ancestors first
                out[r, above] = True
                out[r, ties] = True
        return out


def _tree_rows_search(
    node: np.ndarray, leaf: np.ndarray | None, taxonomy: Taxonomy, b2: float, include_root: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Deep trees (and rows the candidate solver cannot narrow): :class:`_SizeSearch` over every node."""
    pt = _label_rows(node, taxonomy, leaf)  # [G, N] label probabilities
    search = _SizeSearch(pt, taxonomy, b2, include_root)
    search.run(search.first_guess())
    return search.sets(), search.best


# ---------------------------------------------------------------------------------------------- DAGs
def _dag_rows(p: np.ndarray, taxonomy: Taxonomy, b2: float, include_root: bool) -> tuple[np.ndarray, np.ndarray]:
    g, n = p.shape
    first = 0 if include_root else 1
    lnode = _label_sizes(taxonomy, include_root)
    lv = np.arange(int(lnode.max()) + 1)
    cache = taxonomy.namespace_cache(__name__)
    if "desc64" not in cache:
        d = taxonomy.descendants_sparse.astype(np.float64).tocsr()
        d.sort_indices()  # ascending summation order per row keeps q monotone along ancestry
        cache["desc64"] = d
    desc = cache["desc64"]
    sets = np.zeros((g, n), dtype=bool)
    sets[:, 0] = True
    values = np.zeros(g)
    step = max(1, _MAX_ELEMENTS // max(1, n * len(lv)))
    for s in range(0, g, step):
        rows = np.arange(s, min(g, s + step))
        pr = p[rows]
        qfull = np.zeros((len(rows), n, len(lv)))
        r = np.zeros((len(rows), len(lv)))
        for m in range(len(lv)):
            pm = np.where(lnode[None, :] == m, pr, 0.0)
            r[:, m] = pm.sum(1)
            qfull[:, :, m] = np.asarray(desc.dot(pm.T)).T
        ptil = qfull.sum(2)
        cand, valid, tau = _select_candidates(ptil, first, n)
        q = np.take_along_axis(qfull, cand[:, :, None], axis=1)
        q[~valid] = 0.0
        best, _, ok, chosen = _solve(q, lv, valid, r, None if include_root else r[:, 0], tau, b2)
        if not ok.all():  # pragma: no cover - impossible by the proof
            raise RuntimeError("optimal_hfbeta: certificate failed with every candidate node")
        values[rows] = best
        rr, jj = np.nonzero(chosen)
        sets[rows[rr], cand[rr, jj]] = True
    return sets, values


_TORCH_BLOCK_ELEMENTS = 1 << 24  # rows x label sizes x nodes of the [rows, M, N] mass table per block (128 MB)


@register_decoder(
    "optimal_hfbeta",
    returns="set",
    optimal_for="expected hF-beta of an ancestor-closed node set",
    judged_on="hF{beta}_samples",
    aliases={"optimal_hf1": {"beta": 1.0}, "optimal_hfbeta1": {"beta": 1.0}},
)
def optimal_hfbeta(
    probs: Any,
    taxonomy: Taxonomy,
    beta: float = 1.0,
    *,
    include_root: bool = False,
    leaf_probs: bool = False,
    return_value: bool = False,
    initial_candidates: int = 64,
) -> Any:
    """The ancestor-closed node set maximising expected hF-beta, exactly, for every sample.

    The result may span several branches (e.g. ``{animal, cat, dog}`` when cat and dog are equally likely and
    beta is large). See the module docstring for the convention, the proof and the (safe) pruning.

    Args:
        probs: node probabilities ``[B, N]`` (NumPy or torch), or leaf probabilities ``[B, L]`` with
            ``leaf_probs=True``.
        taxonomy: a tree or a DAG.
        beta: F-beta weight, ``>= 0``; larger values reward recall and so deeper, wider sets.
        include_root: count the root in every set (changes the scores, so the optimum).
        leaf_probs: ``probs`` holds leaf probabilities.
        return_value: also return the optimal expected hF-beta ``[B]``.
        initial_candidates: size of the first candidate set tried per sample (a speed knob only; any value
            >= 1 gives the same optimum).

    Returns:
        Boolean node sets ``[B, N]`` (root included), and the expected values with ``return_value=True``.
        Ties between sets of equal computed value go to the smallest set, then to the nodes with smaller ids.
        Sets of different sizes whose exact values are equal (e.g. a star of three equally likely leaves) are
        computed in different float64 sums, so their last bits decide between them.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> probs = np.array([[1.0, 0.9, 0.6, 0.3, 0.1]])  # labels: x 0.6, y 0.3, b 0.1
        >>> sets, value = optimal_hfbeta(probs, tax, beta=1.0, return_value=True)
        >>> [tax.name_of(n) for n in np.flatnonzero(sets[0])], round(float(value[0]), 4)
        (['r', 'a', 'x'], 0.75)
        >>> [tax.name_of(n) for n in np.flatnonzero(optimal_hfbeta(probs, tax, beta=3.0)[0])]
        ['r', 'a', 'x', 'y', 'b']
    """
    b2 = check_beta(beta) ** 2
    if int(initial_candidates) < 1:
        raise ValueError(f"initial_candidates must be >= 1; got {initial_candidates!r}")
    return _optimal_hfbeta_blocks(
        probs,
        taxonomy,
        b2,
        include_root=include_root,
        leaf_probs=leaf_probs,
        return_value=return_value,
        initial_candidates=int(initial_candidates),
    )


@chunked(scale=8)
def _optimal_hfbeta_blocks(
    probs: Any,
    taxonomy: Taxonomy,
    b2: float,
    *,
    include_root: bool,
    leaf_probs: bool,
    return_value: bool,
    initial_candidates: int,
) -> Any:
    """:func:`optimal_hfbeta` on the device (torch kernels) or by the NumPy path, in row blocks."""
    # The block path converts each block to float64 in its own gather: float32 input is not copied up front.
    batch: Batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=leaf_probs or not _block_path(taxonomy))
    bsz, n = batch.node.shape
    sets = np.zeros((bsz, n), dtype=bool)
    sets[:, 0] = True
    values = np.zeros(bsz)
    if n > 1 or include_root:
        step = _CHUNK
        block = batch.leaf is None and _block_path(taxonomy)
        if block:
            step = max(_CHUNK, min(4 * _CHUNK, _BLOCK_ELEMENTS // n))
        for s in range(0, bsz, step):
            sl = slice(s, s + step)
            if taxonomy.is_tree and taxonomy.height + 1 > _DEEP_HEIGHT:
                sets[sl], values[sl] = _tree_rows_search(
                    batch.node[sl], None if batch.leaf is None else batch.leaf[sl], taxonomy, b2, include_root
                )
            elif block:
                sets[sl], values[sl] = _tree_block(
                    batch.node[sl], taxonomy, b2, include_root, int(initial_candidates), row0=s
                )
            elif taxonomy.is_tree:
                sets[sl], values[sl] = _tree_rows(
                    batch.node[sl],
                    None if batch.leaf is None else batch.leaf[sl],
                    taxonomy,
                    b2,
                    include_root,
                    int(initial_candidates),
                )
            else:
                sets[sl], values[sl] = _dag_rows(batch.label[sl], taxonomy, b2, include_root)
    else:  # a single-node taxonomy: the root label, predicted perfectly by the empty (root-only) set
        values[:] = batch.label[:, 0]
    out_sets = restore_sets(sets, batch)
    if return_value:
        return out_sets, restore_values(values, batch)
    return out_sets


def _label_rows(node: np.ndarray, taxonomy: Taxonomy, leaf: np.ndarray | None) -> np.ndarray:
    """Row-major label probabilities ``[G, N]`` from node probabilities (or the leaf probabilities when given)."""
    if leaf is None:
        return np.ascontiguousarray(label_distribution(node, taxonomy))
    out = np.zeros((leaf.shape[0], taxonomy.num_nodes))
    out[:, taxonomy.leaves] = leaf
    return out


def prefix_sums_t(a: np.ndarray, *, block: int | None = None) -> np.ndarray:
    """``cs[j] = sum(a[:j])`` down the rows of node-major ``a [R, G]``: ``[R + 1, G]``."""
    cs = np.zeros((a.shape[0] + 1, a.shape[1]))
    np.cumsum(a, axis=0, out=cs[1:])
    return cs

r"""The exact Bayes-optimal decoder for expected hierarchical F-beta over ancestor-closed node sets.

Setting and convention
----------------------
The label ``y`` is a single node (a leaf or an internal node) with ``p(y)`` the probability that the label is
exactly ``y``. ``Y`` is the set of ancestors-or-self of ``y`` and ``S`` a predicted ancestor-closed set. With
``include_root=False`` (default) the root is left out of both sets, so ``|Y| = depth(y)`` on a tree;
with ``include_root=True`` it is counted in both. Then

.. math:: hF_\beta(S, y) = \frac{(1+\beta^2)\,|S\cap Y|}{\beta^2 |Y| + |S|}

with the convention ``hF = 1`` when both sets are empty (the label is the root and only the root is predicted)
and ``0`` for any other ``0/0`` (an empty prediction). Sets returned by the decoders always
contain the root node; it is simply not counted when ``include_root=False``.

Why the algorithm is exact
--------------------------
Write ``q_m(n) = P(n in Y and |Y| = m)``. For ``|S| = k`` the objective is linear in ``S``:

.. math:: E[hF_\beta(S)] = \sum_{n\in S} w_k(n), \qquad w_k(n) = (1+\beta^2)\sum_m \frac{q_m(n)}{\beta^2 m + k}.

*Monotonicity.* If ``a`` is an ancestor of ``n`` then ``q_m(a) >= q_m(n)`` for every ``m`` (the label size does
not depend on which of its ancestors we look at), so ``w_k(a) >= w_k(n)`` for every ``k``, on trees and DAGs.
The weights are computed so that this survives round-off: an ancestor's weight is a float sum that has the
descendant's weight (trees) or the same terms in the same order plus non-negative ones (DAGs) among its addends.

*Top-k is ancestor-closed.* Sort the nodes by ``w_k`` descending, ties by node id ascending (ids are
topological). Every ancestor of a node sorts before it, so the first ``k`` nodes form an ancestor-closed set;
being the unconstrained maximum-weight ``k``-subset, it is optimal among ancestor-closed sets of size ``k``. The
optimum is ``max_k V_k`` with ``V_k`` the sum of the ``k`` largest ``w_k`` (and the empty set, worth
``P(|Y| = 0)`` when the root is not counted).

*Candidates.* ``P~(n)``, the label probabilities summed over the descendants-or-self of ``n``, only grows
towards the root, so ``C = {P~ > t}`` is ancestor-closed; it is grown top-down from the root. Every node outside
``C`` has an ancestor-or-self ``f`` outside whose parent is in ``C`` (a child left out), with ``P~(n) <= P~(f)``,
and every label below ``f`` has ``|Y| >= |Y_f|``, so ``w_k(n) <= u_k = (1+\beta^2) max_f P~(f) / (\beta^2 |Y_f|
+ k)``. The *relaxed* problem puts, beside the candidates, unboundedly many virtual nodes of weight ``u_k``: its
top-``k`` sum ``R_k`` bounds ``V_k``, and equals it when the ``k``-th candidate weight exceeds ``u_k`` (plus the
tie margin). Nodes with ``P~ = 0`` have weight 0 and never matter. Rows whose search meets a size it cannot
settle this way are searched again with a lower threshold ``t``, the last time ``t = 0``, where every node with
``P~ > 0`` is a candidate and nothing outside weighs anything: the result is exact on every input.

*One label size.* When every label with mass (the root's aside) has the same size ``m``, as with leaf labels
on a balanced tree or a star, ``q_m(n) = P~(n)`` and ``w_k(n) = (1+\beta^2) P~(n) / (\beta^2 m + k)``: the nodes
sort alike for every ``k`` and ``V_k`` is that factor times the sum of the ``k`` largest ``P~``. The row is
then solved without the search: the best value is Dinkelbach's fixed point of ``T / (\beta^2 m + |T|)`` over
``T = {P~ > l}``, ``O(N)`` per row, and a smaller tied size is found by bisection (top-``k`` sums by quickselect).

*Branch and bound over the size.* ``V_k`` (or ``R_k``) is evaluated at a few sizes: ``1``, the majority path's
size, then doubling. Two bounds prune the rest. For every ``k' >= k``, ``|S cap Y| <= min(k', m)`` gives

.. math:: V_{k'} \le \bar U(k) = (1+\beta^2)\sum_m P(|Y| = m)\,\frac{m}{\beta^2 m + \max(k, m)}.

Inside an interval ``a < k < b`` of evaluated sizes, ``1/(c + k)`` is convex in ``k``, so every weight is at most
``l w_a + (1-l) w_b`` with ``l = (b-k)/(b-a)``, and top-``k`` sums are subadditive and concave in ``k``:
``V_k <= l (R_a + (k-a) nxt_a) + (1-l) (R_b - (b-k) kth_b)``, a concave quadratic in ``k`` (``kth``/``nxt`` the
``k``-th and ``(k+1)``-th largest weights). Intervals whose bound is below the best value by more than the tie
margin are dropped, the others split where their bound peaks, until none is left.

Tie rule
--------
Values are compared in float64 and tied when within ``TIE_RTOL * max(1, |best|)`` of the best (the rule shared
by every decoder). Among tied sizes the smallest set wins (the empty prediction first); within the chosen size,
nodes whose weights are within ``TIE_RTOL / (2k)`` of the ``k``-th weight are tied and the smaller ids are taken,
which keeps the set ancestor-closed and within the margin of the size's best value.

Cost
----
Per row, one compiled pass (numba) over the nodes for the label probabilities, ``P~`` and the mass by label size
(over the ancestor lists on a DAG), one for the candidates' masses by label size, then ``O(E + c)`` per evaluated
size for ``c`` candidates and ``E <= N`` (candidate, label size) pairs: about five sizes for a peaked posterior,
``O(log K)`` more for flat ones, each threshold round at most once. A tensor is decoded on the host and the
result moved back to its device. Measured (bench/bench_worstcase.py, 100 samples): a 10,000-node chain in 0.2-0.4 s,
a 100,000-child star (one label size: the closed form) in about 0.35 s for realistic posteriors and 0.8 s for
the exactly uniform one, where every size from a sixth of the children up is tied within the margin and the
bisection for the smallest takes about 17 quickselects per row (the search over sizes took 3 s).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import scipy.sparse as sp
import torch

from hiercls._checks import check_beta
from hiercls.decode.checks import PROBABILITY_ATOL, jit
from hiercls.decode.inputs import (
    TIE_RTOL,
    Batch,
    chunked,
    label_distribution,
    prepare,
    restore_sets,
    restore_values,
)
from hiercls.decode.registry import register_decoder
from hiercls.taxonomy import Taxonomy

__all__ = ["expected_hfbeta", "optimal_hfbeta"]

# First use: numba compiles every jitted helper alone, then again inside each caller it is linked into, so the
# compile time grows with the depth of the call tree. The search is one cached kernel (``_solve_rows``); the
# helpers it calls are compiled without the Python wrappers and the on-disk cache nothing outside needs, and the
# helpers called at one place only are inlined into it (numba IR), which leaves one level of calls.
_inner = numba.njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, nogil=True, error_model="numpy")
_inline = numba.njit(inline="always")
_FRACTIONS = np.array([0.1, 0.01, 0.001, 0.0])  # candidate thresholds, as fractions of the row's mass
_SORT_BELOW = 64  # candidate sets up to this size are sorted by id, larger ones collected in one pass
_CAP_GROWTH = 16  # a threshold round may hold initial_candidates * 16**round candidates before it is skipped


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
        ``[B]`` expected scores (NumPy, or torch on the input's device when ``probs`` is a tensor: the sums run on
        the host in float64, O(N) per row on trees, one sparse product with the ancestor matrix on DAGs).

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
    if isinstance(sets, torch.Tensor):
        sets = sets.detach().cpu().numpy()
    s = np.asarray(sets)
    if s.ndim == 1:
        s = s[None, :]
    if s.shape != (batch_size, taxonomy.num_nodes):
        raise ValueError(
            f"sets must be boolean node sets [B, N] = [{batch_size}, {taxonomy.num_nodes}]; got shape {list(s.shape)}"
        )
    return s.astype(bool, copy=True)


def tree_tables(taxonomy: Taxonomy) -> dict[str, np.ndarray]:
    """Depth-major order, depth segments and per-depth subtree ranges of a tree (cached); used by ``bayes``."""
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


# ---------------------------------------------------------------------------------------------- the compiled search
@_inner
def _tree_masses(x, parent, lsz, atol, p, ptil, r, kids, below, lanes):
    """Trees, from one row of node probabilities ``x``: the label probabilities ``p = P(n) - sum of P(children)``
    clipped at 0, ``P~`` and the label mass by size ``r`` in one bottom-up pass that adds each node to its parent
    (``kids``, ``below``: scratch of ``n``). The mass by size is summed in two lanes (``lanes[2 m + id % 2]``),
    where one sum would make consecutive leaves of one size wait on each other's store. ``False`` when a label
    probability is below ``-atol`` (stricter than ``check_label_mass``, which then decides)."""
    for m in range(lanes.size):
        lanes[m] = 0.0
    for v in range(x.shape[0]):
        kids[v], below[v] = 0.0, 0.0
    ok = True
    for v in range(x.shape[0] - 1, -1, -1):  # pre-order ids: every child comes before its parent here
        s = x[v] - kids[v]
        ok &= s >= -atol
        pv = max(s, 0.0)
        pt = pv + below[v]
        p[v], ptil[v] = pv, pt
        lanes[2 * lsz[v] + (v & 1)] += pv
        u = parent[v]
        if u >= 0:
            kids[u] += x[v]
            below[u] += pt
    for m in range(r.size):
        r[m] = lanes[2 * m] + lanes[2 * m + 1]
    return ok


@_inner
def _masses(lp, row, p, is_tree, parent, anc_ptr, anc_idx, lsz, ptil, r):
    """Row ``row`` of ``lp`` into ``p``, ``P~`` of every node (``ptil``) and the label mass by label size (``r``)."""
    n = p.shape[0]
    for m in range(r.size):
        r[m] = 0.0
    for v in range(n):
        p[v] = lp[row, v]
    if is_tree:
        for v in range(n):
            ptil[v] = p[v]
        for v in range(n - 1, 0, -1):  # pre-order ids: a child's sum is complete before it is added
            ptil[parent[v]] += ptil[v]
    else:
        for v in range(n):
            ptil[v] = 0.0
        for y in range(n):  # ascending labels: a descendant's sum is a subsequence of its ancestor's
            if p[y] > 0.0:
                for j in range(anc_ptr[y], anc_ptr[y + 1]):
                    ptil[anc_idx[j]] += p[y]
    for y in range(n):
        r[lsz[y]] += p[y]


@_inner
def _grow(ptil, thr, cap, ch_ptr, ch_idx, lsz, pos, cand, tau):
    """Candidates ``{P~ > thr}`` top-down from the root, sorted by id in ``cand[:count]`` with ``pos`` their index;
    ``tau[m]``: the largest ``P~`` of the children left out with label size ``m``. ``-1`` past ``cap``."""
    for m in range(tau.size):
        tau[m] = 0.0
    cand[0] = 0
    pos[0] = 0
    count, head = 1, 0
    while head < count:
        v = cand[head]
        head += 1
        for j in range(ch_ptr[v], ch_ptr[v + 1]):
            c = ch_idx[j]
            if pos[c] >= 0:
                continue
            if ptil[c] > thr:
                if count >= cap:
                    for i in range(count):
                        pos[cand[i]] = -1
                    return -1
                pos[c] = count
                cand[count] = c
                count += 1
            elif ptil[c] > tau[lsz[c]]:
                tau[lsz[c]] = ptil[c]
    if count <= _SORT_BELOW:  # few candidates: insertion sort by id
        for i in range(1, count):
            v, j = cand[i], i
            while j > 0 and cand[j - 1] > v:
                cand[j] = cand[j - 1]
                j -= 1
            cand[j] = v
    else:  # many: collect them in id order in one pass over the nodes
        count = 0
        for v in range(pos.size):
            if pos[v] >= 0:
                cand[count] = v
                count += 1
    for i in range(count):
        pos[cand[i]] = i
    return count


@_inner
def _tree_profiles(p, ptil, lsz, tree, pos, cand, count, acc, seg, ent_m, ent_q, cpar):
    """Trees: each candidate's own label mass by size (itself and the subtrees left out below it, each a range of
    pre-order ids) as entries ``ent_m/ent_q[seg[i]:seg[i+1]]`` in ascending size, summed in ``acc`` (size ``m`` in
    ``2m`` and ``2m + 1``: two lanes, as in :func:`_tree_masses`). The sizes a candidate owns run from its own to
    the deepest of its left-out subtrees without a gap (each holds a node of every depth down to its deepest), so
    they have at most as many entries as nodes, and ``acc`` is emptied over that range alone. ``cpar``: the parent's
    candidate index (a weight adds its child candidates'). ``tree``: parents, children and subtree ends."""
    parent, ch_ptr, ch_idx, ends = tree
    out = 0
    for i in range(count):
        v = cand[i]
        cpar[i] = pos[parent[v]] if i > 0 else -1
        seg[i] = out
        acc[2 * lsz[v]] += p[v]
        deep = lsz[v]
        for j in range(ch_ptr[v], ch_ptr[v + 1]):
            c = ch_idx[j]
            if pos[c] < 0 and ptil[c] > 0.0:  # a subtree left out (with mass)
                for y in range(c, ends[c]):
                    acc[2 * lsz[y] + (y & 1)] += p[y]
                    deep = max(deep, lsz[y])
        for m in range(lsz[v], deep + 1):
            q = acc[2 * m] + acc[2 * m + 1]
            acc[2 * m], acc[2 * m + 1] = 0.0, 0.0
            if q > 0.0 and m > 0:
                ent_m[out], ent_q[out] = m, q
                out += 1
    seg[count] = out


@_inner
def _dag_profiles(p, anc_ptr, anc_idx, lsz, pos, count, dense, seg, ent_m, ent_q, cpar):
    """DAGs: each candidate's label mass by size over all its descendants (a pass over the ancestor lists), summed
    in ``dense[:count]``, then as entries in ascending size (as :func:`_tree_profiles`); ``cpar`` is ``-1``."""
    for i in range(count):
        cpar[i] = -1
        for m in range(dense.shape[1]):
            dense[i, m] = 0.0
    for y in range(p.shape[0]):
        if p[y] > 0.0 and lsz[y] > 0:
            for j in range(anc_ptr[y], anc_ptr[y + 1]):
                if pos[anc_idx[j]] >= 0:
                    dense[pos[anc_idx[j]], lsz[y]] += p[y]
    out = 0
    for i in range(count):
        seg[i] = out
        for m in range(1, dense.shape[1]):
            if dense[i, m] > 0.0:
                ent_m[out], ent_q[out] = m, dense[i, m]
                out += 1
    seg[count] = out


@_inner
def _weights(k, b2, seg, ent_m, ent_q, cpar, count, tau, coef, w):
    """``w_k`` of the candidates into ``w``; returns ``u_k``, the bound on every node outside."""
    for m in range(coef.size):
        coef[m] = (1.0 + b2) / (b2 * m + k) if m > 0 else 0.0
    for i in range(count):
        s = 0.0
        for e in range(seg[i], seg[i + 1]):
            s += ent_q[e] * coef[ent_m[e]]
        w[i] = s
    for i in range(count - 1, 0, -1):  # children have larger ids than their parent; -1 on DAGs
        if cpar[i] >= 0:
            w[cpar[i]] += w[i]
    u = 0.0
    for m in range(1, tau.size):
        if tau[m] > 0.0:
            u = max(u, coef[m] * tau[m])
    return u


@_inner
def _relaxed_top(k, w, count, first, u, tolw, buf):
    """``(R_k, kth, nxt, exact)`` of the relaxed problem: candidates plus unboundedly many nodes of weight ``u``.
    The ``k`` largest weights above ``u`` are moved to the end of ``buf[:na]`` by Hoare's quickselect
    (median-of-three pivots; numba's ``np.partition`` takes 20 s to compile)."""
    na, sure = 0, 0
    for i in range(first, count):
        if w[i] > u:
            buf[na] = w[i]
            na += 1
            sure += w[i] > u + tolw
    exact = u == 0.0 or k <= sure
    if k > na:
        total = (k - na) * u
        for i in range(na):
            total += buf[i]
        return total, u, u, exact
    lo, hi, j = 0, na - 1, na - k
    while lo < hi:
        x, y, z = buf[lo], buf[(lo + hi) // 2], buf[hi]
        pivot = max(min(x, y), min(max(x, y), z))
        i, e = lo, hi
        while i <= e:
            while buf[i] < pivot:
                i += 1
            while buf[e] > pivot:
                e -= 1
            if i <= e:
                buf[i], buf[e] = buf[e], buf[i]
                i += 1
                e -= 1
        if j <= e:
            hi = e
        elif j >= i:
            lo = i
        else:
            break
    nxt, total = u, 0.0
    for i in range(j):
        nxt = max(nxt, buf[i])
    for i in range(j, na):
        total += buf[i]
    return total, buf[j], nxt, exact


@_inner
def _winner(ev, ne, best, tol, v0):
    """Row of ``ev`` of the smallest exact size tied with ``best`` (``-1``: the empty prediction)."""
    win = -1
    if v0 >= best - tol:
        return win
    for e in range(ne):
        if ev[e, 4] > 0.0 and ev[e, 1] >= best - tol and (win < 0 or ev[e, 0] < ev[win, 0]):
            win = e
    return win


@_inner
def _bound(ev, ia, ib, kmax, hi, r, b2):
    """Upper bound on ``V_k`` over the open interval of sizes between rows ``ia`` and ``ib`` of ``ev`` (``ib = -1``:
    every size above), and the size to evaluate next there. Three bounds (module docstring): :math:`\\bar U(a+1)`;
    the scaled one, ``w_k <= w_a (b2 hi + a) / (b2 hi + k)`` for every node (``hi`` the largest label size with
    mass) with the top-``k`` sum of ``w_a`` at most ``R_a + (k - a) nxt_a``, whose sign of growth in ``k`` is
    constant, so that it peaks at an end of the interval; and, between two evaluations, the concave quadratic."""
    a, va, na = ev[ia, 0], ev[ia, 1], ev[ia, 3]
    b = ev[ib, 0] if ib >= 0 else kmax + 1.0
    s = 0.0
    for m in range(1, r.size):
        if r[m] > 0.0:
            s += r[m] * m / (b2 * m + max(a + 1.0, m))
    near = (b2 * hi + a) * (va + na) / (b2 * hi + a + 1.0)
    far = (b2 * hi + a) * (va + (b - 1.0 - a) * na) / (b2 * hi + b - 1.0)
    bound = min((1.0 + b2) * s, max(near, far))
    if ib < 0:  # the tail: doubling
        return bound, min(max(2 * int(a), int(a) + 1), kmax)
    length, dv = b - a, ev[ib, 1] - va
    d = max(na - ev[ib, 2], 0.0)  # the interval's bound: module docstring
    t = (dv + d * length) / (2.0 * d) if d > 0.0 else (length - 1.0 if dv > 0.0 else 1.0)
    t = min(max(t, 1.0), length - 1.0)
    quad = va + dv * t / length + d * t * (length - t) / length
    margin = max(1, int(length) // 8)
    return min(bound, quad), int(a) + min(max(int(t + 0.5), margin), int(length) - margin)


@_inline
def _search(kg, kmax, hi, v0, r, b2, tol, prof, count, first, tau, coef, w, buf, ev, stack):
    """Branch and bound over the sizes ``1..kmax``, from ``1`` and the guess ``kg``: ``(best value, number of
    evaluations in ev, certified)``. The stack holds intervals of sizes as pairs of rows of ``ev`` (``-1``: every
    size above). An interval is dropped when its bound is below the best by more than the tie margin, or, above
    the smallest tied size, when it cannot beat the best. A size the candidates cannot settle (not exact, and its
    relaxed value could tie or win) ends the search uncertified."""
    ne, top, kw = np.int64(0), 0, 0  # kw: the winning size so far (0: the empty prediction)
    best = v0
    k = np.int64(1)
    ia, ib = 0, 0
    seg, ent_m, ent_q, cpar = prof
    while True:  # evaluate size k into row ne of ev as (k, R_k, kth, nxt, exact)
        u = _weights(k, b2, seg, ent_m, ent_q, cpar, count, tau, coef, w)
        val, kth, nxt, exact = _relaxed_top(k, w, count, first, u, TIE_RTOL / (2 * k), buf)
        ev[ne, 0], ev[ne, 1], ev[ne, 2], ev[ne, 3], ev[ne, 4] = k, val, kth, nxt, 1.0 if exact else 0.0
        best_before = best
        best = max(best, val) if exact else best
        if ev[ne, 4] == 0.0 and ((k < kw and val >= best - tol) or val > best):
            return best, ne + 1, False
        if best > best_before or (ev[ne, 4] > 0.0 and val >= best - tol and k < kw):
            win = _winner(ev, ne + 1, best, tol, v0)
            kw = int(ev[win, 0]) if win >= 0 else 0
        if ne == 0:  # the first size: then the guess, and everything above the larger of the two
            if kg > 1:
                k, ne = kg, ne + 1
                continue
            stack[0, 0], stack[0, 1], top = 0, -1, int(kmax > 1)
        elif ne == 1 and kg > 1:
            stack[0, 0], stack[0, 1], top = 0, 1, int(kg > 2)
            stack[top, 0], stack[top, 1], top = 1, -1, top + int(kg < kmax)
        else:
            b = int(ev[ib, 0]) if ib >= 0 else kmax + 1
            if k - int(ev[ia, 0]) >= 2:
                stack[top, 0], stack[top, 1], top = ia, ne, top + 1
            if b - k >= 2 or (ib < 0 and k < kmax):
                stack[top, 0], stack[top, 1], top = ne, ib, top + 1
        ne += 1
        k = 0
        while top > 0 and k == 0:
            top -= 1
            ia, ib = stack[top, 0], stack[top, 1]
            bound, k = _bound(ev, ia, ib, kmax, hi, r, b2)
            above = int(ev[ia, 0]) >= kw
            if bound < best - tol or (above and bound <= best):
                k = 0
        if k == 0:
            return best, ne, True


@jit
def _solve_rows(lp, from_nodes, atol, tables, work, b2, first, cap0, fractions, sets, values):
    """The optimal set and value of every row of label probabilities ``lp`` (node probabilities of a tree with
    ``from_nodes``); returns ``-1``, or the first row whose label probabilities fall below ``-atol``."""
    is_tree, parent, ch_ptr, ch_idx, anc_ptr, anc_idx, lsz, ends = tables
    ptil, w, buf, ent_q, lab, r, tau, coef, pos, cand, ent_m, seg, cpar, dense, ev, stack, lanes, acc = work
    n = lp.shape[1]
    p = lab
    for row in range(lp.shape[0]):
        if from_nodes:
            if not _tree_masses(lp[row], parent, lsz, atol, lab, ptil, r, w, buf, lanes):
                return row
        else:
            _masses(lp, row, p, is_tree, parent, anc_ptr, anc_idx, lsz, ptil, r)
        v0 = r[0] if first == 1 else -np.inf  # the empty prediction scores the root label only
        tol = TIE_RTOL * max(1.0, ptil[0])  # expected hF-beta is at most the row's mass
        sets[row, 0] = True
        size = _one_size(r)
        if size:
            values[row] = _single_size(ptil, n, first, b2 * size, b2, tol, v0, buf, cand, sets[row])
            continue
        left_out = np.inf  # the largest P~ the last grown round left out: lower thresholds above it change nothing
        for ri in range(fractions.size):
            last = ri == fractions.size - 1
            if not last and fractions[ri] * ptil[0] >= left_out:
                continue
            cap = n if last else cap0 * _CAP_GROWTH**ri
            count = _grow(ptil, fractions[ri] * ptil[0], cap, ch_ptr, ch_idx, lsz, pos, cand, tau)
            if count < 0:
                continue
            left_out = 0.0
            for m in range(tau.size):
                left_out = max(left_out, tau[m])
            if is_tree:
                tree = (parent, ch_ptr, ch_idx, ends)
                _tree_profiles(p, ptil, lsz, tree, pos, cand, count, acc, seg, ent_m, ent_q, cpar)
            else:
                _dag_profiles(p, anc_ptr, anc_idx, lsz, pos, count, dense, seg, ent_m, ent_q, cpar)
            prof = (seg, ent_m, ent_q, cpar)
            kmax = n - first if left_out > 0.0 else count - first  # left_out > 0: nodes outside may matter
            hi, kg = _start(r, ptil, cand, first, count)
            best, ne, certified = v0, 0, True
            if kmax > 0:
                kg = min(max(kg, 1), kmax)
                best, ne, certified = _search(
                    kg, kmax, hi, v0, r, b2, tol, prof, count, first, tau, coef, w, buf, ev, stack
                )
            if certified or last:
                values[row] = _finish(best, ne, v0, tol, ev, b2, prof, count, first, tau, coef, w, cand, sets[row])
            for i in range(count):
                pos[cand[i]] = -1
            if certified or last:
                break
    return -1


@_inline
def _start(r, ptil, cand, first, count):
    """``(hi, kg)``: the largest label size with mass, and the size of the majority path (the search's guess)."""
    hi, kg = np.int64(0), np.int64(0)
    for m in range(r.size):
        hi = m if r[m] > 0.0 else hi
    for i in range(first, count):
        kg += ptil[cand[i]] > 0.5 * ptil[0]
    return hi, kg


@_inline
def _finish(best, ne, v0, tol, ev, b2, prof, count, first, tau, coef, w, cand, out):
    """Pick the smallest size tied with ``best`` (the empty prediction first), mark its top-``k`` candidates in
    ``out`` and return their weight sum (:func:`_take`)."""
    win = _winner(ev, ne, best, tol, v0)
    if win < 0:
        return v0
    k = int(ev[win, 0])
    seg, ent_m, ent_q, cpar = prof
    _weights(k, b2, seg, ent_m, ent_q, cpar, count, tau, coef, w)
    return _take(k, ev[win, 2], 1.0, w, first, count, cand, out)


@_inner
def _take(k, kth, scale, w, first, count, cand, out):
    """Mark in ``out`` the ``k`` candidates ``cand[first:count]`` of largest weight ``scale * w`` (``kth``: the
    ``k``-th largest, unscaled) and return their weight sum. Weights within ``TIE_RTOL / (2k)`` of the ``k``-th
    are tied: the smaller ids are taken (an ancestor in the tie band before its descendants)."""
    tolw = TIE_RTOL / (2 * k)
    kw = scale * kth
    total, taken = 0.0, 0
    for band in (False, True):
        for i in range(first, count):
            wi = scale * w[i]
            if (wi > kw + tolw and not band) or (band and taken < k and abs(wi - kw) <= tolw):
                out[cand[i]] = True
                total += wi
                taken += 1
    return total


@_inline
def _one_size(r):
    """The one label size ``m >= 1`` that holds mass in ``r`` (the mass by size), else 0."""
    size = 0
    for m in range(1, r.size):
        if r[m] > 0.0:
            if size:
                return 0
            size = m
    return size


@_inline
def _single_size(ptil, n, first, c, b2, tol, v0, buf, ids, out):
    """The optimum of a row whose labels (the root's aside) all have one size ``m``, ``c = b2 m``: then
    ``w_k(n) = (1 + b2) P~(n) / (c + k)`` orders the nodes alike for every ``k``, and ``V_k`` is that factor times
    ``T_k``, the sum of the ``k`` largest ``P~``. Its maximum over ``k`` is Dinkelbach's fixed point ``l`` of
    ``l = T / (c + |{P~ > l}|)`` over ``{P~ > l}`` (one pass per step, a few steps), reached at ``k* = |{P~ > l}|``;
    ``V_k`` grows up to ``k*``, so the smallest tied size is found by bisection below it, each ``T_k`` by
    :func:`_relaxed_top` (no nodes outside). ``O(N)`` per row without ties; ``ids``/``buf``: scratch of ``n``."""
    lam, kstar = 0.0, 1
    while True:
        s, cnt = 0.0, 0
        for v in range(first, n):
            if ptil[v] > lam:
                s += ptil[v]
                cnt += 1
        if cnt == 0 or not s / (c + cnt) > lam:
            break
        lam, kstar = s / (c + cnt), cnt
    best = max(v0, (1.0 + b2) * lam)
    if v0 >= best - tol:
        return v0
    lo, hi = 1, kstar
    while lo < hi:  # the first probe is k* - 1: without a tie it ends the bisection at once
        mid = kstar - 1 if hi == kstar else (lo + hi) // 2
        if (1.0 + b2) * _relaxed_top(mid, ptil, n, first, 0.0, 0.0, buf)[0] / (c + mid) >= best - tol:
            hi = mid
        else:
            lo = mid + 1
    kth = _relaxed_top(lo, ptil, n, first, 0.0, 0.0, buf)[1]
    for v in range(n):
        ids[v] = v
    return _take(lo, kth, (1.0 + b2) / (c + lo), ptil, first, n, ids, out)


def _tables(taxonomy: Taxonomy, include_root: bool) -> tuple[Any, ...]:
    """The structure arrays of :func:`_solve_rows` (cached): kind, parent, children and ancestor lists, label sizes
    and subtree ends (pre-order: the subtree of ``n`` is the ids ``n .. end - 1``).

    Trees need no ancestor lists (a chain of 10,000 nodes has 50 million ancestor pairs): empty arrays stand in;
    DAGs no subtree ends."""
    cache = taxonomy.namespace_cache(__name__)
    key = ("search_tables", include_root)
    if key not in cache:
        n = taxonomy.num_nodes
        if taxonomy.is_tree:
            parent = np.asarray(taxonomy.parent, dtype=np.int64)
            anc_ptr, anc_idx = np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
            ends = np.arange(n) + np.asarray(taxonomy.subtree_size, dtype=np.int64)
        else:
            ends = np.zeros(n, dtype=np.int64)
            parent = np.full(n, -1, dtype=np.int64)
            anc = taxonomy.ancestors_sparse.tocsr()
            anc_ptr, anc_idx = anc.indptr.astype(np.int64), anc.indices.astype(np.int64)
        cache[key] = (
            bool(taxonomy.is_tree),
            parent,
            np.asarray(taxonomy.child_ptr, dtype=np.int64),
            np.asarray(taxonomy.child_idx, dtype=np.int64),
            anc_ptr,
            anc_idx,
            _label_sizes(taxonomy, include_root).astype(np.int64),
            ends,
        )
    return cache[key]


def _workspace(n: int, nsizes: int, is_tree: bool) -> tuple[np.ndarray, ...]:
    """The work arrays of :func:`_solve_rows`, allocated once per block of rows (see its unpacking for names)."""
    floats = [np.empty(n) for _ in range(5)]  # ptil, w, buf, ent_q (one entry per node on trees), lab
    if not is_tree:  # a DAG candidate holds its whole profile: up to nsizes entries each
        floats[3] = np.empty(n * nsizes)
    sizes = [np.empty(nsizes) for _ in range(3)]  # r, tau, coef
    ints = [np.full(n, -1, dtype=np.int64), np.empty(n, dtype=np.int64)]  # pos, cand
    ent_m = np.empty(n if is_tree else n * nsizes, dtype=np.int64)
    seg, cpar = np.empty(n + 1, dtype=np.int64), np.empty(n, dtype=np.int64)
    dense = np.empty((0 if is_tree else n, nsizes))  # DAGs: candidates x sizes
    ev, stack = np.empty((n + 2, 5)), np.empty((n + 2, 2), dtype=np.int64)
    lanes, acc = np.empty(2 * nsizes), np.zeros(2 * nsizes)  # acc: all zero between candidates
    return (*floats, *sizes, *ints, ent_m, seg, cpar, dense, ev, stack, lanes, acc)


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
    beta is large). See the module docstring for the convention, the proof, the pruning and the cost (one compiled
    pass over the nodes per row, then a few tens of sizes on the candidate nodes).

    Args:
        probs: node probabilities ``[B, N]`` (NumPy or torch), or leaf probabilities ``[B, L]`` with
            ``leaf_probs=True``. A tensor is decoded on the host (float64) and the result moved back to its device.
        taxonomy: a tree or a DAG.
        beta: F-beta weight, ``> 0``; larger values reward recall and so deeper, wider sets.
        include_root: count the root in every set (changes the scores, so the optimum).
        leaf_probs: ``probs`` holds leaf probabilities.
        return_value: also return the optimal expected hF-beta ``[B]``.
        initial_candidates: how many candidate nodes the first threshold round may hold (a speed knob only; any
            value >= 1 gives the same optimum).

    Returns:
        Boolean node sets ``[B, N]`` (root included), and the expected values with ``return_value=True``.
        Tie rule: set values within ``TIE_RTOL * max(1, |best|)`` of the best are tied and the smallest set wins
        (the root alone first); within one size, weights within ``TIE_RTOL / (2k)`` of the ``k``-th are tied and
        the smaller node ids win.

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
    """:func:`optimal_hfbeta` on one block of rows."""
    # The input check only. On trees the kernel takes the label probabilities from the node probabilities itself
    # (one read of each row, float32 read as it comes and summed in float64); DAGs and leaf probabilities come as
    # label probabilities.
    batch: Batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=False)
    from_nodes = taxonomy.is_tree and batch.leaf is None
    x = np.ascontiguousarray(batch.x) if from_nodes else np.ascontiguousarray(batch.label, dtype=np.float64)
    sets = np.zeros(x.shape, dtype=bool)
    values = np.zeros(x.shape[0])
    if x.shape[0]:
        first = 0 if include_root else 1
        tables = _tables(taxonomy, include_root)
        work = _workspace(taxonomy.num_nodes, int(tables[6].max()) + 1, tables[0])
        args = (tables, work, float(b2), first, initial_candidates, _FRACTIONS, sets, values)
        if _solve_rows(x, from_nodes, PROBABILITY_ATOL, *args) >= 0:
            label_distribution(
                batch.node, taxonomy, eps=batch.eps, row_offset=batch.row_offset
            )  # raises, naming the row ...
            _solve_rows(x, from_nodes, np.inf, *args)  # ... unless the checks are off: clip, as it does
    out_sets = restore_sets(sets, batch)
    if not return_value:
        return out_sets
    out_values = restore_values(values, batch)
    if not batch.is_torch and getattr(probs, "dtype", None) in (np.float16, np.float32):
        out_values = out_values.astype(probs.dtype)  # the input's float dtype, as for tensors
    return out_sets, out_values

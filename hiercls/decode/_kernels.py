"""Compiled per-row kernels (numba) for node probabilities in row-major memory on trees.

A head returns ``[B, N]`` with contiguous rows. Each kernel reads a row once, checks it and applies its rule while
the row is in the CPU cache, so a decoder costs a few passes of in-cache arithmetic over one read of the input,
where the NumPy formulation pays a column gather (``np.take(x, idx, axis=1)``, one element at a time) per step.

Every kernel has the signature ``kernel(x, parent, mode, lo, hi, edge_tol, root_tol, *tables, out) -> int``: it
writes row ``b``'s answer to ``out[b]`` and returns ``-1``, or stops at the first row that fails its check and
returns that row's index, so that the caller hands the input to the NumPy path, which names the culprit (or, where
its float64 formulation accepts a borderline row, decodes it).

The comparisons are those of the NumPy path in the same precision (``lo``, ``hi``, ``edge_tol`` and the rule's
thresholds carry the input's dtype, as NumPy compares a float32 array with a Python float), and the sums are taken
in the same order, so both paths give the same answers; the tests compare them on random and real inputs.

Indices are unsigned (``np.uint32``/``np.uintp``): numba then skips the negative-index wrap-around, and LLVM turns
the check's parent loop into vector gathers.
"""

from __future__ import annotations

import numba
import numpy as np

_JIT = {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}

CHECK_OFF = 0
"""Finite and ``>= lo`` only (what the decoders refuse with the checks off): ``hi`` is the dtype's largest value."""
CHECK_SCORES = 1
"""Range ``[lo, hi]`` (independent per-node scores)."""
CHECK_NODE = 2
"""Range, ``|P(root) - 1| <= root_tol`` and no node above its parent by more than ``edge_tol``."""


@numba.njit(**_JIT)
def _four_ok(e0, e1, e2, e3, parent, mode, lo, hi, edge_tol, root_tol):
    """The first of four rows that fails the check, or ``-1``: every value in ``[lo, hi]`` (NaN fails both
    comparisons) and, with ``CHECK_NODE``, ``|P(root) - 1| <= root_tol`` and ``P(n) - P(parent) <= edge_tol``.

    The four rows share each parent index load; the counts are unsigned sums of comparisons, a loop that LLVM
    vectorises (a branch per value would not be).
    """
    n = e0.shape[0]
    g0 = g1 = g2 = g3 = np.uint32(0)
    if mode == CHECK_NODE:
        for i in range(np.uint64(n)):  # parent[0] = 0: the root compares with itself
            k = parent[i]
            v0, v1, v2, v3 = e0[i], e1[i], e2[i], e3[i]
            g0 += np.uint32((v0 >= lo) & (v0 <= hi) & (v0 - e0[k] <= edge_tol))
            g1 += np.uint32((v1 >= lo) & (v1 <= hi) & (v1 - e1[k] <= edge_tol))
            g2 += np.uint32((v2 >= lo) & (v2 <= hi) & (v2 - e2[k] <= edge_tol))
            g3 += np.uint32((v3 >= lo) & (v3 <= hi) & (v3 - e3[k] <= edge_tol))
    else:
        for i in range(np.uint64(n)):
            v0, v1, v2, v3 = e0[i], e1[i], e2[i], e3[i]
            g0 += np.uint32((v0 >= lo) & (v0 <= hi))
            g1 += np.uint32((v1 >= lo) & (v1 <= hi))
            g2 += np.uint32((v2 >= lo) & (v2 <= hi))
            g3 += np.uint32((v3 >= lo) & (v3 <= hi))
    full = (g0 == n, g1 == n, g2 == n, g3 == n)
    rows = (e0, e1, e2, e3)
    for r in range(4):
        if not full[r] or (mode == CHECK_NODE and not abs(np.float64(rows[r][0]) - 1.0) <= root_tol):
            return r
    return -1


@numba.njit(**_JIT)
def _row_ok(row, parent, mode, lo, hi, edge_tol, root_tol):
    """Whether one row passes the check of :func:`_four_ok`."""
    return _four_ok(row, row, row, row, parent, mode, lo, hi, edge_tol, root_tol) < 0


@numba.njit(**_JIT)
def check_rows(x, parent, mode, lo, hi, edge_tol, root_tol, out):
    """Only the check: the first failing row, or ``-1`` (``out`` is not written)."""
    for b in range(0, x.shape[0], 4):
        bad = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)[0]
        if bad >= 0:
            return bad
    return -1


@numba.njit(**_JIT)
def _four(x, b, parent, mode, lo, hi, edge_tol, root_tol):
    """Rows ``b .. b + 3`` of ``x`` for the four-row kernels, the last row repeated past the end (its answer is
    stored once), after the check of each real row: ``(first failing row or -1, number of real rows, r0 .. r3)``.

    Four rows go through a rule's loop together: each index or weight is loaded once for four rows, and the four
    comparisons are independent, so they overlap.
    """
    last = x.shape[0] - 1
    rows = min(4, last + 1 - b)
    e0, e1, e2, e3 = x[b], x[min(b + 1, last)], x[min(b + 2, last)], x[min(b + 3, last)]
    lane = _four_ok(e0, e1, e2, e3, parent, mode, lo, hi, edge_tol, root_tol)
    return (-1 if lane < 0 else b + min(lane, rows - 1)), rows, e0, e1, e2, e3


@numba.njit(**_JIT)
def argmax_leaf_rows(x, parent, mode, lo, hi, edge_tol, root_tol, leaves, out):
    """The most probable leaf, the first (smallest id) among equals."""
    for b in range(0, x.shape[0], 4):
        bad, rows, e0, e1, e2, e3 = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)
        if bad >= 0:
            return bad
        j = leaves[0]
        t0, t1, t2, t3 = e0[j], e1[j], e2[j], e3[j]
        b0 = b1 = b2 = b3 = j
        for i in range(1, leaves.shape[0]):
            j = leaves[i]
            if e0[j] > t0:
                t0, b0 = e0[j], j
            if e1[j] > t1:
                t1, b1 = e1[j], j
            if e2[j] > t2:
                t2, b2 = e2[j], j
            if e3[j] > t3:
                t3, b3 = e3[j], j
        _store(out, b, rows, b0, b1, b2, b3)
    return -1


@numba.njit(**_JIT)
def _store(out, b, rows, b0, b1, b2, b3):
    best = (b0, b1, b2, b3)
    for r in range(rows):
        out[b + r] = best[r]


@numba.njit(**_JIT)
def hie_rows(x, parent, mode, lo, hi, edge_tol, root_tol, leaves, coarse, out):
    """The leaf maximising ``P(leaf) * P(coarse[leaf])`` (product in the input's dtype), the first among equals."""
    for b in range(0, x.shape[0], 4):
        bad, rows, e0, e1, e2, e3 = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)
        if bad >= 0:
            return bad
        j, c = leaves[0], coarse[0]
        t0, t1, t2, t3 = e0[j] * e0[c], e1[j] * e1[c], e2[j] * e2[c], e3[j] * e3[c]
        b0 = b1 = b2 = b3 = j
        for i in range(1, leaves.shape[0]):
            j, c = leaves[i], coarse[i]
            v0, v1, v2, v3 = e0[j] * e0[c], e1[j] * e1[c], e2[j] * e2[c], e3[j] * e3[c]
            if v0 > t0:
                t0, b0 = v0, j
            if v1 > t1:
                t1, b1 = v1, j
            if v2 > t2:
                t2, b2 = v2, j
            if v3 > t3:
                t3, b3 = v3, j
        _store(out, b, rows, b0, b1, b2, b3)
    return -1


@numba.njit(**_JIT)
def weighted_argmax_rows(x, parent, mode, lo, hi, edge_tol, root_tol, weight, out):
    """``argmax_n float64(P(n)) * weight[n]``, the first among equals (information gain)."""
    for b in range(0, x.shape[0], 4):
        bad, rows, e0, e1, e2, e3 = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)
        if bad >= 0:
            return bad
        w = weight[0]
        t0, t1, t2, t3 = np.float64(e0[0]) * w, np.float64(e1[0]) * w, np.float64(e2[0]) * w, np.float64(e3[0]) * w
        b0 = b1 = b2 = b3 = 0
        for n in range(1, e0.shape[0]):
            w = weight[n]
            v0, v1, v2, v3 = np.float64(e0[n]) * w, np.float64(e1[n]) * w, np.float64(e2[n]) * w, np.float64(e3[n]) * w
            if v0 > t0:
                t0, b0 = v0, n
            if v1 > t1:
                t1, b1 = v1, n
            if v2 > t2:
                t2, b2 = v2, n
            if v3 > t3:
                t3, b3 = v3, n
        _store(out, b, rows, b0, b1, b2, b3)
    return -1


@numba.njit(**_JIT)
def deepest_above_rows(x, parent, mode, lo, hi, edge_tol, root_tol, t, key, out):
    """Among the nodes with ``P > t``: the largest ``key``, then the largest ``P``, then the smallest id; else 0."""
    for b in range(0, x.shape[0], 4):
        bad, rows, e0, e1, e2, e3 = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)
        if bad >= 0:
            return bad
        b0 = b1 = b2 = b3 = 0
        k0 = k1 = k2 = k3 = -np.inf
        p0, p1, p2, p3 = e0[0], e1[0], e2[0], e3[0]
        for n in range(e0.shape[0]):
            k = key[n]
            v0, v1, v2, v3 = e0[n], e1[n], e2[n], e3[n]
            if v0 > t and (k > k0 or (k == k0 and v0 > p0)):
                b0, k0, p0 = n, k, v0
            if v1 > t and (k > k1 or (k == k1 and v1 > p1)):
                b1, k1, p1 = n, k, v1
            if v2 > t and (k > k2 or (k == k2 and v2 > p2)):
                b2, k2, p2 = n, k, v2
            if v3 > t and (k > k3 or (k == k3 and v3 > p3)):
                b3, k3, p3 = n, k, v3
        _store(out, b, rows, b0, b1, b2, b3)
    return -1


@numba.njit(**_JIT)
def descend_rows(x, parent, mode, lo, hi, edge_tol, root_tol, ptr, kids, t, plurality, tie_tol, out):
    """Greedy descent from the root to the most probable child (the smaller id among equals), while it qualifies.

    ``plurality=False`` (top-down): move while ``P(child) / P(node) >= t`` (``0`` where ``P(node) = 0``) and
    ``P(child) > 0``. ``plurality=True``: keep ``m``, the largest runner-up probability of the families visited
    (float64); move while the family has one child or ``P(child) >= m - tie_tol``, and ``P(child) > 0``.
    """
    zero = x.dtype.type(0)
    for b in range(x.shape[0]):
        if b % 4 == 0:
            bad = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)[0]
            if bad >= 0:
                return bad
        row = x[b]
        cur = 0
        m = 0.0
        while ptr[cur + 1] > ptr[cur]:
            first = ptr[cur]
            kid = kids[first]
            top = row[kid]
            runner = -np.inf
            for j in range(first + 1, ptr[cur + 1]):
                v = row[kids[j]]
                if v > top:
                    runner = max(runner, np.float64(top))
                    top = v
                    kid = kids[j]
                else:
                    runner = max(runner, np.float64(v))
            if plurality:
                single = ptr[cur + 1] - first == 1
                m = max(m, 0.0 if single else runner)
                move = (single or np.float64(top) >= m - tie_tol) and top > zero
            else:
                pu = row[cur]
                cond = top / pu if pu > zero else zero
                move = cond >= t and top > zero
            if not move:
                break
            cur = kid
        out[b] = cur
    return -1


@numba.njit(**_JIT)
def above_rows(x, parent, mode, lo, hi, edge_tol, root_tol, t, close, out):
    """The nodes with ``P > t`` and the root, as a boolean row; with ``close``, every ancestor of a kept node too."""
    n = x.shape[1]
    for b in range(x.shape[0]):
        if b % 4 == 0:
            bad = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)[0]
            if bad >= 0:
                return bad
        row = x[b]
        keep = out[b]
        for i in range(n):
            keep[i] = row[i] > t
        keep[0] = True
        if close:
            for i in range(n - 1, 0, -1):  # a parent has a smaller id: one pass upwards closes the set
                if keep[i]:
                    keep[parent[i]] = True
    return -1


@numba.njit(**_JIT)
def label_mass_rows(e0, e1, e2, e3, parent, bottom_up, p, s):
    """Label probabilities and subtree masses of four rows, in ``bayes._labels_and_subtree_t``'s float64 sums.

    ``p(n) = P(n) - (P(c1) + P(c2) + ...)`` over the children in id order (ids ascending visit each family in that
    order), clipped at 0; ``S(n) = p(n) + (S(c1) + S(c2) + ...)``, children again in id order: the non-root nodes
    are visited deepest level first and by id within a level (``bottom_up``), so each child's sum is final when it
    is added. Column ``r`` of ``p [N, 4]`` and ``s [N, 4]`` belongs to row ``e<r>``: four rows go through each loop
    together, so each index is loaded once for four rows and four sums are in flight at a time.

    Returns:
        Each row's smallest ``p(n)`` before clipping (below ``-atol``: not single-label probabilities).
    """
    n = e0.shape[0]
    s[:] = 0.0  # first the children's P sums, then the children's S sums
    for i in range(1, n):
        k = parent[i]
        s[k, 0] += np.float64(e0[i])
        s[k, 1] += np.float64(e1[i])
        s[k, 2] += np.float64(e2[i])
        s[k, 3] += np.float64(e3[i])
    l0 = l1 = l2 = l3 = 0.0
    for i in range(n):
        d0 = np.float64(e0[i]) - s[i, 0]
        d1 = np.float64(e1[i]) - s[i, 1]
        d2 = np.float64(e2[i]) - s[i, 2]
        d3 = np.float64(e3[i]) - s[i, 3]
        l0, l1, l2, l3 = min(l0, d0), min(l1, d1), min(l2, d2), min(l3, d3)
        p[i, 0], p[i, 1], p[i, 2], p[i, 3] = max(d0, 0.0), max(d1, 0.0), max(d2, 0.0), max(d3, 0.0)
    s[:] = 0.0
    for j in range(bottom_up.shape[0]):
        i = bottom_up[j]
        k = parent[i]
        t0, t1, t2, t3 = p[i, 0] + s[i, 0], p[i, 1] + s[i, 1], p[i, 2] + s[i, 2], p[i, 3] + s[i, 3]
        s[i, 0], s[i, 1], s[i, 2], s[i, 3] = t0, t1, t2, t3
        s[k, 0] += t0
        s[k, 1] += t1
        s[k, 2] += t2
        s[k, 3] += t3
    for r in range(4):
        s[0, r] += p[0, r]
    return l0, l1, l2, l3


@numba.njit(**_JIT)
def bayes_tree_rows(
    x,
    parent,
    mode,
    lo,
    hi,
    edge_tol,
    root_tol,
    bottom_up,
    ptr,
    kids,
    depth,
    cand,
    lca_height,
    every,
    height,
    mass_atol,
    tol,
    out,
):
    """The Bayes node of a closed-form cost on a tree (``bayes._fast_tree_ids``), in the same float64 sums.

    Label probabilities ``p`` and subtree masses ``S`` as :func:`label_mass_rows`, four rows at a time (refused
    below ``-mass_atol`` with the checks on). Shortest path over every node (``every``): the deepest node with
    ``S > S(root) / 2 + tol`` (the largest such id; these nodes form a chain from the root, descended through the
    children ``kids[ptr[n]:ptr[n + 1]]``). Otherwise, over the
    candidates ``cand`` (ascending ids), the first whose score is within ``tol`` of the best: shortest path
    ``2 A(n) - depth(n) S(root)``, LCA height ``A(n) + p(n) (height - depth(n))``, with ``A(n)`` the sum of ``S``
    over the non-root ancestors-or-self of ``n``, root first.
    """
    bsz, n = x.shape
    p = np.empty((n, 4))
    s = np.empty((n, 4))
    a = np.empty((n, 4))
    for b in range(0, bsz, 4):
        bad, rows, e0, e1, e2, e3 = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)
        if bad >= 0:
            return bad
        low = label_mass_rows(e0, e1, e2, e3, parent, bottom_up, p, s)
        if mode != CHECK_OFF:
            for r in range(rows):
                if low[r] < -mass_atol:
                    return b + r
        if every and not lca_height:
            # {S > mass / 2 + tol} is a chain from the root (S only shrinks down the tree, and two children of one
            # node cannot both hold more than half), so its deepest node, the largest id, is found by descending.
            for r in range(rows):
                half = 0.5 * s[0, r] + tol
                cur = 0
                while True:
                    nxt = -1
                    for j in range(ptr[cur], ptr[cur + 1]):
                        if s[kids[j], r] > half:
                            nxt = kids[j]
                            break
                    if nxt < 0:
                        break
                    cur = nxt
                out[b + r] = cur
            continue
        a[0, :] = 0.0  # the root is the LCA of every pair: it adds the same to every score
        for u in range(1, n):
            k = parent[u]
            a[u, 0] = a[k, 0] + s[u, 0]
            a[u, 1] = a[k, 1] + s[u, 1]
            a[u, 2] = a[k, 2] + s[u, 2]
            a[u, 3] = a[k, 3] + s[u, 3]
        for r in range(rows):
            out[b + r] = closed_form_pick(a, r, p, r, s[0, r], cand, depth, lca_height, height, tol)
    return -1


@numba.njit(**_JIT)
def closed_form_pick(a, lane, p, p_col, mass, cand, depth, lca_height, height, tol):
    """The first of the candidates ``cand`` (ascending ids) whose closed-form score is within ``tol`` of the best:
    LCA height ``A + p (height - depth)``, shortest path ``2 A - depth mass``, from the path sums ``a[:, lane]``
    (overwritten by the scores) and the label probabilities ``p[:, p_col]``, indexed as ``cand`` and ``depth``."""
    top = -np.inf
    for i in range(cand.shape[0]):
        u = cand[i]
        sc = a[u, lane] + p[u, p_col] * (height - depth[u]) if lca_height else 2.0 * a[u, lane] - depth[u] * mass
        a[u, lane] = sc  # every path sum is taken already: the candidate's slot keeps its score
        top = max(top, sc)
    for i in range(cand.shape[0]):
        if a[cand[i], lane] >= top - tol:
            return cand[i]
    return cand[0]

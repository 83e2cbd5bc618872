"""Bayes-optimal single-node decoders for a cost between a predicted node and the true label.

``bayes_node`` returns ``argmin_n E_y[cost(n, y)]`` under the label distribution implied by the node
probabilities: the optimal decision for mistake severity (``"lca_height"``), hierarchical distance
(``"shortest_path"``), Wu-Palmer (``"wu_palmer"``) and Zhao's normalised information-content cost (``"zhao"``),
or any cost matrix (e.g. the node-to-leaf costs of Plaud et al., ICML 2025). ``crm`` is the same restricted to
leaves (Karthik et al. 2021). :func:`prediction_expected_cost` scores the predictions of *any* decoder under
the same expectation, and :func:`hiercls.metrics.realized_cost` under the true labels.

One implementation per kind of cost:

* trees, ``shortest_path``, ``lca_height``, ``ic_distance``, ``jiang_conrath``: one compiled kernel per row, from
  ``d(n, y) = f(n) + f(y) - 2 f(lca(n, y))``: the label distribution ``p`` and its subtree sums ``P~`` in one
  bottom-up pass, then ``E[f(lca(n, y))]``, the sum over the ancestors ``a`` of ``n`` of
  ``(f(a) - f(parent a)) P~(a)``, in one top-down pass; O(N) per sample, no ``N x L`` matrix;
* trees, ``wu_palmer`` (either root convention): NumPy, the labels split by depth, O(N * height) per sample;
* ``zhao``, DAGs and cost matrices: NumPy, the dense matrix, built in blocks of labels.

Ties follow :data:`hiercls.decode.inputs.TIE_RTOL`: expected costs within it of the minimum are tied and the
smallest node id wins, with or without ``return_cost``. Tensor input is decoded on the host; the ids (and costs,
in the input's float dtype) go back to its device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hiercls._checks import to_numpy
from hiercls.decode.checks import NODE, check_row, jit, label_mass_tolerance
from hiercls.decode.inputs import (
    CHUNK_ELEMENTS,
    TIE_RTOL,
    Batch,
    first_best,
    label_distribution,
    prepare,
    restore_ids,
    restore_values,
)
from hiercls.decode.registry import register_decoder
from hiercls.taxonomy import Taxonomy, node_id_array
from hiercls.taxonomy.core import DISTANCE_KINDS

__all__ = ["COST_KINDS", "bayes_node", "crm", "expected_cost", "prediction_expected_cost"]

COST_KINDS = DISTANCE_KINDS
_KERNEL_KINDS = ("shortest_path", "lca_height", "ic_distance", "jiang_conrath")
_DENSE_LIMIT = 1 << 26  # entries of a dense cost matrix we are willing to build
_CACHE_LIMIT = 1 << 22  # entries of a node-to-node matrix worth keeping per taxonomy (32 MB)


def _candidate_mask(taxonomy: Taxonomy, candidates: Any) -> np.ndarray:
    n = taxonomy.num_nodes
    if candidates is None or (isinstance(candidates, str) and candidates == "all"):
        return np.ones(n, dtype=bool)
    if isinstance(candidates, str):
        if candidates == "leaves":
            return taxonomy.is_leaf.copy()
        if candidates == "classes":
            return taxonomy.class_mask.copy()
        raise ValueError(
            f"candidates must be 'all', 'leaves', 'classes', a boolean mask [N] or node ids/names; got {candidates!r}"
        )
    arr = np.asarray(to_numpy(candidates, name="candidates"))
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise ValueError(f"candidates mask must have shape [{n}]; got {list(arr.shape)}")
        mask = arr.copy()
    else:
        mask = np.zeros(n, dtype=bool)
        mask[node_id_array(arr, taxonomy, name="candidates")] = True
    if not mask.any():
        raise ValueError("candidates selects no node")
    return mask


@jit
def tree_cost_rows(x: Any, mode: int, child: Any, parent: Any, tol: Any, par: Any, a: Any, f: Any, delta: Any,
                   g: Any, c_const: float, s2: float, label_tol: Any, cand: Any, costs: Any, ids: Any, best: Any,
                   err: Any) -> None:  # fmt: skip
    """Per row of a tree's node probabilities: ``E(n) = a(n) mass + c_const sum_y p(y) f(y) - s2 S(n) - g(n) p(n)``
    with ``S(n)`` the sum of ``delta(u) P~(u)`` over the ancestors-or-self ``u`` of ``n``; the first candidate
    tied with the smallest ``E`` goes to ``ids``, its ``E`` to ``best`` and, when ``costs`` has rows, every
    ``E(n)`` to ``costs``. Ids are a pre-order (``par[j] < j``), so one pass up the ids and one down suffice.
    Four rows go through each pass together (``x`` has a multiple of four rows): their sums into a parent are
    independent of each other, and with no branch in the four-row steps the compiler does them as one vector."""
    n, rows = x.shape[1], 4
    p = np.empty((n, rows))  # p(j) on the way up; E(j) on the way down
    sub = np.empty((n, rows))  # the children's P, added up on the way up
    big = np.empty((n, rows))  # P~: the children's P~, then j's own
    s = np.empty((n, rows))
    moment, low, short = np.empty(rows), np.empty(rows), np.empty(rows)
    for b0 in range(0, x.shape[0], rows):
        for r in range(rows):
            code, pos = check_row(x[b0 + r], mode, child, parent, tol)
            if code:
                err[0], err[1], err[2] = b0 + r, code, pos
                return
        sub[:] = 0.0
        big[:] = 0.0
        moment[:] = 0.0
        low[:] = np.inf
        for j in range(n - 1, -1, -1):  # children first: sub[j] and big[j] are complete when j is reached
            u = par[j]
            for r in range(rows):
                v = np.float64(x[b0 + r, j])
                pj = v - sub[j, r]
                short[r] = pj
                pj = max(pj, 0.0)
                p[j, r] = pj
                big[j, r] += pj
                moment[r] += pj * f[j]
                sub[u, r] += v  # the root adds itself to sub[0], read no more
                big[u, r] += big[j, r] if j else 0.0
            if mode == NODE and min(short[0], short[1], short[2], short[3]) < -label_tol[j]:
                for r in range(rows):
                    if short[r] < -label_tol[j]:
                        err[0], err[1], err[2] = b0 + r, 6, j
                        return
        if costs.shape[0]:
            _costs_down(p, s, big, moment, low, par, a, delta, g, c_const, s2, cand, costs[b0 : b0 + rows])
        else:
            _costs_down(p, s, big, moment, low, par, a, delta, g, c_const, s2, cand, costs)
        for r in range(rows):
            ceiling = low[r] + TIE_RTOL * max(1.0, abs(low[r]))
            for j in range(n):
                if cand[j] and p[j, r] <= ceiling:
                    ids[b0 + r], best[b0 + r] = j, p[j, r]
                    break


@jit
def _costs_down(p, s, big, moment, low, par, a, delta, g, c_const, s2, cand, costs):  # type: ignore[no-untyped-def]
    """The way down of :func:`tree_cost_rows` for four rows: ``S``, every ``E`` into ``p`` (and ``costs`` when it
    has rows) and the smallest candidate ``E`` per row into ``low``."""
    keep = costs.shape[0] > 0
    for j in range(p.shape[0]):
        u = par[j]
        inf = 0.0 if cand[j] else np.inf
        for r in range(4):
            sj = (s[u, r] if j else 0.0) + delta[j] * big[j, r]
            s[j, r] = sj
            e = a[j] * big[0, r] + c_const * moment[r] - s2 * sj - g[j] * p[j, r]
            p[j, r] = e
            c = e + inf
            low[r] = c if c < low[r] else low[r]
        if keep:
            for r in range(4):
                costs[r, j] = p[j, r]


def _kernel_tables(tax: Taxonomy, kind: str) -> tuple[Any, ...]:
    """``(par, a, f, delta, g, c_const, s2)`` of :func:`tree_cost_rows` for a tree and a kernel kind (cached)."""
    cache = tax.namespace_cache(__name__)
    if ("kernel", kind) not in cache:
        n = tax.num_nodes
        par = np.maximum(np.asarray(tax.parent, dtype=np.int64), 0)
        depth = np.asarray(tax.depth, dtype=np.float64)
        if kind == "lca_height":
            h = float(tax.height)
            delta = np.ones(n)
            delta[0] = 0.0  # the root is every pair's common ancestor: H - depth(lca) counts from depth 0
            tables = (par, np.full(n, h), np.zeros(n), delta, h - depth, 0.0, 1.0)
        else:
            f = depth if kind == "shortest_path" else np.asarray(tax.information_content, dtype=np.float64)
            delta = f - np.where(np.arange(n) > 0, f[par], 0.0)
            tables = (par, f, f, delta, np.zeros(n), 1.0, 2.0)
        cache["kernel", kind] = tables
    return cache["kernel", kind]


def _kernel_costs(batch: Batch, kind: str, mask: np.ndarray, full: bool) -> tuple[np.ndarray, np.ndarray, Any]:
    """``(ids, their E, every E or None)`` by :func:`tree_cost_rows`."""
    b, n = batch.x.shape
    ids, best = np.zeros(b, dtype=np.int64), np.zeros(b)
    costs = np.zeros((b, n) if full else (0, 0))
    err = np.zeros(3, dtype=np.int64)
    if b:
        tables = _kernel_tables(batch.taxonomy, kind)
        label_tol = label_mass_tolerance(batch.taxonomy, batch.eps)
        whole = b - b % 4  # the kernel takes four rows at a time: the last rows go padded with copies of the last
        args = (*batch.check_args(), *tables, label_tol, mask)
        if whole:
            tree_cost_rows(batch.x[:whole], *args, costs[:whole], ids[:whole], best[:whole], err)
        if whole < b and not err[1]:
            tail = np.concatenate([batch.x[whole:], np.repeat(batch.x[-1:], whole + 4 - b, axis=0)])
            t_ids, t_best = np.zeros(4, dtype=np.int64), np.zeros(4)
            t_costs = np.zeros((4, n) if full else (0, 0))
            tree_cost_rows(tail, *args, t_costs, t_ids, t_best, err)
            err[0] += whole
            ids[whole:], best[whole:] = t_ids[: b - whole], t_best[: b - whole]
            if full:
                costs[whole:] = t_costs[: b - whole]
    batch.raise_if(err)
    return ids, best, costs if full else None


def _uses_kernel(tax: Taxonomy, cost: Any) -> bool:
    return isinstance(cost, str) and cost in _KERNEL_KINDS and tax.is_tree and tax.num_nodes > 1


def _ratio_cost(p: np.ndarray, tax: Taxonomy, kind: str) -> np.ndarray:
    """``E[cost(n, y)]`` ``[b, N]`` on a tree for the ratio kinds ``1 - 2 f(lca) / (f(n) + f(y))`` from the label
    distribution ``p [b, N]`` (``f``: depth, depth + 1 or information content), without a node-to-label matrix.

    ``f(lca)`` is ``f(root)`` plus the increments ``f(a) - f(parent(a))`` over the non-root ancestors-or-self ``a``
    of the LCA, which are exactly the common non-root ancestors of ``n`` and ``y``. So for the labels sharing one
    value ``v = f(y)``, ``sum p(y) f(lca)`` is ``f(root) r_v`` plus the sum over the non-root ancestors-or-self
    ``a`` of ``n`` of the increment of ``a`` times the label mass of that group below ``a``: two products with the
    ancestor matrix per distinct ``f(y)`` (one group for leaf labels under ``zhao``, one per depth otherwise).
    """
    if kind == "zhao":
        f = np.asarray(tax.information_content, dtype=np.float64)
    else:
        f = np.asarray(tax.depth, dtype=np.float64) + (1.0 if kind == "wu_palmer_root1" else 0.0)
    anc = tax.ancestors_sparse.tocsr().astype(np.float64)  # anc[d, u] = 1: u is an ancestor-or-self of d
    not_root = anc.copy()
    not_root[:, 0] = 0.0
    not_root.eliminate_zeros()
    step = f - f[np.maximum(tax.parent, 0)]  # the increment of f along each edge (the root's is unused)
    out = np.zeros_like(p)
    support = p.any(0)
    for v in np.unique(f[support]):
        group = np.flatnonzero(support & (f == v))
        r = p[:, group].sum(1, keepdims=True)
        below = (not_root[group].T @ p[:, group].T).T  # the group's label mass below each non-root node
        path = (not_root @ (below * step[None, :]).T).T  # increments summed over each node's non-root ancestors
        den = f[None, :] + v
        out += np.where(den > 0, (f[tax.root] * r + path) / np.where(den > 0, den, 1.0), 0.5 * r)
    # Where f(n) + f(y) = 0 (both cover every leaf, or both are the root) the cost is defined as 0: the r/2 above.
    return p.sum(1, keepdims=True) - 2.0 * out


def _expected_cost_rows(batch: Batch, cost: Any, rows: slice) -> np.ndarray:
    """``E[cost(n, y)]`` ``[b, N]`` of the rows ``rows`` by NumPy (the kinds and taxonomies without the kernel)."""
    tax = batch.taxonomy
    if batch.leaf is not None:
        p = np.zeros((batch.leaf[rows].shape[0], tax.num_nodes))
        p[:, tax.leaves] = batch.leaf[rows]
    else:
        p = label_distribution(batch.x[rows], tax, eps=batch.eps, row_offset=batch.row_offset + (rows.start or 0))
    if not isinstance(cost, str):
        return _matrix_cost(p, tax, cost)
    if cost not in COST_KINDS:
        raise ValueError(f"cost must be one of {', '.join(COST_KINDS)} or a cost matrix; got {cost!r}")
    if tax.is_tree and tax.num_nodes > 1 and cost in ("wu_palmer", "wu_palmer_root1", "zhao"):
        return _ratio_cost(p, tax, cost)
    targets = np.flatnonzero(p.any(0)) if p.shape[0] else np.zeros(0, dtype=np.int64)
    _check_distance_size(tax, cost, len(targets))
    full = _distance_matrix(tax, cost)
    if full is not None:
        return p[:, targets] @ full[:, targets].T
    out = np.zeros((p.shape[0], tax.num_nodes))
    for cols, block in _distance_blocks(tax, cost, targets):
        out += p[:, cols] @ block.T
    return out


def _matrix_cost(p: np.ndarray, tax: Taxonomy, cost: Any) -> np.ndarray:
    mat = np.asarray(cost.detach().cpu().numpy() if hasattr(cost, "detach") else cost, dtype=np.float64)
    _check_cost_matrix(tax, mat)
    if mat.shape[1] == tax.num_leaves and tax.num_nodes > 1:
        _check_leaf_labels(tax, p.sum(1) - p[:, tax.leaves].sum(1))
        return p[:, tax.leaves] @ mat.T
    return p @ mat.T


def _all_costs(batch: Batch, cost: Any) -> np.ndarray:
    """Every expected cost ``[B, N]`` float64, by the kernel or the NumPy formulation (in row blocks)."""
    tax = batch.taxonomy
    if _uses_kernel(tax, cost):
        return _kernel_costs(batch, cost, np.ones(tax.num_nodes, dtype=bool), True)[2]
    batch.check()
    b = batch.x.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(1, tax.num_nodes))
    parts = [_expected_cost_rows(batch, cost, slice(s, s + step)) for s in range(0, b, step)]
    return np.concatenate(parts) if parts else np.zeros((0, tax.num_nodes))


def expected_cost(probs: Any, taxonomy: Taxonomy, cost: Any = "shortest_path", *, leaf_probs: bool = False) -> Any:
    """``E_y[cost(n, y)]`` for every node ``n``: ``[B, N]``.

    Args:
        probs: node probabilities ``[B, N]`` (or leaf probabilities with ``leaf_probs=True``).
        cost: a distance kind of :meth:`Taxonomy.distance` (:data:`COST_KINDS`: ``"shortest_path"``,
            ``"lca_height"``, ``"wu_palmer"``, ``"wu_palmer_root1"``, ``"zhao"``, ``"ic_distance"``), or a
            matrix ``cost[n, y]`` = cost of predicting node ``n`` when the label is ``y``: ``[N, L]`` node-to-leaf
            (columns in the order of ``taxonomy.leaves``; labels must then be leaves) or ``[N, N]``
            node-to-label.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> expected_cost(np.array([[1.0, 0.5, 0.5, 0.0, 0.5]]), tax, "shortest_path").round(3).tolist()
        [[1.5, 1.5, 1.5, 2.5, 1.5]]
    """
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    return restore_values(_all_costs(batch, cost), batch)


def _check_distance_size(tax: Taxonomy, cost: str, num_targets: int) -> None:
    if not tax.is_tree and tax.num_nodes * num_targets > _DENSE_LIMIT:
        raise ValueError(
            f"cost {cost!r} on DAG {tax.name!r} would need a {tax.num_nodes} x {num_targets} "
            "matrix; convert with to_tree() first"
        )


def _distance_matrix(tax: Taxonomy, cost: str) -> np.ndarray | None:
    """The node-to-node matrix of a distance kind, cached on the taxonomy; ``None`` past ``_CACHE_LIMIT``."""
    key = ("cost", cost)
    cache = tax.namespace_cache(__name__)
    if key not in cache and tax.num_nodes**2 <= _CACHE_LIMIT:
        cache[key] = tax.distance_matrix(cost, targets=np.arange(tax.num_nodes))
    return cache.get(key)


def _distance_blocks(tax: Taxonomy, cost: str, targets: np.ndarray) -> Any:
    """``(label ids, distance matrix [N, len(ids)])`` over blocks of ``targets`` that keep each near 32 MB."""
    step = max(1, _CACHE_LIMIT // tax.num_nodes)
    for s in range(0, len(targets), step):
        cols = targets[s : s + step]
        yield cols, tax.distance_matrix(cost, targets=cols)


def _check_cost_matrix(tax: Taxonomy, mat: np.ndarray) -> None:
    n, nl, shape = tax.num_nodes, tax.num_leaves, tuple(mat.shape)
    if len(shape) != 2 or shape[0] != n or shape[1] not in (nl, n):
        raise ValueError(
            f"cost matrix must be [N, L] = [{n}, {nl}] (node to leaf) or [N, N] = [{n}, {n}] "
            f"(node to label); got shape {list(shape)}"
        )
    if not np.isfinite(mat).all():
        raise ValueError("cost matrix contains NaN or infinite values")
    if (mat < 0).any():  # a negative cost rewards a mistake: the expected cost no longer ranks predictions
        i, j = (int(v) for v in np.argwhere(mat < 0)[0])
        raise ValueError(f"cost matrix must be >= 0 (a cost, not a score); cost[{i}, {j}] = {mat[i, j]:g}")


def _check_leaf_labels(tax: Taxonomy, internal: Any) -> None:
    """Refuse a node-to-leaf cost when labels carry mass at internal nodes (``internal``: that mass per row)."""
    worst = float(internal.max()) if internal.shape[0] else 0.0
    if worst > 1e-6:
        raise ValueError(
            f"a node-to-leaf cost [N, L] cannot score labels at internal nodes (up to "
            f"{worst:.3g} of the mass is there); pass an [N, N] node-to-label cost"
        )


@register_decoder("bayes_node", optimal_for="the expected cost of a single-node prediction (any cost)")
def bayes_node(
    probs: Any,
    taxonomy: Taxonomy,
    cost: Any = "shortest_path",
    *,
    candidates: Any = None,
    leaf_probs: bool = False,
    return_cost: bool = False,
) -> Any:
    """The node with the smallest expected cost, ``argmin_n sum_y p(y) cost(n, y)`` (ties: smaller id).

    Args:
        probs: node probabilities ``[B, N]`` (or leaf probabilities with ``leaf_probs=True``).
        cost: distance kind or cost matrix, as in :func:`expected_cost`.
        candidates: the nodes that may be predicted: ``None``/``"all"``, ``"leaves"``, ``"classes"``, a boolean
            mask ``[N]`` or node ids/names.
        return_cost: also return the minimal expected cost ``[B]``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4]])
        >>> bayes_node(p, tax, "shortest_path").tolist(), bayes_node(p, tax, "lca_height").tolist()
        ([1], [2])
    """
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    tax = batch.taxonomy
    mask = _candidate_mask(tax, candidates)
    if _uses_kernel(tax, cost):
        ids, best, _ = _kernel_costs(batch, cost, mask, False)
    else:
        exp = _all_costs(batch, cost)
        ids = first_best(exp, minimize=True, mask=mask)
        best = exp[np.arange(len(ids)), ids]
    out = restore_ids(ids, batch)
    if not return_cost:
        return out
    costs = restore_values(best, batch)
    if not batch.is_torch and getattr(probs, "dtype", None) in (np.float16, np.float32):
        costs = costs.astype(probs.dtype)  # the input's float dtype, as for tensors
    return out, costs


def prediction_expected_cost(
    probs: Any, predictions: Any, taxonomy: Taxonomy, cost: Any = "shortest_path", *, leaf_probs: bool = False
) -> Any:
    """Expected cost ``E_y[cost(pred, y)]`` of given single-node predictions under the model's probabilities.

    Scores the output of *any* decoder with the objective :func:`bayes_node` minimises: for every sample the
    expected cost of its prediction is at least that of ``bayes_node(probs, taxonomy, cost)``. The realised
    counterpart (under the true labels) is :func:`hiercls.metrics.realized_cost`.

    Args:
        probs: node probabilities ``[B, N]`` (or leaf probabilities with ``leaf_probs=True``).
        predictions: predicted node ids ``[B]`` (names are accepted too).
        cost: distance kind or cost matrix, as in :func:`expected_cost`.

    Returns:
        ``[B]`` expected costs, in the input's framework.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4]])
        >>> prediction_expected_cost(p, [4], tax, "lca_height").round(6).tolist()  # 0.6 * 2: wrong under a
        [1.2]
    """
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    pred = np.atleast_1d(to_numpy(predictions, name="predictions"))  # one sample's prediction may be a scalar
    ids = node_id_array(pred, taxonomy, name="predictions", rows=batch.x.shape[0])
    exp = _all_costs(batch, cost)
    return restore_values(exp[np.arange(len(ids)), ids], batch)


@register_decoder("crm", optimal_for="the expected cost of a leaf prediction (default: mistake severity)")
def crm(
    probs: Any, taxonomy: Taxonomy, cost: Any = "lca_height", *, leaf_probs: bool = False, return_cost: bool = False
) -> Any:
    """Conditional risk minimisation over leaves (Karthik et al., "No cost likelihood manipulation at test time
    for making better mistakes in deep networks", ICLR 2021): ``argmin_leaf sum_j cost(leaf, j) p(j)``.

    The default cost is the LCA height (mistake severity), as in the paper. Ties: smaller id.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4]])
        >>> crm(p, tax).tolist()  # b is the argmax leaf, but x is safer
        [2]
    """
    return bayes_node(probs, taxonomy, cost, candidates="leaves", leaf_probs=leaf_probs, return_cost=return_cost)

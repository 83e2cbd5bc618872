"""Bayes-optimal single-node decoders for a cost between a predicted node and the true label.

``bayes_node`` returns ``argmin_n E_y[cost(n, y)]`` under the label distribution implied by the node
probabilities: the optimal decision for mistake severity (``"lca_height"``), hierarchical distance
(``"shortest_path"``), Wu-Palmer (``"wu_palmer"``) and Zhao's normalised information-content cost (``"zhao"``),
or any cost matrix (e.g. the node-to-leaf costs of Plaud et al., ICML 2025). ``crm`` is the same restricted to
leaves (Karthik et al. 2021). :func:`prediction_expected_cost` scores the predictions of *any* decoder under
the same expectation, and :func:`hiercls.metrics.realized_cost` under the true labels.

For trees and the kinds ``shortest_path``, ``lca_height``, ``ic_distance`` the expectation is computed without
any ``N x L`` matrix, from ``d(n, y) = f(n) + f(y) - 2 f(lca(n, y))``: ``E[f(lca(n, y))]`` is the sum over the
ancestors ``a`` of ``n`` of ``(f(a) - f(parent a)) * P(a)`` (``a`` is above the LCA exactly when it is above
both), a running sum down the tree, O(N) per sample. ``wu_palmer`` (either root convention) also splits the
labels by depth, O(N * height) per sample. Other costs (``zhao``, whose denominator depends on the label's IC,
and DAGs) use the dense matrix, built in blocks of labels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from hiercls._checks import PROBABILITY_ATOL, check_label_mass, probability_checks_enabled
from hiercls.decode._common import (
    _ROW_OFFSET,
    Batch,
    _child_csr,
    chunked,
    first_true_t,
    index_tensor,
    label_distribution_t,
    label_distribution_torch,
    leaf_rows_torch,
    prepare,
    prepare_torch,
    restore_ids,
    restore_values,
    sorted_children,
    subtree_ends_tensor,
    torch_kernels,
    value_dtype_torch,
)
from hiercls.decode._rows import bottom_up_order, kernel_rows
from hiercls.decode.hfbeta import tree_tables
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.core import DISTANCE_KINDS

__all__ = ["COST_KINDS", "bayes_node", "crm", "expected_cost", "prediction_expected_cost"]

COST_KINDS = DISTANCE_KINDS
_STRUCTURED = ("shortest_path", "lca_height", "ic_distance", "jiang_conrath", "wu_palmer", "wu_palmer_root1")
_DENSE_LIMIT = 1 << 26  # entries of a dense cost matrix we are willing to build
_CLOSED_FORMS = ("shortest_path", "lca_height")  # trees: argmin without the [B, N] expected costs
_TIE_TOL = 1e-12  # per unit of height: expected costs closer than this are ties in the closed forms
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
    arr = np.asarray(candidates)
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise ValueError(f"candidates mask must have shape [{n}]; got {list(arr.shape)}")
        mask = arr.copy()
    else:
        ids = np.array([taxonomy.index(c) if isinstance(c, str) else int(c) for c in arr.ravel()], dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise TaxonomyError(f"candidate ids must be in [0, {n}); got {ids.min()}..{ids.max()}")
        mask = np.zeros(n, dtype=bool)
        mask[ids] = True
    if not mask.any():
        raise ValueError("candidates selects no node")
    return mask


def _path_sum_t(x: np.ndarray, taxonomy: Taxonomy) -> np.ndarray:
    """Node-major ``out[n] = sum of x[a]`` over the ancestors-or-self ``a`` of ``n`` (trees), level by level."""
    out = x.copy()
    par = taxonomy.parent
    for lvl in taxonomy.levels[1:]:
        out[lvl] += out[par[lvl]]
    return out


def _subtree_levels(taxonomy: Taxonomy) -> list[tuple[np.ndarray, sp.csr_matrix]]:
    """Per depth, deepest first: (the parents of the level's nodes, ``S [parents, N]`` summing their children).

    ``S @ x`` adds each parent's children in id order, row by row: the sums of ``np.add.reduceat`` over the
    children sorted by parent, without its column-by-column walk down axis 0.
    """
    cache = taxonomy.namespace_cache(__name__)
    if "subtree_levels" not in cache:
        par = taxonomy.parent
        n = taxonomy.num_nodes
        out = []
        for lvl in reversed(taxonomy.levels[1:]):
            kids = lvl[np.argsort(par[lvl], kind="stable")]
            kp = par[kids]
            parents, row = np.unique(kp, return_inverse=True)
            mat = sp.csr_matrix((np.ones(len(kids)), (row, kids)), shape=(len(parents), n))
            mat.sort_indices()
            out.append((parents, mat))
        cache["subtree_levels"] = out
    return cache["subtree_levels"]


def _subtree_mass_t(pt: np.ndarray, taxonomy: Taxonomy) -> np.ndarray:
    """Node-major ``P~(n)`` = sum of ``pt`` over the subtree of ``n`` (trees), bottom-up one level at a time.

    Sums of non-negative numbers only grow under round-to-nearest, so ``P~`` never increases down the tree.
    """
    out = pt.copy()
    for parents, mat in _subtree_levels(taxonomy):
        out[parents] += mat @ out
    return out


def _labels_and_subtree_t(
    batch: Batch, cols: slice = slice(None), *, keep_labels: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Node-major label probabilities ``p`` (clipped at 0) and their subtree sums ``P~``, for the samples ``cols``.

    ``p`` equals :func:`~hiercls.decode._common.label_distribution_t` (same children, same summation order). With
    ``keep_labels=False`` the sums overwrite ``p`` (one array less).
    """
    tax = batch.taxonomy
    if batch.leaf is not None:
        pt = label_distribution_t(batch.node[cols], tax, leaf=batch.leaf[cols])
    else:
        pt = np.array(batch.node_t[:, cols], dtype=np.float64, order="C")  # [N, b]: the only copy of the input
        pt -= _child_csr(tax) @ pt  # P(n) - the sum of its children's P
        if probability_checks_enabled() and pt.size and pt.min() < -PROBABILITY_ATOL:
            # children above their parent: not single-label probabilities (the check allows round-off only)
            start = cols.start or 0
            check_label_mass(pt, tax, batch.node[cols], node_major=True, row_offset=_ROW_OFFSET.get() + start)
        np.maximum(pt, 0.0, out=pt)
    big = pt.copy() if keep_labels else pt
    for parents, mat in _subtree_levels(tax):
        big[parents] += mat @ big
    return pt, big


def _ancestor_rows(taxonomy: Taxonomy, cand: np.ndarray) -> sp.csr_matrix:
    """``A [len(cand), N]``: row ``i`` marks the ancestors-or-self of ``cand[i]`` (columns in id order, root first).

    ``A @ x`` sums ``x`` down each path from the root in the order of :func:`_path_sum_t` (a parent has a smaller
    id), so it equals that path sum at ``cand`` without computing it anywhere else.
    """
    cache = taxonomy.namespace_cache(__name__)
    key = ("ancestor_rows", cand.tobytes())
    if key not in cache:
        a = taxonomy.ancestors_sparse[cand].tocsr().astype(np.float64)
        a.sort_indices()
        cache[key] = a
    return cache[key]


_BLOCK_FLOATS = 1 << 19  # float64 entries per block of the closed forms: ~4 MB, in the CPU cache


def _fast_tree_ids(batch: Batch, kind: str, mask: np.ndarray) -> np.ndarray | None:
    """``argmin_n E[cost(n, y)]`` over ``mask`` without the expected costs, for the kinds with a closed form.

    On a tree, ``E[depth(lca(n, y))]`` is the sum of ``P~(a)`` over the non-root ancestors-or-self ``a`` of ``n``.
    Shortest path: ``E(n) - E(root)`` is the sum over the same nodes of ``mass - 2 P~(a)``, whose terms only grow
    down a path, so over all nodes the minimum is the deepest node with ``P~ > mass / 2`` (these nodes form a
    chain from the root; a zero term is a tie, which the ancestor, the smaller id, wins). LCA height: ``E(n) =
    H mass - S(n) - p(n) (H - depth(n))`` with ``S`` that path sum. ``None`` when no closed form applies.

    Computed node-major on blocks of samples small enough to stay in the CPU cache.
    """
    tax = batch.taxonomy
    if not tax.is_tree or tax.num_nodes < 2 or kind not in _CLOSED_FORMS:
        return None
    n, b = tax.num_nodes, batch.node.shape[0]
    step = max(256, _BLOCK_FLOATS // n)  # wide enough that each strided read of the input is a long run
    out = np.empty(b, dtype=np.int64)
    depth = tax.depth
    tol = _TIE_TOL * max(1.0, float(tax.height))
    every = bool(mask.all())
    cand = np.flatnonzero(mask)
    ids = np.arange(n, dtype=np.int16 if n < 2**15 else np.int32)[:, None]
    for s in range(0, b, step):
        cols = slice(s, min(b, s + step))
        if kind == "shortest_path" and every:
            _, big = _labels_and_subtree_t(batch, cols, keep_labels=False)
            above = big > 0.5 * big[:1] + tol  # the root's P~ is the row's mass
            # {P~ > mass / 2} is a chain from the root and ids are pre-order, so its deepest node has the largest
            # id (a max down axis 0 is a vectorised row reduction; an argmax there is not).
            out[cols] = np.where(above, ids, 0).max(0)
            continue
        pt, big = _labels_and_subtree_t(batch, cols)
        mass = big[0].copy()  # P~(root): the label mass of each sample
        big[0] = 0.0  # the root is the LCA of every pair: it adds the same to every E(n)
        path = _ancestor_rows(tax, cand) @ big  # the path sums at the candidates only
        if kind == "shortest_path":
            sc = 2.0 * path - depth[cand][:, None] * mass[None, :]  # -(E(n) - const)
        else:
            sc = path + pt[cand] * (float(tax.height) - depth[cand])[:, None]
        # Costs that differ by round-off only are ties, which the smallest id wins (the first within tol of the best).
        out[cols] = cand[first_true_t(sc >= sc.max(0) - tol)]
    return out


def _fast_tree_rows(probs: Any, taxonomy: Taxonomy, kind: str, mask: np.ndarray, leaf_probs: bool) -> Any:
    """:func:`_fast_tree_ids` by the compiled kernel on row-major input, or ``None`` (see ``hiercls.decode._rows``)."""
    rows = kernel_rows(probs, taxonomy, leaf_probs=leaf_probs)
    if rows is None:
        return None
    tol = _TIE_TOL * max(1.0, float(taxonomy.height))
    return rows.ids(
        "bayes_tree_rows",
        bottom_up_order(taxonomy),
        *sorted_children(taxonomy),
        taxonomy.depth,
        np.flatnonzero(mask),
        kind == "lca_height",
        bool(mask.all()),
        float(taxonomy.height),
        PROBABILITY_ATOL,
        tol,
    )


def _level_tables_torch(taxonomy: Taxonomy, device: Any) -> list[tuple[Any, Any, Any, int]]:
    """:func:`_subtree_levels` as device tensors: per depth, deepest first, (kids sorted by parent, each kid's
    parent as a row of the level's parents, those parents, their number)."""
    cache = taxonomy.namespace_cache(__name__)
    key = ("levels_torch", str(device))
    if key not in cache:
        import torch

        par = taxonomy.parent
        out = []
        for lvl in reversed(taxonomy.levels[1:]):
            kids = lvl[np.argsort(par[lvl], kind="stable")]
            parents, row = np.unique(par[kids], return_inverse=True)
            tensors = (torch.as_tensor(a, dtype=torch.int64, device=device) for a in (kids, row, parents))
            out.append((*tensors, len(parents)))
        cache[key] = out
    return cache[key]


def _path_sum_torch(x: Any, taxonomy: Taxonomy) -> Any:
    """:func:`_path_sum_t` on a sample-major tensor ``[B, N]``, in place: each level adds its parents' sums."""
    dev, par = x.device, taxonomy.parent
    for lvl in taxonomy.levels[1:]:
        li = index_tensor(taxonomy, ("level", len(lvl), int(lvl[0])), lvl, dev)
        pi = index_tensor(taxonomy, ("level_parent", len(lvl), int(lvl[0])), par[lvl], dev)
        x[:, li] += x[:, pi]
    return x


def _fast_tree_ids_torch(probs: Any, taxonomy: Taxonomy, kind: str, mask: np.ndarray, leaf_probs: bool) -> Any:
    """:func:`_fast_tree_ids` on the tensor's device, sample-major ``[B, N]``; the same sums in the same order
    (``index_add_`` adds in index order, as the sparse products do), hence the same answers on the CPU."""
    import torch

    x = prepare_torch(probs, taxonomy, leaf_probs=leaf_probs)
    dev, tax = x.device, taxonomy
    b, n = x.shape
    if not b:
        return torch.zeros(0, dtype=torch.int64, device=dev)
    pt = label_distribution_torch(x, tax, leaf=leaf_rows_torch(probs) if leaf_probs else None)
    big = pt.clone()
    for kids, row, parents, count in _level_tables_torch(tax, dev):
        big[:, parents] += torch.zeros(b, count, dtype=big.dtype, device=dev).index_add_(1, row, big[:, kids])
    tol = _TIE_TOL * max(1.0, float(tax.height))
    if kind == "shortest_path" and bool(mask.all()):
        above = big > 0.5 * big[:, :1] + tol  # the root's P~ is the row's mass
        ids = torch.arange(n, device=dev)
        return torch.where(above, ids, 0).amax(1)
    mass = big[:, :1].clone()  # P~(root): the row's label mass, summed as on the NumPy path
    big[:, 0] = 0.0  # the root is the LCA of every pair: it adds the same to every E(n)
    path = _path_sum_torch(big, tax)
    cand_np = np.flatnonzero(mask)
    cand = index_tensor(tax, ("cand", cand_np.tobytes()), cand_np, dev)
    depth = index_tensor(tax, "depth64", tax.depth.astype(np.float64), dev)[cand]
    if kind == "shortest_path":
        sc = 2.0 * path[:, cand] - depth[None, :] * mass
    else:
        sc = path[:, cand] + pt[:, cand] * (float(tax.height) - depth)[None, :]
    first = (sc >= sc.amax(1, keepdim=True) - tol).to(torch.uint8).argmax(1)  # the first within tol of the best
    return cand[first]


def _structured_cost(batch: Batch, kind: str) -> np.ndarray:
    """``E[cost(n, y)]`` ``[B, N]`` on a tree without any node-to-label matrix (node-major internally)."""
    tax = batch.taxonomy
    n = tax.num_nodes
    pt = label_distribution_t(batch.node, tax, leaf=batch.leaf)  # [N, B]
    mass = pt.sum(0)[None, :]
    cs = np.zeros((n + 1, pt.shape[1]))
    np.cumsum(pt, axis=0, out=cs[1:])
    ids = np.arange(n)
    big_p = cs[ids + tax.subtree_size] - cs[ids]  # P(n in Y), re-summed from the label distribution
    del cs
    depth = tax.depth.astype(np.float64)
    not_root = (ids > 0).astype(np.float64)[:, None]
    if kind in ("shortest_path", "ic_distance", "jiang_conrath"):
        f = depth if kind == "shortest_path" else tax.information_content.astype(np.float64)
        delta = f - np.where(tax.parent >= 0, f[np.maximum(tax.parent, 0)], 0.0)
        e_lca = _path_sum_t(big_p * delta[:, None], tax)
        out = f[:, None] * mass + (f @ pt)[None, :] - 2.0 * e_lca
    elif kind == "lca_height":
        h = float(tax.height)
        # distance(n, n) is 0, not H - depth(n): take the label-equals-prediction term back out.
        out = h * mass - _path_sum_t(big_p * not_root, tax) - pt * (h - depth)[:, None]
    elif kind in ("wu_palmer", "wu_palmer_root1"):
        c = 1.0 if kind == "wu_palmer_root1" else 0.0  # the depth of the root
        tab = tree_tables(tax)
        cs = np.zeros((n + 1, pt.shape[1]))
        np.cumsum(pt[tab["order"]], axis=0, out=cs[1:])
        r = cs[tab["seg_hi"]] - cs[tab["seg_lo"]]  # [H+1, B] label mass by depth
        out = np.zeros_like(pt)
        for m in range(r.shape[0]):
            if not r[m].any():
                continue
            # Sum over labels y at depth m of p(y) (depth(lca) + c) = c r_m + the sum over the non-root
            # ancestors a of n of P(a in Y, depth(y) = m).
            q = cs[tab["hi"][:, m]] - cs[tab["lo"][:, m]]
            den = depth[:, None] + m + 2.0 * c
            out += (c * r[m][None, :] + _path_sum_t(q * not_root, tax)) / np.where(den > 0, den, 1.0)
        out = mass - 2.0 * out
        if c == 0.0:
            out[0] -= pt[0]  # distance(root, root) is 0, where the formula reads 1 - 0/0
    else:
        raise ValueError(f"no structured form for cost {kind!r}")
    return np.ascontiguousarray(out.T)


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
    if torch_kernels(probs):
        return _expected_cost_torch(probs, taxonomy, cost, leaf_probs).to(value_dtype_torch(probs))
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs)
    return restore_values(_expected_cost(batch, cost), batch)


def _expected_cost(batch: Batch, cost: Any) -> np.ndarray:
    tax = batch.taxonomy
    p = batch.label
    if isinstance(cost, str):
        if cost not in COST_KINDS:
            raise ValueError(f"cost must be one of {', '.join(COST_KINDS)} or a cost matrix; got {cost!r}")
        if tax.is_tree and tax.num_nodes > 1 and cost in _STRUCTURED:
            return _structured_cost(batch, cost)
        targets = np.flatnonzero(p.any(0)) if p.shape[0] else np.zeros(0, dtype=np.int64)
        _check_distance_size(tax, cost, len(targets))
        full = _distance_matrix(tax, cost)
        if full is not None:
            return p[:, targets] @ full[:, targets].T
        out = np.zeros((p.shape[0], tax.num_nodes))
        for cols, block in _distance_blocks(tax, cost, targets):
            out += p[:, cols] @ block.T
        return out
    mat = np.asarray(cost.detach().cpu().numpy() if hasattr(cost, "detach") else cost, dtype=np.float64)
    _check_cost_matrix(tax, tuple(mat.shape), bool(np.isfinite(mat).all()))
    if mat.shape[1] == tax.num_leaves and tax.num_nodes > 1:
        _check_leaf_labels(tax, p.sum(1) - p[:, tax.leaves].sum(1))
        return p[:, tax.leaves] @ mat.T
    return p @ mat.T


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


def _check_cost_matrix(tax: Taxonomy, shape: tuple[int, ...], finite: bool) -> None:
    n, nl = tax.num_nodes, tax.num_leaves
    if len(shape) != 2 or shape[0] != n or shape[1] not in (nl, n):
        raise ValueError(
            f"cost matrix must be [N, L] = [{n}, {nl}] (node to leaf) or [N, N] = [{n}, {n}] "
            f"(node to label); got shape {list(shape)}"
        )
    if not finite:
        raise ValueError("cost matrix contains NaN or infinite values")


def _check_leaf_labels(tax: Taxonomy, internal: Any) -> None:
    """Refuse a node-to-leaf cost when labels carry mass at internal nodes (``internal``: that mass per row)."""
    worst = float(internal.max()) if internal.shape[0] else 0.0
    if worst > 1e-6:
        raise ValueError(
            f"a node-to-leaf cost [N, L] cannot score labels at internal nodes (up to "
            f"{worst:.3g} of the mass is there); pass an [N, N] node-to-label cost"
        )


def _expected_cost_torch(probs: Any, taxonomy: Taxonomy, cost: Any, leaf_probs: bool) -> Any:
    """:func:`_expected_cost` on the tensor's device: float64 ``[B, N]`` (the same formulas, sample-major).

    Only verdicts leave the device (the checks' booleans); a distance kind without a cached matrix (a DAG or
    ``zhao`` past ``_CACHE_LIMIT``) also reads back which labels carry mass, to build just those columns.
    """
    import torch

    tax = taxonomy
    x = prepare_torch(probs, tax, leaf_probs=leaf_probs)
    dev = x.device
    p = label_distribution_torch(x, tax, leaf=leaf_rows_torch(probs) if leaf_probs else None)
    if isinstance(cost, str):
        if cost not in COST_KINDS:
            raise ValueError(f"cost must be one of {', '.join(COST_KINDS)} or a cost matrix; got {cost!r}")
        if tax.is_tree and tax.num_nodes > 1 and cost in _STRUCTURED:
            return _structured_cost_torch(p, tax, cost)
        full = _distance_matrix(tax, cost)
        if full is not None:
            return p @ index_tensor(tax, ("cost", cost), full, dev).T
        targets = np.asarray(torch.nonzero(p.any(0)).flatten().tolist(), dtype=np.int64)
        _check_distance_size(tax, cost, len(targets))
        out = torch.zeros_like(p)
        for cols, block in _distance_blocks(tax, cost, targets):
            out += p[:, torch.as_tensor(cols, device=dev)] @ torch.as_tensor(block, device=dev).T
        return out
    mat = torch.as_tensor(cost, device=dev).to(torch.float64)
    _check_cost_matrix(tax, tuple(mat.shape), bool(torch.isfinite(mat).all()))
    if mat.shape[1] == tax.num_leaves and tax.num_nodes > 1:
        leaves = index_tensor(tax, "leaves", tax.leaves, dev)
        if not leaf_probs:  # leaf probabilities put no mass on internal nodes
            _check_leaf_labels(tax, p.sum(1) - p[:, leaves].sum(1))
        return p[:, leaves] @ mat.T
    return p @ mat.T


def _structured_cost_torch(pt: Any, tax: Taxonomy, kind: str) -> Any:
    """:func:`_structured_cost` on the tensor's device, sample-major ``[B, N]`` label distribution in and out."""
    import torch

    b, n = pt.shape
    dev = pt.device
    mass = pt.sum(1, keepdim=True)
    cs = torch.zeros(b, n + 1, dtype=pt.dtype, device=dev)
    cs[:, 1:] = torch.cumsum(pt, 1)
    big_p = cs[:, subtree_ends_tensor(tax, dev)] - cs[:, :n]  # P(n in Y), re-summed from the label distribution
    depth = index_tensor(tax, "depth64", tax.depth.astype(np.float64), dev)
    not_root = torch.ones(n, dtype=pt.dtype, device=dev)
    not_root[0] = 0.0
    if kind in ("shortest_path", "ic_distance", "jiang_conrath"):
        f = depth if kind == "shortest_path" else index_tensor(tax, "ic64", tax.information_content, dev).double()
        parent = index_tensor(tax, "parent_or_root", np.maximum(tax.parent, 0), dev)
        delta = f - torch.where(index_tensor(tax, "has_parent", tax.parent >= 0, dev), f[parent], 0.0)
        e_lca = _path_sum_torch(big_p * delta, tax)
        return f * mass + (pt @ f)[:, None] - 2.0 * e_lca
    if kind == "lca_height":
        h = float(tax.height)
        # distance(n, n) is 0, not H - depth(n): take the label-equals-prediction term back out.
        return h * mass - _path_sum_torch(big_p * not_root, tax) - pt * (h - depth)
    c = 1.0 if kind == "wu_palmer_root1" else 0.0  # the depth of the root
    tab = tree_tables(tax)
    cs = torch.zeros(b, n + 1, dtype=pt.dtype, device=dev)
    cs[:, 1:] = torch.cumsum(pt[:, index_tensor(tax, "depth_major_order", tab["order"], dev)], 1)
    seg_lo, seg_hi = (index_tensor(tax, k, tab[k], dev) for k in ("seg_lo", "seg_hi"))
    lo, hi = (index_tensor(tax, ("depth_ranges", k), tab[k], dev) for k in ("lo", "hi"))
    r = cs[:, seg_hi] - cs[:, seg_lo]  # [B, H+1] label mass by depth
    out = torch.zeros_like(pt)
    for m in range(r.shape[1]):  # a depth with no label mass adds exactly 0 (no data-dependent skip: no sync)
        q = cs[:, hi[:, m]] - cs[:, lo[:, m]]
        den = depth + (m + 2.0 * c)
        out += (c * r[:, m : m + 1] + _path_sum_torch(q * not_root, tax)) / torch.where(den > 0, den, 1.0)
    out = mass - 2.0 * out
    if c == 0.0:
        out[:, 0] -= pt[:, 0]  # distance(root, root) is 0, where the formula reads 1 - 0/0
    return out


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
    fast = not return_cost and isinstance(cost, str) and cost in _CLOSED_FORMS and taxonomy.is_tree
    if fast and not torch_kernels(probs):
        # Row-major trees: the compiled kernel on every row at once (its work memory is per row; the row blocks of
        # @chunked would only repeat its set-up). Any other input, or a row it refuses: the blocks below.
        ids = _fast_tree_rows(probs, taxonomy, cost, _candidate_mask(taxonomy, candidates), leaf_probs)
        if ids is not None:
            return ids
    return _bayes_node_blocks(
        probs, taxonomy, cost, candidates=candidates, leaf_probs=leaf_probs, return_cost=return_cost, fast=fast
    )


@chunked
def _bayes_node_blocks(
    probs: Any, taxonomy: Taxonomy, cost: Any, *, candidates: Any, leaf_probs: bool, return_cost: bool, fast: bool
) -> Any:
    """:func:`bayes_node` on the tensor's device or, on the CPU, by the NumPy formulation, in blocks of rows."""
    if torch_kernels(probs):  # on the tensor's device
        mask = _candidate_mask(taxonomy, candidates)
        if fast:
            return _fast_tree_ids_torch(probs, taxonomy, cost, mask, leaf_probs)
        exp = _expected_cost_torch(probs, taxonomy, cost, leaf_probs)
        allowed = index_tensor(taxonomy, ("candidates", mask.tobytes()), mask, exp.device)
        exp = exp.masked_fill(~allowed, float("inf"))
        ids = exp.argmin(1)  # the first minimum: ties go to the smaller id, as np.argmin
        if return_cost:
            return ids, exp.gather(1, ids[:, None])[:, 0].to(value_dtype_torch(probs))
        return ids
    mask = _candidate_mask(taxonomy, candidates)
    # The closed forms convert to float64 while transposing; the general path needs float64 up front.
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=not fast)
    if fast and batch.node.shape[0]:
        ids = _fast_tree_ids(batch, cost, mask)
        if ids is not None:
            return restore_ids(ids, batch)
    exp = _expected_cost(batch, cost)
    exp = np.where(mask[None, :], exp, np.inf)
    ids = np.argmin(exp, axis=1) if exp.shape[0] else np.zeros(0, dtype=np.int64)
    out = restore_ids(ids, batch)
    if return_cost:
        return out, restore_values(exp[np.arange(len(ids)), ids], batch)
    return out


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
    if torch_kernels(probs):
        import torch

        exp = _expected_cost_torch(probs, taxonomy, cost, leaf_probs)
        if isinstance(predictions, torch.Tensor):  # truncated to integers, as int() does on the host path
            ids = predictions.detach().to(exp.device, torch.int64).reshape(-1)
        else:  # names or host ids: converted once, then moved
            ids = torch.as_tensor(_prediction_ids(predictions, taxonomy), device=exp.device)
        extremes = torch.stack([ids.min(), ids.max()]).tolist() if ids.numel() else ()
        _check_prediction_ids(taxonomy, ids.shape[0], exp.shape[0], *extremes)
        return exp.gather(1, ids[:, None])[:, 0].to(value_dtype_torch(probs))
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs)
    pred = predictions.detach().cpu().numpy() if hasattr(predictions, "detach") else predictions
    ids = _prediction_ids(pred, taxonomy)
    _check_prediction_ids(taxonomy, ids.shape[0], batch.node.shape[0], *((ids.min(), ids.max()) if ids.size else ()))
    exp = _expected_cost(batch, cost)
    return restore_values(exp[np.arange(len(ids)), ids], batch)


def _prediction_ids(predictions: Any, taxonomy: Taxonomy) -> np.ndarray:
    return np.array(
        [taxonomy.index(x) if isinstance(x, str) else int(x) for x in np.asarray(predictions).ravel()], dtype=np.int64
    )


def _check_prediction_ids(taxonomy: Taxonomy, count: int, rows: int, low: int = 0, high: int = 0) -> None:
    """Refuse predictions that are not one node id per row (``low``/``high``: their extremes, when any)."""
    if count != rows:
        raise ValueError(f"predictions has {count} entries but probs has {rows} rows")
    if count and (low < 0 or high >= taxonomy.num_nodes):
        raise TaxonomyError(f"predictions must be node ids in [0, {taxonomy.num_nodes}); got {low}..{high}")


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

"""Single-node decision rules: argmax leaf, top-down, threshold/majority, plurality, information-based, HiE.

Every rule takes node probabilities ``P [B, N]`` (``P[b, n]`` = probability that ``n`` is on the label's path)
or leaf probabilities with ``leaf_probs=True``, and returns one node id per sample ``[B]`` (int64; NumPy in,
NumPy out; a tensor in, a tensor out on its device: the batch is decoded on the host and the ids moved back).

Each rule is one compiled kernel (numba) that checks each row (:func:`hiercls.decode.checks.check_row`) and
applies the rule to it in float64, on trees and DAGs alike. Ties follow :data:`hiercls.decode.inputs.TIE_RTOL`:
values within it of the best are tied and the smallest node id among them wins (ids are topological, so an
ancestor beats its descendants and, on a tree, the earlier sibling in taxonomy order wins).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hiercls._checks import to_numpy
from hiercls.decode.checks import check_row, jit
from hiercls.decode.inputs import (
    LOWEST_KEY,
    TIE_RTOL,
    Batch,
    key_value,
    order_key,
    prepare,
    restore_ids,
)
from hiercls.decode.registry import register_decoder
from hiercls.taxonomy import Taxonomy, TaxonomyError, check_taxonomy, node_id_array

__all__ = [
    "argmax_leaf",
    "calibrate_info_gain",
    "hie",
    "info_gain",
    "majority",
    "max_info",
    "plurality",
    "threshold",
    "top_down",
]


@jit
def _score(row: Any, j: int, weight: Any, skip: Any, coarse: Any, above: Any) -> float:
    """``weight[j] * P(j)`` (``weight`` ``None``: 1), times ``above[j] = P(coarse[j])`` unless ``coarse`` is
    ``None``, plus ``skip[j]``; ``None`` factors are left out when the kernel is compiled."""
    s = np.float64(row[j])
    if weight is not None:
        s *= weight[j]
    if coarse is not None:
        s *= above[j]
    return s + skip[j]


@jit
def scored_pick_rows(x: Any, mode: int, child: Any, parent: Any, tol: Any, weight: Any, skip: Any, coarse: Any,
                     out: Any, err: Any) -> None:  # fmt: skip
    """Per row: the first node ``j`` tied with the best :func:`_score`; ``skip`` is ``-inf`` at the nodes that are
    no candidates (0 at the others). Two dense passes over the nodes in id order, without branches (the compiler
    vectorises them): the best score (an integer maximum of :func:`order_key` s), then the first node tied with it
    (an integer minimum); ``coarse``'s probabilities are gathered once per row before them."""
    n = x.shape[1]
    above = np.empty(n if coarse is not None else 0)
    for b in range(x.shape[0]):
        row = x[b]
        code, pos = check_row(row, mode, child, parent, tol)
        if code:
            err[0], err[1], err[2] = b, code, pos
            return
        if coarse is not None:
            for j in range(n):
                above[j] = np.float64(row[coarse[j]])
        top = LOWEST_KEY
        for j in range(n):
            top = max(top, order_key(_score(row, j, weight, skip, coarse, above)))
        best = key_value(top)
        floor = best - TIE_RTOL * max(1.0, abs(best))
        first = n
        for j in range(n):
            first = min(first, j if _score(row, j, weight, skip, coarse, above) >= floor else n)
        out[b] = first


@jit
def deepest_above_rows(x: Any, mode: int, child: Any, parent: Any, tol: Any, t: Any, key: Any, out: Any,
                       err: Any) -> None:  # fmt: skip
    """Per row, among the nodes with ``P > t[0]``: the largest ``key`` (given as :func:`order_key` s), then the
    largest ``P`` (tie rule), then the smallest id; the root when no node qualifies. ``t`` has the rows' dtype (the
    largest value of it not above the threshold: the same ``P > t``, without converting each value). Three dense
    integer reductions, as in :func:`scored_pick_rows`."""
    n, above = x.shape[1], t[0]
    for b in range(x.shape[0]):
        row = x[b]
        code, pos = check_row(row, mode, child, parent, tol)
        if code:
            err[0], err[1], err[2] = b, code, pos
            return
        top = LOWEST_KEY
        for j in range(n):
            k = key[j] if row[j] > above else LOWEST_KEY
            top = max(top, k)
        best = LOWEST_KEY
        for j in range(n):
            k = order_key(np.float64(row[j]))
            best = max(best, k if (row[j] > above) & (key[j] == top) else LOWEST_KEY)
        p = key_value(best)
        floor = p - TIE_RTOL * max(1.0, abs(p))
        first = n
        for j in range(n):
            i = j if (row[j] > above) & (key[j] == top) & (np.float64(row[j]) >= floor) else n
            first = min(first, i)
        out[b] = first if first < n else 0


@jit
def descend_rows(x: Any, mode: int, child: Any, parent: Any, tol: Any, ptr: Any, kids: Any, t: float,
                 plurality: bool, out: Any, err: Any) -> None:  # fmt: skip
    """Per row, walk down from the root to the best child (tie rule: the smallest id among the tied), while the
    rule allows: ``top_down`` while ``P(child) / P(node) >= t``; ``plurality`` while ``P(child)`` ties with or
    beats ``m``, the largest runner-up probability seen so far (a single child always). Never into ``P = 0``."""
    for b in range(x.shape[0]):
        row = x[b]
        code, pos = check_row(row, mode, child, parent, tol)
        if code:
            err[0], err[1], err[2] = b, code, pos
            return
        cur, m = 0, 0.0
        while ptr[cur + 1] > ptr[cur]:
            lo, hi = ptr[cur], ptr[cur + 1]
            best = -np.inf
            for k in range(lo, hi):
                best = max(best, np.float64(row[kids[k]]))
            floor = best - TIE_RTOL * max(1.0, abs(best))
            at = lo
            while np.float64(row[kids[at]]) < floor:
                at += 1
            top = np.float64(row[kids[at]])
            if plurality:
                if hi - lo > 1:
                    runner = -np.inf
                    for k in range(lo, hi):
                        if k != at:
                            runner = max(runner, np.float64(row[kids[k]]))
                    m = max(m, runner)
                move = hi - lo == 1 or top >= m - TIE_RTOL * max(1.0, abs(m))
            else:
                pu = np.float64(row[cur])
                move = (top / pu if pu > 0 else 0.0) >= t
            if not (move and top > 0):
                break
            cur = kids[at]
        out[b] = cur


def _run(kernel: Any, batch: Batch, *tables: Any) -> Any:
    """Node ids ``[B]`` from ``kernel(x, *check, *tables, out, err)`` in the input's framework."""
    out = np.zeros(batch.x.shape[0], dtype=np.int64)
    err = np.zeros(3, dtype=np.int64)
    if out.size:
        kernel(batch.x, *batch.check_args(), *tables, out, err)
    batch.raise_if(err)
    return restore_ids(out, batch)


def _table(taxonomy: Taxonomy, key: Any, make: Any) -> Any:
    """A per-taxonomy kernel table, built once by ``make()``."""
    cache = taxonomy.namespace_cache(__name__)
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _skip_internal(taxonomy: Taxonomy) -> np.ndarray:
    """``-inf`` at the internal nodes, 0 at the leaves: the leaves are the candidates."""
    return _table(taxonomy, "leaf_skip", lambda: np.where(taxonomy.is_leaf, 0.0, -np.inf))


def _sorted_children(taxonomy: Taxonomy) -> tuple[np.ndarray, np.ndarray]:
    """CSR children ``(ptr, idx)`` with each node's children sorted by id."""

    def make() -> tuple[np.ndarray, np.ndarray]:
        ptr = np.asarray(taxonomy.child_ptr, dtype=np.int64)
        idx = np.asarray(taxonomy.child_idx, dtype=np.int64)
        owner = np.repeat(np.arange(taxonomy.num_nodes), np.diff(ptr))
        return ptr, idx[np.lexsort((idx, owner))].astype(np.uint32)  # unsigned: no wrap-around in the kernel

    return _table(taxonomy, "sorted_children", make)


@register_decoder("argmax_leaf", optimal_for="leaf accuracy (the flat classifier's prediction)")
def argmax_leaf(probs: Any, taxonomy: Taxonomy, *, leaf_probs: bool = False) -> Any:
    """The most probable leaf (the flat-classifier prediction).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> argmax_leaf(np.array([[1.0, 0.7, 0.35, 0.35, 0.3]]), tax).tolist()  # tie x/y: smaller id
        [2]
    """
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    return _run(scored_pick_rows, batch, None, _skip_internal(batch.taxonomy), None)


@register_decoder("top_down", optimal_for="the greedy chain of per-node decisions of top-down classifiers")
def top_down(probs: Any, taxonomy: Taxonomy, *, threshold: float = 0.0, leaf_probs: bool = False) -> Any:
    """Greedy top-down descent: from the root, move to the most probable child (ties: smaller id).

    This is the inference of top-down / conditional classifiers (a chain of per-node decisions), as compared
    by Valmadre, "Hierarchical classification at multiple operating points" (NeurIPS 2022).

    Args:
        threshold: stop at the current node ``u`` when the best child's conditional probability
            ``P(c) / P(u)`` is below it. With the default ``0`` the descent stops only at a leaf or where every
            child has probability 0 (a label known to stop at ``u``).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.6, 0.35, 0.25, 0.4]])
        >>> top_down(p, tax).tolist(), argmax_leaf(p, tax).tolist()  # greedy goes to a, then x
        ([2], [4])
        >>> top_down(p, tax, threshold=0.6).tolist()  # P(x | a) = 0.58 < 0.6: stop at a
        [1]
    """
    t = _check_unit(threshold, "threshold")
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    return _run(descend_rows, batch, *_sorted_children(batch.taxonomy), t, False)


@register_decoder("plurality", optimal_for="the deepest node more probable than every node off its path")
def plurality(probs: Any, taxonomy: Taxonomy, *, leaf_probs: bool = False) -> Any:
    """Plurality inference: the deepest node more probable than every node off its path.

    Valmadre, "Hierarchical classification at multiple operating points" (NeurIPS 2022), as implemented by
    Plaud et al., "To Each Metric Its Decoding" (ICML 2025): descend greedily from the root to the most
    probable child, keeping the running threshold ``m`` = the largest *second-best* child probability over
    the families visited so far; move to the best child ``c`` while ``P(c) >= m`` (a single child is always
    entered, as in the authors' code). On a tree with labels at leaves, ``m`` is the largest probability of
    any node that is neither an ancestor nor a descendant of the current one, so the answer is the deepest
    node whose probability is at least that of every incomparable node.

    Ties: ``P(c) = m`` moves (the reference's ``>=``, with the tie margin of
    :data:`~hiercls.decode.inputs.TIE_RTOL`); among equally probable children the smallest id is taken. A child of
    probability 0 is never entered (it cannot happen on the path with leaf labels; with a label known to stop
    at an internal node it keeps the rule there, as :func:`top_down` does).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("R", "X"), ("X", "Y"), ("Y", "a1"), ("Y", "a2"), ("X", "b"), ("R", "c"),
        ...                 ("R", "d")])
        >>> leaf = np.array([[0.23, 0.29, 0.15, 0.31, 0.02]])  # a1, a2, b, c, d
        >>> tax.name_of(int(plurality(leaf, tax, leaf_probs=True)[0]))  # a2 (.29) < c (.31): stop at Y
        'Y'
    """
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    return _run(descend_rows, batch, *_sorted_children(batch.taxonomy), 0.0, True)


def _check_unit(value: float, name: str) -> float:
    v = float(value)
    if not np.isfinite(v) or v < 0 or v > 1:
        raise ValueError(f"{name} must be a probability in [0, 1]; got {value!r}")
    return v


def _deepest_above(probs: Any, taxonomy: Taxonomy, t: float, key: str, leaf_probs: bool) -> Any:
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    tax = batch.taxonomy
    values = tax.depth if key == "depth" else tax.information_content
    keys = _table(tax, key, lambda: np.array([order_key(v) for v in np.asarray(values, dtype=np.float64)]))
    above = np.array([t], dtype=batch.x.dtype)
    if float(above[0]) > t:  # rounded up: the value below it is the largest not above t
        above = np.nextafter(above, above.dtype.type(-np.inf))
    return _run(deepest_above_rows, batch, above, keys)


@register_decoder("threshold", optimal_for="the deepest node above a probability threshold")
def threshold(probs: Any, taxonomy: Taxonomy, *, threshold: float = 0.5, leaf_probs: bool = False) -> Any:
    """The deepest node whose probability exceeds ``threshold`` (ties: more probable, then smaller id).

    For ``threshold >= 0.5`` on a tree the nodes above it form a single chain, so the answer is its end
    (``0.5`` is the "majority" rule). When no node exceeds the threshold (e.g. ``threshold=1``) the root is
    returned. Depth is :attr:`Taxonomy.depth` (shortest root path on a DAG).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.8, 0.55, 0.25, 0.2]])
        >>> threshold(p, tax, threshold=0.6).tolist(), threshold(p, tax, threshold=0.5).tolist()
        ([1], [2])
        >>> threshold(p, tax, threshold=1.0).tolist()  # nothing above 1: the root
        [0]
    """
    return _deepest_above(probs, taxonomy, _check_unit(threshold, "threshold"), "depth", leaf_probs)


@register_decoder("majority", optimal_for="the deepest node with probability above 1/2")
def majority(probs: Any, taxonomy: Taxonomy, *, leaf_probs: bool = False) -> Any:
    """The deepest node with probability above 1/2 (:func:`threshold` at 0.5)."""
    return threshold(probs, taxonomy, threshold=0.5, leaf_probs=leaf_probs)


@register_decoder("max_info", optimal_for="the most informative node above a probability threshold")
def max_info(probs: Any, taxonomy: Taxonomy, *, threshold: float = 0.5, leaf_probs: bool = False) -> Any:
    """The most informative node (fewest leaves below, i.e. largest information content) with ``P > threshold``.

    Valmadre (NeurIPS 2022) calls the ``threshold=0.5`` case "max-info majority" inference; sweeping the
    threshold traces the operating curve. Ties: more probable, then smaller id; the root when no node qualifies.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> max_info(np.array([[1.0, 0.8, 0.55, 0.25, 0.2]]), tax).tolist()
        [2]
    """
    return _deepest_above(probs, taxonomy, _check_unit(threshold, "threshold"), "ic", leaf_probs)


@register_decoder("info_gain", optimal_for="expected information gain (Deng et al., CVPR 2012)")
def info_gain(probs: Any, taxonomy: Taxonomy, *, lam: float = 0.0, leaf_probs: bool = False) -> Any:
    """Maximum expected reward with information-gain rewards: ``argmax_n (IC(n) + lam) * P(n)``.

    Deng, Krause, Berg, Fei-Fei, "Hedging your bets: optimizing accuracy-specificity trade-offs in large scale
    visual recognition" (CVPR 2012, DARTS): a prediction ``n`` is correct when the label is below it and then
    earns the information gain ``log(num_leaves) - log(leaves under n)`` (:attr:`Taxonomy.information_content`,
    in nats). ``lam`` is the Lagrange multiplier of the accuracy guarantee: ``lam = 0`` maximises the expected
    gain, larger values trade specificity for accuracy (at ``lam -> inf`` the rule returns the most probable
    node, the root). Use :func:`calibrate_info_gain` to pick ``lam`` for a target accuracy.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "u"), ("b", "v")])
        >>> p = np.array([[1.0, 0.9, 0.5, 0.4, 0.1, 0.05, 0.05]])
        >>> info_gain(p, tax).tolist(), info_gain(p, tax, lam=5.0).tolist()
        ([2], [1])
    """
    lam = float(lam)
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(f"lam must be a finite number >= 0; got {lam!r}")
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    tax = batch.taxonomy
    weight = np.asarray(tax.information_content, dtype=np.float64) + lam
    return _run(scored_pick_rows, batch, weight, _table(tax, "zeros", lambda: np.zeros(tax.num_nodes)), None)


def calibrate_info_gain(
    probs: Any,
    labels: Any,
    taxonomy: Taxonomy,
    *,
    target_accuracy: float,
    leaf_probs: bool = False,
    tol: float = 1e-4,
    max_lambda: float = 1e6,
) -> float:
    """The smallest ``lam`` for which :func:`info_gain` reaches ``target_accuracy`` on held-out data.

    Accuracy means the prediction is an ancestor-or-self of the label; Deng et al. show it does not decrease
    as ``lam`` grows, so a bisection finds the multiplier (DARTS, Algorithm 1).

    Args:
        probs: validation node (or leaf) probabilities ``[B, N]``.
        labels: validation labels as node ids ``[B]``.
        target_accuracy: the accuracy to guarantee, in ``[0, 1]``.
        tol: bisection tolerance on ``lam``.
        max_lambda: upper end of the search; when even it misses the target, it is returned.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.9, 0.6, 0.3, 0.1], [1.0, 0.9, 0.6, 0.3, 0.1]])
        >>> lam = calibrate_info_gain(p, np.array([2, 3]), tax, target_accuracy=1.0)
        >>> info_gain(p, tax, lam=lam).tolist()
        [1, 1]
    """
    target = _check_unit(target_accuracy, "target_accuracy")
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs)
    y = node_id_array(np.ravel(to_numpy(labels, name="labels")), taxonomy, name="labels", rows=batch.x.shape[0])
    anc = taxonomy.ancestors_sparse

    def accuracy(lam: float) -> float:
        pred = info_gain(batch.x, taxonomy, lam=lam)
        return float(np.asarray(anc[y, pred]).ravel().astype(bool).mean()) if y.size else 1.0

    if accuracy(0.0) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while accuracy(hi) < target and hi < max_lambda:
        lo, hi = hi, min(hi * 4.0, max_lambda)
    if accuracy(hi) < target:
        return hi
    while hi - lo > tol * max(1.0, lo):
        mid = 0.5 * (lo + hi)
        if accuracy(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def _ancestor_at_depth(taxonomy: Taxonomy, nodes: np.ndarray, level: int) -> np.ndarray:
    """Each node's ancestor at depth ``level`` (the node itself when shallower), one parent step per level: no
    ``[N, height]`` path table (a deep chain would need N * height entries)."""
    out, depth = np.array(nodes, dtype=np.int64), np.asarray(taxonomy.depth)[nodes].copy()
    parent = np.asarray(taxonomy.parent, dtype=np.int64)
    while (up := depth > level).any():
        out[up], depth[up] = parent[out[up]], depth[up] - 1
    return out


@register_decoder("hie", optimal_for="the fine posterior re-weighted by the coarse one (HiE, NeurIPS 2023)")
def hie(probs: Any, taxonomy: Taxonomy, *, level: int | None = None, leaf_probs: bool = False) -> Any:
    """HiE test-time amendment: the leaf maximising ``P(leaf) * P(coarse ancestor of the leaf)``.

    Jain, Karthik et al., "Test-time amendment with a coarse classifier for fine-grained classification"
    (NeurIPS 2023): the fine posterior is re-weighted by the coarse posterior of the leaf's ancestor, so a
    leaf in a likely coarse class wins over a slightly more likely leaf in an unlikely one. Trees only.

    Args:
        level: depth of the coarse ancestor, in ``[0, taxonomy.height]`` (``None``: each leaf's parent). Leaves
            shallower than ``level`` use themselves.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "u"), ("b", "v")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4, 0.35, 0.05]])
        >>> argmax_leaf(p, tax).tolist(), hie(p, tax).tolist()  # 0.35*0.4 < 0.3*0.6
        ([5], [2])
    """
    taxonomy = check_taxonomy(taxonomy)
    if not taxonomy.is_tree:
        raise TaxonomyError(f"hie needs a tree; taxonomy {taxonomy.name!r} is a DAG (use to_tree())")
    leaves = np.flatnonzero(taxonomy.is_leaf)
    coarse = np.zeros(taxonomy.num_nodes, dtype=np.uint32)  # the root's P (1) for the internal nodes, skipped anyway
    if level is None:
        coarse[leaves] = np.maximum(taxonomy.parent[leaves], 0)
    else:
        if isinstance(level, bool) or not isinstance(level, int | np.integer) or not 0 <= level <= taxonomy.height:
            raise ValueError(f"level must be a depth in [0, {taxonomy.height}] (the taxonomy's height); got {level!r}")
        coarse[leaves] = _ancestor_at_depth(taxonomy, leaves, int(level))
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, check=False)
    return _run(scored_pick_rows, batch, None, _skip_internal(taxonomy), coarse)

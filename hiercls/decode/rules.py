"""Single-node decision rules: argmax leaf, top-down, threshold/majority, plurality, information-based, HiE.

Every rule takes node probabilities ``P [B, N]`` (``P[b, n]`` = probability that ``n`` is on the label's path)
or leaf probabilities with ``leaf_probs=True``, and returns one node id per sample ``[B]`` (int64; NumPy in,
NumPy out; torch in, torch out on the same device).

Ties are broken deterministically and the same way everywhere: after the rule's own criteria, the node with
the smallest id wins (ids are topological, so an ancestor beats its descendants and, on a tree, the earlier
sibling in taxonomy order wins).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hiercls.decode._common import (
    Batch,
    chunked,
    first_max_t,
    first_true_t,
    index_tensor,
    prepare,
    prepare_torch,
    restore_ids,
    segment_reduce_t,
    sorted_children,
    torch_kernels,
)
from hiercls.decode._rows import indices, kernel_rows
from hiercls.taxonomy import Taxonomy, TaxonomyError

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


_TIE_TOL = 1e-9


def _first_argmax(x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=1) if x.shape[0] else np.zeros(0, dtype=np.int64)


@chunked
def argmax_leaf(probs: Any, taxonomy: Taxonomy, *, leaf_probs: bool = False) -> Any:
    """The most probable leaf (the flat-classifier prediction).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> argmax_leaf(np.array([[1.0, 0.7, 0.35, 0.35, 0.3]]), tax).tolist()  # tie x/y: smaller id
        [2]
    """
    if torch_kernels(probs):  # on the tensor's device (torch.argmax returns the first maximum, as NumPy)
        x = prepare_torch(probs, taxonomy, leaf_probs=leaf_probs)
        leaves = index_tensor(taxonomy, "leaves", taxonomy.leaves, x.device)
        return leaves[x[:, leaves].argmax(1)] if x.shape[0] else leaves[:0]
    rows = kernel_rows(probs, taxonomy, leaf_probs=leaf_probs)
    if rows and (ids := rows.ids("argmax_leaf_rows", indices(taxonomy, "leaves", taxonomy.leaves))) is not None:
        return ids
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=False)
    leaves = taxonomy.leaves
    if not batch.node.shape[0]:
        return restore_ids(leaves[:0], batch)
    if batch.row_major:  # np.argmax returns the first maximum, as first_max_t
        return restore_ids(leaves[np.take(batch.node, leaves, axis=1).argmax(1)], batch)
    return restore_ids(leaves[first_max_t(batch.node_t[leaves])], batch)


# Children gathered per descent step and block of rows: bounds the flat work arrays (a 100k-wide node is
# ~40 rows a block) so the memory stays O(rows + nodes), never [rows, widest family].
_STEP_ELEMENTS = 1 << 20


def _descend(batch: Batch, decide: Any, second: bool = False) -> np.ndarray:
    """Walk down from the root, one family per row and step, on CSR children (O(children visited)).

    ``decide(rows, cur, kid, top, runner)`` says which rows move from ``cur`` to their best child ``kid`` (largest
    probability ``top``, ties: smaller id); ``runner`` is the second-largest child probability (``-inf`` for a
    single child), computed when ``second`` is set. A row that does not move stops for good (the rules only
    tighten), and so does a row at a leaf.
    """
    tax = batch.taxonomy
    ptr, idx = sorted_children(tax)
    nc = np.diff(ptr)
    node = batch.node
    cur = np.zeros(node.shape[0], dtype=np.int64)
    active = np.arange(node.shape[0])
    while active.size:
        c = cur[active]
        cnt_all = nc[c]
        if (cnt_all == 1).all():  # only single-child families (a chain): no segments, one gather
            kid = idx[ptr[c]]
            move = decide(active, c, kid, node[active, kid], np.full(active.size, -np.inf) if second else None)
            cur[active[move]] = kid[move]
            active = active[move]
            continue
        active = active[cnt_all > 0]
        moved = []
        cnt_all = cnt_all[cnt_all > 0]
        # Blocks of rows with at most _STEP_ELEMENTS children in all (a row alone when its family is wider).
        bounds = np.searchsorted(
            np.cumsum(cnt_all), np.arange(1, 1 + (cnt_all.sum() // _STEP_ELEMENTS)) * _STEP_ELEMENTS
        )
        for rows, cnt in zip(np.split(active, bounds), np.split(cnt_all, bounds), strict=True):
            if not rows.size:
                continue
            c = cur[rows]
            seg = np.cumsum(cnt) - cnt
            total = int(cnt.sum())
            flat = np.arange(total) + np.repeat(ptr[c] - seg, cnt)
            kids = idx[flat]
            vals = node[np.repeat(rows, cnt), kids]
            top = np.maximum.reduceat(vals, seg)
            pos = np.minimum.reduceat(np.where(vals == np.repeat(top, cnt), np.arange(total), total), seg)
            runner = None
            if second:
                vals[pos] = -np.inf
                runner = np.maximum.reduceat(vals, seg)
                runner[cnt == 1] = -np.inf
            kid = kids[pos]
            move = decide(rows, c, kid, top, runner)
            cur[rows[move]] = kid[move]
            moved.append(rows[move])
        active = np.concatenate(moved) if moved else active[:0]
    return cur


def _families_torch(x: Any, taxonomy: Taxonomy, second: bool) -> tuple[Any, Any, Any]:
    """Per node and sample: the best child (largest ``P``, ties: smaller id; ``-1`` at a leaf), its ``P`` and, with
    ``second``, the runner-up's ``P`` (``-inf`` for a single child), for every family at once on the device."""
    import torch

    tax = taxonomy
    ptr, idx = sorted_children(tax)
    owner = np.repeat(np.arange(tax.num_nodes), np.diff(ptr))
    dev, (b, n) = x.device, x.shape
    kids = index_tensor(tax, "csr_kids", idx, dev)
    own = index_tensor(tax, "csr_owner", owner, dev)[None, :].expand(b, -1)
    vals = x[:, kids]  # [B, E]
    ninf = float("-inf")
    top = torch.full((b, n), ninf, dtype=x.dtype, device=dev).scatter_reduce(1, own, vals, "amax")
    slot = torch.arange(len(idx), device=dev)[None, :].expand(b, -1)
    first = torch.full((b, n), len(idx), dtype=torch.int64, device=dev)
    first = first.scatter_reduce(1, own, torch.where(vals == top.gather(1, own), slot, len(idx)), "amin")
    kid = torch.cat([kids, kids.new_full((1,), -1)])[first]
    runner = None
    if second:
        rest = vals.masked_fill(slot == first.gather(1, own), ninf)
        runner = torch.full((b, n), ninf, dtype=x.dtype, device=dev).scatter_reduce(1, own, rest, "amax")
    return kid, top, runner


def _descend_torch(x: Any, taxonomy: Taxonomy, decide: Any, second: bool = False) -> Any:
    """:func:`_descend` on the tensor's device: every family's best child at once, then one step per level."""
    import torch

    kid, top, runner = _families_torch(x, taxonomy, second)
    cur = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    live = torch.ones_like(cur, dtype=torch.bool)
    for _ in range(taxonomy.height):  # a fixed number of steps: no host sync to ask whether rows still move
        at = cur[:, None]
        k = kid.gather(1, at)[:, 0]
        go = live & (k >= 0)
        move = go & decide(go, cur, k, top.gather(1, at)[:, 0], None if runner is None else runner.gather(1, at)[:, 0])
        cur = torch.where(move, k, cur)
        live = move
    return cur


@chunked(scale=8)
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
    if torch_kernels(probs):
        import torch

        x = prepare_torch(probs, taxonomy, leaf_probs=leaf_probs)

        def decide_t(go: Any, cur: Any, kid: Any, top: Any, runner: Any) -> Any:
            pu = x.gather(1, cur[:, None])[:, 0]
            cond = torch.where(pu > 0, top / torch.where(pu > 0, pu, 1.0), 0.0)
            return (cond >= t) & (top > 0)

        return _descend_torch(x, taxonomy, decide_t)
    rows = kernel_rows(probs, taxonomy, leaf_probs=leaf_probs)
    if rows and (ids := rows.ids("descend_rows", *sorted_children(taxonomy), rows.value(t), False, 0.0)) is not None:
        return ids
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=False)
    node = batch.node

    def decide(rows: np.ndarray, cur: np.ndarray, kid: np.ndarray, top: np.ndarray, runner: Any) -> np.ndarray:
        pu = node[rows, cur]
        cond = np.where(pu > 0, top / np.where(pu > 0, pu, 1.0), 0.0)
        return (cond >= t) & (top > 0)

    return restore_ids(_descend(batch, decide), batch)


@chunked(scale=8)
def plurality(probs: Any, taxonomy: Taxonomy, *, leaf_probs: bool = False) -> Any:
    """Plurality inference: the deepest node more probable than every node off its path.

    Valmadre, "Hierarchical classification at multiple operating points" (NeurIPS 2022), as implemented by
    Plaud et al., "To Each Metric Its Decoding" (ICML 2025): descend greedily from the root to the most
    probable child, keeping the running threshold ``m`` = the largest *second-best* child probability over
    the families visited so far; move to the best child ``c`` while ``P(c) >= m`` (a single child is always
    entered, as in the authors' code). On a tree with labels at leaves, ``m`` is the largest probability of
    any node that is neither an ancestor nor a descendant of the current one, so the answer is the deepest
    node whose probability is at least that of every incomparable node.

    Ties: ``P(c) = m`` moves (the reference's ``>=``; differences below ``1e-9`` count as equal so that
    round-off cannot flip a decision); among equally probable children the smallest id is taken. A child of
    probability 0 is never entered (it cannot happen on the path with leaf labels; with a label known to stop
    at an internal node it keeps the rule there, as :func:`top_down` does).

    Earlier hiercls versions compared the best child with its siblings *and* the "label stops here" mass instead;
    with labels only at leaves that rule was :func:`top_down` except on ties, so it is not kept.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("R", "X"), ("X", "Y"), ("Y", "a1"), ("Y", "a2"), ("X", "b"), ("R", "c"),
        ...                 ("R", "d")])
        >>> leaf = np.array([[0.23, 0.29, 0.15, 0.31, 0.02]])  # a1, a2, b, c, d
        >>> tax.name_of(int(plurality(leaf, tax, leaf_probs=True)[0]))  # a2 (.29) < c (.31): stop at Y
        'Y'
    """
    if torch_kernels(probs):
        import torch

        x = prepare_torch(probs, taxonomy, leaf_probs=leaf_probs)
        m_t = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)

        def decide_t(go: Any, cur: Any, kid: Any, top: Any, runner: Any) -> Any:
            nonlocal m_t
            single = torch.isneginf(runner)
            m = torch.maximum(m_t, torch.where(single, 0.0, runner))
            m_t = torch.where(go, m, m_t)  # only rows still descending update their threshold
            return (single | (top >= m - _TIE_TOL)) & (top > 0)

        return _descend_torch(x, taxonomy, decide_t, second=True)
    rows = kernel_rows(probs, taxonomy, leaf_probs=leaf_probs)
    if (
        rows
        and (ids := rows.ids("descend_rows", *sorted_children(taxonomy), rows.value(0), True, _TIE_TOL)) is not None
    ):
        return ids
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=False)
    runner_max = np.zeros(batch.node.shape[0])  # m, per row

    def decide(rows: np.ndarray, cur: np.ndarray, kid: np.ndarray, top: np.ndarray, runner: Any) -> np.ndarray:
        single = np.isneginf(runner)
        m = np.maximum(runner_max[rows], np.where(single, 0.0, runner))
        runner_max[rows] = m
        return (single | (top >= m - _TIE_TOL)) & (top > 0)

    return restore_ids(_descend(batch, decide, second=True), batch)


def _check_unit(value: float, name: str) -> float:
    v = float(value)
    if not np.isfinite(v) or v < 0 or v > 1:
        raise ValueError(f"{name} must be a probability in [0, 1]; got {value!r}")
    return v


def _key_groups(taxonomy: Taxonomy, name: str, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The nodes sorted by ``key`` descending then id, and where each run of equal keys starts (cached)."""
    cache = taxonomy.namespace_cache(__name__)
    if ("groups", name) not in cache:
        perm = np.lexsort((np.arange(len(key)), -key))
        k = key[perm]
        starts = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
        cache["groups", name] = (perm.astype(np.intp), starts)
    return cache["groups", name]


def _deepest_above(batch: Batch, t: float, key: np.ndarray, name: str) -> np.ndarray:
    """Among nodes with ``P > t``: max ``key``, then max ``P``, then smallest id; the root when none.

    Node-major: the nodes are grouped by key (best first) and each group's largest ``P`` taken; the first group
    whose largest ``P`` exceeds ``t`` holds the answer, the first node (in group order) with that probability.
    No node of an earlier group can have it (they are all at most ``t``).
    """
    node = batch.node
    if node.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    perm, starts = _key_groups(batch.taxonomy, name, key)
    xs = batch.node_t[perm]
    top = segment_reduce_t(np.maximum, xs, starts)  # [G, b]
    g = first_true_t(top > t)
    found = g < len(starts)
    cols = np.arange(xs.shape[1])
    value = top[np.minimum(g, len(starts) - 1), cols]
    pos = first_true_t(xs == value)
    return np.where(found, perm[np.minimum(pos, len(perm) - 1)], 0)


def _deepest_above_np(probs: Any, taxonomy: Taxonomy, t: float, name: str, key: np.ndarray, leaf: bool) -> Any:
    """:func:`_deepest_above` of NumPy or CPU-tensor input (row-major trees: the compiled kernel)."""
    rows = kernel_rows(probs, taxonomy, leaf_probs=leaf)
    if rows and (ids := rows.ids("deepest_above_rows", rows.value(t), key)) is not None:
        return ids
    batch = prepare(probs, taxonomy, leaf_probs=leaf, exact=False)
    return restore_ids(_deepest_above(batch, t, key, name), batch)


def _deepest_above_torch(probs: Any, taxonomy: Taxonomy, t: float, name: str, key: np.ndarray, leaf: bool) -> Any:
    """:func:`_deepest_above` on the tensor's device, with the same tie rule."""
    x = prepare_torch(probs, taxonomy, leaf_probs=leaf)
    if not x.shape[0]:
        return index_tensor(taxonomy, "leaves", taxonomy.leaves, x.device)[:0]
    k = index_tensor(taxonomy, name, key, x.device)
    mask = x > t
    ninf = float("-inf")
    best_key = k[None, :].where(mask, ninf).amax(1, keepdim=True)
    pick = x.where(mask & (k[None, :] == best_key), ninf).argmax(1)
    return pick.where(mask.any(1), 0)


@chunked
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
    t = _check_unit(threshold, "threshold")
    if torch_kernels(probs):
        return _deepest_above_torch(probs, taxonomy, t, "depth", taxonomy.depth.astype(np.float64), leaf_probs)
    return _deepest_above_np(probs, taxonomy, t, "depth", taxonomy.depth.astype(np.float64), leaf_probs)


@chunked
def majority(probs: Any, taxonomy: Taxonomy, *, leaf_probs: bool = False) -> Any:
    """The deepest node with probability above 1/2 (:func:`threshold` at 0.5)."""
    return threshold(probs, taxonomy, threshold=0.5, leaf_probs=leaf_probs)


@chunked
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
    t = _check_unit(threshold, "threshold")
    ic = taxonomy.information_content.astype(np.float64)
    if torch_kernels(probs):
        return _deepest_above_torch(probs, taxonomy, t, "ic", ic, leaf_probs)
    return _deepest_above_np(probs, taxonomy, t, "ic", ic, leaf_probs)


@chunked
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
    if torch_kernels(probs):
        x = prepare_torch(probs, taxonomy, leaf_probs=leaf_probs)
        w = index_tensor(taxonomy, "ic", taxonomy.information_content.astype(np.float64), x.device) + lam
        return (x.double() * w).argmax(1) if x.shape[0] else w[:0].long()
    weight = taxonomy.information_content + lam  # float64 scores, as the torch path
    rows = kernel_rows(probs, taxonomy, leaf_probs=leaf_probs)
    if rows and (ids := rows.ids("weighted_argmax_rows", weight)) is not None:
        return ids
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=False)
    if not batch.node.shape[0]:
        return restore_ids(np.zeros(0, dtype=np.int64), batch)
    if batch.row_major:
        return restore_ids((batch.node * weight).argmax(1), batch)
    return restore_ids(first_max_t(batch.node_t * weight[:, None]), batch)


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
    y = np.asarray(labels.detach().cpu().numpy() if hasattr(labels, "detach") else labels, dtype=np.int64).ravel()
    if y.shape[0] != batch.node.shape[0]:
        raise ValueError(f"labels has {y.shape[0]} entries but probs has {batch.node.shape[0]} rows")
    if y.size and (y.min() < 0 or y.max() >= taxonomy.num_nodes):
        raise TaxonomyError(f"labels must be node ids in [0, {taxonomy.num_nodes}); got {y.min()}..{y.max()}")
    anc = taxonomy.ancestors_sparse

    def accuracy(lam: float) -> float:
        pred = info_gain(batch.node, taxonomy, lam=lam)
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


@chunked
def hie(probs: Any, taxonomy: Taxonomy, *, level: int | None = None, leaf_probs: bool = False) -> Any:
    """HiE test-time amendment: the leaf maximising ``P(leaf) * P(coarse ancestor of the leaf)``.

    Jain, Karthik et al., "Test-time amendment with a coarse classifier for fine-grained classification"
    (NeurIPS 2023): the fine posterior is re-weighted by the coarse posterior of the leaf's ancestor, so a
    leaf in a likely coarse class wins over a slightly more likely leaf in an unlikely one. Trees only.

    Args:
        level: depth of the coarse ancestor (``None``: each leaf's parent). Leaves shallower than ``level``
            use themselves.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "u"), ("b", "v")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4, 0.35, 0.05]])
        >>> argmax_leaf(p, tax).tolist(), hie(p, tax).tolist()  # 0.35*0.4 < 0.3*0.6
        ([5], [2])
    """
    if not taxonomy.is_tree:
        raise TaxonomyError(f"hie needs a tree; taxonomy {taxonomy.name!r} is a DAG (use to_tree())")
    leaves = taxonomy.leaves
    if level is None:
        coarse = np.maximum(taxonomy.parent[leaves], 0)
    else:
        lv = int(level)
        if lv < 0:
            raise ValueError(f"level must be a depth >= 0; got {level!r}")
        paths = taxonomy.paths[leaves]
        coarse = paths[np.arange(len(leaves)), np.minimum(lv, taxonomy.depth[leaves])]
    if torch_kernels(probs):
        return _hie_torch(probs, taxonomy, coarse, leaf_probs)
    rows = kernel_rows(probs, taxonomy, leaf_probs=leaf_probs)
    if rows:
        ids = rows.ids("hie_rows", indices(taxonomy, "leaves", leaves), indices(taxonomy, ("hie", level), coarse))
        if ids is not None:
            return ids
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=False)
    if not batch.node.shape[0]:
        return restore_ids(leaves[:0], batch)
    if batch.row_major:
        score = np.take(batch.node, leaves, axis=1)
        np.multiply(score, np.take(batch.node, coarse, axis=1), out=score)
        return restore_ids(leaves[score.argmax(1)], batch)
    xt = batch.node_t
    return restore_ids(leaves[first_max_t(xt[leaves] * xt[coarse])], batch)


def _hie_torch(probs: Any, taxonomy: Taxonomy, coarse: np.ndarray, leaf_probs: bool) -> Any:
    x = prepare_torch(probs, taxonomy, leaf_probs=leaf_probs)
    leaves = index_tensor(taxonomy, "leaves", taxonomy.leaves, x.device)
    if not x.shape[0]:
        return leaves[:0]
    c = index_tensor(taxonomy, ("hie", coarse.tobytes()), coarse, x.device)
    return leaves[(x[:, leaves] * x[:, c]).argmax(1)]

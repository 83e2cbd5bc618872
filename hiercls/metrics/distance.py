"""Metrics of single-node predictions that weigh mistakes by how far apart the nodes are, and per-level accuracy.

* Mistake severity (Bertinetto et al. 2020, "Making Better Mistakes"): the mean distance over the
  *mistakes only*; by default the height of the LCA (``"lca_height"``, ``H - depth(lca)``).
* Average hierarchical distance@k (same paper): the mean, over samples and the top-k predictions, of their
  distance to the truth.
* Wu-Palmer and Zhao costs (Plaud et al., ICML 2025): the mean over *all* samples (a correct prediction costs
  0) of ``Taxonomy.distance(kind="wu_palmer")`` / ``kind="zhao"``; the other conventions are
  ``hierarchical_distance_loss(distance="wu_palmer_root1" / "ic_distance")``.
* Realised cost: the mean of any cost, named or an ``[N, L]`` / ``[N, N]`` matrix, between predictions and
  truths (:func:`realized_cost`), to score every decoder under every cost.
* Per-level accuracy: for each depth ``d``, the prediction's ancestor at ``d`` against the truth's, over the
  samples where both exist; also per semantic level (ImageNet-21K).
* Semantic accuracy (Ridnik et al. 2021, "ImageNet-21K Pretraining for the Masses"): micro over all valid
  ``(sample, level)`` pairs, valid meaning the *truth* has a class at that level.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from hiercls._checks import check_choice, check_dense, to_numpy
from hiercls.metrics._validation import (
    Labels,
    check_weights,
    check_zero_division,
    nonempty,
    prepare_pair,
    renamed_keyword,
    safe_divide,
    tensor_device,
    to_device,
    to_labels,
    weight_total,
    weighted_sum,
)
from hiercls.taxonomy import DISTANCE_KINDS, Taxonomy
from hiercls.taxonomy.core import check_taxonomy
from hiercls.taxonomy.labels import node_id_array

__all__ = [
    "DISTANCES",
    "average_hierarchical_distance_at_k",
    "hierarchical_distance_loss",
    "level_argmax_accuracy_score",
    "level_counts",
    "mistake_severity",
    "node_heights",
    "pairwise_distance",
    "per_level_accuracy_score",
    "realized_cost",
    "semantic_accuracy_score",
    "top_k_accuracy_score",
    "top_k_predictions",
    "wu_palmer_loss",
    "zhao_loss",
]

DISTANCES: tuple[str, ...] = (*DISTANCE_KINDS, "lca_node_height")
"""The ``distance`` names of the metrics: every kind of :meth:`Taxonomy.distance` and ``"lca_node_height"``."""
LevelKind = Literal["depth", "semantic"]


def node_heights(taxonomy: Taxonomy) -> np.ndarray:
    """Height of every node: the longest downward path to a descendant leaf (leaves: 0).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> node_heights(Taxonomy([("r", "a"), ("a", "x"), ("r", "b")])).tolist()
        [2, 1, 0, 0]
    """
    cache = taxonomy.namespace_cache(__name__)
    if "heights" not in cache:
        desc = taxonomy.descendants_sparse
        depth = taxonomy.max_depth
        deepest = np.maximum.reduceat(depth[desc.indices], desc.indptr[:-1])
        cache["heights"] = (deepest - depth).astype(np.int64)
    return cache["heights"]


def pairwise_distance(a: np.ndarray, b: np.ndarray, taxonomy: Taxonomy, distance: str) -> np.ndarray:
    """``Taxonomy.distance`` plus ``"lca_node_height"`` (the LCA's own height, for unbalanced trees)."""
    check_choice(distance, DISTANCES, "distance")
    if distance == "lca_node_height":
        lca = np.asarray(taxonomy.lca(a, b))
        return np.where(a == b, 0.0, node_heights(taxonomy)[lca].astype(np.float64))
    return np.asarray(taxonomy.distance(a, b, kind=distance), dtype=np.float64)


def _id_pair(y_true: Any, y_pred: Any, taxonomy: Taxonomy, sample_weight: Any) -> tuple[np.ndarray, ...]:
    """``(true ids, predicted ids, weights)`` of a non-empty batch of single-node labels."""
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight)
    nonempty(t)
    return _ids(t, "y_true"), _ids(p, "y_pred"), w


def _ids(labels: Labels, name: str) -> np.ndarray:
    if not labels.is_ids:
        raise ValueError(
            f"{name} must be single node ids or names [B] for this metric (distances are between "
            "two nodes); got node sets"
        )
    return labels.ids


def mistake_stats(
    t: np.ndarray, p: np.ndarray, w: np.ndarray | None, taxonomy: Taxonomy, distance: str
) -> tuple[float, float, float]:
    """``(Σ w·dist over mistakes, Σ w over mistakes, Σ w)``: the sums the stateful metric keeps."""
    wrong = t != p
    ww = None if w is None else w[wrong]
    dist = pairwise_distance(t[wrong], p[wrong], taxonomy, distance)
    return weighted_sum(dist, ww), weight_total(int(wrong.sum()), ww), weight_total(len(t), w)


def mistake_severity(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    distance: str = "lca_height",
    sample_weight: Any = None,
    zero_division: Any = "warn",
) -> float:
    """Mean distance between truth and prediction over the mispredicted samples (lower is better).

    Args:
        y_true: node ids or names ``[B]`` (``-1`` ignored).
        y_pred: node ids or names ``[B]``.
        taxonomy: the taxonomy.
        distance: ``"lca_height"`` (default, ``H - depth(lca)``), ``"lca_node_height"`` (height of the LCA
            node itself: the same on trees whose leaves are all at depth ``H``), or any kind of
            :meth:`Taxonomy.distance` (``"shortest_path"``, ``"wu_palmer"``, ``"zhao"``, ...). This is
            Bertinetto et al.'s mistake severity (CVPR 2020): an average over the mistakes only. Plaud et al.
            (ICML 2025) call "mistake severity" the mean shortest-path distance over *all* samples, which is
            :func:`hierarchical_distance_loss` (or :func:`realized_cost` with ``cost="shortest_path"``).
        sample_weight: optional weight per sample.
        zero_division: value when there is no mistake at all.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "z")])
        >>> # x->y: lca a at depth 1, height 2 - 1 = 1; x->z: lca r, 2; the correct sample does not count
        >>> mistake_severity(["x", "x", "x"], ["y", "z", "x"], taxonomy=tax)
        1.5
    """
    zero_division = check_zero_division(zero_division)
    num, den, _ = mistake_stats(*_id_pair(y_true, y_pred, taxonomy, sample_weight), taxonomy, distance)
    return safe_divide(float(num), float(den), zero_division, "mistake severity without mistakes")


def hierarchical_distance_loss(
    y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, distance: str = "shortest_path", sample_weight: Any = None
) -> float:
    """Mean distance between truth and prediction over all samples (correct predictions cost 0).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> hierarchical_distance_loss(["x", "x"], ["y", "x"], taxonomy=tax)  # x - a - y: 2 edges, then 0
        1.0
    """
    t, p, w = _id_pair(y_true, y_pred, taxonomy, sample_weight)
    return _mean(pairwise_distance(t, p, taxonomy, distance), w)


def _mean(values: np.ndarray, w: np.ndarray | None) -> float:
    """The (weighted) mean of per-sample values."""
    return float(np.average(values, weights=w)) if w is not None else float(values.mean())


def wu_palmer_loss(y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, sample_weight: Any = None) -> float:
    """Mean Wu-Palmer cost ``1 - 2 d(lca) / (d(a) + d(b))``, root at depth 0 (Plaud et al., ICML 2025).

    WordNet's (NLTK's) convention counts the root at depth 1:
    ``hierarchical_distance_loss(..., distance="wu_palmer_root1")``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> round(wu_palmer_loss(["x"], ["y"], taxonomy=tax), 6)  # 1 - 2*1 / (2 + 2)
        0.5
    """
    return hierarchical_distance_loss(
        y_true, y_pred, taxonomy=taxonomy, distance="wu_palmer", sample_weight=sample_weight
    )


def zhao_loss(y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, sample_weight: Any = None) -> float:
    """Mean Zhao cost ``1 - 2 IC(lca) / (IC(a) + IC(b))``, ``IC(n) = log2(L / leaves under n)`` (Plaud et al.).

    The unnormalised Jiang-Conrath form ``IC(a) + IC(b) - 2 IC(lca)`` (nats) is
    ``hierarchical_distance_loss(..., distance="ic_distance")``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> round(zhao_loss(["x"], ["y"], taxonomy=tax), 6)  # 1 - 2 log2(3/2) / (2 log2 3)
        0.63093
    """
    return hierarchical_distance_loss(y_true, y_pred, taxonomy=taxonomy, distance="zhao", sample_weight=sample_weight)


def cost_values(t: np.ndarray, p: np.ndarray, taxonomy: Taxonomy, cost: Any) -> np.ndarray:
    """``cost(p[i], t[i])`` per sample, for a distance name or a cost matrix ``[N, L]`` / ``[N, N]``."""
    if isinstance(cost, str):
        return pairwise_distance(t, p, taxonomy, cost)
    mat = np.asarray(to_numpy(cost), dtype=np.float64)
    n, nl = taxonomy.num_nodes, taxonomy.num_leaves
    if mat.ndim != 2 or mat.shape[0] != n or mat.shape[1] not in (nl, n):
        raise ValueError(
            f"cost matrix must be [N, L] = [{n}, {nl}] (node to leaf, columns in the order of "
            f"taxonomy.leaves) or [N, N] = [{n}, {n}] (node to label); got shape {list(mat.shape)}"
        )
    if not np.isfinite(mat).all():
        raise ValueError("cost matrix contains NaN or infinite values")
    if mat.shape[1] == n:
        return mat[p, t]
    col = taxonomy.leaf_index[t]
    if (col < 0).any():
        bad = int(t[np.flatnonzero(col < 0)[0]])
        raise ValueError(
            f"a node-to-leaf cost [N, L] needs leaf labels; y_true holds internal node "
            f"{taxonomy.name_of(bad)!r} (id {bad}); pass an [N, N] node-to-label cost"
        )
    return mat[p, col]


def realized_cost(
    y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, cost: Any = "shortest_path", sample_weight: Any = None
) -> float:
    """Mean cost ``cost[pred, true]`` of single-node predictions against the true labels (lower is better).

    The realised counterpart of the expected cost that :func:`hiercls.decode.bayes_node` minimises
    (:func:`hiercls.decode.prediction_expected_cost`): any decoder can be scored under any cost, including the
    node-to-leaf cost matrices of Plaud et al. (ICML 2025).

    Args:
        y_true: node ids or names ``[B]`` (``-1`` ignored).
        y_pred: node ids or names ``[B]``.
        taxonomy: the taxonomy.
        cost: a distance name (:data:`DISTANCES`) or a matrix ``cost[n, y]`` = cost of predicting ``n`` for
            label ``y``: ``[N, L]`` node-to-leaf (columns in the order of ``taxonomy.leaves``; the labels must
            be leaves) or ``[N, N]`` node-to-label.
        sample_weight: optional weight per sample.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> realized_cost(["x", "b"], ["a", "b"], taxonomy=tax)  # a is 1 edge above x; b is right
        0.5
        >>> c = np.arange(15.0).reshape(5, 3)  # [N, L]: leaves x, y, b
        >>> realized_cost(["x", "b"], ["a", "b"], taxonomy=tax, cost=c)  # (c[a, x] + c[b, b]) / 2 = (3 + 14) / 2
        8.5
    """
    t, p, w = _id_pair(y_true, y_pred, taxonomy, sample_weight)
    return _mean(cost_values(t, p, taxonomy, cost), w)


def _candidates(taxonomy: Taxonomy, width: int, candidates: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """``(node ids of the candidates, the score columns holding them)``; columns ``None``: all, in order."""
    n = taxonomy.num_nodes
    if candidates is None:
        candidates = "leaves" if width in (n, taxonomy.num_leaves) else None
        if candidates is None:
            raise ValueError(
                f"scores has {width} columns; expected {taxonomy.num_leaves} (one per leaf) or {n} "
                f"(one per node) for taxonomy {taxonomy.name!r}, or pass candidates="
            )
    if isinstance(candidates, str):
        check_choice(candidates, ("leaves", "classes", "nodes"), "candidates")
        ids = {"leaves": taxonomy.leaves, "classes": taxonomy.classes, "nodes": np.arange(n)}[candidates]
    else:
        ids = node_id_array(candidates, taxonomy, name="candidates")
    if width == len(ids):
        return ids, None
    if width == n:
        return ids, ids
    raise ValueError(f"scores has {width} columns; expected {len(ids)} (one per candidate) or {n} (one per node)")


@renamed_keyword("scores", "y_score")
def top_k_predictions(y_score: Any, k: int, *, taxonomy: Taxonomy, candidates: Any = None) -> np.ndarray:
    """Node ids of the ``k`` highest-scoring candidates per sample, best first, ``[B, k]``.

    Ties: among equal scores the smaller node id comes first (the decoders' rule). The scores are ranked where
    they are (one stable ``torch.sort``; NumPy scores as a CPU tensor): a tensor in gives the ids as a tensor on
    its device, NumPy in gives NumPy.

    Args:
        y_score: ``[B, num_leaves]`` leaf scores, ``[B, N]`` node scores (then ``candidates`` selects the
            columns; default the leaves, since node probabilities always rank ancestors first), or
            ``[B, len(candidates)]``.
        k: how many.
        taxonomy: the taxonomy.
        candidates: ``"leaves"``, ``"classes"``, ``"nodes"`` or node ids/names.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> top_k_predictions(np.array([[0.2, 0.5, 0.3]]), 2, taxonomy=tax).tolist()  # leaves x, y, b
        [[3, 4]]
    """
    s = _score_tensor(y_score)
    ids, cols = _candidates(taxonomy, s.shape[1], candidates)
    if not isinstance(k, int | np.integer) or not 1 <= k <= len(ids):
        raise ValueError(f"k must be an integer in [1, {len(ids)}] (the number of candidates); got {k!r}")
    # Ties: the smallest node id wins, as in the decoders. A stable descending sort over the columns in id
    # order gives exactly that (torch.topk's order among equal scores is unspecified).
    order = np.argsort(ids, kind="stable")
    ids, cols = ids[order], order if cols is None else cols[order]
    top = torch.sort(s[:, torch.as_tensor(cols, device=s.device)], dim=1, descending=True, stable=True).indices
    top = torch.as_tensor(ids, device=s.device)[top[:, :k]]
    return top if isinstance(y_score, torch.Tensor) else top.numpy()


def _score_tensor(y_score: Any) -> torch.Tensor:
    """``y_score`` as a float32/float64 tensor ``[B, C]`` where it is (NumPy: a CPU tensor sharing its memory)."""
    if isinstance(y_score, torch.Tensor):
        s = check_dense(y_score, "y_score").detach()
    else:
        a = np.asarray(to_numpy(y_score, name="y_score"))
        if a.dtype.kind not in "biuf":
            raise TypeError(f"y_score must be numeric; got dtype {a.dtype}")
        s = torch.from_numpy(np.ascontiguousarray(a))
    if s.ndim != 2:
        raise ValueError(f"y_score must be 2-D [B, C]; got shape {tuple(s.shape)}")
    if s.dtype.is_complex:
        raise TypeError(f"y_score must be numeric; got dtype {s.dtype}")
    s = s if s.dtype in (torch.float32, torch.float64) else s.float()
    if s.numel() and not bool(torch.isfinite(s).all()):  # NaN ranks above everything in torch.sort
        bad = torch.nonzero(~torch.isfinite(s))[0].tolist()
        raise ValueError(f"y_score must be finite; row {bad[0]}, column {bad[1]} is {float(s[bad[0], bad[1]])}")
    return s


def _scores_pair(
    y_true: Any, scores: Any, taxonomy: Taxonomy, sample_weight: Any, k: int, candidates: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    check_taxonomy(taxonomy)
    top = top_k_predictions(scores, k, taxonomy=taxonomy, candidates=candidates)
    return top_k_labels(y_true, top, taxonomy, sample_weight)


def top_k_labels(y_true: Any, top: Any, taxonomy: Taxonomy, sample_weight: Any) -> tuple[Any, Any, Any]:
    """``(true ids, top-k ids, weights)`` on the host, of the samples whose ``y_true`` is not ``-1``."""
    ids = _ids(to_labels(y_true, taxonomy, name="y_true", allow_ignore=True), "y_true")
    top = np.asarray(to_numpy(top))  # [B, k] ids: small next to the scores they were ranked from
    if len(ids) != len(top):
        raise ValueError(f"y_true has {len(ids)} samples but y_score has {len(top)} rows")
    w = check_weights(sample_weight, len(ids))
    keep = ids >= 0
    if not keep.all():
        ids, top, w = ids[keep], top[keep], None if w is None else w[keep]
    return ids, top, w


def top_k_hits(t: np.ndarray, top: np.ndarray, w: np.ndarray | None, ks: tuple[int, ...]) -> np.ndarray:
    """Per ``k``: the weighted number of samples whose true node is among their ``k`` best candidates (``top``:
    the ``max(ks)`` best, best first)."""
    hit = np.cumsum(top == t[:, None], axis=1) > 0  # a hit within the first j + 1
    return np.array([weighted_sum(hit[:, k - 1], w) for k in ks])


def top_k_distances(
    t: np.ndarray, top: np.ndarray, w: np.ndarray | None, ks: tuple[int, ...], taxonomy: Taxonomy, distance: str
) -> np.ndarray:
    """Per ``k``: the weighted sum over the samples of the mean distance between the truth and its ``k`` best
    candidates."""
    dist = pairwise_distance(np.broadcast_to(t[:, None], top.shape), top, taxonomy, distance)
    mean = np.cumsum(dist, axis=1) / np.arange(1, top.shape[1] + 1)
    return np.array([weighted_sum(mean[:, k - 1], w) for k in ks])


@renamed_keyword("scores", "y_score")
def top_k_accuracy_score(
    y_true: Any, y_score: Any, *, taxonomy: Taxonomy, k: int = 5, candidates: Any = None, sample_weight: Any = None
) -> float:
    """Fraction of samples whose true node is among the ``k`` best-scored candidates (``y_score`` ``[B, C]``, as
    :func:`top_k_predictions` takes it; ``scores=`` is the deprecated name).

    Ties at the k-th score: the smaller node id is taken (:func:`top_k_predictions`). A true node that is not a
    candidate (an internal node when the candidates are the leaves) is never a hit.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> top_k_accuracy_score(["x", "b"], np.array([[0.2, 0.5, 0.3], [0.2, 0.5, 0.3]]), taxonomy=tax, k=2)
        0.5
    """
    t, top, w = _scores_pair(y_true, y_score, taxonomy, sample_weight, k, candidates)
    nonempty(t)
    return float(top_k_hits(t, top, w, (k,))[0] / weight_total(len(t), w))


@renamed_keyword("scores", "y_score")
def average_hierarchical_distance_at_k(
    y_true: Any,
    y_score: Any,
    *,
    taxonomy: Taxonomy,
    k: int = 5,
    distance: str = "lca_height",
    candidates: Any = None,
    sample_weight: Any = None,
) -> float:
    """Mean distance between the truth and each of the top-k predictions of ``y_score`` (Bertinetto et al. 2020).

    Ties among the scores: the smaller node id ranks first (:func:`top_k_predictions`).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> # truth x, top-2 = (y, b): heights of lca(x, y) = a and lca(x, b) = r are 1 and 2
        >>> average_hierarchical_distance_at_k(["x"], np.array([[0.2, 0.5, 0.3]]), taxonomy=tax, k=2)
        1.5
    """
    t, top, w = _scores_pair(y_true, y_score, taxonomy, sample_weight, k, candidates)
    nonempty(t)
    dist = top_k_distances(t, top, w, (k,), taxonomy, check_choice(distance, DISTANCES, "distance"))
    return float(dist[0] / weight_total(len(t), w))


def _node_levels(taxonomy: Taxonomy, levels: str) -> np.ndarray:
    """Level of every node (``-1``: not on any level): depth (root excluded) or semantic level."""
    check_choice(levels, ("depth", "semantic"), "levels")
    return (taxonomy.depth - 1 if levels == "depth" else taxonomy.semantic_level).astype(np.int64)


def num_levels(taxonomy: Taxonomy, levels: str) -> int:
    lv = _node_levels(taxonomy, levels)
    return int(lv.max()) + 1 if (lv >= 0).any() else 0


def per_level_counts(
    t: Labels, p: Labels, taxonomy: Taxonomy, w: np.ndarray | None, levels: str = "depth", chunk: int = 1 << 17
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted per-level ``(correct, both_valid, true_valid)`` float64 vectors ``[num_levels]``.

    At level ``l`` a sample is *true-valid* if its true set has a node at ``l``, *both-valid* if its predicted
    set has one too, and *correct* if both sets agree on level ``l`` (the same nodes there).
    """
    n_lv = num_levels(taxonomy, levels)
    ww = np.ones(len(t)) if w is None else w
    if taxonomy.is_tree and t.is_ids and p.is_ids:
        # A root path meets each level at most once: the ancestor at that depth, or the class ancestor at that
        # semantic level. Chunks keep the [B, levels] temporaries small for a million samples.
        table = taxonomy.paths[:, 1:] if levels == "depth" else semantic_level_table(taxonomy)
        out = np.zeros((3, n_lv))
        for s in range(0, len(t), chunk):
            at, ap = table[t.ids[s : s + chunk]], table[p.ids[s : s + chunk]]
            vt, both, wc = at >= 0, (at >= 0) & (ap >= 0), ww[s : s + chunk]
            out += (wc @ (both & (at == ap)), wc @ both, wc @ vt)
        return out[0], out[1], out[2]
    node_level = _node_levels(taxonomy, levels)
    ts, ps = t.as_sets(taxonomy), p.as_sets(taxonomy)

    def presence(m: Any) -> np.ndarray:
        m = m.tocsr()
        rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
        lv = node_level[m.indices]
        ok = lv >= 0
        flat = np.bincount(rows[ok] * n_lv + lv[ok], minlength=m.shape[0] * n_lv)
        return flat.reshape(m.shape[0], n_lv)

    vt, vp = presence(ts) > 0, presence(ps) > 0
    mismatch = presence(ts != ps) > 0
    both = vt & vp
    return ww @ (both & ~mismatch), ww @ both, ww @ vt


def per_level_accuracy_score(
    y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, levels: LevelKind = "depth", sample_weight: Any = None
) -> np.ndarray:
    """Accuracy at each level, over the samples where both truth and prediction reach that level.

    Args:
        y_true: labels (ids, names or node sets; ``-1`` ignored).
        y_pred: labels.
        taxonomy: the taxonomy.
        levels: ``"depth"`` (entry ``i`` is depth ``i + 1``, the root's children first) or ``"semantic"``
            (entry ``i`` is semantic level ``i`` of :attr:`Taxonomy.semantic_level`).
        sample_weight: optional weight per sample.

    Returns:
        float64 array, ``nan`` at levels without any valid sample; a float64 tensor on the labels' device when
        they are tensors (the counts are computed on the host copy of the labels).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> per_level_accuracy_score(["x", "x"], ["y", "b"], taxonomy=tax).tolist()  # b has no depth-2 node
        [0.5, 0.0]
    """
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight)
    nonempty(t)
    correct, both, _ = per_level_counts(t, p, taxonomy, w, levels)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(both > 0, correct / np.where(both > 0, both, 1.0), np.nan)
    return to_device(acc, tensor_device(y_true, y_pred))  # tensors in: a float64 tensor on their device


def level_counts(
    y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, levels: LevelKind = "depth", sample_weight: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-level ``(correct, valid)`` weighted counts ``[num_levels]``: the sums behind the per-level accuracies.

    ``valid[l]`` counts the samples whose truth has a node at level ``l``; ``correct[l]`` those among them whose
    prediction has the same nodes there. Sums of these over runs or seeds give pooled per-level accuracies.
    float64 arrays; float64 tensors on the labels' device when they are tensors.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> correct, valid = level_counts(["x", "x"], ["y", "b"], taxonomy=tax)
        >>> correct.tolist(), valid.tolist()
        ([1.0, 0.0], [2.0, 2.0])
    """
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight)
    correct, _, valid = per_level_counts(t, p, taxonomy, w, levels)
    device = tensor_device(y_true, y_pred)
    return to_device(correct, device), to_device(valid, device)


def semantic_accuracy_score(
    y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, levels: LevelKind = "semantic", sample_weight: Any = None
) -> float:
    """Micro accuracy over every ``(sample, level)`` pair at which the truth has a node (Ridnik et al. 2021).

    A prediction that stops above a level the truth reaches is wrong at that level.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> # levels of x: {a} and {x}; prediction y gets a right, x wrong; prediction a: right, missing
        >>> semantic_accuracy_score(["x", "x"], ["y", "a"], taxonomy=tax)
        0.5
    """
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight)
    nonempty(t)
    correct, _, valid = per_level_counts(t, p, taxonomy, w, levels)
    if float(valid.sum()) == 0:
        raise ValueError("no (sample, level) pair is valid: no true label lies on a level")
    return float(correct.sum() / valid.sum())


def semantic_level_table(taxonomy: Taxonomy) -> np.ndarray:
    """``[N, K]``: the class ancestor-or-self of each node at each semantic level, ``-1`` where there is none."""
    cache = taxonomy.namespace_cache(__name__)
    if "semantic_level_table" not in cache:
        if not taxonomy.is_tree:
            raise ValueError(
                f"per-level semantic targets need a tree; taxonomy {taxonomy.name!r} is a DAG (use to_tree())"
            )
        level = taxonomy.semantic_level
        k = int(level.max()) + 1 if (level >= 0).any() else 0
        table = np.full((taxonomy.num_nodes, k), -1, dtype=np.int64)
        paths = taxonomy.paths
        rows, cols = np.nonzero(paths >= 0)
        anc = paths[rows, cols]
        keep = taxonomy.class_mask[anc]
        table[rows[keep], level[anc[keep]]] = anc[keep]
        cache["semantic_level_table"] = table
    return cache["semantic_level_table"]


def level_argmax_accuracy_score(
    y_true: Any,
    level_pred: Any,
    *,
    taxonomy: Taxonomy,
    sample_weight: Any = None,
    drop_deepest_level: bool = False,
) -> float:
    """Semantic accuracy of independent per-level predictions (Ridnik et al., 2021).

    ``level_pred[b, l]`` is the class predicted at semantic level ``l`` (e.g. the per-level argmax of
    :meth:`hiercls.heads.SemanticSoftmaxHead.predict_levels`); the predictions of different levels need not
    lie on one root path and are *not* closed under ancestors. Micro accuracy over every ``(sample, level)``
    pair at which the truth has a class, like :func:`semantic_accuracy_score` (which scores one node per
    sample, read as the whole chain of its class ancestors). Trees only.

    **Which levels.** By default every semantic level counts, the deepest included: the levels that
    :class:`~hiercls.losses.SemanticSoftmaxLoss` trains by default and :func:`semantic_accuracy_score` scores.
    The authors' reference metric (``AccuracySemanticSoftmaxMet`` of Alibaba-MIIL/ImageNet21K) leaves the
    deepest semantic level out, as their loss does: ``drop_deepest_level=True`` reproduces it (the pairs of the
    deepest level are not counted; ``level_pred`` may then also have ``K - 1`` columns).

    Args:
        y_true: node ids or names ``[B]`` (``-1`` ignored).
        level_pred: node ids ``[B, K]``, ``K`` = the number of semantic levels (``-1`` = no prediction).
        taxonomy: the taxonomy.
        sample_weight: optional weight per sample.
        drop_deepest_level: leave the deepest semantic level out, as the published metric (needs two levels).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "z")])
        >>> # truth x has level targets (a, x); the level argmaxes (b, x) disagree with each other
        >>> level_argmax_accuracy_score(["x"], np.array([[4, 2]]), taxonomy=tax)
        0.5
        >>> level_argmax_accuracy_score(["x"], np.array([[4, 2]]), taxonomy=tax, drop_deepest_level=True)
        0.0
    """
    check_taxonomy(taxonomy)
    table = semantic_level_table(taxonomy)
    if drop_deepest_level:
        if table.shape[1] < 2:
            raise ValueError(
                f"drop_deepest_level=True needs at least two semantic levels; taxonomy {taxonomy.name!r} has "
                f"{table.shape[1]}"
            )
        table = table[:, :-1]
    t = to_labels(y_true, taxonomy, name="y_true", allow_ignore=True)
    ids = _ids(t, "y_true")
    lp = np.asarray(to_numpy(level_pred))
    if drop_deepest_level and lp.ndim == 2 and lp.shape[1] == table.shape[1] + 1:
        lp = lp[:, :-1]  # the deepest level's predictions, not scored
    if lp.ndim != 2 or lp.shape != (len(ids), table.shape[1]):
        raise ValueError(
            f"level_pred must be node ids [B, K] = [{len(ids)}, {table.shape[1]}] (one per semantic "
            f"level{', the deepest one optional' if drop_deepest_level else ''}); got shape {list(lp.shape)}"
        )
    if lp.dtype.kind not in "iu":
        raise TypeError(f"level_pred must hold integer node ids; got dtype {lp.dtype}")
    if ((lp < -1) | (lp >= taxonomy.num_nodes)).any():
        raise ValueError(f"level_pred must be node ids in [0, {taxonomy.num_nodes}) or -1")
    w = check_weights(sample_weight, len(ids))
    keep = ids >= 0
    ids, lp = ids[keep], lp[keep]
    ww = np.ones(len(ids)) if w is None else w[keep]
    nonempty(ids)
    truth = table[ids]
    valid = truth >= 0
    if not valid.any():
        raise ValueError("no (sample, level) pair is valid: no true label lies on a level")
    correct = valid & (lp == truth)
    return float(ww @ correct.sum(1) / (ww @ valid.sum(1)))

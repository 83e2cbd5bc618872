"""Metrics of single-node predictions that weigh mistakes by how far apart the nodes are, and per-level accuracy.

* Mistake severity (Bertinetto et al. 2020, "Making Better Mistakes"): the mean distance over the
  *mistakes only*; by default the height of the LCA (``"lca_height"``, ``H - depth(lca)``).
* Average hierarchical distance@k (same paper): the mean, over samples and the top-k predictions, of their
  distance to the truth.
* Wu-Palmer and Zhao costs: the mean over *all* samples (a correct prediction costs 0) of
  ``Taxonomy.distance(kind="wu_palmer")`` / ``kind="zhao"``.
* Per-level accuracy: for each depth ``d``, the prediction's ancestor at ``d`` against the truth's, over the
  samples where both exist; also per semantic level (ImageNet-21K).
* Semantic accuracy (Ridnik et al. 2021, "ImageNet-21K Pretraining for the Masses"): micro over all valid
  ``(sample, level)`` pairs, valid meaning the *truth* has a class at that level.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from hiercls._checks import check_choice, check_taxonomy, to_numpy
from hiercls.metrics._validation import (
    Labels,
    check_weights,
    check_zero_division,
    prepare_pair,
    safe_divide,
    to_labels,
)
from hiercls.taxonomy import Taxonomy

__all__ = [
    "DISTANCES",
    "average_hierarchical_distance_at_k",
    "hierarchical_distance_loss",
    "mistake_severity",
    "node_heights",
    "pairwise_distance",
    "per_level_accuracy_score",
    "semantic_accuracy_score",
    "top_k_accuracy_score",
    "top_k_predictions",
    "wu_palmer_loss",
    "zhao_loss",
]

DISTANCES = ("lca_height", "shortest_path", "wu_palmer", "zhao", "jiang_conrath", "lca_node_height")
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


def _ids(labels: Labels, name: str) -> np.ndarray:
    if not labels.is_ids:
        raise ValueError(f"{name} must be single node ids or names [B] for this metric (distances are between "
                         "two nodes); got node sets")
    return labels.ids


def _nonempty(t: Labels) -> None:
    if len(t) == 0:
        raise ValueError("no samples to score (empty input, or every y_true is -1)")


def mistake_stats(t: np.ndarray, p: np.ndarray, w: np.ndarray | None, taxonomy: Taxonomy,
                  distance: str) -> tuple[float, float, float]:
    """``(Σ w·dist over mistakes, Σ w over mistakes, Σ w)``: the sums the stateful metric keeps."""
    wrong = t != p
    dist = pairwise_distance(t[wrong], p[wrong], taxonomy, distance)
    ww = None if w is None else w[wrong]
    return (float(dist.sum() if ww is None else dist @ ww), float(wrong.sum() if w is None else w[wrong].sum()),
            float(len(t) if w is None else w.sum()))


def mistake_severity(y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, distance: str = "lca_height",
                     sample_weight: Any = None, zero_division: Any = "warn") -> float:
    """Mean distance between truth and prediction over the mispredicted samples (lower is better).

    Args:
        y_true: node ids or names ``[B]`` (``-1`` ignored).
        y_pred: node ids or names ``[B]``.
        taxonomy: the taxonomy.
        distance: ``"lca_height"`` (default, ``H - depth(lca)``), ``"lca_node_height"`` (height of the LCA
            node itself: the same on trees whose leaves are all at depth ``H``), ``"shortest_path"``,
            ``"wu_palmer"``, ``"zhao"`` (= ``"jiang_conrath"``).
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
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight)
    _nonempty(t)
    num, den, _ = mistake_stats(_ids(t, "y_true"), _ids(p, "y_pred"), w, taxonomy, distance)
    return safe_divide(num, den, zero_division, "mistake severity without mistakes")


def hierarchical_distance_loss(y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, distance: str = "shortest_path",
                               sample_weight: Any = None) -> float:
    """Mean distance between truth and prediction over all samples (correct predictions cost 0).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> hierarchical_distance_loss(["x", "x"], ["y", "x"], taxonomy=tax)  # x - a - y: 2 edges, then 0
        1.0
    """
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight)
    _nonempty(t)
    d = pairwise_distance(_ids(t, "y_true"), _ids(p, "y_pred"), taxonomy, distance)
    return float(np.average(d, weights=w)) if w is not None else float(d.mean())


def wu_palmer_loss(y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, sample_weight: Any = None) -> float:
    """Mean Wu-Palmer cost ``1 - 2 (d(lca) + 1) / (d(a) + d(b) + 2)`` (root at depth 1, as WordNet counts).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> round(wu_palmer_loss(["x"], ["y"], taxonomy=tax), 6)  # 1 - 2*2 / (3 + 3)
        0.333333
    """
    return hierarchical_distance_loss(y_true, y_pred, taxonomy=taxonomy, distance="wu_palmer",
                                      sample_weight=sample_weight)


def zhao_loss(y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, sample_weight: Any = None) -> float:
    """Mean information-content cost ``IC(a) + IC(b) - 2 IC(lca)`` (intrinsic IC, ``Taxonomy.distance("zhao")``).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> round(zhao_loss(["x"], ["y"], taxonomy=tax), 6)  # 2 (log 3 - log 3/2)
        1.386294
    """
    return hierarchical_distance_loss(y_true, y_pred, taxonomy=taxonomy, distance="zhao",
                                      sample_weight=sample_weight)


def _candidates(taxonomy: Taxonomy, scores: np.ndarray, candidates: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(node ids of the candidate columns, scores restricted to them)``."""
    n, width = taxonomy.num_nodes, scores.shape[1]
    if candidates is None:
        candidates = "leaves" if width in (n, taxonomy.num_leaves) else None
        if candidates is None:
            raise ValueError(f"scores has {width} columns; expected {taxonomy.num_leaves} (one per leaf) or {n} "
                             f"(one per node) for taxonomy {taxonomy.name!r}, or pass candidates=")
    if isinstance(candidates, str):
        check_choice(candidates, ("leaves", "classes", "nodes"), "candidates")
        ids = {"leaves": taxonomy.leaves, "classes": taxonomy.classes,
               "nodes": np.arange(n)}[candidates]
    else:
        ids = np.asarray(to_numpy(candidates))
        if ids.dtype.kind in "USO":
            ids = taxonomy.ids([str(x) for x in ids])
        ids = ids.astype(np.int64).ravel()
        if ((ids < 0) | (ids >= n)).any():
            raise ValueError(f"candidates must be node ids in [0, {n}); got {ids.tolist()[:10]}")
    if width == len(ids):
        return ids, scores
    if width == n:
        return ids, scores[:, ids]
    raise ValueError(f"scores has {width} columns; expected {len(ids)} (one per candidate) or {n} (one per node)")


def top_k_predictions(scores: Any, k: int, *, taxonomy: Taxonomy, candidates: Any = None) -> np.ndarray:
    """Node ids of the ``k`` highest-scoring candidates per sample, best first, ``[B, k]``.

    Args:
        scores: ``[B, num_leaves]`` leaf scores, ``[B, N]`` node scores (then ``candidates`` selects the
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
    s = np.asarray(to_numpy(scores))
    if s.ndim != 2:
        raise ValueError(f"scores must be 2-D [B, C]; got shape {s.shape}")
    if s.dtype.kind not in "biuf":
        raise TypeError(f"scores must be numeric; got dtype {s.dtype}")
    ids, s = _candidates(taxonomy, s, candidates)
    if not isinstance(k, int | np.integer) or not 1 <= k <= len(ids):
        raise ValueError(f"k must be an integer in [1, {len(ids)}] (the number of candidates); got {k!r}")
    import torch

    # torch's partial sort is several times faster than numpy's argpartition on [10k, 1k] scores.
    scores_t = torch.from_numpy(np.ascontiguousarray(s, dtype=np.float64 if s.dtype == np.float64 else np.float32))
    top = scores_t.topk(k, dim=1, largest=True, sorted=True).indices.numpy()
    return ids[top]


def _scores_pair(y_true: Any, scores: Any, taxonomy: Taxonomy, sample_weight: Any, k: int,
                 candidates: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    check_taxonomy(taxonomy)
    top = top_k_predictions(scores, k, taxonomy=taxonomy, candidates=candidates)
    t = to_labels(y_true, taxonomy, name="y_true", allow_ignore=True)
    ids = _ids(t, "y_true")
    if len(ids) != len(top):
        raise ValueError(f"y_true has {len(ids)} samples but scores has {len(top)} rows")
    w = check_weights(sample_weight, len(ids))
    keep = ids >= 0
    return ids[keep], top[keep], None if w is None else w[keep]


def top_k_accuracy_score(y_true: Any, scores: Any, *, taxonomy: Taxonomy, k: int = 5, candidates: Any = None,
                         sample_weight: Any = None) -> float:
    """Fraction of samples whose true node is among the ``k`` best-scored candidates.

    Ties at the k-th score are broken arbitrarily (by ``torch.topk``). A true node that is not a candidate
    (an internal node when the candidates are the leaves) is never a hit.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> top_k_accuracy_score(["x", "b"], np.array([[0.2, 0.5, 0.3], [0.2, 0.5, 0.3]]), taxonomy=tax, k=2)
        0.5
    """
    t, top, w = _scores_pair(y_true, scores, taxonomy, sample_weight, k, candidates)
    _nonempty(Labels(t, None, taxonomy.num_nodes))
    hit = (top == t[:, None]).any(axis=1)
    return float(np.average(hit, weights=w)) if w is not None else float(hit.mean())


def average_hierarchical_distance_at_k(y_true: Any, scores: Any, *, taxonomy: Taxonomy, k: int = 5,
                                       distance: str = "lca_height", candidates: Any = None,
                                       sample_weight: Any = None) -> float:
    """Mean distance between the truth and each of the top-k predictions (Bertinetto et al. 2020).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> # truth x, top-2 = (y, b): heights of lca(x, y) = a and lca(x, b) = r are 1 and 2
        >>> average_hierarchical_distance_at_k(["x"], np.array([[0.2, 0.5, 0.3]]), taxonomy=tax, k=2)
        1.5
    """
    t, top, w = _scores_pair(y_true, scores, taxonomy, sample_weight, k, candidates)
    _nonempty(Labels(t, None, taxonomy.num_nodes))
    d = pairwise_distance(np.broadcast_to(t[:, None], top.shape), top, taxonomy, distance).mean(axis=1)
    return float(np.average(d, weights=w)) if w is not None else float(d.mean())


def _node_levels(taxonomy: Taxonomy, levels: str) -> np.ndarray:
    """Level of every node (``-1``: not on any level): depth (root excluded) or semantic level."""
    check_choice(levels, ("depth", "semantic"), "levels")
    if levels == "depth":
        lv = taxonomy.depth.astype(np.int64) - 1
        return lv
    return taxonomy.semantic_level.astype(np.int64)


def num_levels(taxonomy: Taxonomy, levels: str) -> int:
    lv = _node_levels(taxonomy, levels)
    return int(lv.max()) + 1 if (lv >= 0).any() else 0


def per_level_counts(t: Labels, p: Labels, taxonomy: Taxonomy, w: np.ndarray | None,
                     levels: str = "depth", chunk: int = 1 << 17) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted per-level ``(correct, both_valid, true_valid)`` float64 vectors ``[num_levels]``.

    At level ``l`` a sample is *true-valid* if its true set has a node at ``l``, *both-valid* if its predicted
    set has one too, and *correct* if both sets agree on level ``l`` (the same nodes there).
    """
    n_lv = num_levels(taxonomy, levels)
    ww = np.ones(len(t)) if w is None else w
    if levels == "depth" and taxonomy.is_tree and t.is_ids and p.is_ids:
        paths = taxonomy.paths
        out = np.zeros((3, n_lv))
        for s in range(0, len(t), chunk):  # chunks keep the [B, height] temporaries small for 1M samples
            pt, pp = paths[t.ids[s:s + chunk], 1:], paths[p.ids[s:s + chunk], 1:]
            vt, vp, wc = pt >= 0, pp >= 0, ww[s:s + chunk]
            both = vt & vp
            out += (wc @ (both & (pt == pp)), wc @ both, wc @ vt)
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


def per_level_accuracy_score(y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, levels: LevelKind = "depth",
                             sample_weight: Any = None) -> np.ndarray:
    """Accuracy at each level, over the samples where both truth and prediction reach that level.

    Args:
        y_true: labels (ids, names or node sets; ``-1`` ignored).
        y_pred: labels.
        taxonomy: the taxonomy.
        levels: ``"depth"`` (entry ``i`` is depth ``i + 1``, the root's children first) or ``"semantic"``
            (entry ``i`` is semantic level ``i`` of :attr:`Taxonomy.semantic_level`).
        sample_weight: optional weight per sample.

    Returns:
        float64 array, ``nan`` at levels without any valid sample.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> per_level_accuracy_score(["x", "x"], ["y", "b"], taxonomy=tax).tolist()  # b has no depth-2 node
        [0.5, 0.0]
    """
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight)
    _nonempty(t)
    correct, both, _ = per_level_counts(t, p, taxonomy, w, levels)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(both > 0, correct / np.where(both > 0, both, 1.0), np.nan)


def semantic_accuracy_score(y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, levels: LevelKind = "semantic",
                            sample_weight: Any = None) -> float:
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
    _nonempty(t)
    correct, _, valid = per_level_counts(t, p, taxonomy, w, levels)
    if valid.sum() == 0:
        raise ValueError("no (sample, level) pair is valid: no true label lies on a level")
    return float(correct.sum() / valid.sum())

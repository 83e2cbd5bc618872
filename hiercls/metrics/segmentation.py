"""Dice per nested region for hierarchical segmentation.

A region is a node of the taxonomy; a pixel belongs to it when its label is the node or one of its
descendants, so regions nest like the hierarchy (BraTS: whole tumour ⊇ tumour core ⊇ enhancing tumour).
Inputs are either per-region masks ``[B, R, *spatial]`` or label maps ``[B, *spatial]`` of node ids plus a
taxonomy (``-1`` pixels of ``y_true`` are ignored in both maps).

``Dice_r = (2 |T_r ∩ P_r| + smooth) / (|T_r| + |P_r| + smooth)``; with masks of probabilities this is the
soft Dice. A region empty in both truth and prediction (denominator 0) scores ``empty_score``: 1.0 (the
usual "nothing to find, nothing found" rule), 0.0, or ``nan`` to leave it out of a mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from hiercls._checks import to_numpy
from hiercls.metrics._validation import check_weights
from hiercls.taxonomy import Taxonomy
from hiercls.taxonomy.core import check_taxonomy
from hiercls.taxonomy.labels import node_id_array

__all__ = ["dice_counts", "nested_dice_score", "region_masks"]


def region_ids(taxonomy: Taxonomy, regions: Any) -> np.ndarray:
    """The region node ids ``regions`` names (ids or names; default: every node but the root), validated."""
    if regions is None:
        return np.arange(1, taxonomy.num_nodes, dtype=np.int64)
    return node_id_array(regions, taxonomy, name="regions")


def region_masks(label_map: Any, *, taxonomy: Taxonomy, regions: Any = None) -> np.ndarray:
    """Boolean masks ``[B, R, *spatial]`` of nested regions from a label map ``[B, *spatial]`` of node ids.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "tumour"), ("tumour", "core"), ("core", "enhancing")])
        >>> region_masks(np.array([[0, 1, 2, 3]]), taxonomy=tax).astype(int).tolist()
        [[[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]]]
    """
    lab = _label_map(label_map, taxonomy, "label_map", allow_ignore=True)
    reg = region_ids(taxonomy, regions)
    under = taxonomy.ancestors_sparse[:, reg].toarray().astype(bool)  # [N, R]: node under region r
    safe = np.where(lab < 0, 0, lab)
    masks = under[safe] & (lab >= 0)[..., None]  # [B, *spatial, R]
    return np.moveaxis(masks, -1, 1)


def _label_map(y: Any, taxonomy: Taxonomy, name: str, allow_ignore: bool) -> np.ndarray:
    a = np.asarray(to_numpy(y))
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} label map must hold integer node ids; got dtype {a.dtype}")
    if a.ndim < 2:
        raise ValueError(f"{name} label map must be [B, *spatial]; got shape {a.shape}")
    a = a.astype(np.int64, copy=False)
    low = -1 if allow_ignore else 0
    bad = (a < low) | (a >= taxonomy.num_nodes)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name}{list(where)} = {int(a[where])} is not a node id of taxonomy {taxonomy.name!r}; "
            f"expected ids in [{low}, {taxonomy.num_nodes})"
        )
    return a


def dice_counts(
    y_true: Any, y_pred: Any, *, taxonomy: Taxonomy | None = None, regions: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample, per-region ``(intersection, true size, predicted size)``, float64 ``[B, R]`` each.

    Example:
        >>> t = np.array([[[1, 1, 0, 0]]])  # one sample, one region, four pixels
        >>> p = np.array([[[1, 0, 1, 0]]])
        >>> [c.tolist() for c in dice_counts(t, p)]
        [[[1.0]], [[2.0]], [[2.0]]]
    """
    if taxonomy is None:
        if regions is not None:
            raise ValueError("regions needs taxonomy= (with masks [B, R, *spatial] every channel is a region)")
        t = np.asarray(to_numpy(y_true))
        p = np.asarray(to_numpy(y_pred))
        if t.shape != p.shape:
            raise ValueError(f"y_true has shape {t.shape} but y_pred has {p.shape}; expected equal [B, R, *spatial]")
        if t.ndim < 3:
            raise ValueError(f"masks must be [B, R, *spatial] (or pass taxonomy= with label maps); got {t.shape}")
        for name, a in (("y_true", t), ("y_pred", p)):
            if a.dtype.kind not in "biuf":
                raise TypeError(f"{name} masks must be bool or numbers; got dtype {a.dtype}")
            if a.size and (a.min() < 0 or a.max() > 1):
                raise ValueError(f"{name} masks must lie in [0, 1] (0/1 or probabilities)")
        t = t.reshape(t.shape[0], t.shape[1], -1).astype(np.float64)
        p = p.reshape(p.shape[0], p.shape[1], -1).astype(np.float64)
        return np.einsum("brx,brx->br", t, p), t.sum(-1), p.sum(-1)
    check_taxonomy(taxonomy)
    t = _label_map(y_true, taxonomy, "y_true", allow_ignore=True)
    p = _label_map(y_pred, taxonomy, "y_pred", allow_ignore=False)
    if t.shape != p.shape:
        raise ValueError(f"y_true has shape {t.shape} but y_pred has {p.shape}; expected equal [B, *spatial]")
    reg = region_ids(taxonomy, regions)
    b, n = t.shape[0], taxonomy.num_nodes
    tf, pf = t.reshape(b, -1), p.reshape(b, -1)
    valid = tf >= 0
    rows = np.broadcast_to(np.arange(b)[:, None], tf.shape)[valid]
    tv, pv = tf[valid], pf[valid]
    anc = taxonomy.ancestors_sparse.astype(np.float64).tocsc()[:, reg]  # [N, R]

    def hist(ids: np.ndarray) -> sp.csr_matrix:
        c = np.bincount(rows * n + ids, minlength=b * n).astype(np.float64)
        return sp.csr_matrix(c.reshape(b, n))

    true_size = np.asarray((hist(tv) @ anc).todense())
    pred_size = np.asarray((hist(pv) @ anc).todense())
    if taxonomy.is_tree:
        # Both labels lie under region r iff their LCA does.
        inter = np.asarray((hist(np.asarray(taxonomy.lca(tv, pv))) @ anc).todense())
    else:
        keys, counts = np.unique((rows * n + tv) * n + pv, return_counts=True)
        ti, pi, bi = (keys // n) % n, keys % n, keys // (n * n)
        a_rows = taxonomy.ancestors_sparse.astype(np.float64)
        both = a_rows[ti].multiply(a_rows[pi]).tocsc()[:, reg]  # [U, R]
        group = sp.csr_matrix((counts.astype(np.float64), (bi, np.arange(len(keys)))), shape=(b, len(keys)))
        inter = np.asarray((group @ both).todense())
    return inter, true_size, pred_size


def dice_from_counts(
    inter: np.ndarray, true_size: np.ndarray, pred_size: np.ndarray, smooth: float, empty_score: float
) -> np.ndarray:
    den = true_size + pred_size + smooth
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (2.0 * inter + smooth) / np.where(den == 0, 1.0, den)
    return np.where(den == 0, empty_score, out)


def check_dice_params(smooth: Any, empty_score: Any) -> tuple[float, float]:
    if not isinstance(smooth, int | float) or smooth < 0 or math.isinf(smooth):
        raise ValueError(f"smooth must be a finite number >= 0; got {smooth!r}")
    if not isinstance(empty_score, int | float) or not (math.isnan(empty_score) or empty_score in (0, 1)):
        raise ValueError(f"empty_score must be 1.0, 0.0 or nan; got {empty_score!r}")
    return float(smooth), float(empty_score)


def nested_dice_score(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy | None = None,
    regions: Any = None,
    smooth: float = 0.0,
    empty_score: float = 1.0,
    per_sample: bool = False,
    sample_weight: Any = None,
) -> np.ndarray:
    """Dice of every (nested) region, ``[R]``.

    Args:
        y_true: masks ``[B, R, *spatial]`` (0/1), or with ``taxonomy`` a label map ``[B, *spatial]``
            of node ids (``-1`` = ignore the pixel).
        y_pred: masks (0/1 or probabilities: soft Dice) or a label map, as ``y_true``.
        taxonomy: the taxonomy of label maps.
        regions: region nodes (ids or names) for label maps; default every node but the root.
        smooth: added to numerator and denominator (Laplace smoothing; 0 = the plain Dice).
        empty_score: score of a region absent from truth and prediction: 1.0, 0.0 or ``nan`` (excluded).
        per_sample: ``False`` pools pixels over the batch (dataset Dice); ``True`` averages per-sample Dice
            (``nan`` entries left out).
        sample_weight: per-sample weights (pooled: weights on pixel counts; per-sample: weights of the mean).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "tumour"), ("tumour", "core"), ("core", "enhancing")])
        >>> t = np.array([[0, 1, 2, 3, 3]])
        >>> p = np.array([[1, 1, 2, 2, 3]])  # tumour: 4 true, 5 predicted, 4 shared; core: 3, 3, 3; enhancing 2, 1, 1
        >>> nested_dice_score(t, p, taxonomy=tax).round(4).tolist()
        [0.8889, 1.0, 0.6667]
    """
    smooth, empty_score = check_dice_params(smooth, empty_score)
    inter, ts, ps = dice_counts(y_true, y_pred, taxonomy=taxonomy, regions=regions)
    sums = dice_sums(inter, ts, ps, check_weights(sample_weight, inter.shape[0]), smooth, empty_score)
    return dice_scores(sums, smooth, empty_score)[1 if per_sample else 0]


def dice_sums(
    inter: np.ndarray, ts: np.ndarray, ps: np.ndarray, w: np.ndarray | None, smooth: float, empty_score: float
) -> dict[str, np.ndarray]:
    """Weighted sums over the samples ``[R]`` of the :func:`dice_counts` (pooled Dice) and of the per-sample Dice
    (``sample_count``: the weight of the samples where it is defined, not ``nan``): the states of ``NestedDice``."""
    ww = np.ones(inter.shape[0]) if w is None else w
    d = dice_from_counts(inter, ts, ps, smooth, empty_score)
    ok = ~np.isnan(d)
    return {
        "inter": ww @ inter,
        "true": ww @ ts,
        "pred": ww @ ps,
        "sample_dice": ww @ np.where(ok, d, 0.0),
        "sample_count": ww @ ok,
    }


def dice_scores(s: Mapping[str, np.ndarray], smooth: float, empty_score: float) -> tuple[np.ndarray, np.ndarray]:
    """``(pooled Dice [R], mean per-sample Dice [R])`` of :func:`dice_sums` (``nan`` where no sample counts)."""
    pooled = dice_from_counts(s["inter"], s["true"], s["pred"], smooth, empty_score)
    count = s["sample_count"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return pooled, np.where(count > 0, s["sample_dice"] / np.where(count > 0, count, 1.0), np.nan)

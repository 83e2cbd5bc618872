"""Set-based hierarchical precision, recall and F-beta (Kiritchenko et al. 2005; Kosmopoulos et al. 2015).

Every label is replaced by the set of its ancestors and itself (for a DAG: ancestors through *all*
parents, by node identity). With ``Y_b`` the true set and ``Ŷ_b`` the predicted set of sample ``b``:

* ``average="micro"`` (Kosmopoulos et al. 2015, Eq. 1-2; hiclass ``average="micro"``): sums over the dataset,
  ``hP = Σ_b |Ŷ_b ∩ Y_b| / Σ_b |Ŷ_b|``, ``hR = Σ_b |Ŷ_b ∩ Y_b| / Σ_b |Y_b|``.
* ``average="samples"`` (the per-sample average of Silla & Freitas 2011, called ``"macro"`` by hiclass):
  the mean over samples of the per-sample ``hP_b``, ``hR_b``, ``hF_b``.
* ``average="macro"`` (scikit-learn's meaning): every node is a binary label; the mean over nodes of the
  per-node precision / recall / F of the closed sets (the node Macro-F1 of hierarchical text classification).
  Its micro counterpart over nodes is exactly ``average="micro"``.
* ``average="weighted"`` (scikit-learn's meaning): the per-node values of ``"macro"`` averaged with weights
  equal to each node's support (the number of samples whose true set holds it).

``hF_beta = (1 + β²) |Ŷ ∩ Y| / (β² |Y| + |Ŷ|)`` from the counts (equal to the harmonic form whenever hP and hR
are defined). ``include_root=False`` (default) leaves the root out of every set (the dataset-aggregated
convention); ``include_root=True`` counts it in every set, true and predicted (the per-sample convention of
e.g. Kiritchenko et al.), so an empty prediction still scores the root.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from hiercls._checks import check_beta, check_choice, to_numpy
from hiercls.metrics._validation import (
    Labels,
    ancestors_int32,
    check_zero_division,
    divide,
    nonempty,
    prepare_pair,
    safe_divide,
    warn_undefined,
    weight_total,
    weighted_sum,
)
from hiercls.taxonomy import Taxonomy
from hiercls.taxonomy.labels import node_id_array

__all__ = [
    "hiclass_precision_recall_fscore",
    "hierarchical_counts",
    "hierarchical_f1_score",
    "hierarchical_fbeta_score",
    "hierarchical_precision_recall_fscore",
    "hierarchical_precision_score",
    "hierarchical_recall_score",
    "node_confusion",
]

Average = Literal["micro", "macro", "weighted", "samples"]


def root_free_counts(t: Labels, p: Labels, taxonomy: Taxonomy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample ``(|T ∩ P|, |P|, |T|)`` of the ancestor-closed label sets, root left out, as float64."""
    if t.is_ids and p.is_ids and taxonomy.is_tree:
        # On a tree anc(a) ∩ anc(b) = anc(lca(a, b)), and |anc(n)| without the root is depth(n).
        d = taxonomy.depth
        lca = np.asarray(taxonomy.lca(t.ids, p.ids))
        return d[lca].astype(np.float64), d[p.ids].astype(np.float64), d[t.ids].astype(np.float64)
    ts, ps = t.as_sets(taxonomy), p.as_sets(taxonomy)
    troot = ts[:, 0].toarray().ravel()
    proot = ps[:, 0].toarray().ravel()
    inter = ts.multiply(ps).getnnz(axis=1) - (troot & proot)
    return (
        inter.astype(np.float64),
        (ps.getnnz(axis=1) - proot).astype(np.float64),
        (ts.getnnz(axis=1) - troot).astype(np.float64),
    )


def hierarchical_counts(
    y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, include_root: bool = False, close: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample ``(|Ŷ ∩ Y|, |Ŷ|, |Y|)`` of the ancestor-closed sets, float64 arrays ``[B]``.

    Samples whose ``y_true`` is ``-1`` are dropped.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> [c.tolist() for c in hierarchical_counts(["x", "x"], ["y", "b"], taxonomy=tax)]
        [[1.0, 0.0], [2.0, 1.0], [2.0, 2.0]]
    """
    t, p, _ = prepare_pair(y_true, y_pred, taxonomy, close=close)
    inter, npred, ntrue = root_free_counts(t, p, taxonomy)
    extra = 1.0 if include_root else 0.0
    return inter + extra, npred + extra, ntrue + extra


def node_confusion(t: Labels, p: Labels, taxonomy: Taxonomy, w: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """Weighted per-node ``(tp, fp, fn)`` float64 vectors ``[N]`` of closed sets (internal helper, public for reuse)."""
    n = taxonomy.num_nodes
    if t.is_ids and p.is_ids and taxonomy.is_tree:
        # Node j is a true positive of sample b iff j is an ancestor of lca(t_b, p_b): count samples per
        # lca / target / prediction once, then push the counts up to every ancestor with one product.
        anc = ancestors_int32(taxonomy).astype(np.float64)
        lca = np.asarray(taxonomy.lca(t.ids, p.ids))
        per_true = np.bincount(t.ids, weights=w, minlength=n)
        per_pred = np.bincount(p.ids, weights=w, minlength=n)
        per_lca = np.bincount(lca, weights=w, minlength=n)
        tp = anc.T @ per_lca
        return tp, anc.T @ per_pred - tp, anc.T @ per_true - tp
    ts, ps = t.as_sets(taxonomy), p.as_sets(taxonomy)
    both = ts.multiply(ps).tocsr()
    if w is None:
        tp = np.asarray(both.sum(axis=0), dtype=np.float64).ravel()
        pos_t = np.asarray(ts.sum(axis=0), dtype=np.float64).ravel()
        pos_p = np.asarray(ps.sum(axis=0), dtype=np.float64).ravel()
    else:
        tp = np.asarray(both.T.astype(np.float64) @ w).ravel()
        pos_t = np.asarray(ts.T.astype(np.float64) @ w).ravel()
        pos_p = np.asarray(ps.T.astype(np.float64) @ w).ravel()
    return tp, pos_p - tp, pos_t - tp


def fbeta_from_counts(
    inter: Any, ntrue: Any, npred: Any, beta2: float, zero_division: Any, what: str, *, warn: bool = True
) -> Any:
    """``(1 + β²) |T ∩ P| / (β² |T| + |P|)`` elementwise, ``zero_division`` where the denominator is 0."""
    inter, ntrue, npred = (np.asarray(x, dtype=np.float64) for x in (inter, ntrue, npred))
    return safe_divide((1.0 + beta2) * inter, beta2 * ntrue + npred, zero_division, what, warn=warn)


def macro_mean(values: np.ndarray) -> float:
    """Mean of the non-NaN entries (NaN when none)."""
    # zero_division=nan marks undefined labels to leave out of the mean (scikit-learn >= 1.4 semantics).
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else float("nan")


def weighted_mean(values: np.ndarray, weights: np.ndarray, zero_division: Any) -> float:
    """Support-weighted mean of the non-NaN entries (scikit-learn's ``average="weighted"``); ``zero_division``
    (``"warn"``: 0) when no weight is left."""
    keep = ~np.isnan(values)
    w = weights[keep]
    if w.sum() == 0:
        return 0.0 if zero_division == "warn" else float(zero_division)
    return float(values[keep] @ w / w.sum())


WARN_FOR = ("precision", "recall", "f-score")
"""The metrics that warn when undefined, by default (scikit-learn's ``warn_for``)."""


def reduce_node_counts(
    tp: np.ndarray,
    fp: np.ndarray,
    fn: np.ndarray,
    beta2: float,
    average: str | None,
    zero_division: Any,
    warn_for: Any = WARN_FOR,
    what: str = "node",
) -> tuple[Any, Any, Any, Any]:
    """``(precision, recall, F-beta, support)`` of per-node counts (already restricted to the nodes to score).

    ``average``: ``None`` (arrays), ``"micro"`` (pooled counts), ``"macro"`` (mean over nodes) or
    ``"weighted"`` (mean weighted by the support ``tp + fn``). Each metric named in ``warn_for`` that is undefined
    (a 0/0 that reaches the result) gives one :class:`UndefinedMetricWarning` under ``zero_division="warn"``.
    """
    support = tp + fn
    zd = zero_division
    if average == "micro":
        tp, fp, fn = tp.sum(), fp.sum(), fn.sum()
    prec, zp = divide(tp, tp + fp, zd)
    rec, zr = divide(tp, tp + fn, zd)
    f, zf = divide((1.0 + beta2) * np.asarray(tp, dtype=np.float64), beta2 * (tp + fn) + tp + fp, zd)
    zeros = (zp, zr, zf)
    if average != "weighted":
        undefined = [bool(np.any(z)) for z in zeros]
        if average == "macro":
            prec, rec, f = (macro_mean(np.atleast_1d(v)) for v in (prec, rec, f))
        elif average is None:
            prec, rec, f = (np.atleast_1d(v) for v in (prec, rec, f))
    else:  # weighted: a 0/0 of a node without support has no weight
        w = np.asarray(support, dtype=np.float64)
        undefined = [bool((np.atleast_1d(z) & (w > 0)).any()) or w.sum() == 0 for z in zeros]
        prec, rec, f = (weighted_mean(np.atleast_1d(v), w, zd) for v in (prec, rec, f))
    for name, und in zip(WARN_FOR, undefined, strict=True):
        if und and name in warn_for:
            warn_undefined(f"{average or 'per-' + what} {what} {name}", zd)
    return prec, rec, f, (np.atleast_1d(support) if average is None else float(np.sum(support)))


def present_mask(mask: np.ndarray, labels: Any, tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """With ``labels="present"``, keep only the nodes that are true or predicted somewhere."""
    if isinstance(labels, str) and labels == "present":
        return mask & ((tp + fp + fn) > 0)
    return mask


def labels_mask(labels: Any, taxonomy: Taxonomy, include_root: bool) -> np.ndarray:
    """Boolean ``[N]`` mask of the nodes a macro average runs over (``labels``: ids, names, ``"present"`` or None)."""
    if labels is None or (isinstance(labels, str) and labels == "present"):
        mask = np.ones(taxonomy.num_nodes, dtype=bool)
        mask[0] = include_root
        return mask
    mask = np.zeros(taxonomy.num_nodes, dtype=bool)
    mask[node_id_array(labels, taxonomy, name="labels")] = True
    return mask


def hierarchical_precision_recall_fscore(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    beta: float = 1.0,
    average: Average = "micro",
    include_root: bool = False,
    sample_weight: Any = None,
    zero_division: Any = "warn",
    labels: Any = None,
    close: bool = True,
    warn_for: Any = WARN_FOR,
) -> tuple[float, float, float]:
    """Hierarchical precision, recall and F-beta in one pass (see the module docstring for the averages).

    Args:
        y_true: node ids ``[B]`` (``-1`` = ignore the sample), names, collections of ids/names per sample
            (multi-label), or 0/1 node sets ``[B, N]`` (numpy, torch or scipy sparse).
        y_pred: the same forms (no ``-1``).
        taxonomy: the taxonomy both refer to.
        beta: weight of recall in the F score.
        average: ``"micro"``, ``"samples"``, ``"macro"`` or ``"weighted"`` (the node means of ``"macro"``
            weighted by each node's support, the number of samples whose true set holds it, as scikit-learn).
        include_root: count the root as a member of every set.
        sample_weight: optional non-negative weight per sample.
        zero_division: value of a 0/0 ratio: ``"warn"`` (0 with a warning), ``0.0``, ``1.0`` or ``nan`` (for
            ``"macro"``: leave the node out of the mean).
        labels: for ``"macro"`` and ``"weighted"``, the nodes to average over: ids or names, ``None`` (every
            node, minus the root unless ``include_root``) or ``"present"`` (those true or predicted at least once,
            as scikit-learn's multiclass default).
        close: add missing ancestors to node sets (the default; ``False`` scores raw sets as given).
        warn_for: the metrics (``"precision"``, ``"recall"``, ``"f-score"``) that warn when undefined, one
            :class:`UndefinedMetricWarning` each per call (the single-score functions warn for their own).

    Returns:
        ``(hP, hR, hF_beta)`` as floats.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> # x vs y share {a} of {a, x} / {a, y}; x vs its parent a share {a}: hP = 2 / 3, hR = 2 / 4
        >>> hierarchical_precision_recall_fscore(["x", "x"], ["y", "a"], taxonomy=tax)
        (0.6666666666666666, 0.5, 0.5714285714285714)
    """
    check_choice(average, ("micro", "macro", "weighted", "samples"), "average")
    beta2 = check_beta(beta) ** 2
    zero_division = check_zero_division(zero_division)
    if labels is not None and average not in ("macro", "weighted"):
        raise ValueError("labels is only used with average='macro' or 'weighted'")
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight, close=close)
    nonempty(t)
    nodes = average in ("macro", "weighted")
    sums = hierarchical_sums(t, p, taxonomy, w, beta2, include_root, zero_division, average == "samples", nodes)
    if average == "samples" and sums["total"] == 0:
        raise ValueError("sample_weight sums to 0")
    mask = labels_mask(labels, taxonomy, include_root)
    return hierarchical_scores(sums, average, beta2, zero_division, mask, labels, include_root, warn_for)


def hierarchical_sums(
    t: Labels,
    p: Labels,
    taxonomy: Taxonomy,
    w: np.ndarray | None,
    beta2: float,
    include_root: bool,
    zero_division: Any,
    per_sample: bool,
    nodes: bool,
) -> dict[str, Any]:
    """The weighted sums every average of :func:`hierarchical_precision_recall_fscore` is computed from (the states
    of :class:`~hiercls.metrics.HierarchicalFBeta`): the counts ``inter``, ``npred``, ``ntrue`` and ``total``; with
    ``per_sample`` (``"samples"``) the sums of the per-sample ratios ``sum_p``, ``sum_r``, ``sum_f`` and how many
    were 0/0 (``undefined_*``); with ``nodes`` (``"macro"``, ``"weighted"``) the per-node ``tp``, ``fp``, ``fn``."""
    inter, npred, ntrue = (x + float(include_root) for x in root_free_counts(t, p, taxonomy))
    out = {"inter": weighted_sum(inter, w), "npred": weighted_sum(npred, w), "ntrue": weighted_sum(ntrue, w)}
    out["total"] = weight_total(len(t), w)
    if per_sample:
        ratios = [
            divide(inter, npred, zero_division),
            divide(inter, ntrue, zero_division),
            divide((1.0 + beta2) * inter, beta2 * ntrue + npred, zero_division),
        ]
        for key, (ratio, zero) in zip("prf", ratios, strict=True):
            out[f"sum_{key}"], out[f"undefined_{key}"] = weighted_sum(ratio, w), float(zero.sum())
    if nodes:
        out.update(zip(("tp", "fp", "fn"), node_confusion(t, p, taxonomy, w), strict=True))
    return out


def hierarchical_scores(
    s: Mapping[str, Any],
    average: str,
    beta2: float,
    zero_division: Any,
    mask: np.ndarray,
    labels: Any,
    include_root: bool,
    warn_for: Any = WARN_FOR,
) -> tuple[float, float, float]:
    """``(hP, hR, hF_beta)`` of :func:`hierarchical_sums` (or the summed states of a stateful metric).

    Each score named in ``warn_for`` that is undefined gives one :class:`UndefinedMetricWarning` under
    ``zero_division="warn"``; ``"samples"`` over no weight is NaN.
    """
    zd, warn = zero_division, [name in warn_for for name in WARN_FOR]
    if average == "micro":
        return (
            safe_divide(s["inter"], s["npred"], zd, "hierarchical precision with no predicted node", warn=warn[0]),
            safe_divide(s["inter"], s["ntrue"], zd, "hierarchical recall with no true node", warn=warn[1]),
            fbeta_from_counts(
                s["inter"], s["ntrue"], s["npred"], beta2, zd, "hierarchical F with no node", warn=warn[2]
            ),
        )
    if average == "samples":
        total = float(s["total"])
        for key, what, on in zip("prf", ("precision", "recall", "F"), warn, strict=True):
            if on and total and float(s[f"undefined_{key}"]) > 0:
                warn_undefined(f"per-sample hierarchical {what}", zd)
        return tuple(float(s[f"sum_{key}"]) / total if total else math.nan for key in "prf")
    tp, fp, fn = (np.array(s[key], dtype=np.float64) for key in ("tp", "fp", "fn"))
    if include_root:  # the root belongs to every set, true and predicted
        tp[0], fp[0], fn[0] = s["total"], 0.0, 0.0
    mask = present_mask(mask, labels, tp, fp, fn)
    prec, rec, f, _ = reduce_node_counts(
        tp[mask], fp[mask], fn[mask], beta2, average, zd, warn_for, "hierarchical node"
    )
    return prec, rec, f


def hierarchical_fbeta_score(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    beta: float = 1.0,
    average: Average = "micro",
    include_root: bool = False,
    sample_weight: Any = None,
    zero_division: Any = "warn",
    labels: Any = None,
    close: bool = True,
) -> float:
    """Hierarchical F-beta; arguments as :func:`hierarchical_precision_recall_fscore`.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> hierarchical_fbeta_score(["x"], ["y"], taxonomy=tax)
        0.5
        >>> hierarchical_fbeta_score(["x"], ["y"], taxonomy=tax, include_root=True)  # {r, a} of 3 each
        0.6666666666666666
    """
    return hierarchical_precision_recall_fscore(**locals(), warn_for=("f-score",))[2]  # its own arguments


def hierarchical_f1_score(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    average: Average = "micro",
    include_root: bool = False,
    sample_weight: Any = None,
    zero_division: Any = "warn",
    labels: Any = None,
    close: bool = True,
) -> float:
    """Hierarchical F1 (:func:`hierarchical_fbeta_score` with ``beta=1``).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> hierarchical_f1_score(["x", "b"], ["x", "b"], taxonomy=tax)
        1.0
    """
    return hierarchical_precision_recall_fscore(**locals(), warn_for=("f-score",))[2]  # its own arguments


def hierarchical_precision_score(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    average: Average = "micro",
    include_root: bool = False,
    sample_weight: Any = None,
    zero_division: Any = "warn",
    labels: Any = None,
    close: bool = True,
) -> float:
    """Hierarchical precision; arguments as :func:`hierarchical_precision_recall_fscore`.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> hierarchical_precision_score(["x"], ["a"], taxonomy=tax)  # predicting the parent is never wrong
        1.0
    """
    return hierarchical_precision_recall_fscore(**locals(), warn_for=("precision",))[0]  # its own arguments


def hierarchical_recall_score(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    average: Average = "micro",
    include_root: bool = False,
    sample_weight: Any = None,
    zero_division: Any = "warn",
    labels: Any = None,
    close: bool = True,
) -> float:
    """Hierarchical recall; arguments as :func:`hierarchical_precision_recall_fscore`.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> hierarchical_recall_score(["x"], ["a"], taxonomy=tax)
        0.5
    """
    return hierarchical_precision_recall_fscore(**locals(), warn_for=("recall",))[1]  # its own arguments


def _path_name_sets(y: Any, name: str) -> list[set[str]]:
    arr = to_numpy(y, passthrough=True)
    rows = arr.tolist() if isinstance(arr, np.ndarray) else list(arr)
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, dict | set):
            raise TypeError(f"{name}[{i}] must be a label path (a sequence of level names); got {row!r}")
        if not isinstance(row, list | tuple):
            row = [row]  # 1-D input, one label per sample: a one-node path, as hiclass reads it
        labels = set()
        for v in row:
            # A label path may itself be a list of paths (hiclass multi-label, 3-D input).
            if isinstance(v, list | tuple):
                labels.update(str(x) for x in v if x not in ("", None))
            elif v not in ("", None):
                labels.add(str(v))
        out.append(labels)
    return out


def hiclass_precision_recall_fscore(
    y_true: Any,
    y_pred: Any,
    *,
    beta: float = 1.0,
    average: Literal["micro", "macro"] = "micro",
    zero_division: Any = "warn",
) -> tuple[float, float, float]:
    """hiclass-compatible scores: compare the *name sets* of label paths, with no taxonomy.

    hiclass (Miranda et al. 2023) represents a label as its path of level names (``["animal", "cat"]``,
    ``""`` padding) and scores the sets of those names; ``average="macro"`` there is the per-sample mean
    (this library's ``average="samples"``). Two different nodes with the same name (``"other"`` under two
    parents) count as the same label here, unlike :func:`hierarchical_precision_recall_fscore`, which compares
    nodes by identity.

    Micro hF is hiclass's harmonic mean of the micro hP and hR, so when no predicted label is right at all
    (``hP = hR = 0``) it is ``zero_division``, as in hiclass, not 0.

    Args:
        y_true: ``[B, L]`` label paths (or ``[B, k, L]`` for several paths per sample, or ``[B]`` with one
            label per sample, read as one-node paths as hiclass does).
        y_pred: the same.
        beta: weight of recall.
        average: ``"micro"`` (dataset sums) or ``"macro"`` (hiclass's per-sample mean).
        zero_division: value of a 0/0 ratio (see :func:`hierarchical_precision_recall_fscore`).

    Example:
        >>> hiclass_precision_recall_fscore([["animal", "cat"]], [["animal", "dog"]])
        (0.5, 0.5, 0.5)
    """
    check_choice(average, ("micro", "macro"), "average")
    beta2 = check_beta(beta) ** 2
    zero_division = check_zero_division(zero_division)
    ts, ps = _path_name_sets(y_true, "y_true"), _path_name_sets(y_pred, "y_pred")
    if len(ts) != len(ps):
        raise ValueError(f"y_true has {len(ts)} samples but y_pred has {len(ps)}")
    if not ts:
        raise ValueError("no samples to score")
    inter = np.array([len(a & b) for a, b in zip(ts, ps, strict=True)], dtype=np.float64)
    ntrue = np.array([len(a) for a in ts], dtype=np.float64)
    npred = np.array([len(b) for b in ps], dtype=np.float64)
    if average == "micro":
        inter, ntrue, npred = inter.sum(), ntrue.sum(), npred.sum()
    # hiclass computes F from precision and recall (per sample for "macro", then averaged), never from the
    # counts: hP = hR = 0 is then a 0/0 that takes zero_division.
    pr, rc = (
        safe_divide(inter, npred, zero_division, "hiclass precision"),
        safe_divide(inter, ntrue, zero_division, "hiclass recall"),
    )
    f = np.mean(safe_divide((1 + beta2) * np.asarray(pr) * rc, beta2 * np.asarray(pr) + rc, zero_division, "hiclass F"))
    return float(np.mean(pr)), float(np.mean(rc)), float(f)

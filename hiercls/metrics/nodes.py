"""Node-level metrics: each node is a binary label of the (ancestor-closed) node sets.

This is the evaluation convention of hierarchical text classification (HTC; e.g. Zhou et al. 2020 HiAGM,
Wang et al. 2022 HPT, Zhu et al. 2023 HiTIN): Micro-F1 pools ``tp/fp/fn`` over all nodes, Macro-F1
averages the per-node F1. The path-aware variants of Yu et al. 2022 ("Constrained Sequence-to-Tree
Generation for Hierarchical Text Classification", SIGIR) score *raw* predicted sets, where a node may be
predicted without its parent:

* P-F1 (:func:`path_constrained_f1_score`): a predicted node is a true positive only if it is a true label
  *and its whole path* (every ancestor but the root) is predicted too; otherwise it is a false positive.
* C-F1 (:func:`constrained_f1_score`): predictions are first made consistent top-down (a node is kept only
  if every ancestor is predicted, the "constrained output"), and then scored with the usual F1; unlike
  P-F1, a dropped inconsistent node costs recall but not precision.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from hiercls._checks import check_beta, check_choice
from hiercls.metrics._validation import Labels, check_zero_division, nonempty, prepare_pair, weight_total
from hiercls.metrics.hierarchical import (
    WARN_FOR,
    labels_mask,
    node_confusion,
    present_mask,
    reduce_node_counts,
)
from hiercls.taxonomy import Taxonomy

__all__ = [
    "consistent_subsets",
    "constrained_counts",
    "constrained_f1_score",
    "exact_match_score",
    "hamming_loss",
    "node_f1_score",
    "node_precision_recall_fscore_support",
    "path_constrained_f1_score",
]

NodeAverage = Literal["micro", "macro", "weighted"] | None


def node_precision_recall_fscore_support(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    beta: float = 1.0,
    average: NodeAverage = None,
    labels: Any = None,
    include_root: bool = False,
    sample_weight: Any = None,
    zero_division: Any = "warn",
    close: bool = True,
    warn_for: Any = WARN_FOR,
) -> tuple[Any, Any, Any, Any]:
    """Per-node precision, recall, F-beta and support over the node sets (scikit-learn's multilabel form).

    Args:
        y_true: labels (ids, names, per-sample collections or ``[B, N]`` sets; ``-1`` ids are ignored).
        y_pred: labels in the same forms.
        taxonomy: the taxonomy.
        beta: weight of recall.
        average: ``None`` (per-node arrays, in the order of ``labels``), ``"micro"``, ``"macro"`` or
            ``"weighted"`` (the per-node values weighted by their support, as scikit-learn).
        labels: nodes to score: ids or names, ``None`` (every node but the root; with it if ``include_root``)
            or ``"present"`` (the nodes true or predicted at least once: scikit-learn's multiclass default).
        include_root: score the root too (always a true positive of non-empty sets).
        sample_weight: optional weight per sample.
        zero_division: the zero-support rule: value of 0/0 (``"warn"`` = 0 with a warning, ``0.0``, ``1.0``,
            or ``nan`` to leave such nodes out of the macro mean). As in scikit-learn, F is 0/0 only for a
            node that is neither true nor predicted anywhere.
        close: close the sets under ancestors first (``False`` scores raw thresholded predictions, as
            HTC papers do).
        warn_for: the metrics (``"precision"``, ``"recall"``, ``"f-score"``) that warn when undefined, one
            :class:`UndefinedMetricWarning` each per call.

    Returns:
        ``(precision, recall, fbeta, support)``: floats for an average, arrays for ``average=None``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p, r, f, s = node_precision_recall_fscore_support(["x", "b"], ["y", "b"], taxonomy=tax,
        ...                                                   zero_division=0.0)
        >>> f.tolist(), s.tolist()  # nodes a, x, y, b
        ([1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 1.0])
    """
    check_choice(average, (None, "micro", "macro", "weighted"), "average")
    beta2 = check_beta(beta) ** 2
    zero_division = check_zero_division(zero_division)
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight, close=close)
    tp, fp, fn = node_confusion(t, p, taxonomy, w)
    mask = present_mask(labels_mask(labels, taxonomy, include_root), labels, tp, fp, fn)
    return reduce_node_counts(tp[mask], fp[mask], fn[mask], beta2, average, zero_division, warn_for)


def node_f1_score(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    average: NodeAverage = "micro",
    labels: Any = None,
    include_root: bool = False,
    sample_weight: Any = None,
    zero_division: Any = "warn",
    close: bool = True,
) -> Any:
    """Micro- or Macro-F1 over nodes (the HTC Micro-F1 / Macro-F1); see :func:`node_precision_recall_fscore_support`.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> node_f1_score(["x", "b"], ["y", "b"], taxonomy=tax)  # tp = a, b; fp = y; fn = x
        0.6666666666666666
        >>> node_f1_score(["x", "b"], ["y", "b"], taxonomy=tax, average="macro", zero_division=0.0)
        0.5
    """
    return node_precision_recall_fscore_support(**locals(), warn_for=("f-score",))[2]  # its own arguments


def hamming_loss(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    labels: Any = None,
    include_root: bool = False,
    sample_weight: Any = None,
    close: bool = True,
) -> float:
    """Fraction of (sample, node) pairs on which the node sets disagree (scikit-learn's Hamming loss on nodes).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> hamming_loss(["x"], ["y"], taxonomy=tax)  # x and y differ, of 4 non-root nodes
        0.5
    """
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight, close=close)
    nonempty(t)
    tp, fp, fn = node_confusion(t, p, taxonomy, w)
    mask = labels_mask(labels, taxonomy, include_root)
    total = float(len(t) if w is None else w.sum())
    if include_root:
        fp, fn = fp.copy(), fn.copy()
        fp[0] = fn[0] = 0.0  # the root is in every set
    mask = present_mask(mask, labels, tp, fp, fn)
    return float((fp[mask].sum() + fn[mask].sum()) / (total * mask.sum()))


def exact_match_score(
    y_true: Any, y_pred: Any, *, taxonomy: Taxonomy, sample_weight: Any = None, close: bool = True
) -> float:
    """Subset accuracy: the fraction of samples whose node sets (root aside) are equal.

    For single node ids this is plain accuracy.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> exact_match_score([["x", "b"], ["y"]], [["b", "x"], ["a"]], taxonomy=tax)
        0.5
    """
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight, close=close)
    nonempty(t)
    equal = exact_matches(t, p, taxonomy)
    return float((equal.sum() if w is None else equal @ w) / weight_total(len(t), w))


def exact_matches(t: Labels, p: Labels, taxonomy: Taxonomy) -> np.ndarray:
    """Per sample: whether the two node sets (root aside) are equal."""
    if t.is_ids and p.is_ids:
        return t.ids == p.ids
    ts, ps = t.as_sets(taxonomy)[:, 1:], p.as_sets(taxonomy)[:, 1:]
    return (ts != ps).getnnz(axis=1) == 0


def consistent_subsets(sets: sp.csr_matrix, taxonomy: Taxonomy) -> sp.csr_matrix:
    """Keep only the nodes of each row whose every ancestor (root aside, all parents of a DAG) is in the row.

    The result is ancestor-closed (modulo the root): an ancestor of a kept node has its own ancestors in the row.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> raw = sp.csr_matrix(np.array([[0, 1, 1, 0, 0], [0, 0, 1, 0, 1]], dtype=bool))  # {a, x}, {x, b}
        >>> consistent_subsets(raw, tax).toarray().astype(int).tolist()
        [[0, 1, 1, 0, 0], [0, 0, 0, 0, 1]]
    """
    sets = sp.csr_matrix(sets, dtype=bool)
    sets.sort_indices()
    n = taxonomy.num_nodes
    rows = np.repeat(np.arange(sets.shape[0], dtype=np.int64), np.diff(sets.indptr))
    cols = sets.indices.astype(np.int64)
    keys = rows * n + cols  # sorted, since rows are and indices within a row are
    anc = taxonomy.ancestors_sparse
    counts = np.diff(anc.indptr)[cols]
    # Every (member, ancestor) pair, looked up among the row's members by key.
    pair_member = np.repeat(np.arange(len(cols)), counts)
    starts = anc.indptr[cols]
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    pair_anc = anc.indices[np.repeat(starts, counts) + offsets].astype(np.int64)
    pair_keys = rows[pair_member] * n + pair_anc
    pos = np.searchsorted(keys, pair_keys)
    found = (pos < len(keys)) & (keys[np.minimum(pos, len(keys) - 1)] == pair_keys)
    found |= pair_anc == 0
    missing = np.bincount(pair_member, weights=~found, minlength=len(cols))
    keep = missing == 0
    out = sp.csr_matrix((np.ones(int(keep.sum()), dtype=bool), (rows[keep], cols[keep])), shape=sets.shape)
    out.sort_indices()
    return out


def _column_sums(m: sp.csr_matrix, w: np.ndarray | None) -> np.ndarray:
    m = m.astype(np.float64)
    return np.asarray(m.sum(axis=0)).ravel() if w is None else np.asarray(m.T @ w).ravel()


def constrained_counts(
    ts: sp.csr_matrix, ps: sp.csr_matrix, taxonomy: Taxonomy, w: np.ndarray | None
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per-node ``(tp, fp, fn)`` of C-F1 (``"C"``) and P-F1 (``"P"``) from closed true sets and *raw* predicted sets.

    The one counting behind :func:`constrained_f1_score`, :func:`path_constrained_f1_score` and the stateful
    :class:`~hiercls.metrics.ConstrainedF1`.
    """
    consistent = consistent_subsets(ps, taxonomy)
    # P-F1: a predicted node is a true positive only if it is true and its whole path is predicted.
    good = consistent.multiply(ts)
    p_tp = _column_sums(good, w)
    p_fp = _column_sums(ps, w) - p_tp
    p_fn = _column_sums(ts, w) - p_tp
    # C-F1: the inconsistent predictions are dropped first, then the usual node counts.
    n = taxonomy.num_nodes
    c_tp, c_fp, c_fn = node_confusion(Labels(None, ts, n), Labels(None, consistent, n), taxonomy, w)
    return {"C": (c_tp, c_fp, c_fn), "P": (p_tp, p_fp, p_fn)}


def path_constrained_f1_score(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    average: Literal["micro", "macro", "weighted"] = "micro",
    labels: Any = None,
    sample_weight: Any = None,
    zero_division: Any = "warn",
) -> float:
    """P-Micro-F1 / P-Macro-F1 of Yu et al. (SIGIR 2022): a node counts only if its whole path is predicted.

    ``y_true`` is closed under ancestors; ``y_pred`` is scored as given (raw, e.g. thresholded sigmoids).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> # truth {a, x}; prediction {x} without its parent a: x is a false positive, a and x are missed
        >>> path_constrained_f1_score([["x"]], [["x"]], taxonomy=tax, zero_division=0.0)
        0.0
    """
    return _constrained_f1("P", **locals())


def constrained_f1_score(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    average: Literal["micro", "macro", "weighted"] = "micro",
    labels: Any = None,
    sample_weight: Any = None,
    zero_division: Any = "warn",
) -> float:
    """C-F1: the node F1 after dropping every predicted node whose path is not fully predicted.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> # truth {a, x} and {b}; predictions {a, y} and {x}: y survives (fp), x is dropped (no fp)
        >>> constrained_f1_score([["x"], ["b"]], [["a", "y"], ["x"]], taxonomy=tax)  # tp=1 (a), fp=1, fn=2
        0.4
    """
    return _constrained_f1("C", **locals())


def _constrained_f1(
    kind: str,
    y_true: Any,
    y_pred: Any,
    taxonomy: Taxonomy,
    average: str,
    labels: Any,
    sample_weight: Any,
    zero_division: Any,
) -> float:
    """C-F1 (``kind="C"``) or P-F1 (``"P"``) with the arguments of the score functions."""
    check_choice(average, ("micro", "macro", "weighted"), "average")
    zero_division = check_zero_division(zero_division)
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight, close=True, close_pred=False)
    tp, fp, fn = constrained_counts(t.as_sets(taxonomy), p.as_sets(taxonomy), taxonomy, w)[kind]
    mask = present_mask(labels_mask(labels, taxonomy, False), labels, tp, fp, fn)
    return reduce_node_counts(tp[mask], fp[mask], fn[mask], 1.0, average, zero_division, ("f-score",))[2]

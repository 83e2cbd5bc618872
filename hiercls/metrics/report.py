"""One-call metric report: :func:`hierarchical_report` (the stateful :class:`HierarchicalMetrics` on one batch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hiercls.metrics._validation import to_labels
from hiercls.metrics.stateful import HierarchicalMetrics
from hiercls.taxonomy import Taxonomy

__all__ = ["hierarchical_report"]


def hierarchical_report(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    scores: Any = None,
    k: Iterable[int] = (1, 5),
    distance: str = "lca_height",
    include_root: bool = False,
    multilabel: bool | None = None,
    sample_weight: Any = None,
    zero_division: Any = 0.0,
    candidates: Any = None,
) -> dict[str, Any]:
    """Every standard metric in one flat dict (the keys of :class:`~hiercls.metrics.HierarchicalMetrics`).

    Args:
        y_true: node ids or names ``[B]`` (``-1`` ignored), or node sets for multi-label data.
        y_pred: predictions in the same form.
        taxonomy: the taxonomy.
        scores: optional ``[B, num_leaves | N]`` scores for top-k accuracy and hdist@k.
        k: the top-k values.
        distance: distance of the mistake severity and hdist@k (default the LCA height).
        include_root: root convention of hP/hR/hF1 and the node metrics.
        multilabel: leave out the metrics between two single nodes; default: ``True`` iff the labels are sets.
        sample_weight: optional weight per sample.
        zero_division: 0/0 rule (default 0.0).
        candidates: candidate nodes of the score columns.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> r = hierarchical_report(["x", "y", "b"], ["x", "x", "a"], taxonomy=tax, k=())
        >>> r["accuracy"], r["hF1_micro"], r["per_level_accuracy"], r["mistake_severity"]
        (0.3333333333333333, 0.6, [0.6666666666666666, 0.5], 1.5)
    """
    if multilabel is None:
        multilabel = not (
            to_labels(y_true, taxonomy, name="y_true", allow_ignore=True).is_ids
            and to_labels(y_pred, taxonomy, name="y_pred").is_ids
        )
    metrics = HierarchicalMetrics(
        taxonomy,
        k=tuple(k) if scores is not None else (),
        distance=distance,
        include_root=include_root,
        multilabel=multilabel,
        zero_division=zero_division,
        candidates=candidates,
        sync_on_compute=False,
    )
    metrics.update(y_true, y_pred, scores=scores, sample_weight=sample_weight)
    return metrics.compute()

"""One-call metric report: :func:`hierarchical_report`, as text (scikit-learn's ``classification_report`` form) or
as the flat dict of the stateful :class:`HierarchicalMetrics` on one batch."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from hiercls.metrics._validation import prepare_pair, renamed_keyword
from hiercls.metrics.distance import per_level_counts
from hiercls.metrics.nodes import node_precision_recall_fscore_support
from hiercls.metrics.stateful import HierarchicalMetrics
from hiercls.taxonomy import Taxonomy

__all__ = ["hierarchical_report"]


@renamed_keyword("scores", "y_score")
def hierarchical_report(
    y_true: Any,
    y_pred: Any,
    *,
    taxonomy: Taxonomy,
    y_score: Any = None,
    k: Iterable[int] = (1, 5),
    distance: str = "lca_height",
    include_root: bool = False,
    multilabel: bool | None = None,
    sample_weight: Any = None,
    zero_division: Any = 0.0,
    candidates: Any = None,
    output_dict: bool = False,
    digits: int = 2,
) -> str | dict[str, Any]:
    """Every standard metric in one call: a ``classification_report``-style text, or a flat dict.

    The text has one row per depth level (precision = right at the level among the samples whose prediction
    reaches it, recall = the same among those whose truth reaches it, support = how many truths reach it), the
    hierarchical micro and per-sample averages and the node macro and support-weighted averages (precision,
    recall, F1, support = samples; nodes for the node averages: their summed support), then the accuracy and,
    for single-node labels, the mistake severity (support = the number of mistakes) and the top-k metrics of
    ``y_score``. The dict (``output_dict=True``) is the result of :class:`~hiercls.metrics.HierarchicalMetrics`
    (``per_level_support`` among its keys).

    Args:
        y_true: node ids or names ``[B]`` (``-1`` ignored), or node sets for multi-label data.
        y_pred: predictions in the same form.
        taxonomy: the taxonomy.
        y_score: optional ``[B, num_leaves | N]`` scores for top-k accuracy and hdist@k (``scores=`` is the
            deprecated name).
        k: the top-k values.
        distance: distance of the mistake severity and hdist@k (default the LCA height).
        include_root: root convention of hP/hR/hF1 and the node metrics.
        multilabel: leave out the metrics between two single nodes; default: ``True`` iff the labels are sets.
        sample_weight: optional weight per sample (supports are then weighted sums).
        zero_division: 0/0 rule (default 0.0).
        candidates: candidate nodes of the score columns.
        output_dict: return the dict instead of the text.
        digits: decimals of the text.

    Raises:
        ValueError: no sample to score (empty input, or every ``y_true`` is ``-1``).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> r = hierarchical_report(["x", "y", "b"], ["x", "x", "a"], taxonomy=tax, k=(), output_dict=True)
        >>> r["accuracy"], r["hF1_micro"], r["per_level_accuracy"], r["per_level_support"], r["mistake_severity"]
        (0.3333333333333333, 0.6, [0.6666666666666666, 0.5], [3.0, 2.0], 1.5)
        >>> print(hierarchical_report(["x", "y", "b"], ["x", "x", "a"], taxonomy=tax, k=()))
                             precision    recall  f1-score   support
        <BLANKLINE>
                     level 1      0.67      0.67      0.67         3
                     level 2      0.50      0.50      0.50         2
        <BLANKLINE>
          hierarchical micro      0.60      0.60      0.60         3
        hierarchical samples      0.50      0.50      0.50         3
                  node macro      0.29      0.50      0.37         5
               node weighted      0.37      0.60      0.45         5
        <BLANKLINE>
                    accuracy                          0.33         3
            mistake severity                          1.50         2
    """
    t, p, w = prepare_pair(y_true, y_pred, taxonomy, sample_weight)
    if len(t) == 0:
        raise ValueError("hierarchical_report: no samples to score (empty input, or every y_true is -1)")
    if multilabel is None:
        multilabel = not (t.is_ids and p.is_ids)
    metrics = HierarchicalMetrics(
        taxonomy,
        k=tuple(k) if y_score is not None else (),
        distance=distance,
        include_root=include_root,
        multilabel=multilabel,
        zero_division=zero_division,
        candidates=candidates,
        sync_on_compute=False,
    )
    metrics.update(y_pred, y_true, y_score=y_score, sample_weight=sample_weight)
    out = metrics.results()
    if output_dict:
        return out
    total = float(len(t) if w is None else w.sum())
    correct, _, true_valid = per_level_counts(t, p, taxonomy, w, "depth")
    _, _, pred_valid = per_level_counts(p, t, taxonomy, w, "depth")  # the third sum counts its first argument
    rows: list[list[tuple[str, list[float | None], float]]] = []
    levels = []
    for i in range(len(correct)):
        pr = correct[i] / pred_valid[i] if pred_valid[i] else float(zero_division)
        rc = correct[i] / true_valid[i] if true_valid[i] else float(zero_division)
        f1 = 2 * pr * rc / (pr + rc) if pr + rc > 0 else 0.0
        levels.append((f"level {i + 1}", [pr, rc, f1], float(true_valid[i])))
    rows.append(levels)
    averages = [
        ("hierarchical micro", [out["hP_micro"], out["hR_micro"], out["hF1_micro"]], total),
        ("hierarchical samples", [out["hP_samples"], out["hR_samples"], out["hF1_samples"]], total),
    ]
    for average in ("macro", "weighted"):
        pr, rc, f1, support = node_precision_recall_fscore_support(
            y_true,
            y_pred,
            taxonomy=taxonomy,
            average=average,
            labels="present",
            include_root=include_root,
            sample_weight=sample_weight,
            zero_division=zero_division,
        )
        averages.append((f"node {average}", [pr, rc, f1], support))
    rows.append(averages)
    scalars = [("accuracy", [None, None, out["accuracy"]], total)]
    if not multilabel:
        mistakes = out.get("error_rate", math.nan) * total
        scalars.append(("mistake severity", [None, None, out["mistake_severity"]], mistakes))
        for key in out:
            if key.startswith("top") or key.startswith("hdist@"):
                scalars.append((key, [None, None, out[key]], total))
    rows.append(scalars)
    return _format_report(rows, digits)


def _format_report(blocks: list[list[tuple[str, list[float | None], float]]], digits: int) -> str:
    width = max(len(name) for block in blocks for name, _, _ in block)
    col = max(digits + 7, 9)  # room for "f1-score" and the numbers

    def number(v: float | None) -> str:
        return "" if v is None else ("nan" if math.isnan(v) else f"{v:.{digits}f}")

    def support(v: float) -> str:
        if math.isnan(v):
            return "nan"
        return str(round(v)) if float(v).is_integer() else f"{v:.{digits}f}"

    head = " " * width + "".join(h.rjust(col + 1) for h in ("precision", "recall", "f1-score", "support"))
    lines = [head.rstrip(), ""]
    for b, block in enumerate(blocks):
        for name, values, sup in block:
            cells = "".join(number(v).rjust(col + 1) for v in values) + support(sup).rjust(col + 1)
            lines.append(name.rjust(width) + cells)
        if b < len(blocks) - 1:
            lines.append("")
    return "\n".join(lines)

"""Hierarchical metrics: scikit-learn style functions and DDP-exact stateful classes.

Functions take ``y_true`` / ``y_pred`` as node ids ``[B]`` (``-1`` in ``y_true`` = ignore the sample), node
names, per-sample collections of ids or names (multi-label), or 0/1 node sets ``[B, N]`` (numpy, torch or
scipy sparse), with a keyword-only ``taxonomy=``. Node sets are closed under ancestors silently (on a DAG
through every parent); pass ``close=False`` where offered to score raw sets. ``*_score`` is higher-better,
``*_loss`` lower-better. See ``docs/metrics.md`` for the exact definitions and their sources.

The stateful classes (:class:`HierarchicalFBeta`, :class:`HierarchicalMetrics`, ...) are ``torchmetrics.Metric``
subclasses with torchmetrics' conventions: ``update(preds, target)`` (predictions first), one scalar tensor from
``compute()``, every value at once from ``results()``, and ``Class.collection(...)`` for a ``MetricCollection``.

Each metric has one implementation, in NumPy: torch labels (any device) are copied to the host, where they are
counted (a batch's labels are small); array results go back to the labels' device, and the stateful classes keep
their summed states on the metric's device.

Example:
    >>> from hiercls.taxonomy import Taxonomy
    >>> from hiercls.metrics import hierarchical_f1_score, mistake_severity
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> hierarchical_f1_score(["x", "b"], ["y", "b"], taxonomy=tax)
    0.6666666666666666
    >>> mistake_severity(["x", "b"], ["y", "b"], taxonomy=tax)
    1.0
"""

from hiercls.metrics._validation import UndefinedMetricWarning
from hiercls.metrics.distance import (
    DISTANCES,
    average_hierarchical_distance_at_k,
    hierarchical_distance_loss,
    level_argmax_accuracy_score,
    level_counts,
    mistake_severity,
    node_heights,
    per_level_accuracy_score,
    realized_cost,
    semantic_accuracy_score,
    top_k_accuracy_score,
    top_k_predictions,
    wu_palmer_loss,
    zhao_loss,
)
from hiercls.metrics.hierarchical import (
    hiclass_precision_recall_fscore,
    hierarchical_counts,
    hierarchical_f1_score,
    hierarchical_fbeta_score,
    hierarchical_precision_recall_fscore,
    hierarchical_precision_score,
    hierarchical_recall_score,
)
from hiercls.metrics.nodes import (
    consistent_subsets,
    constrained_counts,
    constrained_f1_score,
    exact_match_score,
    hamming_loss,
    node_f1_score,
    node_precision_recall_fscore_support,
    path_constrained_f1_score,
)
from hiercls.metrics.report import hierarchical_report
from hiercls.metrics.segmentation import dice_counts, nested_dice_score, region_masks
from hiercls.metrics.stateful import (
    ConstrainedF1,
    HierarchicalFBeta,
    HierarchicalMetrics,
    HierarchicalPrecision,
    HierarchicalRecall,
    LevelAccuracy,
    Metric,
    MistakeSeverity,
    NestedDice,
    NodeF1,
    TopKMetrics,
    all_reduce_states,
    flatten_results,
)

__all__ = [
    "DISTANCES",
    "ConstrainedF1",
    "HierarchicalFBeta",
    "HierarchicalMetrics",
    "HierarchicalPrecision",
    "HierarchicalRecall",
    "LevelAccuracy",
    "Metric",
    "MistakeSeverity",
    "NestedDice",
    "NodeF1",
    "TopKMetrics",
    "UndefinedMetricWarning",
    "all_reduce_states",
    "average_hierarchical_distance_at_k",
    "consistent_subsets",
    "constrained_counts",
    "constrained_f1_score",
    "dice_counts",
    "exact_match_score",
    "flatten_results",
    "hamming_loss",
    "hiclass_precision_recall_fscore",
    "hierarchical_counts",
    "hierarchical_distance_loss",
    "hierarchical_f1_score",
    "hierarchical_fbeta_score",
    "hierarchical_precision_recall_fscore",
    "hierarchical_precision_score",
    "hierarchical_recall_score",
    "hierarchical_report",
    "level_argmax_accuracy_score",
    "level_counts",
    "mistake_severity",
    "nested_dice_score",
    "node_f1_score",
    "node_heights",
    "node_precision_recall_fscore_support",
    "path_constrained_f1_score",
    "per_level_accuracy_score",
    "realized_cost",
    "region_masks",
    "semantic_accuracy_score",
    "top_k_accuracy_score",
    "top_k_predictions",
    "wu_palmer_loss",
    "zhao_loss",
]

"""Stateful metrics (``update(preds, target)`` / ``compute`` / ``reset``) whose states are sums, so DDP results are
exact (the base class and its conventions: :mod:`hiercls.metrics.base`).

Every state is a float64 torch tensor of sums on the metric's device: counts, weighted numerators and denominators,
per-node ``tp/fp/fn`` vectors. Sums commute, so adding the states of all ranks (one ``all_reduce(SUM)``)
gives the state a single process would have reached on the whole data, whatever the shard sizes; the final
ratios are computed only after the reduction. Integer-valued sums (unweighted counts) are exact in float64
up to 2**53; per-sample averages (``average="samples"``) are sums of floats, equal up to rounding order.

``compute()`` reduces across ranks when ``torch.distributed`` is initialised with more than one process
(every rank must then call it, as with any collective); the local state is left untouched, so ``compute()``
can be called repeatedly. ``sync()`` returns the reduced state explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from hiercls._checks import check_beta, check_choice, to_numpy
from hiercls.metrics._validation import (
    Labels,
    check_weights,
    check_zero_division,
    prepare_pair,
    renamed_keyword,
    weight_total,
    weighted_sum,
)
from hiercls.metrics.base import Metric, all_reduce_states, config_digest, flatten_results
from hiercls.metrics.distance import (
    DISTANCES,
    mistake_stats,
    num_levels,
    per_level_counts,
    top_k_distances,
    top_k_hits,
    top_k_labels,
    top_k_predictions,
)
from hiercls.metrics.hierarchical import (
    hierarchical_scores,
    hierarchical_sums,
    labels_mask,
    macro_mean,
    node_confusion,
    present_mask,
    reduce_node_counts,
)
from hiercls.metrics.nodes import constrained_counts, exact_matches
from hiercls.metrics.segmentation import check_dice_params, dice_counts, dice_scores, dice_sums, region_ids
from hiercls.taxonomy import Taxonomy
from hiercls.taxonomy.core import check_taxonomy

__all__ = [
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
    "all_reduce_states",
    "flatten_results",
]


NAMES = ("target", "preds")  # the parameter names of the errors of prepare_pair(target, preds)


class HierarchicalFBeta(Metric):
    """Stateful :func:`~hiercls.metrics.hierarchical_fbeta_score`: ``update(preds, target)``, ``compute()`` the
    hF-beta tensor.

    ``results()`` returns ``{"precision", "recall", "fbeta"}``; :class:`HierarchicalPrecision` and
    :class:`HierarchicalRecall` compute the other two (``output=`` picks any of them).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = HierarchicalFBeta(tax)
        >>> m.update(["y"], ["x"]); m.update(["a"], ["x"])  # preds, target
        >>> m.compute().item()  # the same as one call on both samples
        0.5714285714285714
        >>> m.results()["precision"], m.results()["recall"]
        (0.6666666666666666, 0.5)
    """

    default_output = "fbeta"

    def __init__(
        self,
        taxonomy: Taxonomy,
        *,
        beta: float = 1.0,
        average: str = "micro",
        include_root: bool = False,
        zero_division: Any = "warn",
        labels: Any = None,
        close: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.beta2 = check_beta(beta) ** 2
        self.average = check_choice(average, ("micro", "macro", "weighted", "samples"), "average")
        self.include_root, self.close = include_root, close
        self.zero_division = check_zero_division(zero_division)
        self.mask = labels_mask(labels, taxonomy, include_root)
        self.labels = labels
        if average not in ("macro", "weighted") and labels is not None:
            raise ValueError("labels is only used with average='macro' or 'weighted'")
        # undefined_*: how many per-sample ratios were 0/0, so compute() warns once per metric, not per update
        for name in ("inter", "npred", "ntrue", "sum_p", "sum_r", "sum_f", "total"):
            self.add_sum_state(name)
        for name in ("undefined_p", "undefined_r", "undefined_f"):
            self.add_sum_state(name)
        if average in ("macro", "weighted"):
            for name in ("tp", "fp", "fn"):
                self.add_sum_state(name, taxonomy.num_nodes)
        self.set_config(
            beta2=self.beta2,
            average=average,
            include_root=include_root,
            zero_division=self.zero_division,
            mask=config_digest(self.mask),
            labels=config_digest(labels),
            close=close,
        )

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        """Add a batch: predicted and true labels (torchmetrics' order), as the functions take them."""
        t, p, w = prepare_pair(target, preds, self.taxonomy, sample_weight, close=self.close, names=NAMES)
        self.update_labels(t, p, w)

    def update_labels(self, t: Labels, p: Labels, w: np.ndarray | None) -> None:
        """Update from already validated labels (used by :class:`HierarchicalMetrics`)."""
        nodes = self.average in ("macro", "weighted")
        sums = hierarchical_sums(t, p, self.taxonomy, w, self.beta2, self.include_root, self.zero_division, True, nodes)
        self.accumulate(**sums)

    def _compute(self, s: dict[str, np.ndarray], average: str | None = None) -> dict[str, float]:
        scores = hierarchical_scores(
            s, average or self.average, self.beta2, self.zero_division, self.mask, self.labels, self.include_root
        )
        return dict(zip(("precision", "recall", "fbeta"), scores, strict=True))


class HierarchicalPrecision(HierarchicalFBeta):
    """:class:`HierarchicalFBeta` computing hP (it shares the states of an hF-beta of the same configuration).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = HierarchicalPrecision(tax)
        >>> m.update(["a"], ["x"])  # preds, target: the parent predicted for its leaf
        >>> m.compute().item(), m.higher_is_better
        (1.0, True)
    """

    default_output = "precision"


class HierarchicalRecall(HierarchicalFBeta):
    """:class:`HierarchicalFBeta` computing hR (it shares the states of an hF-beta of the same configuration).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = HierarchicalRecall(tax)
        >>> m.update(["a"], ["x"])  # preds, target: the parent predicted for its leaf
        >>> m.compute().item()
        0.5
    """

    default_output = "recall"


class NodeF1(Metric):
    """Per-node ``tp/fp/fn`` vectors: Micro-/Macro-F1 over nodes and the Hamming loss.

    ``compute()`` returns the ``output`` (default ``"micro_f1"``) of ``results()``: ``{"micro_precision",
    "micro_recall", "micro_f1", "macro_precision", "macro_recall", "macro_f1", "weighted_precision",
    "weighted_recall", "weighted_f1", "hamming_loss"}`` (``weighted``: the per-node values weighted by their
    support, scikit-learn's ``average="weighted"``).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = NodeF1(tax, zero_division=0.0)
        >>> m.update(["y", "b"], ["x", "b"])
        >>> m.results()["macro_f1"], m.compute().item()
        (0.5, 0.6666666666666666)
    """

    default_output = "micro_f1"

    def __init__(
        self,
        taxonomy: Taxonomy,
        *,
        labels: Any = None,
        include_root: bool = False,
        zero_division: Any = "warn",
        close: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.mask = labels_mask(labels, taxonomy, include_root)
        self.labels = labels
        self.include_root, self.close = include_root, close
        self.zero_division = check_zero_division(zero_division)
        for name in ("tp", "fp", "fn"):
            self.add_sum_state(name, taxonomy.num_nodes)
        self.add_sum_state("total")
        self.set_config(
            mask=config_digest(self.mask),
            labels=config_digest(labels),
            include_root=include_root,
            zero_division=self.zero_division,
            close=close,
        )

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        """Add a batch: predicted and true labels (torchmetrics' order), as the functions take them."""
        t, p, w = prepare_pair(target, preds, self.taxonomy, sample_weight, close=self.close, names=NAMES)
        self.update_labels(t, p, w)

    def update_labels(self, t: Labels, p: Labels, w: np.ndarray | None) -> None:
        tp, fp, fn = node_confusion(t, p, self.taxonomy, w)
        self.accumulate(tp=tp, fp=fp, fn=fn, total=weight_total(len(t), w))

    def _compute(self, s: dict[str, np.ndarray]) -> dict[str, float]:
        zd = self.zero_division
        tp, fp, fn = s["tp"].copy(), s["fp"].copy(), s["fn"].copy()
        if self.include_root:
            tp[0], fp[0], fn[0] = s["total"], 0.0, 0.0
        full = self.mask
        mask = present_mask(full, self.labels, tp, fp, fn)
        hamming_errors = fp[full].sum() + fn[full].sum()
        tp, fp, fn = tp[mask], fp[mask], fn[mask]
        total = float(s["total"]) * int(full.sum())
        out: dict[str, float] = {}
        for average in ("micro", "macro", "weighted"):
            prec, rec, f, _ = reduce_node_counts(tp, fp, fn, 1.0, average, zd)
            out.update({f"{average}_precision": prec, f"{average}_recall": rec, f"{average}_f1": f})
        out["hamming_loss"] = float(hamming_errors / total) if total else math.nan
        return out


class ConstrainedF1(Metric):
    """Stateful C-F1 and P-F1 (micro and macro over nodes) of *raw* predicted sets against closed true sets.

    ``results()`` returns ``{"C_micro_f1", "C_macro_f1", "P_micro_f1", "P_macro_f1"}`` (``compute()`` the
    ``output``, default ``"C_micro_f1"``); the macro means run over
    the nodes (root aside) that are true or predicted at least once, as ``node_macro_f1`` of
    :class:`HierarchicalMetrics` does. See :func:`~hiercls.metrics.constrained_f1_score` and
    :func:`~hiercls.metrics.path_constrained_f1_score`. On ancestor-closed predictions both equal the node F1.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = ConstrainedF1(tax)
        >>> m.update([["a", "y"], ["x"]], [["x"], ["b"]])  # preds, target: y kept (fp); x lacks its parent a
        >>> r = m.results()
        >>> r["C_micro_f1"], r["P_micro_f1"]
        (0.4, 0.3333333333333333)
    """

    default_output = "C_micro_f1"

    def __init__(self, taxonomy: Taxonomy, *, zero_division: Any = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.zero_division = check_zero_division(zero_division)
        self.mask = labels_mask(None, taxonomy, False)
        for kind in ("C", "P"):
            for name in ("tp", "fp", "fn"):
                self.add_sum_state(f"{kind}_{name}", taxonomy.num_nodes)
        self.set_config(zero_division=self.zero_division)

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        """Add a batch: raw predicted node sets and true labels (torchmetrics' order)."""
        t, p, w = prepare_pair(target, preds, self.taxonomy, sample_weight, close=True, close_pred=False, names=NAMES)
        self.update_labels(t, p, w)

    def update_labels(self, t: Labels, p: Labels, w: np.ndarray | None) -> None:
        """Add a batch of closed true labels and raw predicted labels."""
        counts = constrained_counts(t.as_sets(self.taxonomy), p.as_sets(self.taxonomy), self.taxonomy, w)
        self.accumulate(
            **{f"{k}_{n}": v for k, c in counts.items() for n, v in zip(("tp", "fp", "fn"), c, strict=True)}
        )

    def _compute(self, s: dict[str, np.ndarray]) -> dict[str, float]:
        out = {}
        for kind in ("C", "P"):
            tp, fp, fn = s[f"{kind}_tp"], s[f"{kind}_fp"], s[f"{kind}_fn"]
            mask = present_mask(self.mask, "present", tp, fp, fn)
            for average in ("micro", "macro"):
                scores = reduce_node_counts(
                    tp[mask], fp[mask], fn[mask], 1.0, average, self.zero_division, ("f-score",)
                )
                out[f"{kind}_{average}_f1"] = scores[2]
        return out


class MistakeSeverity(Metric):
    """Stateful :func:`~hiercls.metrics.mistake_severity` (plus the error rate).

    ``results()`` returns ``{"mistake_severity", "error_rate", "mean_distance"}`` (``mean_distance`` over all
    samples, mistakes and correct ones); ``compute()`` the ``output``, default ``"mistake_severity"``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "z")])
        >>> m = MistakeSeverity(tax)
        >>> m.update(["y", "x"], ["x", "x"]); m.update(["z"], ["x"])  # preds, target
        >>> m.compute().item()
        1.5
    """

    default_output = "mistake_severity"

    def __init__(self, taxonomy: Taxonomy, *, distance: str = "lca_height", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.distance = check_choice(distance, DISTANCES, "distance")
        for name in ("dist_sum", "mistakes", "total"):
            self.add_sum_state(name)
        self.set_config(distance=self.distance)

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        """Add a batch: predicted and true node ids or names (torchmetrics' order)."""
        t, p, w = prepare_pair(target, preds, self.taxonomy, sample_weight, names=NAMES)
        self.update_labels(t, p, w)

    def update_labels(self, t: Labels, p: Labels, w: np.ndarray | None) -> None:
        if not (t.is_ids and p.is_ids):
            raise ValueError("MistakeSeverity needs single node ids or names (not node sets) in preds and target")
        d, m, n = mistake_stats(t.ids, p.ids, w, self.taxonomy, self.distance)
        self.accumulate(dist_sum=d, mistakes=m, total=n)

    def _compute(self, s: dict[str, np.ndarray]) -> dict[str, float]:
        m, n = float(s["mistakes"]), float(s["total"])
        return {
            "mistake_severity": float(s["dist_sum"]) / m if m else math.nan,
            "error_rate": m / n if n else math.nan,
            "mean_distance": float(s["dist_sum"]) / n if n else math.nan,
        }


class TopKMetrics(Metric):
    """Top-k accuracy and average hierarchical distance@k from scores ``[B, num_leaves | N | len(candidates)]``.

    ``results()`` returns ``{"top{k}_accuracy", "hdist@{k}"}`` for each ``k``; ``compute()`` the ``output``,
    default the top-k accuracy of the first ``k``. ``update(preds, target)`` takes the scores first, as
    torchmetrics' ``MulticlassAccuracy(top_k=...)``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = TopKMetrics(tax, k=(1, 2))
        >>> m.update(np.array([[0.2, 0.5, 0.3]]), ["x"])  # preds (scores), target
        >>> m.results()
        {'top1_accuracy': 0.0, 'hdist@1': 1.0, 'top2_accuracy': 0.0, 'hdist@2': 1.5}
    """

    old_keywords = ("y_true", "y_pred", "y_score", "scores")

    def __init__(
        self,
        taxonomy: Taxonomy,
        *,
        k: Iterable[int] = (1, 5),
        distance: str = "lca_height",
        candidates: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.k = tuple(int(x) for x in k)
        if not self.k or any(x < 1 for x in self.k):
            raise ValueError(f"k must be positive integers; got {k!r}")
        self.distance = check_choice(distance, DISTANCES, "distance")
        self.candidates = candidates
        self.add_sum_state("hits", len(self.k))
        self.add_sum_state("dist", len(self.k))
        self.add_sum_state("total")
        self.set_config(k=self.k, distance=self.distance, candidates=config_digest(candidates))

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        """Add a batch: scores ``preds`` ``[B, C]`` and true labels ``target`` ``[B]`` (torchmetrics' order, as
        ``MulticlassAccuracy(top_k=...)``); torch scores are ranked on their device, and only the top ids
        ``[B, max(k)]`` come to the host."""
        if np.ndim(target) == 2 and np.ndim(preds) < 2:
            raise TypeError(
                f"TopKMetrics.update(preds, target) got preds of shape {list(np.shape(preds))} and target of shape "
                f"{list(np.shape(target))}: preds are the scores [B, C] and target the true labels [B] "
                "(torchmetrics' order; (y_true, y_score) was the old one)"
            )
        t, top, w = top_k_labels(target, self.top(preds), self.taxonomy, sample_weight)
        self.update_top(t, top, w)

    def top(self, y_score: Any) -> Any:
        """The ``max(k)`` best candidates per row of ``y_score`` (ranked on the scores' device for tensors)."""
        return top_k_predictions(y_score, max(self.k), taxonomy=self.taxonomy, candidates=self.candidates)

    def update_top(self, t: np.ndarray, top: np.ndarray, w: np.ndarray | None) -> None:
        """Add validated true ids and their top candidates (host arrays)."""
        dists = top_k_distances(t, top, w, self.k, self.taxonomy, self.distance)
        self.accumulate(hits=top_k_hits(t, top, w, self.k), dist=dists, total=weight_total(len(t), w))

    def _compute(self, s: dict[str, np.ndarray]) -> dict[str, float]:
        n = float(s["total"])
        out = {}
        for i, k in enumerate(self.k):
            out[f"top{k}_accuracy"] = float(s["hits"][i]) / n if n else math.nan
            out[f"hdist@{k}"] = float(s["dist"][i]) / n if n else math.nan
        return out


class LevelAccuracy(Metric):
    """Per-level accuracy and semantic accuracy (micro over valid ``(sample, level)`` pairs).

    ``results()`` returns ``{"per_level_accuracy": [...], "per_level_support": [...], "semantic_accuracy": float}``
    where ``levels="depth"`` indexes depths 1..height and ``levels="semantic"`` the semantic levels, and the
    support of a level is the (weighted) number of samples whose truth reaches it. ``compute()`` returns the
    ``output``: ``"semantic_accuracy"`` by default, ``"per_level_accuracy/2"`` for depth 2.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = LevelAccuracy(tax)
        >>> m.update(["y", "a"], ["x", "x"])  # preds, target
        >>> m.results()
        {'per_level_accuracy': [1.0, 0.0], 'per_level_support': [2.0, 2.0], 'semantic_accuracy': 0.5}
    """

    default_output = "semantic_accuracy"

    def __init__(self, taxonomy: Taxonomy, *, levels: str = "depth", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.levels = check_choice(levels, ("depth", "semantic"), "levels")
        n = num_levels(taxonomy, levels)
        for name in ("correct", "both", "valid"):
            self.add_sum_state(name, n)
        self.set_config(levels=self.levels)

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        """Add a batch: predicted and true labels (torchmetrics' order), as the functions take them."""
        t, p, w = prepare_pair(target, preds, self.taxonomy, sample_weight, names=NAMES)
        self.update_labels(t, p, w)

    def update_labels(self, t: Labels, p: Labels, w: np.ndarray | None) -> None:
        c, b, v = per_level_counts(t, p, self.taxonomy, w, self.levels)
        self.accumulate(correct=c, both=b, valid=v)

    def _compute(self, s: dict[str, np.ndarray]) -> dict[str, Any]:
        c, b, v = s["correct"], s["both"], s["valid"]
        per = [float(ci / bi) if bi else math.nan for ci, bi in zip(c, b, strict=True)]
        return {
            "per_level_accuracy": per,
            "per_level_support": [float(x) for x in v],
            "semantic_accuracy": float(c.sum() / v.sum()) if v.sum() else math.nan,
        }


class NestedDice(Metric):
    """Stateful :func:`~hiercls.metrics.nested_dice_score`: pooled and per-sample Dice per region.

    Give ``taxonomy`` (label maps; ``regions`` default every non-root node) or ``num_regions`` (masks).
    ``results()`` returns ``{"dice": [R], "dice_per_sample": [R], "mean_dice": float}``; ``compute()`` the
    ``output``, default ``"mean_dice"``.

    Example:
        >>> m = NestedDice(num_regions=1)
        >>> m.update(np.array([[[1, 0, 1, 0]]]), np.array([[[1, 1, 0, 0]]]))  # preds, target
        >>> m.results()["dice"], m.compute().item()
        ([0.5], 0.5)
    """

    default_output = "mean_dice"

    def __init__(
        self,
        taxonomy: Taxonomy | None = None,
        *,
        regions: Any = None,
        num_regions: int | None = None,
        smooth: float = 0.0,
        empty_score: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.taxonomy = None if taxonomy is None else check_taxonomy(taxonomy)
        self.smooth, self.empty_score = check_dice_params(smooth, empty_score)
        if taxonomy is not None:
            self.regions = region_ids(taxonomy, regions)
            r = len(self.regions)
        else:
            if num_regions is None or int(num_regions) < 1:
                raise ValueError("NestedDice needs taxonomy= (label maps) or num_regions= (masks [B, R, *spatial])")
            self.regions = None
            r = int(num_regions)
        for name in ("inter", "true", "pred", "sample_dice", "sample_count"):
            self.add_sum_state(name, r)
        self.set_config(smooth=self.smooth, empty_score=self.empty_score, regions=config_digest(self.regions), r=r)

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        """Add a batch: predicted and true label maps or masks (torchmetrics' order)."""
        inter, ts, ps = dice_counts(
            target, preds, taxonomy=self.taxonomy, regions=None if self.taxonomy is None else self.regions
        )
        if inter.shape[1] != self.inter.shape[0]:
            raise ValueError(f"got {inter.shape[1]} regions; this metric was built for {self.inter.shape[0]}")
        w = check_weights(sample_weight, inter.shape[0])
        self.accumulate(**dice_sums(inter, ts, ps, w, self.smooth, self.empty_score))

    def _compute(self, s: dict[str, np.ndarray]) -> dict[str, Any]:
        dice, per_sample = dice_scores(s, self.smooth, self.empty_score)
        return {"dice": dice.tolist(), "dice_per_sample": per_sample.tolist(), "mean_dice": macro_mean(dice)}


class HierarchicalMetrics(Metric):
    """The standard collection behind :func:`~hiercls.metrics.hierarchical_report`, the training loop and the CLI.

    Args:
        taxonomy: the taxonomy.
        k: top-k values for the score-based metrics (used when ``update`` gets ``y_score``).
        distance: distance of the mistake severity and hdist@k.
        include_root: root convention of the hierarchical P/R/F and node metrics.
        multilabel: ``True`` for node-set labels: the metrics between two single nodes (mistake severity,
            Wu-Palmer and Zhao costs, top-k) are then left out.
        zero_division: the 0/0 rule of the ratios (default 0.0).
        candidates: candidate nodes of the score columns (see :func:`~hiercls.metrics.top_k_predictions`).
        sync_on_compute: all-reduce over ``torch.distributed`` in ``compute``.

    ``update(preds, target, y_score=None)``; ``compute()`` returns the ``output`` (default ``"hF1_micro"``)
    and ``results()`` a flat dict: ``accuracy`` (exact match), ``hP/hR/hF1`` with ``_micro`` and
    ``_samples`` suffixes, ``hF1_macro`` (= ``node_macro_f1``: the mean F1 over the nodes that are true or
    predicted at least once), ``hF1_weighted`` (= ``node_weighted_f1``: the same weighted by node support),
    ``node_micro_f1``, ``hamming_loss`` (over all nodes),
    ``per_level_accuracy`` (list), ``per_level_support`` (list: how many truths reach each depth),
    ``per_semantic_level_accuracy`` (list), ``semantic_accuracy``, and for
    single-label ``mistake_severity`` (with ``mistake_severity_distance``, the name of its distance),
    ``error_rate``, ``mean_distance``, ``wu_palmer_loss``, ``zhao_loss``,
    ``top{k}_accuracy``, ``hdist@{k}``. ``HierarchicalMetrics.collection(tax)`` is the ``MetricCollection`` of
    them all (one update per batch: its members share one state), for Lightning's ``self.log_dict``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = HierarchicalMetrics(tax, k=(1,))
        >>> m.update(["y", "b"], ["x", "b"], y_score=np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]))
        >>> r = m.results()
        >>> r["accuracy"], r["hF1_micro"], r["mistake_severity"], r["top1_accuracy"]
        (0.5, 0.6666666666666666, 1.0, 0.5)
        >>> m.compute().item()
        0.6666666666666666
    """

    default_output = "hF1_micro"

    def __init__(
        self,
        taxonomy: Taxonomy,
        *,
        k: Iterable[int] = (1, 5),
        distance: str = "lca_height",
        include_root: bool = False,
        multilabel: bool = False,
        zero_division: Any = 0.0,
        candidates: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.multilabel = multilabel
        zd = check_zero_division(zero_division)
        # The parts hold the update and compute logic; their states live here, flattened as "<part>.<state>",
        # so that one sync, one state_dict and MetricCollection's shared states cover them all. They are
        # kept in a plain dict, not registered as submodules.
        parts: dict[str, Metric] = {
            "hier": HierarchicalFBeta(taxonomy, average="samples", include_root=include_root, zero_division=zd),
            "node": NodeF1(taxonomy, labels="present", include_root=include_root, zero_division=zd),
            "depth": LevelAccuracy(taxonomy, levels="depth"),
            "semantic": LevelAccuracy(taxonomy, levels="semantic"),
        }
        if not multilabel:
            parts["severity"] = MistakeSeverity(taxonomy, distance=distance)
            parts["wu_palmer"] = MistakeSeverity(taxonomy, distance="wu_palmer")
            parts["zhao"] = MistakeSeverity(taxonomy, distance="zhao")
            k = tuple(k)
            if k:
                parts["topk"] = TopKMetrics(taxonomy, k=k, distance=distance, candidates=candidates)
        self._parts = parts
        self.add_sum_state("exact")
        self.add_sum_state("total")
        for name, part in parts.items():
            part.sink = (self, f"{name}.")
            for key, value in part.states().items():
                if key != "updates":
                    self.add_sum_state(f"{name}.{key}", tuple(value.shape))
        self.set_config(multilabel=multilabel, **{name: part.config_state for name, part in parts.items()})

    @property
    def parts(self) -> dict[str, Metric]:
        """The metrics whose logic this collection runs (their own states stay empty; the sums are here)."""
        return self._parts

    @renamed_keyword("scores", "y_score")
    def update(self, preds: Any, target: Any, y_score: Any = None, sample_weight: Any = None) -> None:
        """Add a batch: predicted and true labels (torchmetrics' order) as the functions take them, optional
        scores ``y_score`` ``[B, C]`` for the top-k metrics (``scores=`` is the deprecated name)."""
        t, p, w, keep = prepare_pair(target, preds, self.taxonomy, sample_weight, return_keep=True, names=NAMES)
        if not self.multilabel and not (t.is_ids and p.is_ids):
            raise ValueError(
                "HierarchicalMetrics(multilabel=False) needs single node ids or names; pass "
                "multilabel=True for node sets"
            )
        equal = exact_matches(t, p, self.taxonomy)
        self.accumulate(exact=weighted_sum(equal, w), total=weight_total(len(t), w))
        for name, part in self._parts.items():
            if name != "topk":
                part.update_labels(t, p, w)
        if y_score is not None and "topk" in self._parts:
            topk = self._parts["topk"]
            top = topk.top(y_score)  # ranked where the scores are; the top ids come to the host
            if len(top) != len(keep):
                raise ValueError(f"target has {len(keep)} samples but y_score has {len(top)} rows")
            topk.update_top(t.ids, to_numpy(top)[keep], w)

    def _compute(self, arr: dict[str, np.ndarray]) -> dict[str, Any]:
        def states(name: str) -> dict[str, np.ndarray]:
            return {k.split(".", 1)[1]: v for k, v in arr.items() if k.startswith(f"{name}.")}

        results = {name: part._compute(states(name)) for name, part in self._parts.items()}
        results["micro"] = self._parts["hier"]._compute(states("hier"), average="micro")
        n = float(arr["total"])
        out: dict[str, Any] = {"accuracy": float(arr["exact"]) / n if n else math.nan}
        for key, (name, inner) in _RESULTS.items():
            if name in results:
                out[key] = results[name][inner]
        if not self.multilabel:
            out.update(results["severity"], mistake_severity_distance=self._parts["severity"].distance)
            out.update(results.get("topk", {}))
        return out


# The keys of HierarchicalMetrics.compute(): (part, key of the part's result), in the order of the result.
_RESULTS = {
    "hP_micro": ("micro", "precision"),
    "hR_micro": ("micro", "recall"),
    "hF1_micro": ("micro", "fbeta"),
    "hP_samples": ("hier", "precision"),
    "hR_samples": ("hier", "recall"),
    "hF1_samples": ("hier", "fbeta"),
    "hF1_macro": ("node", "macro_f1"),
    "hF1_weighted": ("node", "weighted_f1"),
    "node_micro_f1": ("node", "micro_f1"),
    "node_macro_f1": ("node", "macro_f1"),
    "node_weighted_f1": ("node", "weighted_f1"),
    "hamming_loss": ("node", "hamming_loss"),
    "per_level_accuracy": ("depth", "per_level_accuracy"),
    "per_level_support": ("depth", "per_level_support"),
    "per_semantic_level_accuracy": ("semantic", "per_level_accuracy"),
    "semantic_accuracy": ("semantic", "semantic_accuracy"),
    "wu_palmer_loss": ("wu_palmer", "mean_distance"),
    "zhao_loss": ("zhao", "mean_distance"),
}

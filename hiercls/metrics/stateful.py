"""Stateful metrics (``update`` / ``compute`` / ``reset``) whose states are sums, so DDP results are exact.

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

import functools
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torchmetrics

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
    "LevelAccuracy",
    "Metric",
    "MistakeSeverity",
    "NestedDice",
    "NodeF1",
    "TopKMetrics",
    "all_reduce_states",
    "flatten_results",
]


def _dist_world(group: Any = None) -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(group)
    return 1


def all_reduce_states(states: Sequence[dict[str, torch.Tensor]], group: Any = None) -> list[dict[str, torch.Tensor]]:
    """Sum state dicts over all ranks (``all_reduce(SUM)``); returns reduced copies.

    Without an initialised process group (or with one process) the copies are the local values.
    """
    out = [{k: v.clone() for k, v in s.items()} for s in states]
    if _dist_world(group) > 1:
        for s in out:
            for v in s.values():
                torch.distributed.all_reduce(v, op=torch.distributed.ReduceOp.SUM, group=group)
    return out


def flatten_results(results: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a ``compute()`` result as one flat ``{name: float}``, ready for a logger.

    Lists become one entry per position, numbered from 1 (``per_level_accuracy/1`` is depth 1, as in
    :func:`~hiercls.evaluation.format_results`); strings (``mistake_severity_distance``) are left out; NaN
    stays NaN. Lightning's ``self.log_dict`` takes the result (log it with ``sync_dist=False``: ``compute()``
    already summed the ranks).

    Example:
        >>> flatten_results({"accuracy": 0.5, "per_level_accuracy": [1.0, 0.25], "mistake_severity_distance": "x"})
        {'accuracy': 0.5, 'per_level_accuracy/1': 1.0, 'per_level_accuracy/2': 0.25}
    """
    out: dict[str, float] = {}
    for key, value in results.items():
        if isinstance(value, str):
            continue
        if isinstance(value, (list, tuple, np.ndarray)):
            for i, v in enumerate(value, start=1):
                out[f"{prefix}{key}/{i}"] = float(v)
        else:
            out[f"{prefix}{key}"] = float(value)
    return out


class Metric(torchmetrics.Metric):
    """Base class: a :class:`torchmetrics.Metric` whose every state is a float64 sum (``dist_reduce_fx="sum"``).

    It is an ``nn.Module``: ``.to(device)`` moves it with the module that holds it, ``MetricCollection`` takes
    it, and ``state_dict``/``load_state_dict``/``merge_state``/``sync``/``unsync`` are torchmetrics's (only its
    public API is used). The states live on the metric's device; the counts of a batch are computed on the host
    (from the host copy of the labels, see :func:`~hiercls.metrics._validation.to_labels`) and added with one
    host-to-device copy per update. Under ``torch.distributed`` torchmetrics sums the states over the ranks, so
    every rank gets the single-process result. ``compute()`` returns plain Python numbers and lists and raises (on
    every rank) when no rank has called ``update`` since the last reset.

    Subclasses declare states with :meth:`add_sum_state` in ``__init__``, end it with :meth:`set_config`,
    add to the states in ``update`` with :meth:`accumulate`, and turn a state dict into results in ``_compute``.
    Each call of a subclass's ``update`` adds one to the ``updates`` state.
    """

    is_differentiable = False
    full_state_update = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        update = cls.__dict__.get("update")
        if update is not None:

            @functools.wraps(update)
            def counted(self: Metric, *args: Any, **kw: Any) -> None:
                update(self, *args, **kw)
                self.updates.add_(1.0)  # summed over ranks: "never updated" is told apart from "updated with empty"

            cls.update = counted  # type: ignore[method-assign]

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("compute_with_cache", False)  # a cached result would outlive load_state_dict
        super().__init__(**kwargs)
        self.state_shapes: dict[str, tuple[int, ...]] = {}
        self.add_sum_state("updates")
        self.config_state: str | None = None
        self.sink: tuple[Metric, str] = (self, "")  # where accumulate adds (HierarchicalMetrics holds its parts')
        self.register_load_state_dict_post_hook(_check_loaded_states)

    def add_sum_state(self, name: str, shape: int | tuple[int, ...] = ()) -> None:
        """Declare a float64 sum state (zeros of ``shape``), saved in ``state_dict``."""
        self.state_shapes[name] = (shape,) if isinstance(shape, int) else tuple(shape)
        self.add_state(name, torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum", persistent=True)

    def set_config(self, **config: Any) -> None:
        """Record the settings that change what ``update`` adds or what ``compute`` returns (once, in ``__init__``).

        ``MetricCollection`` shares one state among metrics whose states are equal after the first batch;
        two metrics of the same class but another configuration (say, two distances of
        :class:`MistakeSeverity` on a batch without mistakes) would then be merged wrongly. A zero state
        whose name carries a digest of the configuration keeps them apart, and :meth:`merge` refuses
        metrics of another configuration.
        """
        tax = getattr(self, "taxonomy", None)
        text = repr((type(self).__name__, None if tax is None else tax.fingerprint, sorted(config.items())))
        self.config_state = "config_" + hashlib.sha1(text.encode()).hexdigest()[:12]
        self.add_state(self.config_state, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum", persistent=False)

    def state_names(self) -> list[str]:
        """The names of the sum states (``updates`` included, the configuration marker left out)."""
        return [k for k in self.metric_state if k != self.config_state]

    def accumulate(self, **values: Any) -> None:
        """Add ``values`` (NumPy arrays or Python numbers of the states' shapes) to the states of the same names.

        The host values travel to the states' device as one float64 vector (one copy, whatever the number of
        states). The states are added to in place: torchmetrics copies them wherever it keeps a snapshot
        (``state_dict``, ``forward``, ``sync``), and ``reset`` gives fresh tensors.
        """
        owner, prefix = self.sink
        states = [getattr(owner, prefix + name) for name in values]
        flat = [np.asarray(to_numpy(v), dtype=np.float64).ravel() for v in values.values()]
        for name, cur, a in zip(values, states, flat, strict=True):
            if a.size != cur.numel():
                raise ValueError(f"state {name!r} has {cur.numel()} entries; got {a.size} to add")
        if not states:
            return
        moved = torch.from_numpy(np.concatenate(flat)).to(states[0].device)
        for cur, part in zip(states, torch.split(moved, [a.size for a in flat]), strict=True):
            cur.add_(part.view(cur.shape))

    def states(self) -> dict[str, torch.Tensor]:
        """The sum states by name (live tensors; :meth:`state_dict` gives copies)."""
        return {k: getattr(self, k) for k in self.state_names()}

    def update(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def compute(self) -> Any:
        """Results from the states (summed over all ranks with ``sync_on_compute``, the default)."""
        if float(self.updates) == 0:  # after the reduction: the same answer on every rank
            if self.sync_on_compute and _dist_world(self.process_group) > 1:
                self.unsync()  # torchmetrics restores the local states only when compute returns
            raise RuntimeError(
                f"{type(self).__name__}.compute() was called before any update() since it was built or reset: "
                "there is nothing to score; call update() with a batch first"
            )
        return self._compute({k: v.detach().cpu().numpy() for k, v in self.states().items()})

    def _compute(self, state: dict[str, np.ndarray]) -> Any:
        raise NotImplementedError

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """torchmetrics's, plus: with ``strict``, a missing state or a key that is no state raises ``ValueError``
        naming it (inside a module's ``load_state_dict`` torchmetrics skips missing states; shapes are checked)."""
        if strict:
            extra = sorted(set(state_dict) - set(self.state_names()))
            missing = [k for k in self.state_dict() if k not in state_dict]
            if extra or missing:
                raise ValueError(
                    f"state_dict does not match {type(self).__name__}: missing {missing}, unexpected {extra} "
                    f"(expected the states {self.state_names()})"
                )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def merge_state(self, incoming_state: dict[str, Any] | torchmetrics.Metric) -> None:
        """Add another metric's states (same class, taxonomy and configuration) or a dict of states."""
        if isinstance(incoming_state, torchmetrics.Metric):
            other = incoming_state
            if type(other) is not type(self):
                raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
            mine, theirs = getattr(self, "taxonomy", None), getattr(other, "taxonomy", None)
            if mine is not None and theirs is not None and mine != theirs:
                raise ValueError(f"cannot merge metrics of different taxonomies ({mine!r} vs {theirs!r})")
            if other.config_state != self.config_state:
                raise ValueError(f"cannot merge {type(self).__name__} metrics of different configurations")
            incoming_state = other.states()
        incoming = {}
        for k, want in self.states().items():
            if k not in incoming_state:
                raise ValueError(f"cannot merge: state {k!r} is missing")
            v = torch.as_tensor(incoming_state[k])
            if tuple(v.shape) != tuple(want.shape):
                raise ValueError(f"cannot merge: state {k!r} has shape {tuple(v.shape)}, expected {tuple(want.shape)}")
            incoming[k] = v.to(want.device, torch.float64)
        if self.config_state is not None:
            incoming[self.config_state] = torch.zeros((), dtype=torch.float64, device=self.updates.device)
        for k, v in incoming.items():  # every state is a sum: what Metric.merge_state (torchmetrics >= 1.6) does
            setattr(self, k, getattr(self, k) + v)

    def merge(self, other: Metric) -> Metric:
        """:meth:`merge_state` with another metric (e.g. from another worker); returns ``self``."""
        self.merge_state(other)
        return self


def _check_loaded_states(module: Metric, incompatible_keys: Any) -> None:
    """``load_state_dict`` post-hook (nested loads too): every state of its shape, on the metric's device, float64."""
    for k, shape in module.state_shapes.items():
        v = getattr(module, k)
        if tuple(v.shape) != shape:
            raise ValueError(
                f"state_dict[{k!r}] has shape {tuple(v.shape)}; {type(module).__name__} expects {shape} "
                "(another taxonomy or configuration?)"
            )
        setattr(module, k, v.detach().to(dtype=torch.float64, device=module.device).clone())


def _digest(x: Any) -> str | None:
    """A short digest of an array-like setting (``None`` stays ``None``) for :meth:`Metric.set_config`."""
    if x is None:
        return None
    if isinstance(x, np.ndarray) or type(x).__module__.startswith("torch"):
        a = np.ascontiguousarray(to_numpy(x))
        body = a.tobytes() if a.dtype != object else repr(a.tolist()).encode()
        payload = repr((a.dtype.str, a.shape)).encode() + body
    else:
        payload = repr(x).encode()
    return hashlib.sha1(payload).hexdigest()[:12]


class HierarchicalFBeta(Metric):
    """Stateful :func:`~hiercls.metrics.hierarchical_precision_recall_fscore`.

    ``compute()`` returns ``{"precision", "recall", "fbeta"}``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = HierarchicalFBeta(tax)
        >>> m.update(["x"], ["y"]); m.update(["x"], ["a"])
        >>> m.compute()["fbeta"]  # the same as one call on both samples
        0.5714285714285714
    """

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
            mask=_digest(self.mask),
            labels=_digest(labels),
            close=close,
        )

    def update(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        t, p, w = prepare_pair(y_true, y_pred, self.taxonomy, sample_weight, close=self.close)
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


class NodeF1(Metric):
    """Per-node ``tp/fp/fn`` vectors: Micro-/Macro-F1 over nodes and the Hamming loss.

    ``compute()`` returns ``{"micro_precision", "micro_recall", "micro_f1", "macro_precision", "macro_recall",
    "macro_f1", "weighted_precision", "weighted_recall", "weighted_f1", "hamming_loss"}`` (``weighted``: the
    per-node values weighted by their support, scikit-learn's ``average="weighted"``).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = NodeF1(tax, zero_division=0.0)
        >>> m.update(["x", "b"], ["y", "b"])
        >>> m.compute()["macro_f1"], m.compute()["micro_f1"]
        (0.5, 0.6666666666666666)
    """

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
            mask=_digest(self.mask),
            labels=_digest(labels),
            include_root=include_root,
            zero_division=self.zero_division,
            close=close,
        )

    def update(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        t, p, w = prepare_pair(y_true, y_pred, self.taxonomy, sample_weight, close=self.close)
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

    ``compute()`` returns ``{"C_micro_f1", "C_macro_f1", "P_micro_f1", "P_macro_f1"}``; the macro means run over
    the nodes (root aside) that are true or predicted at least once, as ``node_macro_f1`` of
    :class:`HierarchicalMetrics` does. See :func:`~hiercls.metrics.constrained_f1_score` and
    :func:`~hiercls.metrics.path_constrained_f1_score`. On ancestor-closed predictions both equal the node F1.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = ConstrainedF1(tax)
        >>> m.update([["x"], ["b"]], [["a", "y"], ["x"]])  # y kept (fp); x lacks its parent a
        >>> r = m.compute()
        >>> r["C_micro_f1"], r["P_micro_f1"]
        (0.4, 0.3333333333333333)
    """

    def __init__(self, taxonomy: Taxonomy, *, zero_division: Any = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.zero_division = check_zero_division(zero_division)
        self.mask = labels_mask(None, taxonomy, False)
        for kind in ("C", "P"):
            for name in ("tp", "fp", "fn"):
                self.add_sum_state(f"{kind}_{name}", taxonomy.num_nodes)
        self.set_config(zero_division=self.zero_division)

    def update(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        t, p, w = prepare_pair(y_true, y_pred, self.taxonomy, sample_weight, close=True, close_pred=False)
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

    ``compute()`` returns ``{"mistake_severity", "error_rate", "mean_distance"}`` (``mean_distance`` over all
    samples, mistakes and correct ones).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "z")])
        >>> m = MistakeSeverity(tax)
        >>> m.update(["x", "x"], ["y", "x"]); m.update(["x"], ["z"])
        >>> m.compute()["mistake_severity"]
        1.5
    """

    def __init__(self, taxonomy: Taxonomy, *, distance: str = "lca_height", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.distance = check_choice(distance, DISTANCES, "distance")
        for name in ("dist_sum", "mistakes", "total"):
            self.add_sum_state(name)
        self.set_config(distance=self.distance)

    def update(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        t, p, w = prepare_pair(y_true, y_pred, self.taxonomy, sample_weight)
        self.update_labels(t, p, w)

    def update_labels(self, t: Labels, p: Labels, w: np.ndarray | None) -> None:
        if not (t.is_ids and p.is_ids):
            raise ValueError("MistakeSeverity needs single node ids or names (not node sets) in y_true and y_pred")
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

    ``compute()`` returns ``{"top{k}_accuracy", "hdist@{k}"}`` for each ``k``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = TopKMetrics(tax, k=(1, 2))
        >>> m.update(["x"], np.array([[0.2, 0.5, 0.3]]))
        >>> m.compute()
        {'top1_accuracy': 0.0, 'hdist@1': 1.0, 'top2_accuracy': 0.0, 'hdist@2': 1.5}
    """

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
        self.set_config(k=self.k, distance=self.distance, candidates=_digest(candidates))

    @renamed_keyword("scores", "y_score")
    def update(self, y_true: Any, y_score: Any, sample_weight: Any = None) -> None:
        """Add a batch; torch scores are ranked on their device, and only the top ids ``[B, max(k)]`` come to the
        host."""
        t, top, w = top_k_labels(y_true, self.top(y_score), self.taxonomy, sample_weight)
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

    ``compute()`` returns ``{"per_level_accuracy": [...], "per_level_support": [...], "semantic_accuracy": float}``
    where ``levels="depth"`` indexes depths 1..height and ``levels="semantic"`` the semantic levels, and the
    support of a level is the (weighted) number of samples whose truth reaches it.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = LevelAccuracy(tax)
        >>> m.update(["x", "x"], ["y", "a"])
        >>> m.compute()
        {'per_level_accuracy': [1.0, 0.0], 'per_level_support': [2.0, 2.0], 'semantic_accuracy': 0.5}
    """

    def __init__(self, taxonomy: Taxonomy, *, levels: str = "depth", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        self.levels = check_choice(levels, ("depth", "semantic"), "levels")
        n = num_levels(taxonomy, levels)
        for name in ("correct", "both", "valid"):
            self.add_sum_state(name, n)
        self.set_config(levels=self.levels)

    def update(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        t, p, w = prepare_pair(y_true, y_pred, self.taxonomy, sample_weight)
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
    ``compute()`` returns ``{"dice": [R], "dice_per_sample": [R], "mean_dice": float}``.

    Example:
        >>> m = NestedDice(num_regions=1)
        >>> m.update(np.array([[[1, 1, 0, 0]]]), np.array([[[1, 0, 1, 0]]]))
        >>> m.compute()["dice"]
        [0.5]
    """

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
        self.set_config(smooth=self.smooth, empty_score=self.empty_score, regions=_digest(self.regions), r=r)

    def update(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        inter, ts, ps = dice_counts(
            y_true, y_pred, taxonomy=self.taxonomy, regions=None if self.taxonomy is None else self.regions
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

    ``compute()`` returns a flat dict: ``accuracy`` (exact match), ``hP/hR/hF1`` with ``_micro`` and
    ``_samples`` suffixes, ``hF1_macro`` (= ``node_macro_f1``: the mean F1 over the nodes that are true or
    predicted at least once), ``hF1_weighted`` (= ``node_weighted_f1``: the same weighted by node support),
    ``node_micro_f1``, ``hamming_loss`` (over all nodes),
    ``per_level_accuracy`` (list), ``per_level_support`` (list: how many truths reach each depth),
    ``per_semantic_level_accuracy`` (list), ``semantic_accuracy``, and for
    single-label ``mistake_severity`` (with ``mistake_severity_distance``, the name of its distance),
    ``error_rate``, ``mean_distance``, ``wu_palmer_loss``, ``zhao_loss``,
    ``top{k}_accuracy``, ``hdist@{k}``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = HierarchicalMetrics(tax, k=(1,))
        >>> m.update(["x", "b"], ["y", "b"], y_score=np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]))
        >>> r = m.compute()
        >>> r["accuracy"], r["hF1_micro"], r["mistake_severity"], r["top1_accuracy"]
        (0.5, 0.6666666666666666, 1.0, 0.5)
    """

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
    def update(self, y_true: Any, y_pred: Any, y_score: Any = None, sample_weight: Any = None) -> None:
        """Add a batch: labels as the functions take them, optional scores ``y_score`` ``[B, C]`` for the top-k
        metrics (``scores=`` is the deprecated name)."""
        t, p, w, keep = prepare_pair(y_true, y_pred, self.taxonomy, sample_weight, return_keep=True)
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
                raise ValueError(f"y_true has {len(keep)} samples but y_score has {len(top)} rows")
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

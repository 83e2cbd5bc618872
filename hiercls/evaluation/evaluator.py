"""One evaluator: decode node probabilities with any list of decoder specs and score each with the stateful metrics.

Training, ``hiercls evaluate`` (``--model`` and ``--probs``), ``hiercls decode --labels`` and the Python API all
go through :class:`Evaluator`, so they report the same metric names and the same numbers.

Metric names are those of :class:`hiercls.metrics.HierarchicalMetrics` (``accuracy``, ``hF1_micro``,
``hF1_samples``, ``per_level_accuracy``, ``mistake_severity``, ...), keyed ``"<decoder label>/<metric>"``.
The β of every hF-β decoder (and each β of ``betas``) adds ``hF{β}_micro`` and ``hF{β}_samples`` to every
decoder's results (``hF2_samples`` for ``optimal_hfbeta:beta=2``, the expected score that decoder maximises),
so rows stay comparable. Multi-label truth (ancestor-closed 0/1 node sets ``[B, N]``, e.g. from a text data set
with label sets) switches every decoder to the set metrics (``multilabel=True`` of
:class:`~hiercls.metrics.HierarchicalMetrics`: exact match, hP/hR/hF, ``node_micro_f1`` / ``node_macro_f1``) and adds
C-F1 and P-F1 of the decoder's raw sets (``C_micro_f1``, ``C_macro_f1``, ``P_micro_f1``, ``P_macro_f1``,
:class:`~hiercls.metrics.ConstrainedF1`). Dense outputs ``[B, N, *spatial]`` are decoded per voxel and scored with
:class:`hiercls.metrics.NestedDice`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from hiercls._checks import check_beta, to_numpy
from hiercls.decode import DecoderSpec, check_probabilities, parse_decoder, probabilities_named
from hiercls.decode.spec import format_number
from hiercls.evaluation.files import load_labels, load_probabilities
from hiercls.metrics import ConstrainedF1, HierarchicalFBeta, HierarchicalMetrics, Metric, NestedDice
from hiercls.taxonomy import Taxonomy
from hiercls.taxonomy.core import check_taxonomy

__all__ = ["DEFAULT_DECODERS", "Evaluator", "evaluate_probabilities", "to_plain"]

DEFAULT_DECODERS: tuple[str, ...] = ("argmax_leaf", "optimal_hfbeta")
"""The decoders of :func:`evaluate_probabilities` and ``hiercls evaluate --probs`` when none is given."""


def to_plain(value: Any) -> Any:
    """Tensors, arrays and NumPy scalars as Python numbers and lists (JSON-ready), recursively."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


class Evaluator:
    """Decode with several decoders and accumulate hierarchical metrics for each (``update``/``compute``/``reset``).

    States are sums (see :mod:`hiercls.metrics.stateful`), so under DDP every rank updates with its shard and
    ``compute()`` (a collective: every rank calls it) gives the metrics of the whole data exactly.

    Args:
        taxonomy: the taxonomy the probabilities are indexed by.
        decoders: decoder specs (strings for :func:`hiercls.decode.parse_decoder` or
            :class:`~hiercls.decode.DecoderSpec`); results are keyed by their labels.
        betas: more β for the ``hF{β}_micro`` / ``hF{β}_samples`` of every decoder (the β of hF-β decoders are
            always added; β = 1 is ``hF1_*``, always there).
        k: top-k values of the score-based metrics (those above the number of leaves are left out).
        leaf_probs: ``update`` gets leaf probabilities ``[B, L]`` instead of node probabilities.
        multilabel: the labels are node sets ``[B, N]``; ``None`` (default) decides on the first
            :meth:`update` (2-D labels with 2-D probabilities are node sets).
        check: refuse probabilities that are not probabilities of ``taxonomy`` (a
            :class:`~hiercls.decode.ProbabilityError` naming row and node; see
            :func:`~hiercls.decode.check_probabilities`); ``False`` skips the check.
        sync_on_compute: all-reduce over ``torch.distributed`` in :meth:`compute`.
        process_group: the process group of the reduction.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> ev = Evaluator(tax, ["argmax_leaf", "optimal_hfbeta:beta=2"], k=())
        >>> _ = ev.update(np.array([[1.0, 0.6, 0.3, 0.3, 0.4]]), np.array([2]))
        >>> _ = ev.update(np.array([[1.0, 0.9, 0.8, 0.1, 0.1]]), np.array([2]))
        >>> r = ev.compute()
        >>> r["argmax_leaf/accuracy"], r["optimal_hfbeta:beta=2/hF2_samples"]
        (0.5, 0.9166666666666667)
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        decoders: Iterable[str | DecoderSpec] = ("argmax_leaf",),
        *,
        betas: Iterable[float] = (),
        k: Iterable[int] = (1, 5),
        leaf_probs: bool = False,
        multilabel: bool | None = None,
        check: bool = True,
        sync_on_compute: bool = True,
        process_group: Any = None,
    ) -> None:
        self.taxonomy = check_taxonomy(taxonomy)
        self.multilabel = multilabel
        specs = [parse_decoder(d) for d in decoders]
        if not specs:
            raise ValueError("decoders: needs at least one decoder, e.g. ['argmax_leaf']")
        self.decoders: dict[str, DecoderSpec] = {}
        for spec in specs:
            if spec.label in self.decoders:
                raise ValueError(f"decoders: {spec.label!r} is given twice")
            self.decoders[spec.label] = spec
        all_betas = {check_beta(b) for b in betas} | {s.beta for s in specs if s.beta is not None}
        self.betas = tuple(sorted(all_betas - {1.0}))
        self.k = tuple(int(v) for v in k if int(v) <= taxonomy.num_leaves)
        self.leaf_probs = leaf_probs
        self.check = bool(check)
        self._metric_kw = {"sync_on_compute": sync_on_compute, "process_group": process_group}
        self.dense = False
        self.metrics: dict[str, dict[str, Metric]] = {
            label: self._flat_metrics(spec) for label, spec in self.decoders.items()
        }

    def _flat_metrics(self, spec: DecoderSpec) -> dict[str, Metric]:
        tax, kw = self.taxonomy, self._metric_kw
        sets = spec.is_set or bool(self.multilabel)
        out: dict[str, Metric] = {"": HierarchicalMetrics(tax, k=() if sets else self.k, multilabel=sets, **kw)}
        if self.multilabel:
            out["constrained"] = ConstrainedF1(tax, **kw)
        for beta in self.betas:
            b = format_number(beta)
            for average in ("micro", "samples"):
                out[f"hF{b}_{average}"] = HierarchicalFBeta(tax, beta=beta, average=average, zero_division=0.0, **kw)
        return out

    def update(self, probs: Any, labels: Any) -> dict[str, Any]:
        """Decode a batch with every decoder and add it to the metrics.

        Args:
            probs: node probabilities ``[B, N]`` (leaf ``[B, L]`` with ``leaf_probs``), NumPy or torch, or dense
                ``[B, N, *spatial]`` with labels ``[B, *spatial]``.
            labels: node ids ``[B]`` (``-1`` = ignored), or ancestor-closed 0/1 node sets ``[B, N]``
                (multi-label truth: the set metrics, see the module).

        Returns:
            ``{decoder label: predictions}`` (node ids ``[B]`` or boolean node sets ``[B, N]``, as NumPy).
        """
        y = to_numpy(labels)
        if isinstance(probs, torch.Tensor):
            probs = probs.detach().float()
        if np.ndim(probs) > 2:
            return self._update_dense(probs, y)
        n = int(np.shape(probs)[0]) if np.ndim(probs) == 2 else 1
        if len(y) != n:
            raise ValueError(f"labels has {len(y)} entries but probs has {n} rows")
        self._set_label_kind(np.ndim(y) == 2)
        # Tensor probabilities stay on their device: the decoders and the metrics take them there.
        truth = torch.as_tensor(y, device=probs.device) if isinstance(probs, torch.Tensor) else y
        preds: dict[str, Any] = {}
        for label, spec in self.decoders.items():
            pred = spec(probs, self.taxonomy, leaf_probs=self.leaf_probs, check=self.check)
            scores = None if spec.is_set or not self.k else probs
            for name, metric in self.metrics[label].items():
                if name:  # hF-beta, and C-F1 / P-F1 of the decoder's raw sets (their consistency)
                    metric.update(pred, truth)
                else:
                    metric.update(pred, truth, y_score=scores)
            preds[label] = to_numpy(pred)
        return preds

    def _set_label_kind(self, sets: bool) -> None:
        """Decide the label kind on the first update (node sets switch to the set metrics); refuse mixing kinds."""
        if self.multilabel is None:
            self.multilabel = sets
            if sets:
                self.metrics = {label: self._flat_metrics(spec) for label, spec in self.decoders.items()}
        elif bool(self.multilabel) != sets:
            kinds = ("node ids [B]", "node sets [B, N]")
            raise ValueError(
                f"labels: this evaluator scores {kinds[bool(self.multilabel)]} but got {kinds[sets]}; "
                "use one kind of labels per evaluator"
            )

    def _update_dense(self, probs: Any, y: np.ndarray) -> dict[str, Any]:
        if not self.dense:
            self.dense = True
            self.metrics = {label: {"": NestedDice(self.taxonomy, **self._metric_kw)} for label in self.decoders}
        p = torch.as_tensor(probs)
        flat = p.movedim(1, -1).reshape(-1, p.shape[1])
        preds = {}
        for label, spec in self.decoders.items():
            if spec.is_set:
                raise ValueError(
                    f"decoder {label!r} returns node sets; dense outputs need a single-node rule (e.g. threshold)"
                )
            pred = to_numpy(spec(flat, self.taxonomy, leaf_probs=self.leaf_probs, check=self.check)).reshape(y.shape)
            self.metrics[label][""].update(pred, y)
            preds[label] = pred
        return preds

    def compute(self) -> dict[str, Any]:
        """``{"<decoder label>/<metric>": value}`` over everything updated so far (reduced over DDP ranks)."""
        out: dict[str, Any] = {}
        for label, metrics in self.metrics.items():
            for name, metric in metrics.items():
                values = metric.results()
                if name == "constrained":
                    out.update({f"{label}/{key}": to_plain(v) for key, v in values.items()})
                    continue
                if name:
                    out[f"{label}/{name}"] = to_plain(values["fbeta"])
                    continue
                out.update({f"{label}/{key}": to_plain(v) for key, v in values.items()})
                if isinstance(metric, NestedDice) and metric.regions is not None:
                    out[f"{label}/regions"] = [self.taxonomy.display_names[int(r)] for r in metric.regions]
        return out

    def reset(self) -> None:
        """Forget every update (the label kind found by the first update is kept)."""
        for metrics in self.metrics.values():
            for metric in metrics.values():
                metric.reset()


def evaluate_probabilities(
    probs: Any,
    labels: Any,
    taxonomy: Taxonomy,
    decoders: Sequence[str | DecoderSpec] = DEFAULT_DECODERS,
    *,
    betas: Iterable[float] = (),
    k: Iterable[int] = (1, 5),
    leaf_probs: bool = False,
    check: bool = True,
) -> dict[str, Any]:
    """Decode saved probabilities with each decoder and score them: :class:`Evaluator` in one call.

    Args:
        probs: node probabilities ``[B, N]`` (leaf ``[B, L]`` with ``leaf_probs``), or a file
            :func:`~hiercls.evaluation.load_probabilities` reads.
        labels: node ids ``[B]`` (``-1`` = ignored), node sets ``[B, N]`` (multi-label), or a file
            :func:`~hiercls.evaluation.load_labels` reads.
        taxonomy: the taxonomy.
        decoders: decoder specs.
        betas, k, leaf_probs, check: as for :class:`Evaluator`.

    Returns:
        ``{"taxonomy", "fingerprint", "samples", "ignored", "<decoder label>/<metric>": ...}``.

    Raises:
        ProbabilityError: ``probs`` are not probabilities (naming the file when ``probs`` is one, the row and the
            node).
        ValueError: no probabilities, or every label ignored.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4], [1.0, 0.9, 0.8, 0.1, 0.1]])
        >>> res = evaluate_probabilities(p, np.array([2, 2]), tax, ["argmax_leaf", "crm"])
        >>> res["argmax_leaf/accuracy"], res["crm/accuracy"], res["samples"]
        (0.5, 1.0, 2)
    """
    source = str(probs) if isinstance(probs, (str, os.PathLike)) else "probs"
    if isinstance(probs, (str, os.PathLike)):
        probs = load_probabilities(probs)
    labels_name = str(labels) if isinstance(labels, (str, os.PathLike)) else "labels"
    if isinstance(labels, (str, os.PathLike)):
        labels = load_labels(labels, taxonomy)
    y = np.asarray(to_numpy(labels))
    sets = y.ndim == 2 and np.ndim(probs) == 2  # node sets [B, N] (multi-label truth)
    y = y.astype(np.float32 if sets else np.int64)
    y = y if sets else y.ravel()
    if np.ndim(probs) >= 1 and np.shape(probs)[0] == 0:
        raise ValueError(f"{source}: no rows of probabilities to evaluate")
    if y.size and not (y >= 0).any():
        raise ValueError(f"{labels_name}: every one of the {y.size} labels is -1 (ignored): nothing to evaluate")
    evaluator = Evaluator(
        taxonomy, decoders, betas=betas, k=k, leaf_probs=leaf_probs, check=check, sync_on_compute=False
    )
    if check:  # up front, so that the message names the file (the decoders check rows again, without it)
        kind = "leaf" if leaf_probs else "node"
        check_probabilities(probs, taxonomy, kind=kind, name=source)
    with probabilities_named(source):
        evaluator.update(probs, y)
    ignored = int((y < 0).any(1).sum()) if sets else int((y < 0).sum())
    return {
        "taxonomy": taxonomy.name,
        "fingerprint": taxonomy.fingerprint,
        "samples": len(y) - ignored,
        "ignored": ignored,
        **evaluator.compute(),
    }

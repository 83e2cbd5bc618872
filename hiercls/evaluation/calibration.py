r"""Calibration: temperature scaling fitted on the validation split, and the Expected Calibration Error per level.

Every optimal decoder (``optimal_hfbeta``, ``bayes_node``, ``crm``...) maximises an *expected* score under the
model's probabilities, so it is only optimal when those probabilities are calibrated. Temperature scaling
(Guo et al., "On Calibration of Modern Neural Networks", ICML 2017) divides the head's logits by one scalar
``T > 0`` fitted on held-out labels; it changes no ranking of a single softmax, but it changes the node
probabilities every set or cost-based decoder reads.

**Fitting.** ``T`` minimises the head's own training likelihood on the validation outputs: the mean of
``model.loss(output / T, targets)`` (softmax cross-entropy for ``flat``, the per-level cross-entropies for
``semantic_softmax``, the node BCE / MCLoss for ``multilabel``...) with label smoothing switched off (it
regularises training and is no part of the likelihood). The search is a golden-section search on ``log T`` over
``[0.05, 20]`` to a relative precision of about ``1e-4`` (:func:`fit_temperature`); the loss sums are all-reduced
over DDP ranks, so every rank finds the same ``T``. A boundary value means the loss wants a temperature outside
the bracket (it is logged).

**ECE per level.** With ``M`` equal-width bins ``B_m = ((m-1)/M, m/M]`` (the first bin also holds 0),

.. math:: \mathrm{ECE} = \sum_{m=1}^{M} \frac{|B_m|}{n}\,\bigl|\mathrm{acc}(B_m) - \mathrm{conf}(B_m)\bigr|

(Naeini et al. 2015; Guo et al. 2017, Eq. 3), ``M = 15`` by default. Per depth level ``d`` (1..height):

* single-label: each sample whose label reaches depth ``d`` contributes one pair: the confidence is the largest
  node probability at depth ``d`` (ties: smallest id), correct when that node is an ancestor-or-self of the
  label (the top-label ECE of the level's own classification);
* multi-label (node-set labels): every (sample, node at depth ``d``) pair contributes ``(P(n), [n in the
  set])``: the reliability of the node probabilities themselves (the binary ECE of each node's event).

Example:
    >>> # bins of 0.2: (0.8, 1] holds 0.9, 0.9 (acc 1/2); (0.4, 0.6] holds 0.6 (hit); [0, 0.2] holds 0.2 (miss)
    >>> round(expected_calibration_error([0.9, 0.9, 0.6, 0.2], [1, 0, 1, 0], n_bins=5), 6)  # (0.8 + 0.4 + 0.2) / 4
    0.35
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from hiercls._checks import to_numpy
from hiercls.decode import DecoderSpec
from hiercls.evaluation.evaluator import Evaluator
from hiercls.evaluation.model import num_samples
from hiercls.evaluation.report import format_table
from hiercls.metrics import Metric, all_reduce_states
from hiercls.taxonomy import Taxonomy
from hiercls.taxonomy.core import check_taxonomy

logger = logging.getLogger(__name__)

__all__ = [
    "CALIBRATED_SUFFIX",
    "ECE_BINS",
    "LevelCalibration",
    "calibrate_outputs",
    "expected_calibration_error",
    "fit_temperature",
    "format_calibration",
    "scale_output",
]

ECE_BINS = 15
"""Default number of equal-width confidence bins of the ECE."""
CALIBRATED_SUFFIX = " (calibrated)"
"""Appended to a decoder's label for its results on temperature-scaled probabilities."""
T_BOUNDS = (0.05, 20.0)
"""The bracket of the temperature search."""


def _bin_sums(conf: np.ndarray, correct: np.ndarray, n_bins: int) -> np.ndarray:
    """``[3, n_bins]``: count, summed confidence and summed correctness per equal-width bin."""
    # Bin m holds ((m-1)/M, m/M]; conf * M is rounded first so that 0.7 (0.69999...) * 10 lands in (0.6, 0.7].
    idx = np.clip(np.ceil(np.round(conf * n_bins, 9)).astype(np.int64) - 1, 0, n_bins - 1)
    out = np.zeros((3, n_bins))
    out[0] = np.bincount(idx, minlength=n_bins)
    out[1] = np.bincount(idx, weights=conf, minlength=n_bins)
    out[2] = np.bincount(idx, weights=correct, minlength=n_bins)
    return out


def _ece_from_sums(sums: np.ndarray) -> float:
    count, conf, correct = sums
    n = count.sum()
    return float(np.abs(correct - conf).sum() / n) if n else math.nan  # sum_m |B_m|/n |acc_m - conf_m|


def expected_calibration_error(confidence: Any, correct: Any, *, n_bins: int = ECE_BINS) -> float:
    """ECE with ``n_bins`` equal-width bins: ``sum_m |B_m|/n |acc(B_m) - conf(B_m)|`` (see the module).

    Args:
        confidence: predicted probabilities ``[n]`` in ``[0, 1]``.
        correct: 0/1 (or boolean) outcomes ``[n]``.
        n_bins: number of bins ``M`` (bin ``m`` is ``((m-1)/M, m/M]``, the first also holds 0).

    Returns:
        The ECE, ``nan`` for no pairs.

    Raises:
        ValueError: shapes differ, a confidence outside ``[0, 1]``, or ``n_bins < 1``.
    """
    conf = np.asarray(to_numpy(confidence), dtype=np.float64).ravel()
    ok = np.asarray(to_numpy(correct), dtype=np.float64).ravel()
    if conf.shape != ok.shape:
        raise ValueError(f"confidence has {conf.size} entries but correct has {ok.size}")
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer; got {n_bins!r}")
    if conf.size and (not np.isfinite(conf).all() or conf.min() < 0 or conf.max() > 1):
        raise ValueError("confidence must be probabilities in [0, 1]")
    return _ece_from_sums(_bin_sums(conf, ok, n_bins))


class LevelCalibration(Metric):
    """Stateful ECE per depth level (bin sums, exact under DDP); see the module for the pairs of each level.

    ``update(preds [B, N], target)`` (node probabilities, torchmetrics' order) takes node ids ``[B]`` (``-1``
    ignored) or node sets ``[B, N]``. ``compute()`` returns the ECE of depth 1 (``output="ece_per_level/2"``: depth
    2), ``results()`` ``{"ece_per_level": [...], "pairs_per_level": [...]}`` (``nan`` for a level with no
    pair).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> m = LevelCalibration(tax, n_bins=10)
        >>> m.update(np.array([[1, .8, .6, .2, .2], [1, .7, .4, .3, .3]]), np.array([2, 4]))
        >>> [round(v, 3) for v in m.results()["ece_per_level"]]  # level 1: (.8, hit), (.7, miss); level 2: (.6, hit)
        [0.45, 0.4]
    """

    def __init__(self, taxonomy: Taxonomy, *, n_bins: int = ECE_BINS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taxonomy = check_taxonomy(taxonomy)
        if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer; got {n_bins!r}")
        self.n_bins = n_bins
        self.levels = [np.flatnonzero(taxonomy.depth == d) for d in range(1, taxonomy.height + 1)]
        self.add_sum_state("sums", (len(self.levels), 3, n_bins))

    def update(self, preds: Any, target: Any) -> None:
        p = np.asarray(to_numpy(preds), dtype=np.float64)
        y = np.asarray(to_numpy(target))
        tax = self.taxonomy
        if p.ndim != 2 or p.shape[1] != tax.num_nodes:
            raise ValueError(f"preds must be node probabilities [B, {tax.num_nodes}]; got shape {list(p.shape)}")
        if len(y) != len(p):
            raise ValueError(f"target has {len(y)} entries but preds has {len(p)} rows")
        p = np.clip(p, 0.0, 1.0)
        sums = np.zeros((len(self.levels), 3, self.n_bins))
        if y.ndim == 2:  # node sets: every (sample, node of the level) pair
            for i, nodes in enumerate(self.levels):
                sums[i] = _bin_sums(p[:, nodes].ravel(), (y[:, nodes] > 0.5).ravel().astype(np.float64), self.n_bins)
        else:
            y = y.astype(np.int64)
            keep = y >= 0
            p, y = p[keep], y[keep]
            anc = tax.ancestors_sparse[y].toarray().astype(bool) if len(y) else np.zeros((0, tax.num_nodes), bool)
            label_depth = tax.depth[y]
            for i, nodes in enumerate(self.levels):
                rows = np.flatnonzero(label_depth >= i + 1)
                if not len(rows):
                    continue
                level = p[np.ix_(rows, nodes)]
                pick = level.argmax(1)  # first maximum: the smallest id among ties (ids are sorted)
                correct = anc[rows, nodes[pick]].astype(np.float64)
                sums[i] = _bin_sums(level[np.arange(len(rows)), pick], correct, self.n_bins)
        self.accumulate(sums=sums)

    def _compute(self, s: dict[str, np.ndarray]) -> dict[str, Any]:
        sums = s["sums"]
        return {
            "ece_per_level": [_ece_from_sums(sums[i]) for i in range(len(sums))],
            "pairs_per_level": [int(sums[i, 0].sum()) for i in range(len(sums))],
        }


def fit_temperature(
    nll: Callable[[float], float], *, bounds: tuple[float, float] = T_BOUNDS, tol: float = 1e-5
) -> float:
    """The ``T`` in ``bounds`` minimising ``nll(T)``: golden-section search on ``log T`` (deterministic).

    The NLL of temperature-scaled logits is smooth and, for a softmax, convex in ``1/T``, so it is unimodal in
    ``log T`` and the bracketed search finds its minimum (to ``tol`` in ``log T``).

    Example:
        >>> round(fit_temperature(lambda t: (math.log(t) - math.log(2.5)) ** 2), 4)
        2.5
    """
    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(math.exp(a)), nll(math.exp(b))
    while hi - lo > tol:
        if fa <= fb:  # ties keep the smaller temperature
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(math.exp(b))
    return math.exp((lo + hi) / 2)


def scale_output(output: Any, temperature: float) -> torch.Tensor:
    """``output / temperature`` for a head's logit tensor.

    Raises:
        TypeError: the output is not one tensor (prompting models return dicts: no single logit tensor).
    """
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"temperature scaling needs the head's output to be one logit tensor; got {type(output).__name__} "
            "(prompting heads such as transhp return dicts): set eval.calibrate: false"
        )
    return output if temperature == 1.0 else output / temperature


@contextlib.contextmanager
def _without_label_smoothing(model: Any) -> Iterator[None]:
    # Label smoothing regularises training; the likelihood T is fitted on has none.
    crit = getattr(getattr(model, "head", None), "criterion", None)
    old = getattr(crit, "label_smoothing", None)
    if old:
        crit.label_smoothing = 0.0
    try:
        yield
    finally:
        if old:
            crit.label_smoothing = old


def _chunks(n: int, size: int = 1024) -> Iterator[slice]:
    for s in range(0, n, size):
        yield slice(s, min(n, s + size))


@torch.no_grad()
def calibrate_outputs(
    model: Any,
    outputs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    taxonomy: Taxonomy,
    decoders: Sequence[str | DecoderSpec],
    *,
    n_bins: int = ECE_BINS,
) -> dict[str, Any]:
    """Fit the temperature on collected ``(output, targets)`` batches, set ``model.temperature``, score both ways.

    Args:
        model: a model with ``loss``, ``node_probs`` and a ``temperature`` attribute
            (:class:`~hiercls.models.HierarchicalClassifier`); the outputs are the head's raw logits.
        outputs: this rank's ``(output, targets)`` batches of the validation split (CPU tensors).
        taxonomy: the taxonomy.
        decoders: decoder specs; each is also scored on the calibrated probabilities, as
            ``"<label> (calibrated)/<metric>"``.
        n_bins: ECE bins.

    Returns:
        ``{"<label> (calibrated)/<metric>": ..., "calibration": {"temperature", "nll_before", "nll_after",
        "ece_per_level_before", "ece_per_level_after", "pairs_per_level", "n_bins"}}``.

    Raises:
        TypeError: an output that is not one logit tensor.
        ValueError: no batches, or dense (per-voxel) outputs.
    """
    if not outputs:
        raise ValueError("calibration needs the validation outputs: no evaluation batch was collected")
    out = torch.cat([scale_output(o, 1.0).float() for o, _ in outputs])
    tgt = torch.cat([t for _, t in outputs])
    if out.dim() > 2:
        raise ValueError("temperature scaling and ECE per level are not defined here for dense (per-voxel) outputs")
    model.temperature = 1.0
    device = next(model.parameters()).device

    def nll(temperature: float) -> float:
        total = torch.zeros(2, dtype=torch.float64)
        with _without_label_smoothing(model):
            for s in _chunks(len(out)):
                n = num_samples(tgt[s])
                if n:
                    loss = model.loss(out[s].to(device) / temperature, tgt[s].to(device))
                    total += torch.tensor([float(loss) * n, n], dtype=torch.float64)
        total = all_reduce_states([{"t": total}])[0]["t"]
        return float(total[0] / total[1]) if total[1] > 0 else math.nan

    temperature = fit_temperature(nll)
    if min(abs(temperature - b) / b for b in T_BOUNDS) < 1e-3:
        logger.warning(
            "calibration: the temperature %.3g is at the edge of the search bracket %s", temperature, T_BOUNDS
        )
    evaluator = Evaluator(taxonomy, decoders)
    before, after = LevelCalibration(taxonomy, n_bins=n_bins), LevelCalibration(taxonomy, n_bins=n_bins)
    for s in _chunks(len(out)):
        y = tgt[s]
        before.update(model.node_probs(out[s].to(device)).float(), y)
        scaled = model.node_probs(out[s].to(device) / temperature).float()
        after.update(scaled, y)
        evaluator.update(scaled, y)
    results = {
        f"{key.rsplit('/', 1)[0]}{CALIBRATED_SUFFIX}/{key.rsplit('/', 1)[1]}": v
        for key, v in evaluator.compute().items()
    }
    b, a = before.results(), after.results()
    results["calibration"] = {
        "temperature": temperature,
        "nll_before": nll(1.0),
        "nll_after": nll(temperature),
        "ece_per_level_before": b["ece_per_level"],
        "ece_per_level_after": a["ece_per_level"],
        "pairs_per_level": b["pairs_per_level"],
        "n_bins": n_bins,
    }
    model.temperature = temperature
    return results


def _fmt(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def format_calibration(runs: dict[str, dict[str, Any]], *, name: str = "head", max_levels: int = 6) -> str:
    """A table of each run's temperature, validation NLL and ECE per level, before and after calibration.

    Returns ``""`` when no run has calibration results.

    Example:
        >>> cal = {"temperature": 1.5, "nll_before": 2.0, "nll_after": 1.8, "ece_per_level_before": [0.2],
        ...        "ece_per_level_after": [0.05], "pairs_per_level": [10], "n_bins": 15}
        >>> print(format_calibration({"flat": {"calibration": cal}}))
        head  probabilities  T      NLL    ECE level 1 (n=10)
        ----  -------------  -----  -----  ------------------
        flat  raw            1.000  2.000  0.200
        flat  calibrated     1.500  1.800  0.050
    """
    cals = {k: r["calibration"] for k, r in runs.items() if isinstance(r.get("calibration"), dict)}
    if not cals:
        return ""
    levels = min(max_levels, max(len(c["ece_per_level_before"]) for c in cals.values()))
    first = next(iter(cals.values()))
    header = [name, "probabilities", "T", "NLL"]
    header += [f"ECE level {i + 1} (n={first['pairs_per_level'][i]})" for i in range(levels)]
    rows = []
    for label, c in cals.items():
        for which, key, t in (("raw", "before", 1.0), ("calibrated", "after", c["temperature"])):
            ece = c[f"ece_per_level_{key}"]
            rows.append(
                [
                    label,
                    which,
                    _fmt(t),
                    _fmt(c[f"nll_{key}"]),
                    *[_fmt(ece[i]) if i < len(ece) else "-" for i in range(levels)],
                ]
            )
    return format_table(header, rows)

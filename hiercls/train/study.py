"""A head comparison a reader can trust: several seeds, a label-prior baseline and a paired bootstrap interval.

:func:`run_study` runs a recipe whose ``study.seeds`` is set (``hiercls train`` calls it): every head of the
recipe (``model.head`` and ``compare_heads``) is trained once per seed with its own settings
(``study.head_settings``), picks its best checkpoint on ``data.eval_split``, and is scored on ``study.split``,
which no run has seen. The report gives, per head and decoder, mean ± std over seeds of accuracy and micro hF1,
the accuracy at every depth with the number of samples whose label reaches it, what the decoder predicts
(``"1 node, depth 7.2"`` or ``"3.1-node set, depth 5.0"``), a label-prior row (the training label frequencies,
the same prediction for every input: what a model learns without looking at the input), and the difference of
the first two heads' micro hF1 with a paired bootstrap interval over the scored samples. With ``eval.conformal``
set it adds the conformal rows of every head (:func:`hiercls.train.report.run_conformal`: calibrated on
``data.eval_split``, coverage, mean set size and mean depth on ``study.split``; mean ± std over seeds).

Per-level accuracy here is the semantic-accuracy convention of Ridnik et al. (2021) applied per depth: of the
samples whose label reaches depth ``d``, the fraction whose prediction has the label's node at depth ``d``; a
prediction that stops above ``d`` is wrong there. (``per_level_accuracy`` of the metrics counts only samples
whose prediction reaches ``d``, which leaves hedged node sets undefined at deep levels.)
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hiercls._textio import atomic_write
from hiercls.data import build_dataset, subsample
from hiercls.decode import DecoderSpec, parse_decoder
from hiercls.evaluation import Evaluator, format_table
from hiercls.evaluation.model import evaluate_model, split_loader
from hiercls.metrics import hierarchical_counts, level_counts
from hiercls.taxonomy import Taxonomy
from hiercls.train.checkpoint import own_folder
from hiercls.train.config import StudyConfig, TrainConfig, apply_overrides
from hiercls.train.distributed import DistInfo, cleanup_distributed, init_distributed
from hiercls.train.inference import load_trained_model
from hiercls.train.loop import train
from hiercls.train.report import run_conformal

logger = logging.getLogger(__name__)

__all__ = ["best_run", "conformal_summary", "label_prior", "paired_bootstrap", "run_study", "score_predictions"]


def label_prior(labels: Sequence[int] | np.ndarray, taxonomy: Taxonomy) -> np.ndarray:
    """Node probabilities ``[N]`` of the label frequencies: ``P(n)`` = share of labels at ``n`` or below it.

    Labels may be internal nodes; ``-1`` is ignored. On a DAG a label counts once for every ancestor.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> label_prior([2, 2, 3, 4], tax).tolist()
        [1.0, 0.75, 0.5, 0.25, 0.25]
    """
    y = np.asarray(labels, dtype=np.int64)
    y = y[y >= 0]
    if y.size == 0:
        raise ValueError("label_prior: no labels (every label is -1)")
    counts = np.bincount(y, minlength=taxonomy.num_nodes).astype(np.float64)
    anc = taxonomy.ancestors_sparse  # row n: n and its ancestors
    return np.asarray(anc.T @ counts).ravel() / y.size


def paired_bootstrap(
    counts_a: tuple[np.ndarray, np.ndarray, np.ndarray],
    counts_b: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Micro hF1 of ``a`` minus ``b`` with a percentile bootstrap interval, resampling the same samples for both.

    Args:
        counts_a: per-sample ``(|T ∩ P|, |P|, |T|)`` of system ``a`` (:func:`hiercls.metrics.hierarchical_counts`;
            several seeds may be summed per sample first).
        counts_b: the same samples scored for system ``b``.
        resamples: bootstrap resamples.
        confidence: interval level.
        seed: the resampling seed.

    Returns:
        ``{"difference", "low", "high", "resamples", "samples"}``.

    Example:
        >>> a = (np.array([2.0, 1, 2]), np.array([2.0, 2, 2]), np.array([2.0, 2, 2]))
        >>> b = (np.array([1.0, 1, 0]), np.array([2.0, 2, 2]), np.array([2.0, 2, 2]))
        >>> r = paired_bootstrap(a, b, resamples=200)
        >>> round(r["difference"], 3), r["low"] <= r["difference"] <= r["high"]
        (0.5, True)
    """
    a, b = np.stack(counts_a), np.stack(counts_b)  # [3, S]
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap: the two systems scored different samples ({a.shape[1]} vs {b.shape[1]})")

    def hf1(c: np.ndarray) -> np.ndarray:  # c [..., 3] summed counts
        denom = c[..., 1] + c[..., 2]
        return np.where(denom > 0, 2 * c[..., 0] / np.where(denom > 0, denom, 1), 0.0)

    n = a.shape[1]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    # How often each sample is drawn in each resample; one product then sums the counts of both systems.
    weights = np.zeros((resamples, n))
    np.add.at(weights, (np.repeat(np.arange(resamples), n), idx.ravel()), 1.0)
    diffs = hf1(weights @ a.T) - hf1(weights @ b.T)
    alpha = (1 - confidence) / 2
    return {
        "difference": float(hf1(a.sum(1)) - hf1(b.sum(1))),
        "low": float(np.quantile(diffs, alpha)),
        "high": float(np.quantile(diffs, 1 - alpha)),
        "resamples": int(resamples),
        "samples": int(n),
    }


def score_predictions(pred: Any, labels: np.ndarray, taxonomy: Taxonomy) -> dict[str, Any]:
    """What the study needs of one decoder's predictions (node ids ``[B]`` or node sets ``[B, N]``) on one run:
    per-sample counts, per-depth counts, prediction shape."""
    pred = np.asarray(pred)
    inter, npred, ntrue = hierarchical_counts(labels, pred, taxonomy=taxonomy)
    correct, valid = level_counts(labels, pred, taxonomy=taxonomy)
    depth = taxonomy.depth
    if pred.ndim == 2:
        sets = pred.astype(bool).copy()
        sets[:, taxonomy.root] = False
        size = sets.sum(1)
        deepest = np.where(sets, depth[None, :], 0).max(1)
    else:
        size = (pred != taxonomy.root).astype(np.int64)
        deepest = depth[pred]
    return {
        "counts": (inter, npred, ntrue),
        "level_correct": correct,
        "level_valid": valid,
        "set": pred.ndim == 2,
        "mean_size": float(size.mean()),
        "mean_depth": float(deepest.mean()),
    }


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def _describe(scores: Sequence[Mapping[str, Any]]) -> str:
    size = float(np.mean([s["mean_size"] for s in scores]))
    depth = float(np.mean([s["mean_depth"] for s in scores]))
    if not scores[0]["set"]:
        return f"1 node, depth {depth:.1f}"
    return f"{size:.1f}-node set, depth {depth:.1f}"


def _head_config(cfg: TrainConfig, head: str, seed: int, out: Path) -> TrainConfig:
    run = copy.deepcopy(cfg)
    if head != cfg.model.head:
        run.model.head = head
        run.model.head_options = {}
    run.compare_heads = []
    run.study = StudyConfig()
    run.run.seed = seed
    run.run.out_dir = str(out)
    settings = cfg.study.head_settings.get(head, {})
    return apply_overrides(run, [f"{k}={json.dumps(v)}" for k, v in settings.items()])


def run_study(cfg: TrainConfig, *, quick: bool = False) -> dict[str, Any]:
    """Train and score every head of ``cfg`` once per ``cfg.study.seeds`` (see the module docstring).

    Args:
        cfg: a recipe with ``study.seeds`` set.
        quick: only the first seed (no standard deviations; the interval still covers sample variation).

    Returns:
        The study (also written to ``<out_dir>/study.json``, the table to ``study.txt``, the plot to
        ``study.png``): ``{"heads", "decoders", "seeds", "split", "samples", "levels", "rows", "difference",
        "best_run"}``; ``best_run`` (:func:`best_run`) is the run ``hiercls evaluate`` / ``predict --model`` load
        when given the study folder.

    Raises:
        ValueError: ``study.seeds`` is empty, or the split has no labelled sample.
    """
    study = cfg.study
    if not study.seeds:
        raise ValueError("run_study: study.seeds is empty (set e.g. study.seeds=[0,1,2])")
    seeds = list(study.seeds[:1] if quick else study.seeds)
    heads = list(dict.fromkeys([cfg.model.head, *cfg.compare_heads]))
    specs = [parse_decoder(d) for d in cfg.eval.decoders]
    out_dir = cfg.out_dir
    info = init_distributed(cfg.run.device)
    if info.distributed:
        cleanup_distributed(info)
        raise ValueError("run_study runs in one process (the runs are small); launch it without torchrun")
    lock = own_folder(out_dir, "study")  # one study per folder, before any work; each run locks its own folder
    try:
        return _study(cfg, heads, seeds, specs, info)
    finally:
        os.close(lock)


def _study(
    cfg: TrainConfig, heads: list[str], seeds: list[int], specs: list[DecoderSpec], info: DistInfo
) -> dict[str, Any]:
    """The runs, their scores and the report files of :func:`run_study` (the study folder is locked)."""
    study, out_dir, device = cfg.study, cfg.out_dir, info.device
    scores: dict[str, dict[str, list[dict[str, Any]]]] = {h: {s.label: [] for s in specs} for h in heads}
    results: dict[str, list[dict[str, Any]]] = {h: [] for h in heads}
    conformal: dict[str, list[dict[str, Any]]] = {h: [] for h in heads}  # eval.conformal: each run's rows
    finals: list[tuple[str, dict[str, Any], str]] = []  # (run folder, train()'s results, best_mode) of every run
    taxonomy: Taxonomy | None = None
    labels: np.ndarray | None = None
    try:
        for head in heads:
            for seed in seeds:
                run_cfg = _head_config(cfg, head, seed, out_dir / "runs" / f"{head}-seed{seed}")
                logger.info("study: head %s, seed %d -> %s", head, seed, run_cfg.run.out_dir)
                finals.append((f"runs/{head}-seed{seed}", train(run_cfg), run_cfg.eval.best_mode))
                model, taxonomy, _ = load_trained_model(run_cfg.out_dir, which="best", device=device)
                _, loader = split_loader(model, taxonomy, run_cfg, study.split, study.max_samples, None)
                res, probs, y = evaluate_model(model, loader, taxonomy, specs, device=device, keep_probs=True)
                if probs is None or y is None or not (y >= 0).any():
                    raise ValueError(f"study.split {study.split!r}: no labelled sample to score")
                keep = y >= 0
                probs, y = probs[keep], y[keep]
                if labels is not None and not np.array_equal(labels, y):
                    raise ValueError("study: the runs scored different samples (the split must load in one order)")
                labels = y
                results[head].append(res)
                for spec in specs:
                    scores[head][spec.label].append(score_predictions(spec(probs, taxonomy), y, taxonomy))
                if cfg.eval.conformal is not None:
                    conformal[head].append(
                        run_conformal(run_cfg.out_dir, model, taxonomy, run_cfg, probs, y, device=device)
                    )
        assert taxonomy is not None and labels is not None
        prior_row = None
        if study.prior:
            prior_row = _prior_scores(cfg, taxonomy, labels, specs)
    finally:
        cleanup_distributed(info)
    report = _report(cfg, heads, specs, seeds, labels, taxonomy, results, scores, prior_row)
    if cfg.eval.conformal is not None:
        report["conformal"] = conformal_summary(conformal)
    report["best_run"] = best_run(finals, cfg.data.eval_split)
    for name, text in (("study.json", json.dumps(report, indent=2)), ("study.txt", format_study(report))):
        with atomic_write(out_dir / name, encoding="utf-8") as f:
            f.write(text + "\n")
    try:
        plot_study(report, out_dir / "study.png")
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        logger.warning("matplotlib missing: no study.png")
    return report


def _prior_scores(
    cfg: TrainConfig, taxonomy: Taxonomy, labels: np.ndarray, specs: Sequence[DecoderSpec]
) -> dict[str, Any]:
    train_set = subsample(
        build_dataset(cfg.data.dataset, cfg.data.train_split, taxonomy, cfg.data.options), cfg.data.max_train_samples
    )
    prior = label_prior(_targets(train_set), taxonomy)
    probs = np.broadcast_to(prior, (len(labels), prior.size)).astype(np.float32)
    ev = Evaluator(taxonomy, specs, k=())
    preds = ev.update(probs, labels)  # the decoded predictions, scored below without decoding again
    res = ev.compute()
    return {"results": res, "scores": {s.label: [score_predictions(preds[s.label], labels, taxonomy)] for s in specs}}


def conformal_summary(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The study's conformal rows: each head's :func:`~hiercls.train.report.run_conformal` rows over its seeds.

    Args:
        runs: ``{head: [the conformal rows of each seed's run]}``.

    Returns:
        ``{"alpha", "calibration_split", "split", "n_calibration", "n_test", "rows"}``; each row is ``{"head",
        "method", "threshold", "coverage", "mean_set_size", "mean_depth"}`` with ``[mean, std]`` values, and
        ``per_seed_coverage``.

    Example:
        >>> run = {"alpha": 0.1, "calibration_split": "val", "split": "test", "n_calibration": 9, "n_test": 8,
        ...        "rows": {"node": {"threshold": 0.8, "coverage": 0.875, "mean_set_size": 2.0, "mean_depth": 1.0}}}
        >>> other = {**run, "rows": {"node": {**run["rows"]["node"], "coverage": 1.0}}}
        >>> conformal_summary({"flat": [run, other]})["rows"][0]["coverage"]
        [0.9375, 0.08838834764831845]
    """
    first = next(r[0] for r in runs.values() if r)
    rows = []
    for head, seeds in runs.items():
        for method in seeds[0]["rows"] if seeds else ():
            row: dict[str, Any] = {"head": head, "method": method}
            for col in ("threshold", "coverage", "mean_set_size", "mean_depth"):
                row[col] = list(_mean_std([s["rows"][method][col] for s in seeds]))
            row["per_seed_coverage"] = [s["rows"][method]["coverage"] for s in seeds]
            rows.append(row)
    keys = ("alpha", "calibration_split", "split", "n_calibration", "n_test")
    return {**{k: first[k] for k in keys}, "rows": rows}


def best_run(finals: Sequence[tuple[str, Mapping[str, Any], str]], split: str | None) -> dict[str, Any] | None:
    """The run that stands for the study where one model is asked for (``hiercls evaluate --model STUDY``).

    It is the run whose best checkpoint scored best on ``split`` (``data.eval_split``, the split that picked the
    checkpoints), by each run's own ``best_key`` / ``best_value``; never on the split the study reports on. ``None``
    when the runs were kept on different metrics (or no run was evaluated): nothing can be compared then.

    Args:
        finals: ``(folder relative to the study, train()'s results, eval.best_mode)`` of every run.
        split: the split the checkpoints were picked on.

    Example:
        >>> runs = [("runs/a-seed0", {"best_key": "x/hF1_micro", "best_value": 0.4}, "max"),
        ...         ("runs/b-seed0", {"best_key": "x/hF1_micro", "best_value": 0.6}, "max")]
        >>> best_run(runs, "val")["run"], best_run(runs[:1] + [("c", {"best_key": "eval_loss"}, "min")], "val")
        ('runs/b-seed0', None)
    """
    keys = {(r.get("best_key"), mode) for _, r, mode in finals}
    scored = [(folder, r) for folder, r, _ in finals if isinstance(r.get("best_value"), (int, float))]
    if len(keys) != 1 or not scored or len(scored) != len(finals):
        return None
    (key, mode) = keys.pop()
    sign = 1.0 if mode == "max" else -1.0
    folder, r = max(scored, key=lambda fr: sign * float(fr[1]["best_value"]))  # ties: the first run
    return {"run": folder, "metric": key, "value": float(r["best_value"]), "split": split, "of": len(finals)}


def _targets(ds: Any) -> np.ndarray:
    if isinstance(ds, torch.utils.data.Subset):
        return np.asarray(_targets(ds.dataset))[np.asarray(ds.indices)]
    targets = getattr(ds, "targets", None)
    if targets is None:
        return np.asarray([int(ds[i][1]) for i in range(len(ds))])
    return np.asarray(targets.numpy() if isinstance(targets, torch.Tensor) else targets)


def _report(
    cfg: TrainConfig,
    heads: list[str],
    specs: Sequence[DecoderSpec],
    seeds: list[int],
    labels: np.ndarray,
    taxonomy: Taxonomy,
    results: Mapping[str, list[dict[str, Any]]],
    scores: Mapping[str, Mapping[str, list[dict[str, Any]]]],
    prior: Mapping[str, Any] | None,
) -> dict[str, Any]:
    valid = scores[heads[0]][specs[0].label][0]["level_valid"]
    levels = [int(v) for v in valid]
    rows = []

    def row(name: str, label: str, runs: list[dict[str, Any]], sc: list[dict[str, Any]]) -> dict[str, Any]:
        acc = _mean_std([r[f"{label}/accuracy"] for r in runs])
        hf1 = _mean_std([r[f"{label}/hF1_micro"] for r in runs])
        per = np.stack([s["level_correct"] / np.maximum(s["level_valid"], 1) for s in sc])
        return {
            "head": name,
            "decoder": label,
            "prediction": _describe(sc),
            "accuracy": acc,
            "hF1_micro": hf1,
            "level_accuracy": [[float(m), float(sd)] for m, sd in zip(per.mean(0), _std0(per), strict=True)],
            "per_seed_hF1_micro": [r[f"{label}/hF1_micro"] for r in runs],
        }

    for head in heads:
        for spec in specs:
            rows.append(row(head, spec.label, results[head], scores[head][spec.label]))
    if prior is not None:
        for spec in specs:
            rows.append(row("label prior", spec.label, [prior["results"]], prior["scores"][spec.label]))
    differences = []
    if len(heads) >= 2:
        for spec in specs:

            def pooled(head: str, label: str = spec.label) -> tuple[np.ndarray, ...]:
                return tuple(np.sum([s["counts"][i] for s in scores[head][label]], axis=0) for i in range(3))

            diff = paired_bootstrap(
                pooled(heads[0]), pooled(heads[1]), resamples=cfg.study.bootstrap, confidence=cfg.study.confidence
            )
            differences.append({"a": heads[0], "b": heads[1], "decoder": spec.label, **diff})
    return {
        "name": cfg.name,
        "heads": heads,
        "decoders": [s.label for s in specs],
        "seeds": seeds,
        "split": cfg.study.split,
        "samples": len(labels),
        "levels": levels,
        "confidence": cfg.study.confidence,
        "rows": rows,
        "difference": differences,
        "taxonomy": taxonomy.name,
    }


def _std0(per: np.ndarray) -> np.ndarray:
    return per.std(0, ddof=1) if per.shape[0] > 1 else np.zeros(per.shape[1])


def _pm(v: Sequence[float], seeds: int) -> str:
    m, sd = v
    return f"{m:.3f}" if seeds < 2 or math.isnan(sd) else f"{m:.3f} ± {sd:.3f}"


def format_study(report: Mapping[str, Any]) -> str:
    """The study as text: the table (mean ± std over seeds) and the paired difference with its interval."""
    n_seeds = len(report["seeds"])
    levels = report["levels"]
    shown = [i for i, n in enumerate(levels) if n > 0]
    header = ["head", "decoder", "prediction", "accuracy", "hF1 (micro)", *[f"d{i + 1} (n={levels[i]})" for i in shown]]
    rows = []
    for r in report["rows"]:
        seeds = n_seeds if r["head"] != "label prior" else 1
        rows.append(
            [
                r["head"],
                r["decoder"],
                r["prediction"],
                _pm(r["accuracy"], seeds),
                _pm(r["hF1_micro"], seeds),
                *[f"{r['level_accuracy'][i][0]:.3f}" for i in shown],
            ]
        )
    seeds_txt = f"{n_seeds} seeds ({', '.join(map(str, report['seeds']))})" if n_seeds > 1 else "1 seed"
    lines = [
        f"{report['name']}: {seeds_txt}, {report['samples']} samples of split {report['split']!r}; "
        "mean ± std over seeds; d<k>: accuracy at depth k over the n samples whose label reaches it",
        format_table(header, rows),
    ]
    for d in report["difference"]:
        level = round(100 * report["confidence"])
        verdict = (
            f"{d['a']} is ahead"
            if d["low"] > 0
            else (f"{d['b']} is ahead" if d["high"] < 0 else "no difference shown (the interval contains 0)")
        )
        lines.append(
            f"hF1 (micro) {d['a']} - {d['b']}, {d['decoder']}: {d['difference']:+.3f} "
            f"({level}% CI [{d['low']:+.3f}, {d['high']:+.3f}], paired bootstrap over {d['samples']} samples, "
            f"seeds pooled, {d['resamples']} resamples): {verdict}"
        )
    if report.get("conformal"):
        lines.append(_format_conformal(report["conformal"], n_seeds))
    best = report.get("best_run")
    if best:
        lines.append(
            f"best run (what evaluate/predict --model <this folder> load): {best['run']}, "
            f"{best['metric']} {best['value']:.4f} on split {best['split']!r}"
        )
    return "\n".join(lines)


def _format_conformal(conf: Mapping[str, Any], n_seeds: int) -> str:
    alpha = conf["alpha"]
    header = ["head", "conformal", "threshold", "coverage", "mean set size", "mean depth"]
    cols = ("threshold", "coverage", "mean_set_size", "mean_depth")
    rows = [[r["head"], r["method"], *[_pm(r[c], n_seeds) for c in cols]] for r in conf["rows"]]
    return (
        f"conformal: alpha = {alpha:g} (target coverage {1 - alpha:g}; risk:<loss> targets E[loss] <= {alpha:g}), "
        f"calibrated on {conf['n_calibration']} samples of split {conf['calibration_split']!r}, checked on "
        f"{conf['n_test']} samples of split {conf['split']!r}; threshold = the posterior rule at 1 - alpha, "
        f"not conformal\n{format_table(header, rows)}"
    )


def plot_study(report: Mapping[str, Any], png_path: str | Path) -> Path:
    """Accuracy per depth of every head (mean ± std over seeds), one panel per decoder, prior dashed."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    decoders = report["decoders"]
    shown = [i for i, n in enumerate(report["levels"]) if n > 0]
    fig, axes = plt.subplots(1, len(decoders), figsize=(5.5 * len(decoders), 4), squeeze=False)
    for ax, dec in zip(axes[0], decoders, strict=True):
        for r in report["rows"]:
            if r["decoder"] != dec:
                continue
            m = np.array([r["level_accuracy"][i][0] for i in shown])
            sd = np.array([r["level_accuracy"][i][1] for i in shown])
            x = np.array(shown) + 1
            style = "--" if r["head"] == "label prior" else "o-"
            ax.plot(x, m, style, label=f"{r['head']} (hF1 {r['hF1_micro'][0]:.3f})")
            ax.fill_between(x, m - sd, m + sd, alpha=0.2)
        ax.set_title(f"decoder {dec}")
        ax.set_xlabel("depth (1 = coarsest)")
        ax.set_ylabel("accuracy at depth")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{report['name']}: {len(report['seeds'])} seed(s), split {report['split']}")
    fig.tight_layout()
    out = Path(png_path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

"""Running a recipe with its head comparison: :func:`run_recipe`; a run's conformal rows: :func:`run_conformal`.

The result tables are :func:`hiercls.evaluation.format_results` (re-exported here for ``hiercls.train`` users).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hiercls._textio import atomic_write
from hiercls.evaluation import format_results, format_table
from hiercls.evaluation.model import run_probabilities
from hiercls.evaluation.table import conformal_rows
from hiercls.taxonomy import Taxonomy
from hiercls.train.config import TrainConfig
from hiercls.train.distributed import cleanup_distributed, init_distributed
from hiercls.train.inference import load_trained_model
from hiercls.train.loop import train

logger = logging.getLogger(__name__)

__all__ = [
    "format_conformal",
    "format_results",
    "run_conformal",
    "run_recipe",
]  # format_results: re-exported for hiercls.train users


def run_recipe(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Train ``cfg`` and then, for every head of ``cfg.compare_heads``, the same recipe with that head.

    The comparison runs go to ``<out_dir>/compare/<head>`` with the same data, seed and schedule. Returns
    ``{head: final results}`` (the main run first) and writes ``<out_dir>/comparison.json``. With
    ``eval.conformal`` set, every finished run's results get its conformal rows (:func:`run_conformal`).
    """
    # One process group for all the runs (under torchrun); train() reuses it.
    info = init_distributed(cfg.run.device)
    try:
        runs: dict[str, dict[str, Any]] = {cfg.model.head: train(cfg)}
        for head in cfg.compare_heads:
            if head in runs:
                continue
            other = copy.deepcopy(cfg)
            other.model.head = head
            other.model.head_options = {}
            other.compare_heads = []
            other.run.out_dir = str(cfg.out_dir / "compare" / head)
            logger.info("comparison run: head %s -> %s", head, other.run.out_dir)
            runs[head] = train(other)
    finally:
        cleanup_distributed(info)
    if not info.is_main:
        return runs
    if cfg.eval.conformal is not None:
        # After the process group is gone: rank 0 alone scores every sample of both splits.
        for results in runs.values():
            if not results.get("interrupted"):
                model, taxonomy, run_cfg = load_trained_model(results["out_dir"], which="best", device=info.device)
                probs, labels, _ = run_probabilities(
                    model, taxonomy, run_cfg, split=cfg.study.split, max_samples=cfg.study.max_samples or 0,
                    device=info.device,
                )  # fmt: skip
                results["conformal"] = run_conformal(
                    results["out_dir"], model, taxonomy, run_cfg, probs, labels, device=info.device
                )
    if len(runs) > 1:
        with atomic_write(cfg.out_dir / "comparison.json", encoding="utf-8") as f:
            json.dump(runs, f, indent=2)
    return runs


def run_conformal(
    run_dir: str | Path,
    model: torch.nn.Module,
    taxonomy: Taxonomy,
    cfg: TrainConfig,
    probs: np.ndarray,
    labels: np.ndarray,
    *,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Conformal rows of a finished run: calibrated on ``data.eval_split``, scored on the given split's rows.

    The calibration probabilities are the model's on ``data.eval_split`` (its first ``data.max_eval_samples``,
    the samples that picked the checkpoint); ``probs`` / ``labels`` are the checked split's (``study.split``;
    ``-1`` rows are left out). The rows are :func:`hiercls.evaluation.table.conformal_rows` at ``alpha =
    eval.conformal``, the same as ``hiercls evaluate --model RUN --conformal ALPHA``; they are added to the
    ``results.json`` of ``run_dir`` (the run folder) under ``"conformal"`` when the run has finished.

    Returns:
        ``{"alpha", "calibration_split", "split", "n_calibration", "n_test", "rows"}``; ``rows[method]`` holds
        ``threshold``, ``coverage``, ``mean_set_size`` and ``mean_depth``.

    Raises:
        ValueError: ``eval.conformal`` is not set, or a split has no labelled sample.
    """
    alpha, cal_split = cfg.eval.conformal, cfg.data.eval_split
    if alpha is None or cal_split is None:
        raise ValueError("run_conformal: needs eval.conformal (alpha) and data.eval_split (the calibration split)")
    cal_p, cal_y, _ = run_probabilities(model, taxonomy, cfg, split=cal_split, device=device)
    keep_cal, keep = cal_y >= 0, np.asarray(labels) >= 0
    if not keep_cal.any() or not keep.any():
        raise ValueError(f"eval.conformal: split {cal_split!r} or {cfg.study.split!r} has no labelled sample")
    rows, _ = conformal_rows(
        np.concatenate([cal_p[keep_cal], np.asarray(probs)[keep]]),
        np.concatenate([cal_y[keep_cal], np.asarray(labels)[keep]]),
        taxonomy,
        alpha,
        calibration=np.arange(int(keep_cal.sum())),
    )
    out = {
        "alpha": alpha,
        "calibration_split": cal_split,
        "split": cfg.study.split,
        "n_calibration": rows.n_calibration,
        "n_test": rows.n_test,
        "rows": rows.rows,
    }
    done = Path(run_dir) / "results.json"
    if done.is_file():
        results = json.loads(done.read_text(encoding="utf-8"))
        results["conformal"] = out
        with atomic_write(done, encoding="utf-8") as f:
            f.write(json.dumps(results, indent=2))
    return out


def format_conformal(runs: dict[str, dict[str, Any]]) -> str:
    """The conformal rows of every run that has them (``results["conformal"]``), one line per (run, method)."""
    header = ["run", "conformal", "threshold", "coverage", "mean set size", "mean depth"]
    rows, first = [], None
    for name, res in runs.items():
        conf = res.get("conformal")
        if conf is None:
            continue
        first = first or conf
        for method, v in conf["rows"].items():
            cells = [f"{v[c]:.3f}" for c in ("threshold", "coverage", "mean_set_size", "mean_depth")]
            rows.append([name, method, *cells])
    if first is None:
        return ""
    return (
        f"conformal: alpha = {first['alpha']:g} (target coverage {1 - first['alpha']:g}), calibrated on split "
        f"{first['calibration_split']!r} ({first['n_calibration']} samples), checked on split {first['split']!r} "
        f"({first['n_test']} samples); threshold = the posterior rule at 1 - alpha, not conformal\n"
        + format_table(header, rows)
    )

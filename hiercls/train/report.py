"""Running a recipe (with its head comparison) and the result tables printed by ``hiercls train/evaluate``.

Example:
    >>> res = {"argmax_leaf/accuracy": 0.5, "argmax_leaf/hF1_micro": 0.75,
    ...        "argmax_leaf/per_level_accuracy": [0.9, 0.5]}
    >>> print(format_results({"flat": res}, max_levels=2))
    head  decoder      accuracy  hF1    level 1  level 2
    ----  -----------  --------  -----  -------  -------
    flat  argmax_leaf  0.500     0.750  0.900    0.500
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from hiercls.train.config import TrainConfig

logger = logging.getLogger(__name__)

__all__ = ["decoders_in", "format_results", "run_recipe"]


def decoders_in(results: Mapping[str, Any]) -> list[str]:
    """Decoder names present in a results dict (keys ``<decoder>/<metric>``), in first-seen order."""
    seen: dict[str, None] = {}
    for key in results:
        if "/" in key:
            seen.setdefault(key.split("/", 1)[0], None)
    return list(seen)


def _fmt(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return "nan" if isinstance(v, float) and math.isnan(v) else f"{v:.3f}"
    return "-" if v is None else str(v)


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def format_results(runs: Mapping[str, Mapping[str, Any]], *, max_levels: int = 6,
                   extra: tuple[str, ...] = ()) -> str:
    """One row per (run, decoder): accuracy (exact match), micro hF1, per-level accuracy of the first levels.

    Args:
        runs: run label (e.g. head name) -> results of :func:`hiercls.train.train` / ``evaluate_model``.
        max_levels: number of depth levels shown.
        extra: more metric keys to show (e.g. ``("mistake_severity",)``).
    """
    if any(isinstance(res.get(f"{d}/dice"), list) for res in runs.values() for d in decoders_in(res)):
        return _format_dense(runs)
    levels = 0
    for res in runs.values():
        for d in decoders_in(res):
            per = res.get(f"{d}/per_level_accuracy")
            if isinstance(per, list):
                levels = max(levels, min(max_levels, len(per)))
    header = ["head", "decoder", "accuracy", "hF1", *extra, *[f"level {i + 1}" for i in range(levels)]]
    rows = []
    for label, res in runs.items():
        for d in decoders_in(res):
            per = res.get(f"{d}/per_level_accuracy")
            per = per if isinstance(per, list) else []
            dice = res.get(f"{d}/mean_dice")
            row = [label, d, _fmt(res.get(f"{d}/accuracy", dice)), _fmt(res.get(f"{d}/hF1_micro")),
                   *[_fmt(res.get(f"{d}/{k}")) for k in extra],
                   *[_fmt(per[i]) if i < len(per) else "-" for i in range(levels)]]
            rows.append(row)
    return format_table(header, rows)


def _format_dense(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """Segmentation results: mean Dice and Dice per nested region."""
    regions: list[str] = []
    for res in runs.values():
        for d in decoders_in(res):
            regions = regions or list(res.get(f"{d}/regions") or [])
            if not regions and isinstance(res.get(f"{d}/dice"), list):
                regions = [f"region {i + 1}" for i in range(len(res[f"{d}/dice"]))]
    header = ["head", "decoder", "mean Dice", *[f"Dice {r}" for r in regions]]
    rows = []
    for label, res in runs.items():
        for d in decoders_in(res):
            dice = res.get(f"{d}/dice") or []
            rows.append([label, d, _fmt(res.get(f"{d}/mean_dice")),
                         *[_fmt(dice[i]) if i < len(dice) else "-" for i in range(len(regions))]])
    return format_table(header, rows)


def run_recipe(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Train ``cfg`` and then, for every head of ``cfg.compare_heads``, the same recipe with that head.

    The comparison runs go to ``<out_dir>/compare/<head>`` with the same data, seed and schedule. Returns
    ``{head: final results}`` (the main run first) and writes ``<out_dir>/comparison.json``.
    """
    from hiercls.train.distributed import cleanup_distributed, init_distributed
    from hiercls.train.loop import train

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
        if info.is_main and len(runs) > 1:
            (cfg.out_dir / "comparison.json").write_text(json.dumps(runs, indent=2), encoding="utf-8")
        return runs
    finally:
        cleanup_distributed(info)

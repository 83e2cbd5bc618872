"""Running a recipe with its head comparison: :func:`run_recipe`.

The result tables are :func:`hiercls.evaluation.format_results` (re-exported here for ``hiercls.train`` users).
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

from hiercls._textio import atomic_write
from hiercls.evaluation import format_results
from hiercls.train.config import TrainConfig
from hiercls.train.distributed import cleanup_distributed, init_distributed
from hiercls.train.loop import train

logger = logging.getLogger(__name__)

__all__ = ["format_results", "run_recipe"]  # format_results: re-exported for hiercls.train users


def run_recipe(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Train ``cfg`` and then, for every head of ``cfg.compare_heads``, the same recipe with that head.

    The comparison runs go to ``<out_dir>/compare/<head>`` with the same data, seed and schedule. Returns
    ``{head: final results}`` (the main run first) and writes ``<out_dir>/comparison.json``.
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
        if info.is_main and len(runs) > 1:
            with atomic_write(cfg.out_dir / "comparison.json", encoding="utf-8") as f:
                json.dump(runs, f, indent=2)
        return runs
    finally:
        cleanup_distributed(info)

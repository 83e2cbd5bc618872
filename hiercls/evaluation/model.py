"""Evaluating a model on a data loader, or a trained run on a split of its recipe's data set.

:func:`evaluate_model` is what training evaluates with and :func:`evaluate_run` what ``hiercls evaluate --model``
runs; both score through one :class:`~hiercls.evaluation.Evaluator`, as ``hiercls evaluate --probs`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from hiercls.data import build_dataset, image_transform, subsample
from hiercls.decode import DecoderSpec
from hiercls.evaluation.evaluator import Evaluator
from hiercls.metrics import all_reduce_states
from hiercls.models import move_to_device
from hiercls.taxonomy import Taxonomy

__all__ = ["evaluate_model", "evaluate_run", "num_samples", "run_probabilities", "split_loader"]


def num_samples(targets: Any) -> int:
    """Samples a micro-batch's mean loss averages over (1-D targets: the non-ignored ones).

    Example:
        >>> num_samples(torch.tensor([3, -1, 2])), num_samples(torch.zeros(2, 5))
        (2, 2)
    """
    if isinstance(targets, torch.Tensor):
        if targets.dim() == 1 and not targets.dtype.is_floating_point:
            return int((targets != -1).sum())
        return int(targets.shape[0])
    return len(targets)


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    loader: Iterable[Any],
    taxonomy: Taxonomy,
    decoders: Sequence[str | DecoderSpec],
    *,
    device: torch.device,
    amp_dtype: torch.dtype | None = None,
    progress: bool = False,
    keep_probs: bool = False,
    collect: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[dict[str, Any], np.ndarray | None, np.ndarray | None]:
    """Hierarchical metrics of ``model`` on ``loader`` under each decoder (exact over DDP ranks).

    The node probabilities stay on ``device``: the decoders and the metrics run there, through one
    :class:`~hiercls.evaluation.Evaluator` (the same code as ``hiercls evaluate --probs`` and
    ``hiercls decode --labels``). The model is left in training mode.

    Args:
        model: a model with ``loss`` and ``node_probs`` (:class:`hiercls.models.HierarchicalModel`).
        loader: ``(inputs, targets)`` batches.
        taxonomy: the model's taxonomy.
        decoders: decoder specs.
        device: where the model runs.
        amp_dtype: the autocast dtype (``None``: full precision).
        progress: show a progress bar.
        keep_probs: also return this rank's probabilities and labels.
        collect: when given, receives this rank's ``(output, targets)`` batches on the CPU (for calibration).

    Returns:
        ``({"<decoder label>/<metric>": value, ..., "eval_loss": mean loss}, probs, labels)``; ``probs``/``labels``
        (this rank's, NumPy) only with ``keep_probs``.
    """
    model.eval()
    evaluator = Evaluator(taxonomy, decoders)
    loss_sum = torch.zeros(2, dtype=torch.float64)
    kept_p, kept_y = [], []
    # disable=None: a bar on a terminal only, never in a redirected log.
    for inputs, targets in tqdm(loader, desc="eval", disable=None if progress else True, leave=False):
        inputs, targets = move_to_device(inputs, device), move_to_device(targets, device)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            output = model(inputs)
            loss = model.loss(output, targets)
        n = num_samples(targets)
        loss_sum += torch.tensor([float(loss) * n, n], dtype=torch.float64)
        probs = model.node_probs(output).float()
        if collect is not None:
            out = output.detach().float().cpu() if isinstance(output, torch.Tensor) else output
            collect.append((out, targets.cpu()))
        evaluator.update(probs, targets)
        if keep_probs:
            kept_p.append(probs.cpu().numpy())
            kept_y.append(targets.cpu().numpy())
    results = evaluator.compute()
    loss_sum = all_reduce_states([{"loss": loss_sum}])[0]["loss"]
    results["eval_loss"] = float(loss_sum[0] / loss_sum[1]) if loss_sum[1] > 0 else float("nan")
    model.train()
    if keep_probs:
        return results, np.concatenate(kept_p) if kept_p else None, np.concatenate(kept_y) if kept_y else None
    return results, None, None


def evaluate_run(
    model: nn.Module,
    taxonomy: Taxonomy,
    cfg: Any,
    *,
    split: str | None = None,
    decoders: Sequence[str] | None = None,
    max_samples: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Hierarchical metrics of a trained model on a split of its recipe's data set.

    Args:
        model: the trained model (see :func:`hiercls.train.load_trained_model`).
        taxonomy: its taxonomy.
        cfg: the recipe (a :class:`hiercls.train.TrainConfig`; its ``data`` section says which data set).
        split: the split (default the recipe's ``data.eval_split``).
        decoders: decoder specs for :func:`hiercls.decode.parse_decoder` (default the recipe's ``eval.decoders``).
        max_samples: evaluate a fixed subset (default the recipe's ``data.max_eval_samples``; ``0`` = all).
        batch_size: evaluation batch size.
        device: where the model runs.
    """
    if max_samples is not None and (
        isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 0
    ):
        raise ValueError(f"max_samples must be a whole number >= 1 (or 0 for every sample); got {max_samples!r}")
    split = split or cfg.data.eval_split or "val"
    limit = cfg.data.max_eval_samples if max_samples is None else (max_samples or None)
    dev = torch.device(device)
    ds, loader = split_loader(model, taxonomy, cfg, split, limit, batch_size)
    results, _, _ = evaluate_model(model, loader, taxonomy, list(decoders or cfg.eval.decoders), device=dev)
    return {"split": split, "samples": len(ds), **results}


def run_probabilities(
    model: nn.Module,
    taxonomy: Taxonomy,
    cfg: Any,
    *,
    split: str | None = None,
    max_samples: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device = "cpu",
) -> tuple[np.ndarray, np.ndarray, str]:
    """``(node probabilities [S, N], labels [S], split)`` of a trained model on a split of its recipe's data set.

    What ``hiercls evaluate --model DIR --table`` scores with :func:`~hiercls.evaluation.decoder_metric_table`
    (the same samples, in the same order, as :func:`evaluate_run` with the same arguments).

    Raises:
        ValueError: the split has no samples.
    """
    split = split or cfg.data.eval_split or "val"
    limit = cfg.data.max_eval_samples if max_samples is None else (max_samples or None)
    _, loader = split_loader(model, taxonomy, cfg, split, limit, batch_size)
    # One decoder is the cheapest pass of evaluate_model; only the probabilities it keeps are used.
    _, probs, labels = evaluate_model(
        model, loader, taxonomy, ["argmax_leaf"], device=torch.device(device), keep_probs=True
    )
    assert probs is not None and labels is not None  # split_loader refuses an empty split
    return probs, labels, split


def split_loader(
    model: nn.Module,
    taxonomy: Taxonomy,
    cfg: Any,
    split: str,
    max_samples: int | None,
    batch_size: int | None,
) -> tuple[Any, torch.utils.data.DataLoader]:
    """``(dataset, loader)`` of a split of the recipe's data set, in a fixed order, with the model's eval transform.

    Raises:
        ValueError: the split has no samples.
    """
    transform = image_transform(model, train=False, image_size=cfg.data.image_size, augment=cfg.data.augment)
    ds = subsample(build_dataset(cfg.data.dataset, split, taxonomy, cfg.data.options, transform), max_samples)
    if len(ds) == 0:
        raise ValueError(f"split {split!r} of data set {cfg.data.dataset!r} has no samples to evaluate")
    size = batch_size or cfg.data.eval_batch_size or cfg.data.batch_size
    loader = torch.utils.data.DataLoader(ds, batch_size=size, shuffle=False, collate_fn=getattr(model, "collate", None))
    return ds, loader

"""Training targets as soft leaf distributions: timm's Mixup / CutMix and label smoothing (``data.mixup``).

:class:`SoftTargets` turns a micro-batch's node-id targets ``[B]`` into a distribution over the leaves
``[B, num_leaves]`` (``taxonomy.leaves`` order, the order of every head's soft targets) and mixes the inputs
with ``timm.data.Mixup``. Mixup draws from NumPy's global random stream, which the run's checkpoints capture
(:func:`hiercls.train.checkpoint.rng_state`), so resuming stays exact. Each rank draws its own mixing weights
(timm's behaviour under DDP), so a mixup run is not bitwise the same for every world size.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from hiercls.taxonomy import Taxonomy
from hiercls.train.config import ConfigError, MixupConfig

logger = logging.getLogger(__name__)

__all__ = ["SoftTargets", "build_soft_targets"]


class SoftTargets:
    """Mixup / CutMix of a batch and its leaf targets, or label smoothing alone.

    Args:
        config: the recipe's ``data.mixup``.
        taxonomy: the run's taxonomy (leaf order, and the names in errors).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> soft = SoftTargets(MixupConfig(label_smoothing=0.3), tax)
        >>> x, q = soft(torch.zeros(2, 1), torch.tensor([2, -1]))
        >>> [[round(v, 3) for v in row] for row in q.tolist()]  # leaves x, y, b; an ignored row stays ignored
        [[0.8, 0.1, 0.1], [-1.0, -1.0, -1.0]]
    """

    def __init__(self, config: MixupConfig, taxonomy: Taxonomy) -> None:
        self.taxonomy, self.num_leaves = taxonomy, taxonomy.num_leaves
        self.smoothing = float(config.label_smoothing)
        self.leaf_index = torch.as_tensor(np.array(taxonomy.leaf_index, dtype=np.int64))
        from timm.data import mixup as timm_mixup  # timm's import is heavy: only recipes that use it pay for it

        self._one_hot = timm_mixup.mixup_target  # (leaf positions, L, lam=1, smoothing): smoothed one-hot rows
        self.mixup = None
        if config.mixup_alpha > 0 or config.cutmix_alpha > 0:
            self.mixup = timm_mixup.Mixup(
                mixup_alpha=config.mixup_alpha,
                cutmix_alpha=config.cutmix_alpha,
                prob=config.prob,
                switch_prob=config.switch_prob,
                mode=config.mode,
                label_smoothing=self.smoothing,
                num_classes=self.num_leaves,
            )

    def leaf_positions(self, targets: torch.Tensor) -> torch.Tensor:
        """Leaf positions ``[B]`` of node-id targets (``-1`` stays ``-1``); an internal-node label is refused."""
        if not isinstance(targets, torch.Tensor) or targets.dim() != 1 or targets.is_floating_point():
            raise ConfigError(f"data.mixup: needs integer node-id targets [B]; got {_describe(targets)}")
        t = targets.long().cpu()
        pos = torch.where(t >= 0, self.leaf_index[t.clamp(min=0)], torch.full_like(t, -1))
        internal = (t >= 0) & (pos < 0)
        if bool(internal.any()):
            node = int(t[internal][0])
            raise ConfigError(
                f"data.mixup: label {self.taxonomy.name_of(node)!r} (node {node}) is not a leaf; mixup and label "
                f"smoothing need leaf labels (a distribution over the leaves)"
            )
        return pos

    def __call__(self, inputs: Any, targets: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """``(inputs, soft targets [B, num_leaves] float32)``; a row of ``-1`` is an ignored sample (its own label
        was ``-1``, or, mixed, its partner's).

        The inputs are mixed where they are (on the device); the targets are built on the host and returned on
        ``targets``' device, so that a training loop can count a batch's samples without a device sync.
        """
        pos = self.leaf_positions(targets)
        ignored = pos < 0
        pos = pos.clamp(min=0)
        if self.mixup is None:
            soft = self._one_hot(pos, self.num_leaves, 1.0, self.smoothing)
            return inputs, soft.masked_fill(ignored[:, None], -1.0).to(targets.device)
        if not isinstance(inputs, torch.Tensor) or not inputs.is_floating_point():
            raise ConfigError(f"data.mixup: mixup / cutmix mix input tensors (images); got {_describe(inputs)}")
        # timm mixes sample i with sample B - 1 - i and needs an even batch: an odd one leaves its last sample as
        # it is (smoothed only).
        even = len(pos) - len(pos) % 2
        _, mixed = self.mixup(inputs[:even], pos[:even])
        if even < len(pos):
            mixed = torch.cat([mixed, self._one_hot(pos[even:], self.num_leaves, 1.0, self.smoothing)])
        ignored[:even] |= ignored[:even].flip(0)
        return inputs, mixed.masked_fill(ignored[:, None], -1.0).to(targets.device)


def build_soft_targets(config: MixupConfig, taxonomy: Taxonomy, head: str) -> SoftTargets | None:
    """The recipe's :class:`SoftTargets`, or ``None`` when ``data.mixup`` is off (hard targets, as before).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("r", "b")])
        >>> build_soft_targets(MixupConfig(), tax, "flat") is None
        True
    """
    if not (config.mixup_alpha > 0 or config.cutmix_alpha > 0 or config.label_smoothing > 0):
        return None
    if head == "semantic_softmax" and config.label_smoothing > 0:
        logger.warning(
            "data.mixup.label_smoothing=%g smooths over the leaves and the semantic_softmax head smooths each level "
            "again (model.head_options.label_smoothing); set one of them to 0 for the published recipe",
            config.label_smoothing,
        )
    return SoftTargets(config, taxonomy)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {list(x.shape)}"
    return type(x).__name__

"""``semantic_softmax``: one softmax per semantic level, as in ImageNet-21K pretraining (Ridnik et al. 2021)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hiercls.heads.base import HierarchicalHead
from hiercls.heads.registry import register_head
from hiercls.losses.chained_softmax import ChainedSoftmax
from hiercls.losses.semantic import SemanticKDLoss, SemanticSoftmaxLoss
from hiercls.losses.validation import upcast
from hiercls.taxonomy import Taxonomy

__all__ = ["SemanticSoftmaxHead"]


@register_head("semantic_softmax")
class SemanticSoftmaxHead(HierarchicalHead):
    """A linear layer over all classes read as one softmax per semantic level.

    Training uses :class:`~hiercls.losses.SemanticSoftmaxLoss` (label smoothing 0.2, level weights
    ``min(C / #classes at level >= l, 20)``, every level trained; ``drop_deepest_level=True`` for the published
    loss, without the deepest level). :meth:`distillation_loss` is semantic KD.

    Node probabilities chain the level softmaxes top-down: ``P(c) = P(q) * softmax_l(z)[c]`` renormalised over
    the classes sharing ``c``'s nearest class ancestor ``q``; so a class's class-children sum to it (no stop
    mass), nodes that are not classes get the sum of their children, the root 1. :meth:`predict_levels` gives
    the independent per-level argmax (the published inference).

    Args:
        taxonomy: a tree whose ``classes`` are the labels (default: every node but the root).
        in_features: feature dimension.
        label_smoothing: per-level label smoothing (default 0.2).
        max_weight: cap of the level weights (default 20).
        normalize: ``"none"`` (published weighting) or ``"present"`` (see the loss).
        drop_deepest_level: leave the deepest level out of the loss, as the published code does.
        bias: linear layer bias.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> head = SemanticSoftmaxHead(tax, 4)
        >>> out = head(torch.randn(2, 4))
        >>> head.predict_levels(out).shape, head.node_probs(out).shape
        (torch.Size([2, 2]), torch.Size([2, 5]))
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        in_features: int,
        *,
        label_smoothing: float = 0.2,
        max_weight: float = 20.0,
        normalize: str = "none",
        drop_deepest_level: bool = False,
        bias: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(taxonomy, in_features, **options)
        self.criterion = SemanticSoftmaxLoss(
            taxonomy,
            label_smoothing=label_smoothing,
            max_weight=max_weight,
            normalize=normalize,
            drop_deepest_level=drop_deepest_level,
        )
        self.layout = self.criterion.layout
        self.num_outputs = self.layout.num_classes
        self._fill_nonclass = not self.layout.all_nodes_are_classes
        if not self._fill_nonclass:
            # The same chained softmaxes with outputs in node-id order, so node_probs needs one gather and no
            # reordering after it: node n >= 1 is output n - 1 and reads its class's logit; the root is a lead column.
            chained, pos = self.layout.chained, np.zeros(taxonomy.num_nodes, dtype=np.int64)
            pos[self.layout.class_ids.numpy()] = np.arange(self.num_outputs)
            group = chained.group.numpy()[pos[1:]]
            parent_node = self.layout.class_ids.numpy()[chained.parent.numpy()]
            parent = np.where(chained.has_parent.numpy(), parent_node - 1, -1)
            self.node_softmax = ChainedSoftmax(group, parent, input_order=pos[1:])
        if self._fill_nonclass:
            # Depth-wise tables to sum children into the nodes that are not classes (bottom-up).
            depth, parent, is_class = taxonomy.depth, taxonomy.parent, taxonomy.class_mask
            self._fill_depths = []
            for d in range(taxonomy.height - 1, -1, -1):
                targets = np.flatnonzero((depth == d) & ~is_class & ~taxonomy.is_leaf)
                if len(targets):
                    kids = np.flatnonzero(depth == d + 1)
                    self.register_index(f"fill_children_{d}", kids)
                    self.register_index(f"fill_parents_{d}", parent[kids])
                    self.register_index(f"fill_targets_{d}", targets)
                    self._fill_depths.append(d)
        self._build_linear(bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Class logits ``[B, C]``, level-major (``self.layout.slices[l]`` is level ``l``)."""
        return self._linear(features)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.criterion(output, targets)

    def distillation_loss(
        self, output: torch.Tensor, teacher_output: torch.Tensor, *, distance: str = "mse", level_weights: bool = False
    ) -> torch.Tensor:
        """Semantic KD from a teacher with the same layout (:class:`~hiercls.losses.SemanticKDLoss`)."""
        key = (distance, level_weights)
        if getattr(self, "_kd_key", None) != key:
            self._kd = SemanticKDLoss(self.taxonomy, distance=distance, level_weights=level_weights).to(output.device)
            self._kd_key = key
        return self._kd(output, teacher_output)

    def level_probs(self, output: torch.Tensor) -> list[torch.Tensor]:
        """The independent per-level softmaxes, ``[B, level_sizes[l]]`` each (float32)."""
        return [torch.softmax(z.float(), dim=1) for z in self.layout.split(output)]

    def predict_levels(self, output: torch.Tensor) -> torch.Tensor:
        """Per-level argmax as node ids ``[B, num_levels]`` (the published per-level inference).

        Score them with :func:`hiercls.metrics.level_argmax_accuracy_score` (the published semantic accuracy,
        which does not close the per-level predictions under ancestors). Ties: the smallest node id (a level's
        logits are in id order and ``argmax`` takes the first maximum).
        """
        ids = self.layout.class_ids
        preds = [ids[s][z.argmax(1)] for s, z in zip(self.layout.slices, self.layout.split(output), strict=True)]
        return torch.stack(preds, dim=1)

    def node_probs(self, output: torch.Tensor) -> torch.Tensor:
        if not self._fill_nonclass:  # every node but the root is a class: outputs in node order, in [0, 1], root 1
            self.layout.split(output)  # shape check
            return self.node_softmax.probs(upcast(output), lead=1).float()
        probs = self.layout.class_probs(output)
        out = probs.new_zeros(probs.shape[0], self.taxonomy.num_nodes)
        out = out.index_copy(1, self.layout.class_ids, probs)
        for d in self._fill_depths:
            kids = self._buffers[f"fill_children_{d}"]
            sums = torch.zeros_like(out).index_add(1, self._buffers[f"fill_parents_{d}"], out[:, kids])
            tgt = self._buffers[f"fill_targets_{d}"]
            out = out.index_copy(1, tgt, sums[:, tgt])
        out = out.float().clamp_(0.0, 1.0)  # a sum of children may round above 1
        out[:, 0] = 1.0
        return out

"""``nested_sigmoid``: nested-region probabilities (BraTS WT ⊃ TC ⊃ ET), for vectors and dense 2-D/3-D maps."""

from __future__ import annotations

from typing import Any

import torch

from hiercls.heads.base import HierarchicalHead
from hiercls.heads.registry import register_head
from hiercls.losses.nested import NestedRegionLoss, node_ids_to_regions
from hiercls.taxonomy import Taxonomy

__all__ = ["NestedSigmoidHead", "node_ids_to_regions"]


@register_head("nested_sigmoid")
class NestedSigmoidHead(HierarchicalHead):
    """Sigmoid per region chained down the tree: ``p(n) = p(parent) * sigmoid(z_n)``, nested by construction.

    Features ``[B, D]`` give ``[B, N - 1]`` logits; dense features ``[B, D, H, W(, Z)]`` give per-voxel logits
    ``[B, N - 1, H, W(, Z)]`` through the same weights (a 1x1(x1) convolution). :meth:`node_probs` is
    ``[B, N(, *spatial)]`` with the root (background-or-anything) at 1. The loss is
    :class:`~hiercls.losses.NestedRegionLoss` (BCE and/or soft Dice per region) with targets given as node ids
    ``[B]`` / ``[B, *spatial]`` or region masks ``[B, N - 1, *spatial]``. For BraTS, build the taxonomy and the
    masks with :func:`hiercls.taxonomy.regions.brats_regions`.

    Args:
        taxonomy: a tree (a chain for nested regions; a general tree gives nested multi-label probabilities).
        in_features: feature (channel) dimension.
        loss: ``"bce"``, ``"dice"`` or ``"bce+dice"`` (default).
        dice_smooth: Dice smoothing (default 1).
        dice_weight: weight of Dice in ``"bce+dice"`` (default 1).
        bias: bias of the linear map.

    Example:
        >>> chain = Taxonomy([("root", "WT"), ("WT", "TC"), ("TC", "ET")])
        >>> head = NestedSigmoidHead(chain, 8)
        >>> p = head.node_probs(head(torch.randn(2, 8, 4, 4)))
        >>> p.shape, bool((p[:, 1] >= p[:, 2]).all() and (p[:, 2] >= p[:, 3]).all())
        (torch.Size([2, 4, 4, 4]), True)
    """

    supports_dense = True

    def __init__(
        self,
        taxonomy: Taxonomy,
        in_features: int,
        *,
        loss: str = "bce+dice",
        dice_smooth: float = 1.0,
        dice_weight: float = 1.0,
        bias: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(taxonomy, in_features, **options)
        self.criterion = NestedRegionLoss(taxonomy, loss=loss, dice_smooth=dice_smooth, dice_weight=dice_weight)
        self.num_outputs = taxonomy.num_nodes - 1
        self._build_linear(bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Region logits ``[B, N - 1(, *spatial)]`` (node ``n`` is channel ``n - 1``)."""
        return self._linear(features)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.criterion(output, targets)

    def node_probs(self, output: torch.Tensor) -> torch.Tensor:
        return self.criterion.nested(output)[0].exp().float()

    def region_probs(self, output: torch.Tensor) -> torch.Tensor:
        """Region probabilities without the root, ``[B, N - 1(, *spatial)]`` (the layout of region masks)."""
        return self.node_probs(output)[:, 1:]

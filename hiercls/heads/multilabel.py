"""``multilabel``: a sigmoid per node (hierarchical multi-label text classification), optionally C-HMCNN."""

from __future__ import annotations

from typing import Any

import torch

from hiercls.heads.base import HierarchicalHead
from hiercls.heads.registry import register_head
from hiercls.losses.multilabel import HierarchicalBCELoss, mcm_logits
from hiercls.taxonomy import Taxonomy

__all__ = ["MultiLabelHead"]


@register_head("multilabel")
class MultiLabelHead(HierarchicalHead):
    """Independent sigmoids over every non-root node, read coherently through the max-constraint (MCM).

    Training: BCE on ancestor-closed targets (node ids ``[B]`` or multi-hot ``[B, N]``), or with
    ``coherent=True`` C-HMCNN's MCLoss. Node probabilities are always the MCM output
    ``P(n) = max(sigmoid(z_d) for d descendant-or-self of n)``, which makes a parent at least as likely as each
    child on trees and DAGs (without ``coherent`` this is C-HMCNN's post-hoc correction). The root is 1.

    Args:
        taxonomy: a tree or a DAG.
        in_features: feature dimension.
        coherent: train with MCLoss (default ``False``).
        pos_weight: optional weight of positive targets.
        bias: linear layer bias.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> head = MultiLabelHead(tax, 4, coherent=True)
        >>> out = head(torch.randn(2, 4))
        >>> p = head.node_probs(out)
        >>> bool((p[:, 1] >= p[:, 2]).all()), head.loss(out, torch.tensor([2, 4])).ndim
        (True, 0)
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        in_features: int,
        *,
        coherent: bool = False,
        pos_weight: float | None = None,
        bias: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(taxonomy, in_features, **options)
        self.criterion = HierarchicalBCELoss(taxonomy, coherent=coherent, pos_weight=pos_weight)
        self.num_outputs = taxonomy.num_nodes - 1
        self._build_linear(bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Node logits ``[B, N - 1]`` (node ``n`` is column ``n - 1``)."""
        return self._linear(features)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.criterion(output, targets)

    def node_probs(self, output: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(mcm_logits(output, self.criterion.ops)).float()
        return torch.cat([p.new_ones(p.shape[0], 1), p], dim=1)

"""Heads with one softmax over the leaves: ``flat`` (cross-entropy), ``hxe`` and ``soft_labels``.

All three share the layout (``num_outputs = num_leaves``, logits in the order of ``taxonomy.leaves``) and the
node probabilities: the marginals ``P(n) = sum of the leaf probabilities below n`` (a parent is exactly the
sum of its children on a tree; labels never stop at an internal node).
"""

from __future__ import annotations

from typing import Any

import torch

from hiercls.heads.base import HierarchicalHead
from hiercls.heads.registry import register_head
from hiercls.losses.leaf import HXELoss, LeafCrossEntropy, SoftLabelLoss
from hiercls.taxonomy import DistanceKind, Taxonomy
from hiercls.taxonomy.tensors import TreeOps, node_probs_from_leaves

__all__ = ["FlatSoftmaxHead", "HXEHead", "SoftLabelHead", "leaf_probs_to_node_probs"]


def leaf_probs_to_node_probs(taxonomy: Taxonomy, leaf_probs: torch.Tensor) -> torch.Tensor:
    """Node probabilities ``[B, N]`` (float32) from leaf probabilities ``[B, num_leaves]``.

    The node-probability contract of the heads (see :meth:`hiercls.taxonomy.tensors.TreeOps.node_probs`).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> leaf_probs_to_node_probs(tax, torch.tensor([[0.5, 0.25, 0.25]])).tolist()
        [[1.0, 0.75, 0.5, 0.25, 0.25]]
    """
    return node_probs_from_leaves(taxonomy, leaf_probs)


class _LeafSoftmaxHead(HierarchicalHead):
    def __init__(self, taxonomy: Taxonomy, in_features: int, *, bias: bool = True, **options: Any) -> None:
        super().__init__(taxonomy, in_features, **options)
        self.num_outputs = taxonomy.num_leaves
        self.tree_ops = TreeOps(taxonomy)
        self._build_linear(bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Leaf logits ``[B, num_leaves]``."""
        return self._linear(features)

    def node_probs(self, output: torch.Tensor) -> torch.Tensor:
        """Marginals of the leaf softmax: ``P(n) = sum of softmax(logits)`` over the leaves below ``n``."""
        return self.tree_ops.node_probs(torch.softmax(output.float(), dim=1))


@register_head("flat")
class FlatSoftmaxHead(_LeafSoftmaxHead):
    """The baseline: a linear layer and a softmax over the leaves, trained with cross-entropy.

    A sample labelled with an internal node scores the marginal of its subtree (``-log sum of its leaves``).

    Args:
        taxonomy: tree or DAG.
        in_features: feature dimension.
        label_smoothing: uniform smoothing over the leaves (default 0).
        bias: linear layer bias.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> head = FlatSoftmaxHead(tax, 4)
        >>> out = head(torch.randn(2, 4))
        >>> head.loss(out, torch.tensor([2, 1])).ndim, head.node_probs(out)[:, 0].tolist()
        (0, [1.0, 1.0])
    """

    def __init__(
        self, taxonomy: Taxonomy, in_features: int, *, label_smoothing: float = 0.0, bias: bool = True, **options: Any
    ) -> None:
        super().__init__(taxonomy, in_features, bias=bias, **options)
        self.criterion = LeafCrossEntropy(taxonomy, label_smoothing=label_smoothing)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.criterion(output, targets)


@register_head("hxe")
class HXEHead(_LeafSoftmaxHead):
    """Leaf softmax trained with hierarchical cross-entropy (:class:`~hiercls.losses.HXELoss`).

    Args:
        taxonomy: a tree.
        in_features: feature dimension.
        alpha: weight decay with depth, ``lambda(n) = exp(-alpha * depth(n))`` (default 0.1).
        normalize: normalise the weights to sum to one over all nodes (default ``True``, as published).
        bias: linear layer bias.
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        in_features: int,
        *,
        alpha: float = 0.1,
        normalize: bool = True,
        bias: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(taxonomy, in_features, bias=bias, **options)
        self.criterion = HXELoss(taxonomy, alpha=alpha, normalize=normalize)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.criterion(output, targets)


@register_head("soft_labels")
class SoftLabelHead(_LeafSoftmaxHead):
    """Leaf softmax trained on soft labels ``softmax(-beta * d(leaf, y) / d_max)``
    (:class:`~hiercls.losses.SoftLabelLoss`).

    Args:
        taxonomy: a tree (a DAG only when small enough for the precomputed table).
        in_features: feature dimension.
        beta: sharpness (default 10), the paper's hardness when ``normalize_distances`` (Bertinetto et al.).
        kind: taxonomy distance (default ``"lca_height"``).
        normalize_distances: divide the distances by the largest leaf-to-leaf one, ``d_max``, as the reference
            code does (default); ``False`` keeps hiercls's earlier raw scale (``d_max = 1``).
        bias: linear layer bias.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> SoftLabelHead(tax, 4, beta=4.0, normalize_distances=False).criterion.distance_scale
        1.0
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        in_features: int,
        *,
        beta: float = 10.0,
        kind: DistanceKind = "lca_height",
        normalize_distances: bool = True,
        bias: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(taxonomy, in_features, bias=bias, **options)
        self.criterion = SoftLabelLoss(taxonomy, beta=beta, kind=kind, normalize_distances=normalize_distances)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.criterion(output, targets)

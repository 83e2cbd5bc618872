"""``conditional_softmax``: one softmax per parent over its children (hierarchical softmax), optionally Huffman."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hiercls.heads.base import HierarchicalHead
from hiercls.heads.registry import register_head
from hiercls.losses.conditional import ConditionalSoftmax, huffman_tree
from hiercls.losses.leaf import LeafCrossEntropy
from hiercls.losses.validation import check_leaf_distribution, is_soft_targets
from hiercls.taxonomy import Taxonomy
from hiercls.taxonomy.tensors import TreeOps

__all__ = ["ConditionalSoftmaxHead"]


@register_head("conditional_softmax")
class ConditionalSoftmaxHead(HierarchicalHead):
    """Conditional softmax over the taxonomy tree; node probabilities are products along the root path.

    The loss is ``-log P(label)``: the sum of ``-log P(n | parent)`` down the label's path. With ``stop=True``
    each internal node's softmax has an extra "stop here" outcome and an internal label also pays
    ``-log P(stop | label)``; node probabilities then satisfy ``P(n) = sum of children + P(stop at n)``.

    With ``huffman_counts`` (label frequencies, one per leaf in ``taxonomy.leaves`` order) the softmaxes run over
    a binary Huffman tree of the leaves instead (word2vec style, for flat label sets): ``2 (L - 1)`` logits, short
    paths for frequent labels; node probabilities of the taxonomy are the leaf marginals. Internal labels are
    then scored by the marginal of their leaves.

    Soft targets ``q [B, num_leaves]`` (a leaf distribution) give ``-sum_leaf q(leaf) log P(leaf)``: the loss is
    linear in a one-hot target and this is the expectation of the hard loss.

    Args:
        taxonomy: a tree (with ``huffman_counts``, any taxonomy).
        in_features: feature dimension.
        stop: model labels that stop at internal nodes (default ``False``).
        huffman_counts: optional per-leaf frequencies to build a Huffman tree.
        bias: linear layer bias.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> head = ConditionalSoftmaxHead(tax, 4, stop=True)
        >>> p = head.node_probs(head(torch.randn(2, 4)))
        >>> bool((p[:, 1] >= p[:, 2] + p[:, 3] - 1e-6).all())  # a = x + y + P(stop at a)
        True
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        in_features: int,
        *,
        stop: bool = False,
        huffman_counts: Sequence[float] | np.ndarray | None = None,
        bias: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(taxonomy, in_features, **options)
        self.huffman = huffman_counts is not None
        if self.huffman:
            if stop:
                raise ValueError("stop=True cannot be combined with huffman_counts (Huffman leaves are the labels)")
            counts = np.asarray(huffman_counts, dtype=np.float64)
            if counts.shape != (taxonomy.num_leaves,):
                raise ValueError(
                    f"huffman_counts must have one count per leaf ({taxonomy.num_leaves}, in "
                    f"taxonomy.leaves order); got shape {counts.shape}"
                )
            self.tree = huffman_tree(
                [taxonomy.name_of(i) for i in taxonomy.leaves], counts, name=f"{taxonomy.name}-huffman"
            )
            # Huffman node id of each taxonomy leaf, in taxonomy.leaves order.
            self.register_index("huffman_leaf_ids", self.tree.ids([taxonomy.name_of(i) for i in taxonomy.leaves]))
            self.tree_ops = TreeOps(taxonomy)
            self.leaf_ce = LeafCrossEntropy(taxonomy)
        else:
            self.tree = taxonomy
        self.softmax = ConditionalSoftmax(self.tree, stop=stop)
        self.num_outputs = self.softmax.num_outputs
        self.register_index("leaf_ids", taxonomy.leaves)
        self._build_linear(bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, num_outputs]`` (one per non-root node of the tree, then the stop logits)."""
        return self._linear(features)

    def _leaf_log_probs(self, output: torch.Tensor) -> torch.Tensor:
        return self.softmax.node_log_probs(output).index_select(1, self.huffman_leaf_ids)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if is_soft_targets(targets):
            q, keep = check_leaf_distribution(targets, self.taxonomy.num_leaves, batch=output.shape[0])
            if self.huffman:
                ll = self._leaf_log_probs(output)
            else:
                ll = self.softmax.node_log_probs(output).index_select(1, self.leaf_ids)
            nll = -(q.to(ll.dtype) * ll).sum(1)
            return (nll * keep).sum() / keep.sum().clamp(min=1)
        t = self._check_targets(targets, output.shape[0])
        valid = t >= 0
        t = t.clamp(min=0)
        if self.huffman:
            leaf_pos = self.leaf_ce.leaf_index[t]
            if bool((leaf_pos < 0).any()):  # internal labels: marginal over the full leaf distribution
                ll = self.leaf_ce.log_marginal(self._leaf_log_probs(output), t)
            else:  # only the label's Huffman path is needed
                ll = self.softmax.label_log_likelihood(output, self.huffman_leaf_ids[leaf_pos])
        else:
            ll = self.softmax.label_log_likelihood(output, t)
        return -(ll * valid).sum() / valid.sum().clamp(min=1)

    def node_probs(self, output: torch.Tensor) -> torch.Tensor:
        if self.huffman:
            return self.tree_ops.node_probs(self._leaf_log_probs(output).exp().float())
        return self.softmax.node_probs(output).float()

    def stop_probs(self, output: torch.Tensor) -> torch.Tensor:
        """``P(label stops at n)`` for every node ``[B, N]`` (leaves: their own probability). Needs ``stop=True``."""
        if not self.softmax.stop:
            raise ValueError("stop_probs needs a head built with stop=True")
        cond, stop = self.softmax.conditional_log_probs(output)
        logp = self.softmax.ops.top_down_sum(cond)
        k = self.softmax.internal_index
        extra = torch.where(k >= 0, stop.index_select(1, k.clamp(min=0)), torch.zeros_like(logp))
        return (logp + extra).exp()

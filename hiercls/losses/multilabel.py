"""Multi-label over all nodes with sigmoids: BCE on ancestor-closed targets, and C-HMCNN's MCM / MCLoss.

Layout: one logit per non-root node (logit ``n - 1`` for node ``n``). C-HMCNN (Giunchiglia & Lukasiewicz,
NeurIPS 2020): the constrained output of a node is the max of the sigmoids of its descendants-or-self (MCM),
so a parent is never below a child; MCLoss trains it with, for a positive node, the max over its *positive*
descendants only. Since the sigmoid is monotone both maxima are taken on the logits, and the BCE is computed
with logits: finite for any logit size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hiercls.losses.validation import check_leaf_distribution, is_soft_targets, upcast
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.tensors import TreeOps, as_tensor

__all__ = ["HierarchicalBCELoss", "close_targets", "mcm_logits"]


def mcm_logits(logits: torch.Tensor, ops: TreeOps) -> torch.Tensor:
    """C-HMCNN's max-constraint on logits ``[B, N - 1]``: ``max`` over descendants-or-self (trees and DAGs)."""
    z = upcast(logits)
    full = torch.cat([z.new_full((z.shape[0], 1), -math.inf), z], 1)
    return ops.descendant_max(full)[:, 1:]


def close_targets(targets: torch.Tensor, ops: TreeOps) -> torch.Tensor:
    """Ancestor closure of multi-hot targets ``[B, N]``: a node is positive when a descendant-or-self is."""
    return ops.descendant_max(targets if targets.is_floating_point() else targets.float())


class HierarchicalBCELoss(nn.Module):
    """Binary cross-entropy over all non-root nodes (the hierarchical text classification convention).

    Targets are node ids ``[B]`` (``-1`` = ignore), multi-hot or soft node marginals ``[B, N]`` (a row with a
    negative entry is ignored), or a leaf distribution ``[B, num_leaves]`` (float, mixup / cutmix), read as its
    node marginals; they are ancestor-closed here (idempotent on already closed targets). BCE is linear in the
    target, so soft marginals give the expectation of the hard loss over the leaves; MCLoss is not linear:
    its positive-descendant mask takes the nodes with target above 1/2. With ``coherent=True`` the
    loss is C-HMCNN's MCLoss; otherwise plain BCE on the raw logits. Mean over nodes and kept samples.

    Args:
        taxonomy: a tree or a DAG.
        coherent: use MCLoss (default ``False``).
        pos_weight: optional weight of positive targets (scalar), e.g. for sparse label sets.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> loss = HierarchicalBCELoss(tax)
        >>> round(loss(torch.zeros(1, 4), torch.tensor([2])).item(), 4)  # log 2 for every node
        0.6931
    """

    def __init__(self, taxonomy: Taxonomy, coherent: bool = False, pos_weight: float | None = None) -> None:
        super().__init__()
        if taxonomy.num_nodes < 2:
            raise TaxonomyError(f"taxonomy {taxonomy.name!r} has a single node: nothing to classify")
        if pos_weight is not None and not (math.isfinite(pos_weight) and pos_weight > 0):
            raise ValueError(f"pos_weight must be a positive number; got {pos_weight!r}")
        self.num_nodes, self.coherent, self.pos_weight = taxonomy.num_nodes, bool(coherent), pos_weight
        self.ops = TreeOps(taxonomy)
        self.paths: torch.Tensor | None
        if taxonomy.is_tree:
            self.register_buffer("paths", as_tensor(taxonomy.paths), persistent=False)
        else:
            self.paths = None

    def closed_targets(self, targets: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ancestor-closed 0/1 targets [B, N - 1], kept-sample mask [B])``."""
        if not isinstance(targets, torch.Tensor):
            targets = torch.as_tensor(targets)
        n = self.num_nodes
        if targets.dim() == 1:
            if targets.dtype.is_floating_point or targets.dtype == torch.bool:
                raise TypeError(f"node-id targets must be integers; got {targets.dtype}")
            if targets.shape[0] != batch:
                raise ValueError(f"targets must have shape [{batch}] or [{batch}, {n}]; got {list(targets.shape)}")
            t = targets.long()
            if targets.numel() and (int(t.min()) < -1 or int(t.max()) >= n):
                raise ValueError(
                    f"targets must be -1 or node ids in [0, {n}); got values in [{int(t.min())}, {int(t.max())}]"
                )
            keep = t >= 0
            if self.paths is not None:  # tree: the closure of a single label is its root path
                path = self.paths[t.clamp(min=0)]
                y = torch.zeros(batch, n, device=t.device).scatter_(1, path.clamp(min=0), 1.0)
                return (y * keep[:, None])[:, 1:], keep
            y = F.one_hot(t.clamp(min=0), n).float() * keep[:, None].float()
        elif is_soft_targets(targets) and targets.shape[1] == self.ops.num_leaves != n:
            q, keep = check_leaf_distribution(targets, self.ops.num_leaves, batch=batch)
            return self.ops.marginals(q.float())[:, 1:], keep
        elif targets.dim() == 2 and tuple(targets.shape) == (batch, n):
            y = targets.float()
            keep = (y >= 0).all(1)
            y = y.clamp(min=0)
            if bool((y > 1).any()):
                raise ValueError("multi-hot targets must be 0/1 (or -1 to ignore a row)")
        else:
            raise ValueError(
                f"targets must be node ids [{batch}] or multi-hot [{batch}, {n}]; got {list(targets.shape)}"
            )
        return close_targets(y, self.ops)[:, 1:], keep

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if logits.dim() != 2 or logits.shape[1] != self.num_nodes - 1:
            raise ValueError(
                f"logits must have shape [B, {self.num_nodes - 1}] (one per non-root node); got {list(logits.shape)}"
            )
        y, keep = self.closed_targets(targets, logits.shape[0])
        z = upcast(logits)
        y = y.to(z.dtype)
        if self.coherent:
            all_max = mcm_logits(z, self.ops)
            # For positive nodes: the max over positive descendants only (negatives cannot raise a positive).
            pos_max = mcm_logits(z.masked_fill(y < 0.5, -math.inf), self.ops)
            z = torch.where(y > 0.5, pos_max, all_max)
        pw = None if self.pos_weight is None else z.new_tensor(self.pos_weight)
        bce = F.binary_cross_entropy_with_logits(z, y, reduction="none", pos_weight=pw).mean(1)
        return (bce * keep).sum() / keep.sum().clamp(min=1)

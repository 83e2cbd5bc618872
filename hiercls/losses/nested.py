"""Nested-region probabilities (BraTS: WT ⊃ TC ⊃ ET) and their losses, for vectors and dense maps.

Layout: one logit per non-root node (logit ``n - 1`` for node ``n``), on axis 1 of ``[B, N - 1, *spatial]``.
``p(n) = p(parent(n)) * sigmoid(z_n)`` with ``p(root) = 1``: every region lies inside its parent by
construction (``p(ET) <= p(TC) <= p(WT)``). ``log p`` and ``log(1 - p)`` are both computed in log space,
``log(1 - p(n)) = logaddexp(log(1 - p(parent)), log p(parent) + log sigmoid(-z_n))``, so a BCE on the nested
probabilities stays finite and has useful gradients for logits of any size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hiercls.losses.validation import check_leaf_distribution, is_soft_targets, upcast
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.tensors import TreeOps, require_tree

__all__ = ["NestedRegionLoss", "NestedSigmoid", "node_ids_to_regions", "soft_dice_loss"]


class NestedSigmoid(nn.Module):
    """``(log p, log(1 - p))`` ``[B, N, *spatial]`` of nested regions from logits ``[B, N - 1, *spatial]``.

    Example:
        >>> chain = Taxonomy([("root", "WT"), ("WT", "TC"), ("TC", "ET")])
        >>> logp, _ = NestedSigmoid(chain)(torch.zeros(1, 3))
        >>> logp.exp().tolist()
        [[1.0, 0.5, 0.25, 0.125]]
    """

    def __init__(self, taxonomy: Taxonomy) -> None:
        super().__init__()
        require_tree(taxonomy, "nested sigmoid regions")
        if taxonomy.num_nodes < 2:
            raise TaxonomyError(f"taxonomy {taxonomy.name!r} has no region below the root")
        self.num_nodes = taxonomy.num_nodes
        self.ops = TreeOps(taxonomy)

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.dim() < 2 or logits.shape[1] != self.num_nodes - 1:
            raise ValueError(
                f"logits must have shape [B, {self.num_nodes - 1}, *spatial] (one per non-root node); "
                f"got {list(logits.shape)}"
            )
        z = upcast(logits)
        pad = z.new_zeros(z.shape[0], 1, *z.shape[2:])
        pos, neg = F.logsigmoid(torch.cat([pad, z], 1)), F.logsigmoid(-torch.cat([pad, z], 1))
        ops = self.ops
        lp = [pad]
        lq = [torch.full_like(pad, -math.inf)]
        for d in range(1, ops.height + 1):
            nodes, pp = ops.level_nodes(d), ops.parent_positions(d)
            lp_parent = lp[-1].index_select(1, pp)
            leave = lp_parent + neg.index_select(1, nodes)  # inside the parent, outside this region
            lq.append(leave if d == 1 else torch.logaddexp(lq[-1].index_select(1, pp), leave))
            lp.append(lp_parent + pos.index_select(1, nodes))
        return ops.assemble(lp), ops.assemble(lq)


def node_ids_to_regions(
    node_ids: torch.Tensor, taxonomy: Taxonomy, *, include_root: bool = False, ops: TreeOps | None = None
) -> torch.Tensor:
    """Region masks from node ids: region ``n`` is on where the node id is ``n`` or a descendant of ``n``.

    ``node_ids`` is ``[B]`` or ``[B, *spatial]`` (``-1`` = ignore: all regions off); the result is float
    ``[B, N - 1, *spatial]`` (``[B, N, ...]`` with ``include_root``); ``ops`` reuses prebuilt tables of
    ``taxonomy``. For raw BraTS labels use
    :class:`hiercls.taxonomy.regions.NestedRegions` (``labels_to_regions`` / ``labels_to_nodes``).

    Example:
        >>> chain = Taxonomy([("root", "WT"), ("WT", "TC"), ("TC", "ET")])
        >>> node_ids_to_regions(torch.tensor([0, 2, 3]), chain).tolist()
        [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    """
    n = taxonomy.num_nodes
    ids = node_ids.long()
    if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= n):
        raise ValueError(
            f"node_ids must be -1 or node ids in [0, {n}); got values in [{int(ids.min())}, {int(ids.max())}]"
        )
    onehot = F.one_hot(ids.clamp(min=0), n).float() * (ids >= 0).unsqueeze(-1).float()
    onehot = onehot.movedim(-1, 1)
    if ops is None:  # callers that convert every step pass their own (device-resident) tables
        ops = TreeOps(taxonomy).to(ids.device)
    closed = ops.descendant_max(onehot)
    return closed if include_root else closed[:, 1:]


def soft_dice_loss(
    probs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None, smooth: float = 1.0
) -> torch.Tensor:
    """Mean over regions (axis 1) of ``1 - (2 sum(p y) + s) / (sum p + sum y + s)``, sums over batch and space.

    Example:
        >>> p = torch.tensor([[1.0, 0.0]]); y = torch.tensor([[1.0, 0.0]])
        >>> soft_dice_loss(p, y, smooth=0.0 + 1e-6).item() < 1e-5  # region 2 empty in both: 1e-6/1e-6 = 1
        True
    """
    if probs.shape != targets.shape:
        raise ValueError(f"probs {list(probs.shape)} and targets {list(targets.shape)} must have the same shape")
    if mask is not None:
        probs, targets = probs * mask, targets * mask
    dims = [0, *range(2, probs.dim())]
    inter = (probs * targets).sum(dims)
    denom = probs.sum(dims) + targets.sum(dims)
    return (1.0 - (2.0 * inter + smooth) / (denom + smooth)).mean()


class NestedRegionLoss(nn.Module):
    """BCE and/or soft Dice on nested region probabilities.

    Targets may be node ids ``[B]`` (classification) or ``[B, *spatial]`` (label maps of node ids, ``-1`` =
    ignore), or region masks ``[B, N - 1, *spatial]`` (0/1 or soft; e.g. ``NestedRegions.labels_to_regions``).
    For vector logits ``[B, N - 1]`` soft targets may also be node marginals ``[B, N]`` or a leaf distribution
    ``[B, num_leaves]`` (mixup / cutmix; read as its node marginals; a row with a negative entry is ignored);
    a shape equal to the logits' is read as region masks. BCE is linear in the target, so these give the
    expectation of the hard BCE over the leaves; soft Dice is not linear and takes the marginals as soft masks.

    Args:
        taxonomy: a tree (a chain for BraTS).
        loss: ``"bce"``, ``"dice"`` or ``"bce+dice"``.
        dice_smooth: additive smoothing of the Dice ratio.
        dice_weight: weight of the Dice term in ``"bce+dice"``.

    Example:
        >>> chain = Taxonomy([("root", "WT"), ("WT", "TC"), ("TC", "ET")])
        >>> loss = NestedRegionLoss(chain, loss="bce")
        >>> round(loss(torch.zeros(1, 3), torch.tensor([1])).item(), 4)  # p = .5, .25, .125; y = 1, 0, 0
        0.3715
    """

    def __init__(
        self, taxonomy: Taxonomy, loss: str = "bce+dice", dice_smooth: float = 1.0, dice_weight: float = 1.0
    ) -> None:
        super().__init__()
        if loss not in ("bce", "dice", "bce+dice"):
            raise ValueError(f"loss must be 'bce', 'dice' or 'bce+dice'; got {loss!r}")
        if not dice_smooth >= 0:
            raise ValueError(f"dice_smooth must be >= 0; got {dice_smooth!r}")
        self.taxonomy, self.kind = taxonomy, loss
        self.dice_smooth, self.dice_weight = float(dice_smooth), float(dice_weight)
        self.nested = NestedSigmoid(taxonomy)

    def region_targets(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(region targets [B, N-1, *spatial] float, valid mask broadcastable to it)``."""
        if not isinstance(targets, torch.Tensor):
            targets = torch.as_tensor(targets)
        spatial = logits.shape[2:]
        if is_soft_targets(targets) and logits.dim() == 2 and targets.shape != logits.shape:
            return self._soft_node_targets(targets, logits.shape[0])
        if targets.shape == logits.shape:  # region masks
            y = targets.float()
            if bool(((y < 0) | (y > 1)).any()):
                raise ValueError("region-mask targets must lie in [0, 1]")
            return y, torch.ones_like(y[:, :1])
        if targets.dtype.is_floating_point or targets.dtype == torch.bool:
            raise ValueError(
                f"targets must be node ids [B{', *spatial' if spatial else ''}] = "
                f"{[logits.shape[0], *spatial]} or region masks {list(logits.shape)}; got "
                f"{targets.dtype} {list(targets.shape)}"
            )
        if tuple(targets.shape) != (logits.shape[0], *spatial):
            raise ValueError(
                f"node-id targets must have shape {[logits.shape[0], *spatial]} to match logits "
                f"{list(logits.shape)}; got {list(targets.shape)}"
            )
        y = node_ids_to_regions(targets, self.taxonomy, ops=self.nested.ops)
        return y, (targets >= 0).unsqueeze(1).float()

    def _soft_node_targets(self, targets: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Node marginals [B, N] (the root column dropped) or a leaf distribution [B, num_leaves] summed up the tree.
        n = self.taxonomy.num_nodes
        if targets.shape == (batch, n):
            keep = (targets >= 0).all(1)
            y = targets.float().clamp(min=0)[:, 1:]
            if bool((y > 1).any()):
                raise ValueError("node-marginal targets must lie in [0, 1] (or have a negative entry to be ignored)")
            return y, keep[:, None].float()
        q, keep = check_leaf_distribution(targets, self.taxonomy.num_leaves, batch=batch)
        return self.nested.ops.marginals(q.float())[:, 1:], keep[:, None].float()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logp, logq = self.nested(logits)
        logp, logq = logp[:, 1:], logq[:, 1:]
        y, valid = self.region_targets(logits, targets)
        total = logits.new_zeros((), dtype=torch.float32)
        if "bce" in self.kind:
            bce = -(y * logp + (1.0 - y) * logq) * valid
            total = total + bce.sum() / (valid.sum() * logp.shape[1]).clamp(min=1)
        if "dice" in self.kind:
            weight = self.dice_weight if self.kind == "bce+dice" else 1.0
            total = total + weight * soft_dice_loss(logp.exp(), y, valid, self.dice_smooth)
        return total

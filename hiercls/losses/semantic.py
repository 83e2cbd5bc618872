"""Semantic softmax (Ridnik et al., "ImageNet-21K Pretraining for the Masses", NeurIPS 2021) and semantic KD.

Layout: one logit per class (``taxonomy.classes``), ordered by semantic level and then by node id, so level
``l``'s classes are the contiguous slice ``layout.slices[l]``. The semantic level of a class is its number of
class ancestors (:attr:`Taxonomy.semantic_level`). A sample labelled ``y`` has one target per level: the class
ancestor-or-self of ``y`` at that level, or none (``-1``) below ``y``'s own level.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hiercls.losses.chained_softmax import ChainedSoftmax
from hiercls.losses.validation import check_leaf_distribution, check_node_targets, is_soft_targets, upcast
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.tensors import TreeOps, as_tensor, require_tree

__all__ = ["SemanticKDLoss", "SemanticLayout", "SemanticSoftmaxLoss", "semantic_level_weights"]


def semantic_level_weights(level_sizes: list[int] | np.ndarray, max_weight: float = 20.0) -> np.ndarray:
    """Per-level loss weights ``w_l = min(C / #classes at level >= l, max_weight)`` (``C`` = all classes).

    This is the published normalisation: deep levels, which few samples reach, are weighted up, capped at 20.

    Example:
        >>> semantic_level_weights([2, 4, 4]).tolist()
        [1.0, 1.25, 2.5]
    """
    sizes = np.asarray(level_sizes, dtype=np.float64)
    if sizes.ndim != 1 or len(sizes) == 0 or (sizes <= 0).any():
        raise ValueError(f"level_sizes must be positive class counts per level; got {level_sizes!r}")
    at_or_below = np.cumsum(sizes[::-1])[::-1]
    return np.minimum(sizes.sum() / at_or_below, float(max_weight))


class SemanticLayout(nn.Module):
    """Index tables of the semantic-softmax layout of a tree taxonomy (buffers move with ``.to(device)``).

    Attributes:
        num_levels: number of semantic levels ``K``.
        level_sizes: classes per level; ``slices[l]`` is level ``l``'s slice of the logits.
        class_ids: ``[C]`` node id of each logit (buffer).
        level_targets: ``[N, K]`` position within level ``l`` of the class ancestor-or-self of each node, ``-1``
            where there is none (buffer).
        parent_pos: per level ``l >= 1``, the position within level ``l - 1`` of each class's nearest class
            ancestor (buffers ``parent_pos_{l}``).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> lay = SemanticLayout(tax)
        >>> lay.level_sizes, [tax.name_of(i) for i in lay.class_ids.tolist()]
        ([2, 2], ['a', 'b', 'x', 'y'])
        >>> lay.level_targets[tax.index("y")].tolist()  # a at level 0 (position 0), y at level 1 (position 1)
        [0, 1]
    """

    def __init__(self, taxonomy: Taxonomy) -> None:
        super().__init__()
        require_tree(taxonomy, "the semantic softmax")
        classes = taxonomy.classes
        if len(classes) == 0:
            raise TaxonomyError(f"taxonomy {taxonomy.name!r} has no classes for a semantic softmax")
        level = taxonomy.semantic_level
        order = classes[np.lexsort((classes, level[classes]))]
        self.num_levels = int(level[classes].max()) + 1
        self.level_sizes = np.bincount(level[order], minlength=self.num_levels).tolist()
        offsets = np.concatenate([[0], np.cumsum(self.level_sizes)])
        self.slices = [slice(int(offsets[k]), int(offsets[k + 1])) for k in range(self.num_levels)]
        self.num_classes = len(order)
        pos_in_level = np.full(taxonomy.num_nodes, -1, dtype=np.int64)
        pos_in_level[order] = np.arange(len(order)) - offsets[level[order]]
        # Class ancestors of a node on a tree are a chain whose levels are 0, 1, 2, ... (each has one more class
        # ancestor than the one above it), so the root path gives every level target at once.
        paths = taxonomy.paths
        table = np.full((taxonomy.num_nodes, self.num_levels), -1, dtype=np.int64)
        rows, cols = np.nonzero(paths >= 0)
        anc = paths[rows, cols]
        keep = taxonomy.class_mask[anc]
        table[rows[keep], level[anc[keep]]] = pos_in_level[anc[keep]]
        self.register_buffer("class_ids", as_tensor(order), persistent=False)
        self.register_buffer("level_targets", as_tensor(table), persistent=False)
        parent_out = np.full(len(order), -1, dtype=np.int64)  # layout position of each class's class parent
        for k in range(1, self.num_levels):
            nodes = order[self.slices[k]]
            self.register_buffer(f"parent_pos_{k}", as_tensor(table[nodes, k - 1]), persistent=False)
            parent_out[self.slices[k]] = offsets[k - 1] + table[nodes, k - 1]
        # One softmax per group of classes sharing a nearest class ancestor, chained top-down.
        group_parent, group = np.unique(parent_out, return_inverse=True)
        self.chained = ChainedSoftmax(group.reshape(-1), group_parent)
        self.all_nodes_are_classes = bool(taxonomy.class_mask[1:].all()) and not taxonomy.class_mask[0]

    def split(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """Per-level logits ``[B, level_sizes[l]]`` (views of ``logits``)."""
        if logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"logits must have shape [B, {self.num_classes}] (one per class, level-major); got {list(logits.shape)}"
            )
        return [logits[:, s] for s in self.slices]

    def targets(self, targets: torch.Tensor) -> torch.Tensor:
        """``[B, K]`` per-level targets (positions within each level, ``-1`` = no target at that level)."""
        t = targets.clamp(min=0)
        out = self.level_targets[t]
        return torch.where((targets >= 0)[:, None], out, torch.full_like(out, -1))

    def class_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Top-down chained log-probabilities ``[B, C]`` (layout order) of every class.

        ``log P(c) = log P(q) + log softmax(z restricted to the classes whose nearest class ancestor is q)[c]``
        where ``q`` is ``c``'s nearest class ancestor (level-0 classes share the root). Each level's softmax is
        renormalised within the parent, so a class's children sum exactly to it: consistent by construction.
        """
        self.split(logits)  # shape check
        return self.chained.log_probs(upcast(logits))

    def class_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``exp(class_log_probs)`` ``[B, C]`` (float32) by
        :meth:`~hiercls.losses.ChainedSoftmax.probs`."""
        self.split(logits)  # shape check
        return self.chained.probs(upcast(logits))


_LOG2E = 1.0 / math.log(2.0)


class _LevelSmoothedCE(torch.autograd.Function):
    """``sum_{b,l} coef[b,l] * CE_l(b)`` over contiguous level slices, with a hand-written backward.

    ``CE_l(b) = lse_l(b) - (1 - eps) z[b, t_l] - eps * mean_l(z[b])``, ``lse_l`` the log-sum-exp of level ``l``'s
    slice. Each level is shifted by its own maximum, ``e = exp(z - max_l z)``, so nothing overflows or
    underflows for any spread of the logits; ``lse_l = max_l + log E_l`` with ``E_l`` the sum of ``e`` over the
    level, and level ``l``'s softmax is ``e / E_l``, so ``e`` is never normalised (a softmax would spend one more
    pass on it). The only ``[B, C]`` tensor kept for the backward is ``e``, as ``F.cross_entropy`` keeps its
    log-softmax, and the gradient ``coef * (e / E_l - (1 - eps) onehot - eps / n_l)`` is written in one pass.
    A few torch calls per level (``split`` views; a dozen levels on ImageNet-21K), any device.
    """

    @staticmethod
    def forward(
        ctx,
        z: torch.Tensor,
        coef: torch.Tensor,
        tpos: torch.Tensor,  # type: ignore[override]
        inv_sizes: torch.Tensor,
        sizes: tuple[int, ...],
        eps: float,
    ) -> torch.Tensor:
        levels, e = z.split(sizes, 1), torch.empty_like(z)
        shift = torch.stack([v.amax(1) for v in levels], 1)
        sums = []
        # Level by level, so that a level is still in the cache for its exp and sum. exp as 2^((z - max) log2 e),
        # the scaling folded into the shift: torch's exp2 is the vectorised kernel on CPU, exp is not.
        for out, v, m in zip(e.split(sizes, 1), levels, shift.mul(-_LOG2E).split(1, 1), strict=True):
            sums.append(torch.add(m, v, alpha=_LOG2E, out=out).exp2_().sum(1))
        sums = torch.stack(sums, 1)
        per = (shift + sums.log()).sub_(z.gather(1, tpos), alpha=1.0 - eps)
        if eps:  # the smoothing term -eps * mean_l(z)
            per.sub_(torch.stack([v.sum(1) for v in levels], 1).mul_(inv_sizes), alpha=eps)
        ctx.save_for_backward(e, sums, coef, tpos, inv_sizes)
        ctx.sizes, ctx.eps = sizes, eps
        return (coef * per).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        e, sums, coef, tpos, inv_sizes = ctx.saved_tensors
        sizes, eps = ctx.sizes, ctx.eps
        # Written straight into a fresh buffer: one read of e and one write, where a clone of e scaled in place
        # would make two of each (e itself may be needed again by a retained graph).
        g = grad * coef
        out = torch.empty_like(e)
        scale = (g / sums).split(1, 1)  # coef * softmax_l = e * coef / S_l
        # Per level a multiply, then the floor added while the level is in the cache: addcmul with two broadcast
        # operands runs torch's scalar loop on CPU, at up to twice the time of these two vectorised passes.
        floor = (g * inv_sizes).mul_(-eps).split(1, 1) if eps else [None] * len(sizes)
        for o, v, s, f in zip(out.split(sizes, 1), e.split(sizes, 1), scale, floor, strict=True):
            torch.mul(v, s, out=o)
            if f is not None:
                o.add_(f)
        out.scatter_add_(1, tpos, g.mul_(-(1.0 - eps)))
        return out, None, None, None, None, None


class SemanticSoftmaxLoss(nn.Module):
    """The semantic softmax loss: one label-smoothed softmax cross-entropy per semantic level.

    ``loss = sum_l w_l * mean_b CE_l(b)`` with ``CE_l(b) = 0`` where sample ``b`` has no level-``l`` target,
    ``w_l`` from :func:`semantic_level_weights` and the mean over the non-ignored samples (as the published code,
    which averages over the whole batch). Unlike the published code every level is trained, the deepest
    included; ``drop_deepest_level=True`` reproduces the published loss, which leaves the deepest semantic
    level out (its logits get no gradient) while the level weights stay those computed over all levels, as in
    the authors' code. With ``normalize="present"`` each sample's weighted sum is instead divided by the sum of
    the weights of the levels it has, so that shallow-labelled samples are not down-weighted.

    Soft targets, a distribution ``q [B, num_leaves]`` over the leaves (mixup / cutmix), give each level the
    target ``Q(c)``, the mass of ``q`` below class ``c`` (marginals): ``CE_l = -(1 - eps) sum_c Q(c) log p_l(c)
    - eps * M_l * mean_c log p_l(c)`` with ``M_l = sum_c Q(c)`` the mass that has a level-``l`` class. The loss
    is linear in ``q`` and equals the expectation of the hard loss over the leaves (with ``"present"`` each
    leaf's mass is divided by its own weight sum first), so a one-hot ``q`` gives the hard loss.

    Args:
        taxonomy: a tree (use ``to_tree`` for WordNet).
        label_smoothing: per-level smoothing (default 0.2, as published).
        max_weight: cap of the level weights (default 20).
        normalize: ``"none"`` (published) or ``"present"``.
        drop_deepest_level: leave the deepest level out of the loss (the published loss); needs at least two
            levels.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> loss = SemanticSoftmaxLoss(tax, label_smoothing=0.0)
        >>> logits = torch.zeros(1, 4)  # levels {a, b} and {x, y}, uniform
        >>> w = semantic_level_weights([2, 2])  # [1, 2]
        >>> math.isclose(loss(logits, torch.tensor([2])).item(), w[0] * math.log(2) + w[1] * math.log(2), rel_tol=1e-6)
        True
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        label_smoothing: float = 0.2,
        max_weight: float = 20.0,
        normalize: str = "none",
        *,
        drop_deepest_level: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {label_smoothing!r}")
        if normalize not in ("none", "present"):
            raise ValueError(f"normalize must be 'none' or 'present'; got {normalize!r}")
        if not max_weight > 0:
            raise ValueError(f"max_weight must be > 0; got {max_weight!r}")
        self.taxonomy = taxonomy
        self.layout = SemanticLayout(taxonomy)
        self.label_smoothing, self.normalize = float(label_smoothing), normalize
        self.level_weights = semantic_level_weights(self.layout.level_sizes, max_weight).tolist()
        self.drop_deepest_level = bool(drop_deepest_level)
        if self.drop_deepest_level and self.layout.num_levels < 2:
            raise ValueError(
                f"drop_deepest_level=True needs at least two semantic levels; taxonomy "
                f"{taxonomy.name!r} has {self.layout.num_levels}"
            )
        # The weights the loss applies: the deepest level's is 0 when it is dropped.
        self._loss_weights = [*self.level_weights[:-1], 0.0] if self.drop_deepest_level else self.level_weights
        self._sizes = tuple(int(n) for n in self.layout.level_sizes)
        # Per node: the layout position of its target at every level (any position where it has none, weighted
        # 0) and the weight of each level in its loss, so that a batch needs one lookup of each.
        level_t = self.layout.level_targets
        offsets = torch.tensor([sl.start for sl in self.layout.slices])
        self.register_buffer("_tpos_table", level_t.clamp(min=0) + offsets, persistent=False)
        coef = raw = (level_t >= 0).double() * torch.tensor(self._loss_weights, dtype=torch.float64)
        if normalize == "present":
            coef = coef / coef.sum(1, keepdim=True).clamp(min=1e-12)
        # Kept outside the buffers so that module.half() cannot round the weights; cast per (device, dtype).
        self._coef_table64 = coef
        # Soft targets: each leaf's mass is scaled by its own per-level normaliser (1 unless "present").
        leaves = as_tensor(taxonomy.leaves)
        self._leaf_scale64 = coef.sum(1)[leaves] / raw.sum(1)[leaves].clamp(min=1e-12)
        self.ops = TreeOps(taxonomy)
        self._coef_tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _coef_table(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(coef table [N, K], 1 / level sizes [K])`` on ``like``'s device and dtype (made once per pair)."""
        key = (like.device, like.dtype)
        tables = self._coef_tables.get(key)
        if tables is None:
            inv = 1.0 / torch.tensor(self._sizes, dtype=torch.float64)
            tables = self._coef_tables[key] = tuple(
                t.to(device=like.device, dtype=like.dtype) for t in (self._coef_table64, inv)
            )
        return tables

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != self.layout.num_classes:
            self.layout.split(logits)  # raises with the expected shape
        if is_soft_targets(targets):
            return self._forward_soft(logits, targets)
        t = check_node_targets(targets, self.taxonomy.num_nodes, batch=logits.shape[0])
        z = upcast(logits)
        valid = t >= 0
        node = t.clamp(min=0)
        kept = valid.to(z.dtype)
        kept = kept / kept.sum().clamp(min=1)  # mean over the kept samples
        table, inv_sizes = self._coef_table(z)
        coef = table[node] * kept[:, None]
        tpos = self._tpos_table[node]
        return _LevelSmoothedCE.apply(z.contiguous(), coef, tpos, inv_sizes, self._sizes, self.label_smoothing)

    def _forward_soft(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        q, keep = check_leaf_distribution(targets, self.taxonomy.num_leaves, batch=logits.shape[0])
        z = upcast(logits)
        q = q.to(z.dtype) * self._leaf_scale64.to(device=z.device, dtype=z.dtype)
        mass = self.ops.marginals(q).index_select(1, self.layout.class_ids)  # [B, C], layout order
        kept = keep.to(z.dtype) / keep.sum().clamp(min=1)
        eps, total = self.label_smoothing, z.new_zeros(())
        for w, zl, ml in zip(self._loss_weights, z.split(self._sizes, 1), mass.split(self._sizes, 1), strict=True):
            if w:
                logp = F.log_softmax(zl, dim=1)
                ce = -(1.0 - eps) * (ml * logp).sum(1) - eps * ml.sum(1) * logp.mean(1)
                total = total + w * (ce * kept).sum()
        return total


class SemanticKDLoss(nn.Module):
    """Semantic knowledge distillation: per level, a distance between teacher and student level softmaxes.

    For each level ``l`` with ``n_l`` classes, ``p_s = softmax(student_l)``, ``p_t = softmax(teacher_l)`` and the
    teacher's confidence ``c_b = sum of its top ceil(n_l / 20) probabilities`` (the top 5%, no gradient):
    ``loss = sum_l mean_b c_b * D(p_s, p_t)`` with ``D = sum_classes (p_s - p_t)^2`` (``distance="mse"``, as
    published; the published code also sums over the batch, here it is averaged) or ``KL(p_t || p_s)``
    (``distance="kl"``). ``level_weights=True`` multiplies each level by its semantic-softmax weight.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> kd = SemanticKDLoss(tax)
        >>> logits = torch.randn(3, 4)
        >>> kd(logits, logits).item()  # identical teacher and student
        0.0
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        distance: str = "mse",
        level_weights: bool = False,
        max_weight: float = 20.0,
        top_fraction: float = 0.05,
    ) -> None:
        super().__init__()
        if distance not in ("mse", "kl"):
            raise ValueError(f"distance must be 'mse' or 'kl'; got {distance!r}")
        if not 0 < top_fraction <= 1:
            raise ValueError(f"top_fraction must be in (0, 1]; got {top_fraction!r}")
        self.layout = SemanticLayout(taxonomy)
        self.distance, self.top_fraction = distance, float(top_fraction)
        w = (
            semantic_level_weights(self.layout.level_sizes, max_weight)
            if level_weights
            else np.ones(self.layout.num_levels)
        )
        self.level_weights = w.tolist()

    def forward(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        if student_logits.shape != teacher_logits.shape:
            raise ValueError(
                f"student_logits {list(student_logits.shape)} and teacher_logits "
                f"{list(teacher_logits.shape)} must have the same shape"
            )
        total = upcast(student_logits).new_zeros(())
        for k, (zs, zt) in enumerate(
            zip(self.layout.split(student_logits), self.layout.split(teacher_logits), strict=True)
        ):
            pt = torch.softmax(upcast(zt.detach()), dim=1)
            with torch.no_grad():
                top = max(1, math.ceil(zt.shape[1] * self.top_fraction))
                conf = pt.topk(top, dim=1).values.sum(1)
            if self.distance == "mse":
                d = (torch.softmax(upcast(zs), dim=1) - pt).pow(2).sum(1)
            else:
                d = F.kl_div(F.log_softmax(upcast(zs), dim=1), pt, reduction="none").sum(1)
            total = total + self.level_weights[k] * (conf * d).mean()
        return total

"""Nested softmaxes chained down a tree of sibling groups: the one implementation behind the semantic and
conditional softmaxes (probabilities, log-probabilities and per-group log-sum-exps, with autograd, on any device).

Layout. Groups of similar size sit side by side in *buckets*: bucket ``k`` holds ``n_k`` groups padded to a common
width ``w_k`` (padding is ``-inf``, which a softmax gives 0), a view ``[n_k, w_k]`` (or ``[w_k, n_k]`` when it
holds more groups than members per group) of its run of *slots*, so each group's reduction (max, sum, softmax) is
one call per bucket. The widths are chosen once per tree by dynamic programming over the group sizes (padding
against the number of buckets; about fifteen buckets and 9 % padding on ImageNet-21K). The log-softmaxes
(:meth:`ChainedSoftmax.padded_log_softmax`, :meth:`ChainedSoftmax.log_probs`) gather the logits into ``[B, P]``
(one ``index_select`` along the rows); :meth:`ChainedSoftmax.probs` works slot-major, ``[P, B]``: the logits are
transposed once and gathered by rows, so that every per-group step (the reductions, the broadcasts, the gathers of
groups) runs along rows of ``B`` contiguous values, which torch vectorises for any group size, and the result is
gathered by rows into output order and transposed back. Indexed scatters along a row are several times slower
than a softmax on the CPU, so nothing scatters in a forward pass.

Exactness. Each group's softmax shifts by the group's own maximum, so no exponential overflows and no group's
sum underflows, whatever the spread of the logits; there is no retry path. ``P(parent of g)`` (``log P`` for the
log-probabilities) is a product (sum) over the ancestors of ``g`` in the tree of groups, taken by pointer
doubling (``ceil(log2(depth + 1))`` row gathers of ``[G, B]``, for any depth). The gradients of
:meth:`ChainedSoftmax.probs` and of the gathers are written by hand (gathers again, and one scatter over ``[G, B]``
rows), because autograd's would scatter along rows.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from hiercls.taxonomy.tensors import as_tensor

__all__ = ["ChainedSoftmax", "bucket_widths"]

_LOG2E = 1.0 / math.log(2.0)

#: The cost of one more bucket, in padded columns (a few small calls against a pass over that many columns).
BUCKET_COST = 128


def bucket_widths(sizes: np.ndarray, bucket_cost: int = BUCKET_COST) -> np.ndarray:
    """The padded width of each group: its bucket's largest size, buckets chosen to minimise the padded columns
    plus ``bucket_cost`` per bucket (dynamic programming over the distinct sizes, which a bucket takes as a run).

    Example:
        >>> bucket_widths(np.array([1, 2, 2, 3, 40]), bucket_cost=4).tolist()
        [3, 3, 3, 3, 40]
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    distinct, counts = np.unique(sizes, return_counts=True)
    k = len(distinct)
    # best[j]: least cost of the first j distinct sizes; a bucket covering sizes i..j-1 pads them to distinct[j-1].
    best, cut = np.zeros(k + 1), np.zeros(k + 1, dtype=np.int64)
    below = np.concatenate([[0], np.cumsum(counts)])
    for j in range(1, k + 1):
        costs = best[:j] + distinct[j - 1] * (below[j] - below[:j]) + bucket_cost
        cut[j] = int(np.argmin(costs))
        best[j] = costs[cut[j]]
    width = np.empty(k, dtype=np.int64)
    j = k
    while j > 0:
        width[cut[j] : j] = distinct[j - 1]
        j = cut[j]
    return width[np.searchsorted(distinct, sizes)]


class _Permute(torch.autograd.Function):
    """``y = x[:, index]`` with columns ``fill`` set to ``value``, for an ``index`` that reads each column of ``x``
    at most once outside ``fill``; ``inverse[c]`` is the column of ``y`` that reads ``x``'s column ``c`` (``-1``:
    none), so that the gradient is a gather too (autograd's ``index_add`` along a row is several times slower)."""

    @staticmethod
    def forward(ctx, x, index, fill, value, inverse):  # type: ignore[override]
        y = x.index_select(1, index)
        if fill.numel():
            y.index_fill_(1, fill, value)
        ctx.save_for_backward(inverse)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        (inverse,) = ctx.saved_tensors
        return _gather_or_zero(grad, inverse), None, None, None, None


def _gather_or_zero(x: torch.Tensor, index: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``x.index_select(dim, index)`` with zeros where ``index`` is ``-1``."""
    x = torch.cat([x, x.new_zeros(x.shape[0], 1) if dim == 1 else x.new_zeros(1, x.shape[1])], dim)
    return x.index_select(dim, torch.where(index >= 0, index, x.shape[dim] - 1))


class _ChainedProbs(torch.autograd.Function):
    """:meth:`ChainedSoftmax.probs` with its gradient by hand (autograd's would scatter along rows).

    Slot-major: the logits are transposed once to ``[num_inputs, B]`` and gathered into ``[P, B]``, so that every
    per-group step (reductions over a group's slots, broadcasts, gathers of groups) runs along whole rows of
    ``B`` contiguous values, which torch vectorises for any group size; one transpose back at the end. (Along
    ``[B, P]`` a reduction over a few slots per group runs several times slower than its share of a softmax.)

    Forward: per group, ``e = exp(z - max)`` and its sum ``s`` (so ``q = e / s``, the group's softmax), then one
    factor per group ``f = P(parent) / s`` and ``P = e * f``: one pass of exponentials over the padded logits and
    one of products, the rest on ``[G, B]``; ``P(parent)`` is the product of ``q`` at the conditioning outputs of
    the group and of its ancestor groups (a product of probabilities underflows only where the true value does).
    Backward, with ``u = dL/dlog P = g * P``, ``U_g`` its sum over group ``g`` and ``D_g`` the sum of ``U`` over
    the groups below-or-at ``g``: ``dL/dz_j = u_j - D_g q_j + D_h`` for ``j`` in group ``g``, where ``D_h`` is
    summed over the groups ``h`` that output ``j`` conditions; so ``dL/dz_j = e_j (g_j f_g - D_g / s_g) + D_h``.
    """

    @staticmethod
    def forward(ctx, z, cs, k, lead):  # type: ignore[override]
        e, s = cs.group_exp(z.new_empty(z.shape[1], z.shape[0]).copy_(z.t()))
        q_parent = e.index_select(0, cs.parent_slot).div_(s.index_select(0, cs.parent_group))
        q_parent.index_fill_(0, cs.root_groups, 1.0)
        f = cs.ancestor_reduce(q_parent, product=True).div_(s)  # P(parent) / s per group, [G, B]
        keep = ctx.needs_input_grad[0]
        p = cs.scale_groups(e, f, out=torch.empty_like(e) if keep else e)
        if keep:
            ctx.save_for_backward(e, f, s)
        ctx.cs, ctx.k, ctx.lead = cs, k, lead
        out = p.index_select(0, cs.output_map(k, lead)[0])
        out[:lead] = 1.0
        return out.t().contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        e, f, s = ctx.saved_tensors
        cs = ctx.cs
        g_slots = _gather_or_zero(grad.t().contiguous(), cs.output_map(ctx.k, ctx.lead)[1], dim=0)
        gf = cs.scale_groups(g_slots, f, out=g_slots).mul_(e)  # u = g * P
        d = cs.subtree_sums(cs.group_sums(gf))
        gf.sub_(cs.scale_groups(e, d.div(s)))
        g = _gather_or_zero(gf, cs.input_slot, dim=0)
        g.index_add_(0, cs.parent_input, d.index_fill_(0, cs.root_groups, 0.0))
        return g.t().contiguous(), None, None, None


class ChainedSoftmax(nn.Module):
    """Probabilities of nested softmaxes: one softmax per sibling group, chained down a tree of groups.

    Output ``i`` belongs to sibling group ``group[i]``; group ``j``'s softmax is conditioned on output
    ``parent[j]`` (``-1``: on nothing, probability 1), so ``P(i) = P(parent[group[i]]) * softmax_j(z)[i]``.
    The semantic softmax (groups = classes sharing a nearest class ancestor) and the conditional softmax
    (groups = the children, and stop outcome, of each internal node) are both of this form. Output ``i`` reads
    logit ``input_order[i]`` (default: logit ``i``; each logit is read by at most one output), so the outputs can
    come out in another order (node ids) at no extra cost. Groups are renumbered at construction (by bucket, see
    the module docstring), so :attr:`group` and :attr:`parent` hold the new numbers.

    ``log P(i) = log q_i + T_g`` with ``q`` the softmax of group ``g = group[i]`` and ``T_g = log P(parent[g])``,
    the sum of ``log q`` at the conditioning outputs of ``g`` and its ancestor groups. :meth:`probs` multiplies
    each group's softmax by ``P(parent)``, so a probability underflows only where its true value is below the
    float range.
    Results are float32 (float64 input stays float64), also for fp16/bf16 logits and under autocast; every step
    is a torch op on the logits' device, differentiable.

    Args:
        group: ``[M]`` group id (``0 .. G-1``) of each output.
        parent: ``[G]`` output conditioning each group, ``-1`` for a top group; groups must form a forest.
        input_order: ``[M]`` logit read by each output (default ``0 .. M-1``).

    Example:
        >>> # outputs a, b | x, y: {a, b} at the top, {x, y} below a (output 0)
        >>> cs = ChainedSoftmax(np.array([0, 0, 1, 1]), np.array([-1, 0]))
        >>> p = cs.probs(torch.tensor([[math.log(3), 0.0, 0.0, math.log(4)]]))  # a 3/4, b 1/4, x, y within a
        >>> [round(v, 6) for v in p[0].tolist()]
        [0.75, 0.25, 0.15, 0.6]
        >>> cs.probs(torch.tensor([[math.log(3), 0.0, 0.0, math.log(4)]]), outputs=2, lead=1).round(decimals=6)
        tensor([[1.0000, 0.7500, 0.2500]])
    """

    def __init__(self, group: np.ndarray, parent: np.ndarray, input_order: np.ndarray | None = None) -> None:
        super().__init__()
        group, parent = np.asarray(group, dtype=np.int64), np.asarray(parent, dtype=np.int64)
        reads = _check_groups(group, parent, input_order)
        self.num_outputs, self.num_groups = len(group), len(parent)
        self.num_inputs = int(reads.max(initial=-1)) + 1
        gparent = np.where(parent >= 0, group[np.maximum(parent, 0)], -1)
        _check_forest(gparent)
        # Renumber the groups in bucket order (by padded width, then by id), so per-bucket results concatenate.
        sizes = np.bincount(group, minlength=self.num_groups)
        width = bucket_widths(sizes)
        order = np.lexsort((np.arange(self.num_groups), width))
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        group, parent, gparent, width = rank[group], parent[order], gparent[order], width[order]
        gparent = np.where(gparent >= 0, rank[np.maximum(gparent, 0)], -1)
        self.register_buffer("group", as_tensor(group), persistent=False)
        self.register_buffer("parent", as_tensor(np.maximum(parent, 0)), persistent=False)
        self.register_buffer("has_parent", torch.from_numpy(parent >= 0), persistent=False)
        self.register_buffer("parent_input", as_tensor(reads[np.maximum(parent, 0)]), persistent=False)
        self.register_buffer("root_groups", as_tensor(np.flatnonzero(parent < 0)), persistent=False)
        self._build_slots(group, width, reads)
        self._build_doubling(gparent)

    def _build_slots(self, group: np.ndarray, width: np.ndarray, reads: np.ndarray) -> None:
        """The padded layout: ``slot_output[s]`` is the output in slot ``s`` (``-1``: padding)."""
        # Buckets: runs of groups of one width, as (groups, width) pairs in slot order. A bucket of more groups than
        # its width is stored member-major, [B, w, n] (a group's members n apart), so that its reductions run along
        # rows of n groups, which torch vectorises; the others group-major, [B, n, w].
        bounds = np.flatnonzero(np.diff(width)) + 1
        self._buckets = [(len(run), int(run[0])) for run in np.split(width, bounds) if len(run)]
        self._member_major = [n > w for n, w in self._buckets]
        bucket_start = np.concatenate([[0], np.cumsum([n * w for n, w in self._buckets])])
        first_group = np.concatenate([[0], np.cumsum([n for n, _ in self._buckets])])
        bucket = np.repeat(np.arange(len(self._buckets)), [n for n, _ in self._buckets])  # per group
        by_group = np.argsort(group, kind="stable")
        sizes = np.bincount(group, minlength=self.num_groups)
        g = group[by_group]
        rank = np.arange(self.num_outputs) - np.concatenate([[0], np.cumsum(sizes)])[g]  # member rank in its group
        b, j = bucket[g], g - first_group[bucket[g]]  # the bucket and the group's place in it
        n_b, w_b = np.array(self._buckets)[b].T
        member_major = np.array(self._member_major)[b]
        slot = np.empty(self.num_outputs, dtype=np.int64)
        slot[by_group] = bucket_start[b] + np.where(member_major, rank * n_b + j, j * w_b + rank)
        slot_output = np.full(int(bucket_start[-1]), -1, dtype=np.int64)
        slot_output[slot] = np.arange(self.num_outputs)
        self.num_slots = len(slot_output)
        input_slot = np.full(self.num_inputs, -1, dtype=np.int64)
        input_slot[reads] = slot
        self.register_buffer("slot", as_tensor(slot), persistent=False)
        self.register_buffer("slot_output", as_tensor(slot_output), persistent=False)
        slot_group = np.zeros(len(slot_output), dtype=np.int64)
        slot_group[slot] = group
        self.register_buffer("slot_group", as_tensor(slot_group), persistent=False)
        self.register_buffer("parent_slot", as_tensor(slot[np.maximum(self.parent.numpy(), 0)]), persistent=False)
        self.register_buffer("parent_group", as_tensor(group[np.maximum(self.parent.numpy(), 0)]), persistent=False)
        slot_input = np.where(slot_output >= 0, reads[slot_output], 0)
        self.register_buffer("slot_input", as_tensor(slot_input), persistent=False)
        self.register_buffer("pad_slots", as_tensor(np.flatnonzero(slot_output < 0)), persistent=False)
        # The pads of each bucket, relative to the bucket's first slot (for the bucket-by-bucket steps).
        pads, first = np.flatnonzero(slot_output < 0), bucket_start[:-1]
        pad_bucket = np.searchsorted(bucket_start, pads, side="right") - 1
        self.register_buffer("bucket_pads", as_tensor(pads - first[pad_bucket]), persistent=False)
        self._bucket_pad_counts = np.bincount(pad_bucket, minlength=len(self._buckets)).tolist()
        self.register_buffer("input_slot", as_tensor(input_slot), persistent=False)

    def _build_doubling(self, gparent: np.ndarray) -> None:
        """Pointer-doubling tables over the tree of groups: at step ``k``, group ``g`` takes the value of its
        ancestor ``jump_k[g]``, ``2^k`` generations up, or of row ``G`` (an identity row) when it has none."""
        self._steps = 0
        jump = gparent.copy()
        while (jump >= 0).any():
            table = as_tensor(np.where(jump >= 0, jump, len(jump)))
            self.register_buffer(f"jump_{self._steps}", table, persistent=False)
            self._steps += 1
            jump = np.where(jump >= 0, jump[np.maximum(jump, 0)], -1)

    def _inputs(self, logits: torch.Tensor) -> torch.Tensor:
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != self.num_inputs:
            shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must have shape [B, {self.num_inputs}]; got {shape}")
        return logits if logits.dtype == torch.float64 else logits.float()

    # ---------------------------------------------------------------- the padded layout's steps (no autograd)
    def _views(self, padded: torch.Tensor, dim: int = 1) -> list[tuple[torch.Tensor, int]]:
        """Per bucket ``(view, the axis of the members)`` of a ``[B, P]`` (``dim=1``: ``[B, w, n]`` or
        ``[B, n, w]``) or slot-major ``[P, B]`` tensor (``dim=0``: ``[w, n, B]`` or ``[n, w, B]``)."""
        parts = padded.split([n * w for n, w in self._buckets], dim)
        return [
            (v.unflatten(dim, (w, n)), dim) if mm else (v.unflatten(dim, (n, w)), dim + 1)
            for v, (n, w), mm in zip(parts, self._buckets, self._member_major, strict=True)
        ]

    def group_softmax(self, padded: torch.Tensor, log: bool = False) -> torch.Tensor:
        """``[B, P]`` -> ``[B, P]``: the (log-)softmax of each group's slots; pads get 0 (log: ``-inf``).

        One fused torch softmax per bucket (each group shifted by its own maximum), differentiable.
        """
        fn = torch.log_softmax if log else torch.softmax
        return torch.cat([fn(v, axis).flatten(1) for v, axis in self._views(padded)], 1)

    def group_exp(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(e [P, B], s [G, B])`` from the logits transposed, ``w = z.T`` ``[num_inputs, B]``: ``e = exp(z - max)``
        over each group's slots (pads 0) and its sum ``s`` per group. ``e <= 1`` exactly (the shift is a rounded
        difference to the group's maximum, never positive) and ``s >= 1`` (the maximum contributes exactly 1),
        so every probability built from them stays in ``[0, 1]`` without a clamp."""
        e = w.new_empty(self.num_slots, w.shape[1])
        sums = []
        parts = zip(
            self._views(e, 0),
            e.split([n * w for n, w in self._buckets], 0),
            self.slot_input.split([n * w for n, w in self._buckets]),
            self.bucket_pads.split(self._bucket_pad_counts),
            strict=True,
        )
        # Bucket by bucket, gather and the four passes, so that a bucket is still in the cache for each pass.
        for (v, axis), block, index, pads in parts:
            torch.index_select(w, 0, index, out=block)
            block.index_fill_(0, pads, -math.inf)
            # exp(x) as 2^(x log2 e): torch's exp2 is the vectorised kernel on the CPU, exp is not. The shift comes
            # first and exactly as a difference, so that large logits lose no accuracy to the scaling.
            sums.append(v.sub_(v.amax(axis, keepdim=True)).mul_(_LOG2E).exp2_().sum(axis))
        return e, torch.cat(sums, 0)

    def group_sums(self, padded: torch.Tensor) -> torch.Tensor:
        """``[P, B]`` -> ``[G, B]``: each group's sum over its slots."""
        return torch.cat([v.sum(axis) for v, axis in self._views(padded, 0)], 0)

    def scale_groups(self, padded: torch.Tensor, per_group: torch.Tensor, out: torch.Tensor | None = None):
        """``[P, B] * [G, B]`` broadcast over each group's slots (into ``out`` when given)."""
        out = torch.empty_like(padded) if out is None else out
        parts = per_group.split([n for n, _ in self._buckets], 0)
        for (v, axis), (o, _), f in zip(self._views(padded, 0), self._views(out, 0), parts, strict=True):
            torch.mul(v, f.unsqueeze(axis), out=o)
        return out

    def ancestor_reduce(self, per_group: torch.Tensor, product: bool = False) -> torch.Tensor:
        """``[G, B]``: sums (``product``: products) over each group's ancestors-or-self in the tree of groups
        (pointer doubling: one gather of rows per power of two up to the depth, for any depth). Differentiable."""
        identity = per_group.new_ones(1, per_group.shape[1]) if product else per_group.new_zeros(1, per_group.shape[1])
        t = torch.cat([per_group, identity])
        for k in range(self._steps):
            # Whole-width steps (the groups without an ancestor that far up read the identity row): a gather of
            # every row and one elementwise pass cost less than index_copy_ / index_reduce_ on the live rows. The
            # gather copies the old values before any of them is overwritten.
            up = t.index_select(0, self._buffers[f"jump_{k}"])
            if product:
                t[:-1].mul_(up)
            else:
                t[:-1].add_(up)
        return t[:-1]

    def subtree_sums(self, per_group: torch.Tensor) -> torch.Tensor:
        """``[G, B]``: sums over each group's descendants-or-self (the transpose of :meth:`ancestor_reduce`)."""
        d = torch.cat([per_group, per_group.new_zeros(1, per_group.shape[1])])
        for k in reversed(range(self._steps)):
            d.index_add_(0, self._buffers[f"jump_{k}"], d[:-1].clone())  # row G takes what has no ancestor there
        return d[:-1]

    def output_map(self, k: int, lead: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(index, inverse)``: the slot read by each of ``lead + k`` output columns (any slot for the lead
        columns), and the output column of each slot (``-1``: none)."""
        so = self.slot_output
        index = torch.cat([self.slot.new_zeros(lead), self.slot[:k]])
        return index, torch.where((so >= 0) & (so < k), so + lead, -1)

    # ---------------------------------------------------------------- the public results
    def padded_log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B, P]``: every output's log-probability within its group, in slot order (output ``i`` is column
        ``slot[i]``; padding ``-inf``). Differentiable; gather the columns you need.

        Example:
            >>> cs = ChainedSoftmax(np.array([0, 0, 1]), np.array([-1, 0]))
            >>> cs.padded_log_softmax(torch.zeros(1, 3))[0, cs.slot].tolist()  # log 1/2, log 1/2, log 1
            [-0.6931471824645996, -0.6931471824645996, 0.0]
        """
        padded = _Permute.apply(self._inputs(logits), self.slot_input, self.pad_slots, -math.inf, self.input_slot)
        return self.group_softmax(padded, log=True)

    def _check_outputs(self, outputs: int | None, lead: int) -> int:
        k = self.num_outputs if outputs is None else int(outputs)
        if not 0 <= k <= self.num_outputs or lead < 0:
            raise ValueError(f"outputs must be in 0..{self.num_outputs} and lead >= 0; got {outputs}, {lead}")
        return k

    def log_probs(self, logits: torch.Tensor, *, outputs: int | None = None, lead: int = 0) -> torch.Tensor:
        """``log P(i)`` for every output, ``[B, M]`` (float32; float64 stays float64). Differentiable.

        Args: as :meth:`probs` (the lead columns hold ``log 1 = 0``).
        """
        k = self._check_outputs(outputs, lead)
        lq = self.padded_log_softmax(logits)
        zero = torch.zeros((), dtype=lq.dtype, device=lq.device)
        t = torch.where(self.has_parent, lq.index_select(1, self.parent_slot), zero)
        t = self.ancestor_reduce(t.t().contiguous()).t().contiguous()
        index, inverse = self.output_map(k, lead)
        lead_cols = torch.arange(lead, device=lq.device)
        return _Permute.apply(lq + t.index_select(1, self.slot_group), index, lead_cols, 0.0, inverse)

    def probs(self, logits: torch.Tensor, *, outputs: int | None = None, lead: int = 0) -> torch.Tensor:
        """``P(i)`` for every output, ``[B, M]`` (float32; float64 stays float64), in ``[0, 1]`` by construction
        (no clamp), for any finite logits. Differentiable.

        Args:
            logits: ``[B, num_inputs]``.
            outputs: return only outputs ``0 .. outputs - 1`` (all of them still enter the group sums).
            lead: that many columns of ones before the outputs (a root of probability 1): ``[B, lead + outputs]``.
        """
        k = self._check_outputs(outputs, lead)
        return _ChainedProbs.apply(self._inputs(logits), self, k, lead)


def _check_groups(group: np.ndarray, parent: np.ndarray, input_order: np.ndarray | None) -> np.ndarray:
    """Validate the constructor's arrays; return the logit read by each output."""
    if group.ndim != 1 or parent.ndim != 1 or (group < 0).any() or (group >= len(parent)).any():
        raise ValueError(f"group must be [M] ids in 0..{len(parent) - 1}; got {group!r}")
    if np.bincount(group, minlength=len(parent)).min(initial=1) == 0:
        raise ValueError("every group needs at least one output")
    if ((parent < -1) | (parent >= len(group))).any():
        raise ValueError(f"parent must be output indices in 0..{len(group) - 1} or -1; got {parent!r}")
    if input_order is None:
        return np.arange(len(group))
    reads = np.asarray(input_order, dtype=np.int64)
    if reads.shape != group.shape or (reads < 0).any() or len(np.unique(reads)) != len(reads):
        raise ValueError(f"input_order must be [{len(group)}] distinct logit indices; got {input_order!r}")
    return reads


def _check_forest(gparent: np.ndarray) -> None:
    cur = np.arange(len(gparent))
    for _ in range(len(gparent) + 1):  # pointer chasing: one step per depth of the group tree
        if not (cur >= 0).any():
            return
        cur = np.where(cur >= 0, gparent[np.maximum(cur, 0)], -1)
    raise ValueError("parent: the groups form a cycle")

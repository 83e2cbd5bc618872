"""Losses on a softmax over the leaves: flat cross-entropy, hierarchical cross-entropy (HXE), soft labels.

Logits are ``[B, num_leaves]`` in the order of ``taxonomy.leaves``. Targets are node ids ``[B]`` (``-1`` =
ignore) and may be internal nodes: their likelihood is the marginal ``P(label) = sum of the leaves below``.
Soft targets are a distribution over the leaves ``[B, num_leaves]`` (float; mixup / cutmix, label smoothing; a
row with a negative entry is ignored): each loss is linear in a one-hot target, and its soft form is the
expectation of the hard loss over the target distribution, so a one-hot row gives the hard loss.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hiercls._checks import check_finite_number
from hiercls.losses.validation import check_leaf_distribution, check_node_targets, is_soft_targets, upcast
from hiercls.taxonomy import DISTANCE_KINDS, DistanceKind, Taxonomy
from hiercls.taxonomy.tensors import TreeOps, as_tensor, leaf_ranges, require_tree

__all__ = ["HXELoss", "LeafCrossEntropy", "SoftLabelLoss", "hxe_weights", "max_leaf_distance", "soft_label_targets"]


def _check_leaf_logits(logits: torch.Tensor, num_leaves: int) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != num_leaves:
        shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must have shape [B, {num_leaves}] (one per leaf); got {shape}")


def _masked_mean(per_sample: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    # Mean over kept samples; a batch with none kept gives 0 while staying attached to the graph.
    return (per_sample * valid).sum() / valid.sum().clamp(min=1)


class _LeafBase(nn.Module):
    def __init__(self, taxonomy: Taxonomy) -> None:
        super().__init__()
        self.taxonomy = taxonomy
        self.num_leaves = taxonomy.num_leaves
        self.num_nodes = taxonomy.num_nodes
        self.register_buffer("leaf_index", as_tensor(taxonomy.leaf_index), persistent=False)
        if taxonomy.is_tree:
            lo, hi = leaf_ranges(taxonomy)  # the leaves below a node are leaf positions [lo, hi)
            self.register_buffer("leaf_lo", as_tensor(lo), persistent=False)
            self.register_buffer("leaf_hi", as_tensor(hi), persistent=False)
        else:
            # [N, L] "leaf l is below node n" as a sparse buffer: rows are selected on the logits' device.
            coo = taxonomy.ancestors_sparse[taxonomy.leaves].T.tocoo()
            idx = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
            desc = torch.sparse_coo_tensor(
                idx, torch.ones(coo.nnz), (self.num_nodes, self.num_leaves), check_invariants=True
            )
            self.register_buffer("leaf_desc", desc.coalesce(), persistent=False)

    def soft(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(leaf distribution [B, L] in the logits' computing dtype, kept-row mask)`` of soft targets."""
        q, keep = check_leaf_distribution(targets, self.num_leaves, batch=logits.shape[0])
        return q.to(upcast(logits).dtype), keep

    def targets(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = check_node_targets(targets, self.num_nodes, batch=logits.shape[0])
        valid = t >= 0
        return t.clamp(min=0), valid

    def log_marginal(self, leaf_logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``log P(target)`` per sample from leaf log-probabilities (targets already clamped to >= 0)."""
        leaf_pos = self.leaf_index[targets]
        out = leaf_logp.gather(1, leaf_pos.clamp(min=0)[:, None])[:, 0]
        internal = leaf_pos < 0
        if bool(internal.any()):
            if self.taxonomy.is_tree:
                ar = torch.arange(self.num_leaves, device=leaf_logp.device)
                mask = (ar >= self.leaf_lo[targets][:, None]) & (ar < self.leaf_hi[targets][:, None])
            else:
                mask = self.leaf_desc.index_select(0, targets).to_dense() > 0
            lse = leaf_logp.masked_fill(~mask, -math.inf).logsumexp(1)
            out = torch.where(internal, lse, out)
        return out


class LeafCrossEntropy(_LeafBase):
    """Cross-entropy of a softmax over the leaves; an internal label scores the sum of its leaves.

    ``loss = -log P(y)`` with ``P(y) = sum(softmax(logits)[leaves under y])`` (plain cross-entropy when every
    label is a leaf), with optional label smoothing over the leaves, averaged over non-ignored samples. Soft
    targets ``q [B, num_leaves]`` give ``-sum_l q_l log p_l`` (the expectation of the hard loss), smoothed alike.

    Args:
        taxonomy: the taxonomy (tree or DAG).
        label_smoothing: mass spread uniformly over the leaves, in ``[0, 1)``.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> logits = torch.zeros(1, 3)  # uniform over the 3 leaves x, y, b
        >>> round(LeafCrossEntropy(tax)(logits, torch.tensor([1])).item(), 4)  # label "a": -log(2/3)
        0.4055
    """

    def __init__(self, taxonomy: Taxonomy, label_smoothing: float = 0.0) -> None:
        super().__init__(taxonomy)
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        _check_leaf_logits(logits, self.num_leaves)
        logp = F.log_softmax(upcast(logits), dim=1)
        if is_soft_targets(targets):
            q, valid = self.soft(logits, targets)
            nll = -(q * logp).sum(1)
        else:
            t, valid = self.targets(logits, targets)
            nll = -self.log_marginal(logp, t)
        if self.label_smoothing:
            nll = (1 - self.label_smoothing) * nll - self.label_smoothing * logp.mean(1)
        return _masked_mean(nll, valid)


def hxe_weights(taxonomy: Taxonomy, alpha: float, normalize: bool = True) -> np.ndarray:
    """HXE edge weights ``lambda[n] = exp(-alpha * depth(n))`` for the edge parent(n) -> n.

    This is the weighting of the published "making better mistakes" code (``get_exponential_weighting``:
    ``exp(-alpha * len(treeposition))``); with ``normalize`` the weights of all ``N`` nodes (root included) sum
    to one, so at ``alpha = 0`` every weight is ``1 / N`` and HXE is cross-entropy divided by the node count.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> hxe_weights(tax, 0.0).tolist()
        [0.2, 0.2, 0.2, 0.2, 0.2]
    """
    if not math.isfinite(alpha):
        raise ValueError(f"alpha must be finite; got {alpha!r}")
    w = np.exp(-float(alpha) * taxonomy.depth.astype(np.float64))
    return w / w.sum() if normalize else w


def _block_size(num_leaves: int) -> int:
    # Path masses are interior blocks plus two edge blocks per path node: about num_leaves / b + 2 b entries per
    # node, least near b = sqrt(num_leaves / 2); a power of two keeps the index arithmetic simple.
    return max(8, 1 << max(0, round(math.log2(max(1.0, math.sqrt(num_leaves / 2))))))


def _path_masses(
    p: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, block: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Sums of ``p [B, L]`` over the leaf ranges ``[lo, hi) [B, P]`` of each row, exactly (no prefix differences).

    The leaves are cut into blocks of ``block``: a range is the blocks strictly between its first and last
    block (summed once per row, then a masked sum over at most ``L / block`` block sums) plus the covered
    entries of those two edge blocks (gathered). Empty ranges (``lo == hi``) sum to 0. Returns the sums and what
    :func:`_spread_path_weights` needs to send weights back to the leaves.
    """
    num_leaves = p.shape[1]
    n_full = num_leaves // block
    first, last = lo.div(block, rounding_mode="floor"), (hi - 1).div(block, rounding_mode="floor")
    k = torch.arange(n_full, device=p.device)
    interior = (k > first[..., None]) & (k < last[..., None])  # [B, P, n_full]; such blocks are full-size
    block_sums = p[:, : n_full * block].unflatten(1, (n_full, block)).sum(2)
    inner = torch.bmm(interior.to(p.dtype), block_sums[:, :, None])[..., 0]
    r = torch.arange(block, device=p.device)
    idx = torch.stack([first, last], 2)[..., None] * block + r  # [B, P, 2, block]
    edge = (idx >= lo[..., None, None]) & (idx < hi[..., None, None])
    edge[:, :, 1] &= (last != first)[..., None]  # one edge block: counted once
    idx = idx.clamp_(0, num_leaves - 1).flatten(1)
    edge_p = p.gather(1, idx).view(edge.shape) * edge
    return inner + edge_p.sum((2, 3)), (interior, idx, edge_p)


def _spread_path_weights(
    p: torch.Tensor, weights: torch.Tensor, geometry: tuple[torch.Tensor, ...], block: int
) -> torch.Tensor:
    """``out[b, l] = p[b, l] * sum_j weights[b, j] [lo_j <= l < hi_j]`` for the ranges of :func:`_path_masses`."""
    interior, idx, edge_p = geometry
    num_leaves = p.shape[1]
    n_full = num_leaves // block
    out = torch.empty_like(p)
    per_block = torch.bmm(weights[:, None, :], interior.to(p.dtype))  # [B, 1, n_full]
    torch.mul(
        p[:, : n_full * block].unflatten(1, (n_full, block)),
        per_block.transpose(1, 2),
        out=out[:, : n_full * block].unflatten(1, (n_full, block)),
    )
    out[:, n_full * block :] = 0
    return out.scatter_add_(1, idx, (edge_p * weights[..., None, None]).flatten(1))


class _PathLogMassSum(torch.autograd.Function):
    """``sum_{b,j} coef[b,j] * log mass[b,j]`` with ``mass`` the softmax mass of leaf ranges, its gradient by hand.

    With ``p = softmax(z)`` and ``sum_j coef[b, j] = 0`` for every row (HXE's telescoping sum), the softmax's
    normaliser drops out and ``d/dz_l = p_l * sum_{j: l in range j} coef_j / mass_j``.
    """

    @staticmethod
    def forward(ctx, z, p, mass, coef, geometry, block):  # type: ignore[override]
        ctx.save_for_backward(p, mass, coef, *geometry)
        ctx.block = block
        return (coef * mass.log()).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        p, mass, coef, *geometry = ctx.saved_tensors
        return _spread_path_weights(p, grad * coef / mass, tuple(geometry), ctx.block), None, None, None, None, None


class _NodeLogMassSum(torch.autograd.Function):
    """``sum_{b,n} coef[b,n] * log mass[b,n]`` over every node, ``mass`` the softmax marginals, gradient by hand.

    With ``sum_n coef[b, n] = 0`` for every row, ``d/dz_l = p_l * sum_{n ancestor-or-self of l} coef_n / mass_n``:
    one top-down sum instead of autograd through the marginals' per-level gathers.
    """

    @staticmethod
    def forward(ctx, z, p, mass, coef, ops, leaf_ids):  # type: ignore[override]
        ctx.save_for_backward(p, mass, coef, leaf_ids)
        ctx.ops = ops
        return (coef * mass.log()).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        p, mass, coef, leaf_ids = ctx.saved_tensors
        down = ctx.ops.top_down_sum(grad * coef / mass).index_select(1, leaf_ids)
        return p * down, None, None, None, None, None


class HXELoss(_LeafBase):
    """Hierarchical cross-entropy (Bertinetto et al., "Making better mistakes", CVPR 2020).

    ``HXE(y) = -sum_{n on the path root -> y, n != root} lambda[n] * log P(n | parent(n))`` with
    ``P(n | parent) = P(n) / P(parent)`` from the leaf softmax marginals and ``lambda`` from
    :func:`hxe_weights`. Internal labels simply have shorter paths. Averaged over non-ignored samples.
    HXE is linear in a one-hot target; soft targets ``q [B, num_leaves]`` are by definition the expectation
    ``sum_leaf q(leaf) HXE(leaf) = -sum_{n != root} lambda[n] Q(n) log P(n | parent(n))`` with ``Q`` the
    marginals of ``q``.

    Args:
        taxonomy: a tree.
        alpha: decay of the weights with depth (0 = cross-entropy / N with ``normalize``).
        normalize: divide the weights by their sum over all nodes (as the published code does).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> logits, y = torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([2])
        >>> ce = torch.nn.functional.cross_entropy(logits, torch.tensor([0]))  # x is leaf 0
        >>> bool(torch.isclose(HXELoss(tax, alpha=0.0)(logits, y), ce / tax.num_nodes))
        True
    """

    def __init__(self, taxonomy: Taxonomy, alpha: float = 0.1, normalize: bool = True) -> None:
        super().__init__(taxonomy)
        require_tree(taxonomy, "HXELoss")
        self.alpha, self.normalize = float(alpha), bool(normalize)
        self.ops = TreeOps(taxonomy)
        self.register_buffer("paths", as_tensor(taxonomy.paths), persistent=False)
        self.register_buffer("parent", as_tensor(np.maximum(taxonomy.parent, 0)), persistent=False)
        self.register_buffer("leaf_ids", as_tensor(taxonomy.leaves), persistent=False)
        self.register_buffer(
            "weights", as_tensor(hxe_weights(taxonomy, alpha, normalize), dtype=torch.float64), persistent=False
        )
        self._block = _block_size(self.num_leaves)

    #: A label subtree whose softmax mass falls below this takes the exact all-node path (float32 stays normal).
    _TINY = 1e-30

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        _check_leaf_logits(logits, self.num_leaves)
        if is_soft_targets(targets):
            return self._forward_soft(logits, targets)
        t, valid = self.targets(logits, targets)
        z = upcast(logits)
        path = self.paths[t]  # [B, H + 1], -1 past the label
        on = path >= 0
        # Only the label's path is needed: P(path node) is the softmax mass of its leaf range [lo, hi) (leaves
        # are in DFS order), and HXE = sum_j coef_j log P(node at depth j) with coef_j = w_{j+1} - w_j (w_j the
        # weight of the edge into the path node at depth j, 0 for the root and past the label): the telescoping
        # sum of -w_j log P(n_j | n_{j-1}).
        node = path.clamp(min=0)
        zero = torch.zeros_like(path)
        lo, hi = torch.where(on, self.leaf_lo[node], zero), torch.where(on, self.leaf_hi[node], zero)
        w = torch.where(on, self.weights.to(z.dtype)[node], torch.zeros((), dtype=z.dtype, device=z.device))
        w[:, 0] = 0
        coef = torch.cat([w[:, 1:], w[:, :1]], 1) - w  # w[:, 0] == 0 closes the shift
        kept = valid.to(z.dtype)
        coef = coef * (kept / kept.sum().clamp(min=1))[:, None]
        block = self._block
        with torch.no_grad():
            p = torch.softmax(z.detach(), 1)
            mass, geometry = _path_masses(p, lo, hi, block)
            own = mass.gather(1, on.sum(1, keepdim=True) - 1)  # the label's own subtree
        if bool((own < self._TINY).any()):  # the label subtree underflows the shared shift: exact marginals
            return self._forward_all_nodes(z, t, valid)
        mass = torch.where(on, mass, torch.ones_like(mass))
        return _PathLogMassSum.apply(z, p, mass, coef, geometry, block)

    def _forward_all_nodes(self, z: torch.Tensor, t: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        # Every node's log-marginal with per-node shifts (exact for any logits; slower).
        logp = F.log_softmax(z, dim=1)
        log_marg = self.ops.bottom_up(logp, "logsumexp")  # [B, N]
        path = self.paths[t]
        on_path = path[:, 1:] >= 0
        child, parent = path[:, 1:].clamp(min=0), path[:, :-1].clamp(min=0)
        cond = log_marg.gather(1, child) - log_marg.gather(1, parent)
        terms = torch.where(on_path, self.weights.to(cond.dtype)[child] * cond, torch.zeros_like(cond))
        return _masked_mean(-terms.sum(1), valid)

    def _forward_soft(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # -sum_{n != root} w_n Q(n) (log P(n) - log P(parent n)) = sum_n coef_n log P(n) with
        # coef_n = sum_{children c} w_c Q(c) - w_n Q(n) (the root: its children's part only, log P(root) = 0), so
        # that every row's coefficients sum to 0 as _NodeLogMassSum's gradient needs.
        q, valid = self.soft(logits, targets)
        z = upcast(logits)
        kept = valid.to(z.dtype)
        wq = self.ops.marginals(q) * self.weights.to(z.dtype)
        coef = torch.zeros_like(wq).index_add_(1, self.parent[1:], wq[:, 1:])
        coef[:, 1:] -= wq[:, 1:]
        coef *= (kept / kept.sum().clamp(min=1))[:, None]
        with torch.no_grad():
            p = torch.softmax(z.detach(), 1)
            mass = self.ops.marginals(p)
            mass[:, 0] = 1.0
            if bool(((coef != 0) & (mass < self._TINY)).any()):  # a mass underflows: exact per-node log-sum-exps
                log_marg = self.ops.bottom_up(F.log_softmax(z, dim=1), "logsumexp")
                return (coef.detach() * log_marg).sum()
            mass = torch.where(coef != 0, mass, torch.ones_like(mass))
        return _NodeLogMassSum.apply(z, p, mass, coef.detach(), self.ops, self.leaf_ids)


def max_leaf_distance(taxonomy: Taxonomy, kind: DistanceKind = "lca_height", *, block: int = 1 << 22) -> float:
    """The largest distance between two leaves, ``max_{l, l'} d(l, l')``: the normaliser of Bertinetto et al.

    On trees ``lca_height`` and ``shortest_path`` take O(N) (the shallowest branching node; the longest
    leaf-to-leaf path); other kinds (and DAGs) scan the leaf-to-leaf distances in blocks of ``block`` entries.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> max_leaf_distance(tax, "lca_height"), max_leaf_distance(tax, "shortest_path")
        (2.0, 3.0)
    """
    leaves = taxonomy.leaves
    if len(leaves) < 2:
        return 0.0
    depth = taxonomy.depth
    if taxonomy.is_tree and kind == "lca_height":
        # Two leaves have their shallowest LCA at the first node below the root with two children.
        branching = np.flatnonzero(taxonomy.num_children >= 2)
        return float(taxonomy.height - depth[branching].min())
    if taxonomy.is_tree and kind == "shortest_path":
        # Deepest leaf below every node, then at each node the two deepest child subtrees meet.
        deepest = np.where(taxonomy.is_leaf, depth, -1).astype(np.int64)
        par = taxonomy.parent
        best = 0
        first = deepest.copy()
        second = np.full(taxonomy.num_nodes, -1, dtype=np.int64)
        for lvl in reversed(taxonomy.levels[1:]):
            for n in lvl:  # ids of one level; the loop is O(N) in total
                u, d = int(par[n]), int(first[n])
                if d > first[u]:
                    first[u], second[u] = d, first[u]
                elif d > second[u]:
                    second[u] = d
        internal = second >= 0
        if internal.any():
            best = int((first[internal] + second[internal] - 2 * depth[internal]).max())
        return float(best)
    out = 0.0
    step = max(1, block // len(leaves))
    for s in range(0, len(leaves), step):
        out = max(out, float(taxonomy.distance_matrix(kind, nodes=leaves[s : s + step], targets=leaves).max()))
    return out


def soft_label_targets(
    taxonomy: Taxonomy,
    targets: np.ndarray,
    beta: float,
    kind: DistanceKind = "lca_height",
    *,
    normalize_distances: bool = True,
) -> np.ndarray:
    """Reference soft labels ``softmax(-beta * d(leaf, y) / d_max)`` over the leaves (numpy, for small trees).

    ``d_max`` is :func:`max_leaf_distance`, as in Bertinetto et al.'s code, so ``beta`` is the paper's
    hardness; ``normalize_distances=False`` uses the raw distances (``d_max = 1``, hiercls's earlier scale,
    where the paper's ``beta`` is ``beta / d_max``).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> soft_label_targets(tax, np.array([2]), beta=0.0).round(3).tolist()
        [[0.333, 0.333, 0.333]]
        >>> q = soft_label_targets(tax, np.array([2]), beta=2.0)  # lca_height 0, 1, 2 over d_max = 2
        >>> bool(np.allclose(q, np.exp([0.0, -1.0, -2.0]) / np.exp([0.0, -1.0, -2.0]).sum()))
        True
    """
    d = taxonomy.distance_matrix(kind, nodes=np.asarray(targets), targets=taxonomy.leaves)
    if normalize_distances:
        d_max = max_leaf_distance(taxonomy, kind)
        d = d / d_max if d_max > 0 else d
    z = -beta * d
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


class SoftLabelLoss(_LeafBase):
    """Soft-label cross-entropy (Bertinetto et al. 2020): targets ``q = softmax(-beta * d(leaf, y) / d_max)``.

    ``loss = -sum_leaves q(leaf) log p(leaf)``, averaged over non-ignored samples; ``d`` is
    :meth:`Taxonomy.distance` of ``kind`` (default ``lca_height``, the paper's height of the LCA) and ``d_max``
    the largest leaf-to-leaf distance (:func:`max_leaf_distance`), as in the authors' code, so ``beta`` is
    the paper's hardness (``beta = 4`` in the paper is ``beta = 4`` here). ``normalize_distances=False``
    keeps the raw distances (hiercls's earlier scale: the paper's ``beta`` is then ``beta / d_max``). The
    ``[N, num_leaves]`` target table is precomputed when it has at most ``table_limit`` entries; on larger trees
    the distances of each batch are computed on the device from the root paths (same formulas) in
    ``O(B * (num_leaves + height))``. The loss is linear in a one-hot target; soft targets ``r [B, num_leaves]``
    give the expectation, i.e. the cross-entropy against ``sum_y r(y) q_y``.

    Args:
        taxonomy: a tree (or a DAG small enough for the table).
        beta: sharpness (large beta -> one-hot cross-entropy).
        kind: distance kind.
        table_limit: largest table to precompute.
        normalize_distances: divide the distances by ``d_max`` (the reference's convention).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> loss = SoftLabelLoss(tax, beta=1e3)  # beta -> infinity gives cross-entropy
        >>> logits, y = torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([2])
        >>> bool(torch.isclose(loss(logits, y), torch.nn.functional.cross_entropy(logits, torch.tensor([0]))))
        True
    """

    _KINDS = DISTANCE_KINDS

    def __init__(
        self,
        taxonomy: Taxonomy,
        beta: float = 10.0,
        kind: DistanceKind = "lca_height",
        table_limit: int = 1 << 22,
        *,
        normalize_distances: bool = True,
    ) -> None:
        super().__init__(taxonomy)
        if kind not in self._KINDS:
            raise ValueError(f"kind must be one of {', '.join(self._KINDS)}; got {kind!r}")
        self.beta, self.kind = check_finite_number(beta, "beta", minimum=0.0), kind
        self.normalize_distances = bool(normalize_distances)
        d_max = max_leaf_distance(taxonomy, kind) if self.normalize_distances else 1.0
        self.distance_scale = d_max if d_max > 0 else 1.0  # the divisor of the distances
        self.use_table = taxonomy.num_nodes * taxonomy.num_leaves <= table_limit
        self.register_buffer("leaves", as_tensor(taxonomy.leaves), persistent=False)
        self._mean_rows: dict[torch.device, torch.Tensor] = {}
        if self.use_table:
            table = soft_label_targets(
                taxonomy, np.arange(taxonomy.num_nodes), self.beta, kind, normalize_distances=self.normalize_distances
            )
            self.register_buffer("table", as_tensor(table, dtype=torch.float32), persistent=False)
        else:
            require_tree(taxonomy, f"SoftLabelLoss on a taxonomy this large ({taxonomy.num_nodes} nodes)")
            self.register_buffer("paths", as_tensor(taxonomy.paths), persistent=False)
            self.register_buffer("depth", as_tensor(taxonomy.depth, dtype=torch.float32), persistent=False)
            self.register_buffer("ic", as_tensor(taxonomy.information_content, dtype=torch.float32), persistent=False)

    def soft_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """Soft target distributions ``[B, num_leaves]`` for node ids ``targets`` (all >= 0)."""
        if self.use_table:
            return self.table[targets]
        py = self.paths[targets]  # [B, H+1], -1 past the label
        # The leaves below the path's nodes are nested ranges of leaf positions; counting, for every leaf, the
        # ranges that contain it (a difference array and a cumulative sum) gives the depth of its LCA with y + 1.
        on = (py >= 0).to(torch.int32)
        node = py.clamp(min=0)
        diff = torch.zeros(py.shape[0], self.num_leaves + 1, dtype=torch.int32, device=py.device)
        diff.scatter_add_(1, self.leaf_lo[node], on)
        diff.scatter_add_(1, self.leaf_hi[node], -on)
        lca_depth = (diff.cumsum(1, dtype=torch.int32)[:, : self.num_leaves] - 1).long()
        dy, dl = self.depth[targets][:, None], self.depth[self.leaves][None, :]
        dlca = lca_depth.to(self.depth.dtype)
        if self.kind == "shortest_path":
            d = dy + dl - 2 * dlca
        elif self.kind == "lca_height":
            d = float(self.taxonomy.height) - dlca
        elif self.kind in ("wu_palmer", "wu_palmer_root1"):
            c = 1.0 if self.kind == "wu_palmer_root1" else 0.0
            den = dy + dl + 2 * c
            d = 1.0 - 2.0 * (dlca + c) / torch.where(den > 0, den, torch.ones_like(den))
        elif self.kind == "zhao":
            lca = py.gather(1, lca_depth)
            den = self.ic[targets][:, None] + self.ic[self.leaves][None, :]
            ratio = 2 * self.ic[lca] / torch.where(den > 0, den, torch.ones_like(den))
            d = torch.where(den > 0, 1.0 - ratio, torch.zeros_like(den))
        else:
            lca = py.gather(1, lca_depth)
            d = self.ic[targets][:, None] + self.ic[self.leaves][None, :] - 2 * self.ic[lca]
        d = torch.where(targets[:, None] == self.leaves[None, :], torch.zeros_like(d), d)
        return torch.softmax(-self.beta * d / self.distance_scale, dim=1)

    def mixed_soft_targets(self, r: torch.Tensor) -> torch.Tensor:
        """``sum_y r[b, y] q_y`` ``[B, num_leaves]``: the soft labels of a leaf distribution ``r [B, num_leaves]``.

        With the table one product; else ``r`` is split into its row minimum (a uniform floor, as label smoothing
        leaves, against the mean soft label, computed once) and the few leaves above it (mixup's pairs).
        """
        if self.use_table:
            return r @ self.table.index_select(0, self.leaves).to(r.dtype)
        floor = r.min(1, keepdim=True).values
        rest = r - floor
        out = torch.zeros_like(r)
        if bool((floor > 0).any()):
            out = floor * self.num_leaves * self._mean_row(r.device).to(r.dtype)
        k = int((rest > 0).sum(1).max()) if rest.numel() else 0
        vals, idx = rest.topk(k, dim=1) if k else (rest[:, :0], rest[:, :0].long())
        for j in range(k):
            out = out + vals[:, j : j + 1] * self.soft_targets(self.leaves[idx[:, j]]).to(r.dtype)
        return out

    def _mean_row(self, device: torch.device) -> torch.Tensor:
        # Mean soft label over all leaf labels, in blocks of leaves (a [L, L] table does not fit here).
        if device not in self._mean_rows:
            step = max(1, (1 << 22) // max(1, self.num_leaves))
            total = torch.zeros(self.num_leaves, dtype=torch.float64, device=device)
            for s in range(0, self.num_leaves, step):
                total += self.soft_targets(self.leaves.to(device)[s : s + step]).double().sum(0)
            self._mean_rows[device] = total / self.num_leaves
        return self._mean_rows[device]

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        _check_leaf_logits(logits, self.num_leaves)
        logp = F.log_softmax(upcast(logits), dim=1)
        if is_soft_targets(targets):
            r, valid = self.soft(logits, targets)
            q = self.mixed_soft_targets(r)
        else:
            t, valid = self.targets(logits, targets)
            q = self.soft_targets(t)
        return _masked_mean(-(q * logp).sum(1), valid)

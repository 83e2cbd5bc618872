"""The one home of taxonomy tensor operations (torch): leaf->node marginals, depth-wise recursions, index tables.

Every head, loss and decoder that needs these goes through this module, so there is one definition of each.
Recursions work on ``[B, N, *rest]`` tensors (node axis 1), are built once per taxonomy, and loop over depths
(about a dozen on WordNet), never over samples or nodes. Nodes of one depth are stored leaves-first so that the
internal nodes of a depth are a contiguous block: sums over the children of a node are segment reductions into
that block.

Marginals are exactly monotone in floating point: on a tree every parent is computed as a float sum of
non-negative terms that include each child's already-rounded value, and rounding is monotone, so
``P(parent) >= P(child)`` holds bit for bit (a leaves-to-nodes matrix product sums in another order per node
and can break it by one ulp). On a DAG, where summing children would count shared descendants twice, the
leaf sums are followed by a max pass up the edges, which only moves values by rounding.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from hiercls.taxonomy.core import Taxonomy, TaxonomyError

__all__ = [
    "TreeOps",
    "as_tensor",
    "leaf_marginals",
    "leaf_ranges",
    "node_probs_from_leaves",
    "require_tree",
    "segment_logsumexp",
    "tree_ops",
]


def as_tensor(array: np.ndarray, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A fresh tensor copy of a (possibly read-only) numpy array."""
    return torch.from_numpy(np.array(array, copy=True)).to(dtype)


def require_tree(taxonomy: Taxonomy, what: str) -> None:
    """Raise a :class:`TaxonomyError` naming ``what`` when ``taxonomy`` has multi-parent nodes."""
    if not taxonomy.is_tree:
        raise TaxonomyError(
            f"{what} needs a tree but taxonomy {taxonomy.name!r} has multi-parent nodes; "
            "convert it with taxonomy.to_tree('first' | 'shortest' | 'longest')"
        )


def _expand_index(index: torch.Tensor, like: torch.Tensor, dim: int = 1) -> torch.Tensor:
    shape = [1] * like.dim()
    shape[dim] = -1
    size = list(like.shape)
    size[dim] = index.numel()
    return index.view(shape).expand(size)


def segment_logsumexp(values: torch.Tensor, group: torch.Tensor, num_groups: int, dim: int = 1) -> torch.Tensor:
    """``logsumexp`` of the entries of ``values`` along ``dim`` that share a ``group`` id (groups non-empty).

    Example:
        >>> v = torch.tensor([[0.0, 0.0, 1.0]])
        >>> segment_logsumexp(v, torch.tensor([0, 0, 1]), 2).tolist()  # [log 2, 1]
        [[0.6931471824645996, 1.0]]
    """
    idx = _expand_index(group, values, dim)
    shape = list(values.shape)
    shape[dim] = num_groups
    # The shift only keeps exp() in range; it is constant for the gradient, so it is detached.
    finite = values.detach().masked_fill(~torch.isfinite(values.detach()), torch.finfo(values.dtype).min)
    shift = torch.full(shape, torch.finfo(values.dtype).min, dtype=values.dtype, device=values.device)
    shift = shift.scatter_reduce(dim, idx, finite, reduce="amax", include_self=True)
    summed = torch.zeros(shape, dtype=values.dtype, device=values.device)
    summed = summed.scatter_add(dim, idx, torch.exp(values - shift.gather(dim, idx)))
    return shift + torch.log(summed)


def _node_major(x: torch.Tensor) -> torch.Tensor:
    # [B, N, *rest] -> [N, B, *rest]: the recursions gather whole rows, much faster than columns on CPU.
    return x.transpose(0, 1).contiguous()


class TreeOps(nn.Module):
    """Index tables and depth-wise recursions over a taxonomy (buffers move with ``.to(device)``).

    Tree recursions (``top_down_sum``, ``bottom_up``) need a tree; :meth:`descendant_max` works on DAGs too.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> ops = TreeOps(tax)
        >>> ops.bottom_up(torch.tensor([[0.5, 0.25, 0.25]]), "sum").tolist()  # leaves x, y, b
        [[1.0, 0.75, 0.5, 0.25, 0.25]]
    """

    def __init__(self, taxonomy: Taxonomy) -> None:
        super().__init__()
        self.num_nodes = taxonomy.num_nodes
        self.num_leaves = taxonomy.num_leaves
        self.is_tree = taxonomy.is_tree
        reg = self._reg
        if self.is_tree:
            is_leaf, parent = taxonomy.is_leaf, taxonomy.parent
            level_lists, self.level_num_leaves = [], []
            for nodes in taxonomy.levels:
                lv = np.concatenate([nodes[is_leaf[nodes]], nodes[~is_leaf[nodes]]])
                level_lists.append(lv)
                self.level_num_leaves.append(int(is_leaf[nodes].sum()))
            pos = np.empty(self.num_nodes, dtype=np.int64)
            for lv in level_lists:
                pos[lv] = np.arange(len(lv))
            self.height = len(level_lists) - 1
            self.level_sizes = [len(lv) for lv in level_lists]
            for d, lv in enumerate(level_lists):
                reg(f"nodes_{d}", lv)
                reg(f"leafpos_{d}", taxonomy.leaf_index[lv[: self.level_num_leaves[d]]])
                if d > 0:
                    ppos = pos[parent[lv]]
                    reg(f"ppos_{d}", ppos)
                    reg(f"pgroup_{d}", ppos - self.level_num_leaves[d - 1])
                    reg(f"parents_{d}", parent[lv])
            reg("leaves", taxonomy.leaves)
            reg("assemble_index", np.argsort(np.concatenate(level_lists), kind="stable"))
        # Edges grouped by the child's longest-path depth: pushing values up level by level from the deepest
        # makes every node final before it is pushed (its children are all strictly deeper).
        md = taxonomy.max_depth
        children = np.repeat(np.arange(taxonomy.num_nodes), np.diff(taxonomy.parent_ptr))
        parents = taxonomy.parent_idx
        self.edge_levels = []
        for d in range(int(md.max()) if taxonomy.num_nodes > 1 else 0, 0, -1):
            sel = md[children] == d
            if sel.any():
                reg(f"edge_child_{d}", children[sel])
                reg(f"edge_parent_{d}", parents[sel])
                self.edge_levels.append(d)
        if not self.is_tree:
            # DAG marginals: a node's leaves are summed once each (summing children would count shared ones twice).
            coo = taxonomy.ancestors_sparse[taxonomy.leaves].T.tocoo()  # [N, L]
            idx = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
            self.register_buffer(
                "leaf_to_node",
                torch.sparse_coo_tensor(
                    idx, torch.ones(coo.nnz), (self.num_nodes, self.num_leaves), check_invariants=True
                ).coalesce(),
                persistent=False,
            )

    def _reg(self, name: str, array: np.ndarray) -> None:
        self.register_buffer(name, as_tensor(array), persistent=False)

    def _buf(self, name: str) -> torch.Tensor:
        return self._buffers[name]  # type: ignore[return-value]

    def _need_tree(self) -> None:
        if not self.is_tree:
            raise TaxonomyError("this tree recursion needs a tree taxonomy; convert the DAG with to_tree()")

    def assemble(self, per_level: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate per-depth tensors (in this object's level order) into node-id order ``[B, N, ...]``."""
        return torch.cat(per_level, dim=1).index_select(1, self._buf("assemble_index"))

    def level_nodes(self, depth: int) -> torch.Tensor:
        """Node ids at ``depth`` in this object's order (leaves first)."""
        return self._buf(f"nodes_{depth}")

    def parent_positions(self, depth: int) -> torch.Tensor:
        """Position of each depth-``depth`` node's parent within ``level_nodes(depth - 1)``."""
        return self._buf(f"ppos_{depth}")

    def _assemble0(self, per_level: list[torch.Tensor]) -> torch.Tensor:
        out = torch.cat(per_level, dim=0).index_select(0, self._buf("assemble_index"))
        return out.transpose(0, 1).contiguous()

    def top_down_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``out[n] = sum of values over the root-to-n path`` (e.g. log-probabilities of conditional softmaxes).

        Args:
            values: ``[B, N, *rest]`` per-node terms (the root's entry is included as is).
        """
        self._need_tree()
        v = _node_major(values)
        cur = v.index_select(0, self._buf("nodes_0"))
        out = [cur]
        for d in range(1, self.height + 1):
            cur = cur.index_select(0, self._buf(f"ppos_{d}")) + v.index_select(0, self._buf(f"nodes_{d}"))
            out.append(cur)
        return self._assemble0(out)

    def bottom_up(self, leaf_values: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        """Node values from leaf values ``[B, num_leaves, *rest]`` (leaf order = ``taxonomy.leaves``).

        ``reduce="sum"`` gives marginal probabilities from leaf probabilities (:meth:`marginals`);
        ``"logsumexp"`` gives log-marginals from leaf log-probabilities (stable in the tails).
        """
        self._need_tree()
        if reduce not in ("sum", "logsumexp"):
            raise ValueError(f"reduce must be 'sum' or 'logsumexp'; got {reduce!r}")
        if reduce == "sum":
            return self.marginals(leaf_values)
        leaf = _node_major(leaf_values)
        out: list[torch.Tensor] = [leaf.new_empty(0)] * (self.height + 1)
        below = None
        for d in range(self.height, -1, -1):
            parts = [leaf.index_select(0, self._buf(f"leafpos_{d}"))]
            n_internal = self.level_sizes[d] - self.level_num_leaves[d]
            if n_internal:
                parts.append(segment_logsumexp(below, self._buf(f"pgroup_{d + 1}"), n_internal, dim=0))
            below = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
            out[d] = below
        return self._assemble0(out)

    def marginals(self, leaf_probs: torch.Tensor) -> torch.Tensor:
        """``P(n) = sum of leaf_probs over the leaves below n``: ``[B, num_leaves, *rest]`` -> ``[B, N, *rest]``.

        Trees and DAGs; ``P(parent) >= P(child)`` holds exactly in floating point for non-negative input (see
        the module docstring). Differentiable; computes in the input's dtype.

        Example:
            >>> ops = TreeOps(Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")]))
            >>> ops.marginals(torch.tensor([[0.5, 0.25, 0.25]])).tolist()
            [[1.0, 0.75, 0.5, 0.25, 0.25]]
        """
        return self._marginals_node_major(leaf_probs).transpose(0, 1).contiguous()

    def _marginals_node_major(self, leaf_probs: torch.Tensor) -> torch.Tensor:
        # [B, L, *rest] -> [N, B, *rest]: whole-row gathers and adds, much faster than columns on CPU.
        if leaf_probs.dim() < 2 or leaf_probs.shape[1] != self.num_leaves:
            raise ValueError(
                f"leaf_probs must have shape [B, {self.num_leaves}, ...] (one entry per leaf, in "
                f"taxonomy.leaves order); got {list(leaf_probs.shape)}"
            )
        leaf = _node_major(leaf_probs)
        if self.is_tree:
            # In place, deepest level first: each parent's row gets every child's final row added.
            out = leaf.new_zeros(self.num_nodes, *leaf.shape[1:])
            out.index_copy_(0, self._buf("leaves"), leaf)
            for d in range(self.height, 0, -1):
                out.index_add_(0, self._buf(f"parents_{d}"), out.index_select(0, self._buf(f"nodes_{d}")))
            return out
        sums = torch.sparse.mm(self._buf("leaf_to_node").to(leaf.dtype), leaf.reshape(self.num_leaves, -1))
        return self._edge_max(sums.reshape(self.num_nodes, *leaf.shape[1:]), dim=0)

    def node_probs(self, leaf_probs: torch.Tensor) -> torch.Tensor:
        """Node probabilities ``[B, N]`` as every head returns them, from leaf probabilities ``[B, num_leaves]``.

        The contract: float32 (float64 input stays float64, for gradient checks), :meth:`marginals` clamped to
        ``[0, 1]`` (rounding can push a sum a hair above 1) and the root exactly 1; clamping is monotone, so
        ``parent >= child`` still holds exactly.

        Example:
            >>> ops = TreeOps(Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")]))
            >>> ops.node_probs(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float16)).dtype
            torch.float32
        """
        p = leaf_probs if leaf_probs.dtype == torch.float64 else leaf_probs.float()
        out = self._marginals_node_major(p).clamp_(0.0, 1.0)
        out[0] = 1.0  # the root (id 0)
        return out.transpose(0, 1).contiguous()

    def descendant_max(self, values: torch.Tensor) -> torch.Tensor:
        """``out[n] = max(values[d] for d descendant-or-self of n)`` along axis 1 (trees and DAGs).

        This is the MCM of C-HMCNN and the ancestor closure of multi-hot labels.
        """
        if self.is_tree:
            return self._tree_descendant_max(values)
        return self._edge_max(values, dim=1)

    def _edge_max(self, values: torch.Tensor, dim: int) -> torch.Tensor:
        # Edges by decreasing child depth (longest path): a child is final before it is pushed to its parents.
        out = values
        for d in self.edge_levels:
            child, parent = self._buf(f"edge_child_{d}"), self._buf(f"edge_parent_{d}")
            src = out.index_select(dim, child)
            out = out.scatter_reduce(dim, _expand_index(parent, src, dim), src, reduce="amax", include_self=True)
        return out

    @torch.no_grad()
    def descendant_argmax(self, values: torch.Tensor) -> torch.Tensor:
        """Id of a descendant-or-self attaining :meth:`descendant_max`, ``[B, N, *rest]`` (trees only).

        Ties go to the node itself, then to the smallest id among the children's winners.
        """
        self._need_tree()
        # Node-major layout: gathering whole rows is much faster than gathering columns on CPU.
        v = values.transpose(0, 1).contiguous()  # [N, B, *rest]

        def rows(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            return index.view(-1, *([1] * (like.dim() - 1))).expand(index.numel(), *like.shape[1:])

        out_idx: list[torch.Tensor] = [v.new_empty(0, dtype=torch.long)] * (self.height + 1)
        below_val = below_idx = None
        for d in range(self.height, -1, -1):
            nodes = self._buf(f"nodes_{d}")
            own_val = v.index_select(0, nodes)
            own_idx = rows(nodes, own_val)
            n_leaf = self.level_num_leaves[d]
            n_internal = self.level_sizes[d] - n_leaf
            if n_internal:
                group = rows(self._buf(f"pgroup_{d + 1}"), below_val)
                shape = (n_internal, *below_val.shape[1:])
                agg_val = below_val.new_full(shape, -math.inf).scatter_reduce(0, group, below_val, reduce="amax")
                cand = torch.where(below_val == agg_val.gather(0, group), below_idx, self.num_nodes)
                agg_idx = cand.new_full(shape, self.num_nodes).scatter_reduce(0, group, cand, reduce="amin")
                iv, ii = own_val[n_leaf:], own_idx[n_leaf:]
                take_own = iv >= agg_val
                own_val = torch.cat([own_val[:n_leaf], torch.where(take_own, iv, agg_val)], dim=0)
                own_idx = torch.cat([own_idx[:n_leaf], torch.where(take_own, ii, agg_idx)], dim=0)
            below_val, below_idx = own_val, own_idx
            out_idx[d] = own_idx
        return torch.cat(out_idx, dim=0).index_select(0, self._buf("assemble_index")).transpose(0, 1)

    def _tree_descendant_max(self, values: torch.Tensor) -> torch.Tensor:
        # The argmax is found without autograd; gathering it keeps the (sub)gradient of the max, cheaply.
        return values.gather(1, self.descendant_argmax(values))


def tree_ops(taxonomy: Taxonomy, device: torch.device | str | None = None) -> TreeOps:
    """The :class:`TreeOps` of ``taxonomy`` on ``device`` (default CPU), built once and cached on the taxonomy.

    For callers without a module of their own to hold the buffers (functions, decoders, ``Taxonomy.marginals``);
    a head or loss holds its own ``TreeOps`` so that ``.to(device)`` moves it.
    """
    dev = torch.device("cpu" if device is None else device)
    cache = taxonomy.namespace_cache(__name__)
    if dev not in cache:
        cache[dev] = TreeOps(taxonomy).to(dev)
    return cache[dev]


def leaf_marginals(taxonomy: Taxonomy, leaf_probs: Any) -> Any:
    """:meth:`TreeOps.marginals` of ``[..., num_leaves]`` leaf probabilities: torch in, torch out on the same device
    (float32; float64 stays float64, also under fp16/bf16 autocast; differentiable); NumPy in goes to
    :meth:`Taxonomy.marginals`, the NumPy form of the same sums.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> leaf_marginals(tax, torch.tensor([0.5, 0.25, 0.25])).tolist()
        [1.0, 0.75, 0.5, 0.25, 0.25]
    """
    if not isinstance(leaf_probs, torch.Tensor):
        return taxonomy.marginals(leaf_probs)
    x = leaf_probs.to(torch.float64 if leaf_probs.dtype == torch.float64 else torch.float32)
    if x.dim() < 1 or x.shape[-1] != taxonomy.num_leaves:
        raise ValueError(
            f"leaf_probs must have shape [..., {taxonomy.num_leaves}] (one entry per leaf of taxonomy "
            f"{taxonomy.name!r}, in taxonomy.leaves order); got {list(x.shape)}"
        )
    lead, ops = x.shape[:-1], tree_ops(taxonomy, x.device)
    return ops.marginals(x.reshape(-1, taxonomy.num_leaves)).reshape(*lead, taxonomy.num_nodes)


def node_probs_from_leaves(taxonomy: Taxonomy, leaf_probs: torch.Tensor) -> torch.Tensor:
    """:meth:`TreeOps.node_probs` (the heads' node-probability contract) of leaf probabilities ``[B, num_leaves]``.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> node_probs_from_leaves(tax, torch.tensor([[0.5, 0.25, 0.25]])).tolist()
        [[1.0, 0.75, 0.5, 0.25, 0.25]]
    """
    return tree_ops(taxonomy, leaf_probs.device).node_probs(leaf_probs)


def leaf_ranges(taxonomy: Taxonomy) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` per node of a tree: the leaves below node ``n`` are leaf positions ``lo[n] <= i < hi[n]``.

    Subtrees are contiguous id ranges (DFS pre-order) and ``taxonomy.leaves`` is sorted by id, so each node's
    leaves are one contiguous block of leaf positions.

    Example:
        >>> lo, hi = leaf_ranges(Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")]))
        >>> lo.tolist(), hi.tolist()
        ([0, 0, 0, 1, 2], [3, 2, 1, 2, 3])
    """
    require_tree(taxonomy, "leaf_ranges")
    ids = np.arange(taxonomy.num_nodes)
    lo = np.searchsorted(taxonomy.leaves, ids)
    hi = np.searchsorted(taxonomy.leaves, ids + taxonomy.subtree_size)
    return lo.astype(np.int64), hi.astype(np.int64)

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
import warnings
import weakref
from typing import Any

import numpy as np
import torch
from torch import nn

from hiercls.taxonomy.core import Taxonomy, TaxonomyError

__all__ = [
    "ChainedSoftmax",
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


def _take_columns(x: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[:, index]`` for a 2-D ``x``, written into ``out`` when given.

    A gather with the index broadcast over the rows: on CPU it took 0.55-0.95x the time of
    ``index_select(1, index)`` on ``[256, 10K]`` float32 (the gathers of :class:`ChainedSoftmax`'s fast
    path), and it writes into a strided slice of a larger buffer without a copy.
    """
    return torch.gather(x, 1, _expand_index(index, x), out=out)


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


#: ChainedSoftmax -> ((device, data pointer of its index pairs), CSR matrix); outside the module, so that copying
#: or broadcasting the module never meets a sparse tensor.
_CSR_CACHE: weakref.WeakKeyDictionary[Any, tuple[Any, torch.Tensor]] = weakref.WeakKeyDictionary()

_LOG2E = 1.0 / math.log(2.0)
#: ChainedSoftmax -> {(device, dtype, lead, group pointer): [lead + M, G] CSC 0/1 group matrix}.
_SUMS_CACHE: weakref.WeakKeyDictionary[Any, dict[Any, torch.Tensor]] = weakref.WeakKeyDictionary()

#: ChainedSoftmax's fast path: an exponential overflowed without a shift.
_OVERFLOW = object()
#: ... and a group sum underflowed below the shared shift.
_UNDERFLOW = object()


def _sparse_csr(
    pairs: torch.Tensor, shape: tuple[int, int], csc: bool = False, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A 0/1 CSR (or CSC) matrix with ones at the ``(row, col)`` columns of ``pairs [2, nnz]``, on ``pairs``'
    device."""
    ones = torch.ones(pairs.shape[1], device=pairs.device, dtype=dtype)
    coo = torch.sparse_coo_tensor(pairs, ones, shape, check_invariants=True).coalesce()
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is stable
        warnings.simplefilter("ignore", UserWarning)
        return coo.to_sparse_csc() if csc else coo.to_sparse_csr()


def _times_sparse(x: torch.Tensor, m_t: torch.Tensor) -> torch.Tensor:
    """``x @ m`` for dense ``x [B, K]``, given ``m_t = m.T`` as CSR ``[J, K]`` (sparse-times-dense is the
    product every backend has, and it needs no per-call conversion of the matrix)."""
    with torch.autocast(x.device.type, enabled=False):  # autocast would run the product in half precision
        return torch.sparse.mm(m_t.to(x.dtype), x.t()).t()


class _KernelTables:
    """The index tables of :func:`hiercls.taxonomy._ops_kernels.chained_probs_rows` for one ChainedSoftmax.

    Built with the module (NumPy arrays, CPU only: the kernel runs for CPU logits). Groups are listed by size
    class (all groups of one size together, each group's members in output order), so that the kernel's inner
    loops have one trip count per class. Indices are ``uint16`` where every input and group index fits (half the
    bytes of the index streams), else ``uint32``.

    Args:
        group: ``[M]`` group of each output; gparent: ``[G]`` parent group (``-1`` for a top group);
        parent: ``[G]`` conditioning output (any where ``gparent`` is ``-1``); order: ``[M]`` logit read by each
        output; num_inputs: the number of logits. Groups are numbered top-down (``gparent[g] < g``).
    """

    def __init__(
        self, group: np.ndarray, gparent: np.ndarray, parent: np.ndarray, order: np.ndarray, num_inputs: int
    ) -> None:
        num_groups = len(gparent)
        counts = np.bincount(group, minlength=num_groups)
        by_group = np.argsort(group, kind="stable")
        ptr = np.concatenate([[0], np.cumsum(counts)])
        sizes, members, member_group, off, goff = [], [], [], 0, 0
        for size in np.unique(counts):
            groups = np.flatnonzero(counts == size)
            outputs = by_group[(ptr[groups][:, None] + np.arange(size)).reshape(-1)]
            members.append(order[outputs])
            member_group.append(groups)
            sizes.append((size, len(groups), off, goff))
            off, goff = off + size * len(groups), goff + len(groups)
        small = max(num_inputs, num_groups) <= np.iinfo(np.uint16).max + 1
        index = np.uint16 if small else np.uint32

        def idx(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a, dtype=index)

        self.sizes = np.ascontiguousarray(np.array(sizes, dtype=np.int64).reshape(-1, 4))
        self.members, self.member_group = idx(np.concatenate(members)), idx(np.concatenate(member_group))
        # Top groups read nothing from these two (their index 0 is a placeholder).
        top = gparent < 0
        self.pin, self.gparent = idx(np.where(top, 0, order[np.maximum(parent, 0)])), idx(np.maximum(gparent, 0))
        self.src, self.group = idx(order), idx(group)


class ChainedSoftmax(nn.Module):
    """Probabilities of nested softmaxes: one softmax per sibling group, chained down a tree of groups.

    Output ``i`` belongs to sibling group ``group[i]``; group ``j``'s softmax is conditioned on output
    ``parent[j]`` (``-1``: on nothing, probability 1), so ``P(i) = P(parent[group[i]]) * softmax_j(z)[i]``.
    The semantic softmax (groups = classes sharing a nearest class ancestor) and the conditional softmax
    (groups = the children, and stop outcome, of each internal node) are both of this form. Output ``i`` reads
    logit ``input_order[i]`` (default: logit ``i``), so the outputs can come out in another order (node ids) at
    the cost of one gather. Groups are renumbered top-down at construction (by depth in the tree of groups, ties
    in the given order), so :attr:`group` and :attr:`parent` hold the new numbers.

    :meth:`log_probs` takes one segmented log-softmax over all groups and one sparse ancestor product over the
    tree of *groups* in log space: ``log P(i) = z_i + A[group[i]]`` where ``A[j]`` sums
    ``z[parent[a]] - logsumexp_a(z)`` over the ancestors-or-self ``a`` of group ``j``; it shifts each group by its
    own maximum (exact for any logits).

    :meth:`probs` is the fast path. Without autograd on the CPU it runs a compiled kernel (numba, see
    :meth:`_kernel_probs`): torch's ``exp`` of a block of 16 rows into a buffer that stays in the CPU cache, then
    the group sums, the scales down the tree of groups and the output from it in one call, so that the logits are
    read once and the output is written once (about 2.4x a flat ``torch.softmax`` on the 10,450 outputs of
    ImageNet-21K at batch 256, single thread, where the torch formulation below took 6-7x); rows whose group sums
    leave ``[_TINY, _HUGE]`` are recomputed by the torch formulation, row by row. That formulation (autograd, CUDA)
    writes ``2^(z log2 e)`` into the output buffer without autograd (one pass; exp2 is the faster kernel on CPU),
    takes the group sums (on CPU a dense-times-sparse product with the 0/1 group matrix, elsewhere
    ``index_add_``), runs the ancestor products on ``[B, num_groups]`` in probability space (``c[j] = P(parent of
    j) / sum_j``, one small gather per depth of the tree of groups, the product before the division so that no
    factor overflows), and multiplies the output buffer in place by one gather of ``c``. So the passes over
    ``[B, M]`` are: the scaling (or the one reordering gather when ``input_order`` is given), the exponential, the
    sums and the scale; no loop over nodes or levels touches ``[B, M]``. With autograd, or when the tree of groups
    is deeper than ``_MAX_LEVELS``, the same formula runs out of place in log space (the ancestor sums as one
    sparse product in the deep case). The logits are not shifted unless some group's sum exceeds ``_HUGE``
    (logits above about 60; then each row is shifted by its maximum and recomputed), so the rounding error is a
    few ulps of the largest logit (``max|z| * 2^-23`` relative), the precision float32 logits carry anyway; a
    batch where some group's sum underflows (all of a group more than about 70 below the shift) is recomputed
    through :meth:`log_probs`. The over/underflow check reads one pair of booleans back from the device.

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
        >>> cs.probs(torch.tensor([[math.log(3), 0.0, 0.0, math.log(4)]]), outputs=2, lead=1).tolist()  # a, b
        [[1.0, 0.75, 0.25]]
    """

    #: Group sums below this (the shared shift left too little mass) trigger the exact per-group path.
    _TINY = 1e-30
    #: Unshifted group sums above this (logits above about 60) are recomputed with each row shifted by its
    #: maximum, so that a scale ``P(parent) / sum`` never falls far below ``P(parent)`` into the subnormals.
    _HUGE = 1e28
    #: Deeper trees of groups take the sparse ancestor product (out of place) instead of one step per depth.
    _MAX_LEVELS = 64
    #: Devices where :meth:`probs` takes the group sums as a sparse product (see :meth:`_group_sums`).
    _SPARSE_SUM_DEVICES: tuple[str, ...] = ("cpu",)
    #: Devices where :meth:`probs` without autograd runs the compiled kernel (see :meth:`_kernel_probs`).
    _KERNEL_DEVICES: tuple[str, ...] = ("cpu",)
    #: Rows per block of :meth:`_kernel_probs`: their exponentials (``rows * num_inputs`` values) stay in the
    #: CPU cache between torch's exp and the kernel.
    _KERNEL_ROWS = 16

    def __init__(self, group: np.ndarray, parent: np.ndarray, input_order: np.ndarray | None = None) -> None:
        super().__init__()
        group, parent = np.asarray(group, dtype=np.int64), np.asarray(parent, dtype=np.int64)
        self.num_outputs, self.num_groups = len(group), len(parent)
        if group.ndim != 1 or parent.ndim != 1 or (group < 0).any() or (group >= len(parent)).any():
            raise ValueError(f"group must be [M] ids in 0..{len(parent) - 1}; got {group!r}")
        if np.bincount(group, minlength=len(parent)).min(initial=1) == 0:
            raise ValueError("every group needs at least one output")
        if ((parent < -1) | (parent >= len(group))).any():
            raise ValueError(f"parent must be output indices in 0..{len(group) - 1} or -1; got {parent!r}")
        if input_order is None:
            self.num_inputs = len(group)
        else:
            input_order = np.asarray(input_order, dtype=np.int64)
            if input_order.shape != group.shape or (input_order < 0).any():
                raise ValueError(f"input_order must be [{len(group)}] logit indices; got shape {input_order.shape}")
            self.num_inputs = int(input_order.max()) + 1
            self.register_buffer("input_order", as_tensor(input_order), persistent=False)
        # The tree of groups: group j hangs below the group of its conditioning output.
        gparent = np.where(parent >= 0, group[np.maximum(parent, 0)], -1)
        rows, cur = [], np.arange(len(parent))
        for _ in range(len(parent) + 1):  # pointer chasing: one step per depth of the group tree
            live = cur >= 0
            if not live.any():
                break
            rows.append(np.flatnonzero(live))
            cur = np.where(live, gparent[np.maximum(cur, 0)], -1)
        else:
            raise ValueError("parent: the groups form a cycle")
        # Renumber the groups top-down, so that each depth is a contiguous block whose parents come before it.
        gdepth = np.bincount(np.concatenate(rows), minlength=len(parent)) - 1
        order = np.argsort(gdepth, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        group, parent, gparent, gdepth = rank[group], parent[order], gparent[order], gdepth[order]
        gparent = np.where(gparent >= 0, rank[np.maximum(gparent, 0)], -1)
        anc_rows, anc_cols, cur = [], [], np.arange(len(parent))
        while (cur >= 0).any():
            live = np.flatnonzero(cur >= 0)
            anc_rows.append(live)
            anc_cols.append(cur[live])
            cur = np.where(cur >= 0, gparent[np.maximum(cur, 0)], -1)
        self.register_buffer("group", as_tensor(group), persistent=False)
        self.register_buffer("parent", as_tensor(np.maximum(parent, 0)), persistent=False)
        self.register_buffer("has_parent", torch.from_numpy(parent >= 0), persistent=False)
        if input_order is not None:  # the logit of each group's parent output
            self.register_buffer("parent_input", as_tensor(input_order[np.maximum(parent, 0)]), persistent=False)
        # [G, G] with entry (j, a) = 1 when a is an ancestor-or-self of j (the transpose of the summing matrix),
        # kept as dense index pairs: sparse buffers break copy.deepcopy (EMA, teachers) and DDP's broadcast.
        pairs = np.vstack([np.concatenate(anc_rows), np.concatenate(anc_cols)])
        self.register_buffer("ancestor_pairs", torch.from_numpy(pairs), persistent=False)
        # Depth blocks [lo, hi) of the renumbered groups; block d >= 1 reads its parents' groups from lower blocks.
        bounds = np.searchsorted(gdepth, np.arange(int(gdepth.max(initial=0)) + 2))
        self.num_top_groups = int(bounds[1])
        self._levels: list[tuple[int, int]] = []
        if len(bounds) - 2 <= self._MAX_LEVELS:
            for d in range(1, len(bounds) - 1):
                lo, hi = int(bounds[d]), int(bounds[d + 1])
                self.register_buffer(f"level_parent_{d}", as_tensor(gparent[lo:hi]), persistent=False)
                self._levels.append((lo, hi))
        reads = np.arange(len(group)) if input_order is None else input_order
        self._kernel_tables = _KernelTables(group, gparent, parent, reads, self.num_inputs)

    @property
    def ancestor_sum_t(self) -> torch.Tensor:
        """The ``[G, G]`` CSR matrix of :attr:`ancestor_pairs`, built once per device and cached."""
        pairs = self.ancestor_pairs
        key = (pairs.device, pairs.data_ptr())
        cached = _CSR_CACHE.get(self)
        if cached is None or cached[0] != key:
            n = self.num_groups
            cached = (key, _sparse_csr(pairs, (n, n)))
            _CSR_CACHE[self] = cached
        return cached[1]

    def _inputs_unordered(self, logits: torch.Tensor) -> torch.Tensor:
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != self.num_inputs:
            shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(f"logits must have shape [B, {self.num_inputs}]; got {shape}")
        return logits if logits.dtype == torch.float64 else logits.float()

    def _inputs(self, logits: torch.Tensor) -> torch.Tensor:
        z = self._inputs_unordered(logits)
        order = self._buffers.get("input_order")
        return z if order is None else z.index_select(1, order)

    def _offsets(self, z: torch.Tensor, log_sums: torch.Tensor) -> torch.Tensor:
        # A[j] = sum over ancestors-or-self a of j of (z[parent[a]] - logsumexp_a), one sparse product.
        zq = torch.where(self.has_parent, z.index_select(1, self.parent), torch.zeros((), dtype=z.dtype))
        return _times_sparse(zq - log_sums, self.ancestor_sum_t)

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``log P(i)`` for every output, ``[B, M]`` (float32; float64 stays float64). Differentiable."""
        z = self._inputs(logits)
        lse = segment_logsumexp(z, self.group, self.num_groups, dim=1)
        return z + self._offsets(z, lse).index_select(1, self.group)

    def probs(self, logits: torch.Tensor, *, outputs: int | None = None, lead: int = 0) -> torch.Tensor:
        """``P(i)`` for every output, ``[B, M]`` (float32; float64 stays float64). Differentiable.

        Args:
            logits: ``[B, num_inputs]``.
            outputs: return only outputs ``0 .. outputs - 1`` (all of them still enter the group sums).
            lead: that many columns of ones before the outputs (a root of probability 1): ``[B, lead + outputs]``.
        """
        k = self.num_outputs if outputs is None else int(outputs)
        if not 0 <= k <= self.num_outputs or lead < 0:
            raise ValueError(f"outputs must be in 0..{self.num_outputs} and lead >= 0; got {outputs}, {lead}")
        grad = torch.is_grad_enabled() and isinstance(logits, torch.Tensor) and logits.requires_grad
        if not grad and isinstance(logits, torch.Tensor) and logits.device.type in self._KERNEL_DEVICES:
            return self._kernel_probs(self._inputs_unordered(logits), k, lead)
        return self._torch_probs(logits, k, lead, grad)

    def _torch_probs(self, logits: torch.Tensor, k: int, lead: int, grad: bool) -> torch.Tensor:
        """:meth:`probs` in torch ops (autograd, devices other than the CPU, rows the kernel flags)."""
        # Without autograd and on a shallow tree of groups, the in-place path; else the out-of-place one.
        fast = self._fast_probs_no_grad if self._levels and not grad else self._fast_probs
        p = fast(logits, k, lead, shift=False)
        if p is _OVERFLOW:  # some exponential overflowed: shift each row by its maximum
            p = fast(logits, k, lead, shift=True)
        if isinstance(p, torch.Tensor):
            return p
        # Some group's mass underflowed below the shared shift: the exact per-group path.
        p = self.log_probs(logits).exp()[:, :k]
        return torch.cat([p.new_ones(p.shape[0], lead), p], dim=1) if lead else p

    def _kernel_probs(self, z: torch.Tensor, k: int, lead: int) -> torch.Tensor:
        """:meth:`probs` without autograd on the CPU: torch's exp and the compiled kernel, a block of rows at a time.

        For each block of :attr:`_KERNEL_ROWS` rows, ``exp(z)`` goes into a buffer that stays in the CPU cache and
        :func:`~hiercls.taxonomy._ops_kernels.chained_probs_rows` takes the group sums, the scales down the tree of
        groups and the output from it, so that the logits are read once and the output written once. The logits
        are not shifted; rows where some group's sum leaves ``[_TINY, _HUGE]`` (the kernel flags them) are
        recomputed by the torch path, which shifts them or takes the exact per-group path.
        """
        from hiercls.taxonomy._ops_kernels import chained_probs_rows

        tables = self._kernel_tables
        b = z.shape[0]
        # The kernel's memory is NumPy's (tensors over it via from_numpy): no torch tensor is viewed as an array.
        dtype = np.float64 if z.dtype == torch.float64 else np.float32
        out_np = np.empty((b, lead + k), dtype=dtype)
        out = torch.from_numpy(out_np)
        if lead:
            out_np[:, :lead] = 1.0
        if b == 0 or k == 0:
            return out
        rows = min(self._KERNEL_ROWS, b)
        buf_np = np.empty((rows, self.num_inputs), dtype=dtype)
        buf = torch.from_numpy(buf_np)
        scratch = np.empty((2, self.num_groups, 4), dtype=dtype)
        status = np.zeros(b, dtype=np.int64)
        limits = dtype(self._TINY), dtype(self._HUGE)
        src, group = tables.src[:k], tables.group[:k]
        flagged = 0
        for r0 in range(0, b, rows):
            n = min(rows, b - r0)
            torch.exp(z[r0 : r0 + n], out=buf[:n])
            flagged += chained_probs_rows(
                buf_np[:n], out_np, r0, lead, *limits, tables.sizes, tables.members, tables.member_group,
                tables.pin, tables.gparent, self.num_top_groups, src, group, scratch[0], scratch[1], status,
            )  # fmt: skip
        if flagged:
            bad = torch.from_numpy(np.flatnonzero(status))
            out[bad] = self._torch_probs(z[bad], k, lead, grad=False)
        return out

    def _check_sums(self, sums: torch.Tensor, shift: bool) -> object:
        """``None`` when the group sums fit, else ``_OVERFLOW`` (retry shifted) or ``_UNDERFLOW`` (exact path)."""
        lo, hi = torch.aminmax(sums.detach())
        underflow, overflow = torch.stack([lo < self._TINY, hi > self._HUGE]).tolist()  # one read-back
        if overflow and not shift:
            return _OVERFLOW
        return _UNDERFLOW if underflow or overflow else None

    def _log2_scales(self, zq: torch.Tensor, sums: torch.Tensor, s: torch.Tensor | None, grad: bool) -> torch.Tensor:
        """``[B, G]``: log2 of P(parent of j) / (sum of group j), in the units of the shifted exponentials.

        ``zq`` (the parent logits, ours to overwrite) and ``sums`` are consumed.
        """
        log_sums = sums.log2() if grad else sums.log2_()
        if s is not None:  # the sums of the true exponentials
            log_sums = log_sums + s * _LOG2E
        zq[:, : self.num_top_groups] = 0.0  # top groups hang below nothing: log2 P = 0
        c = zq * _LOG2E - log_sums if grad else zq.mul_(_LOG2E).sub_(log_sums)
        if self._levels:  # a shallow tree of groups: add the parents' sums depth by depth, top-down
            for d, (lo, hi) in enumerate(self._levels, 1):
                c[:, lo:hi] += c.index_select(1, self._buffers[f"level_parent_{d}"])
        else:
            c = _times_sparse(c, self.ancestor_sum_t)
        if s is not None:  # back to the units of the shifted exponentials
            c = c + s * _LOG2E if grad else c.add_(s * _LOG2E)
        return c

    def _fast_probs(self, logits: torch.Tensor, k: int, lead: int, shift: bool) -> torch.Tensor | object:
        """:meth:`probs` for autograd (out of place); ``_OVERFLOW`` / ``_UNDERFLOW`` when the shared shift does
        not fit."""
        z = self._inputs(logits)
        b, g = z.shape[0], self.num_groups
        if b == 0:
            return z.new_zeros(0, lead + k)
        zq = z.index_select(1, self.parent)
        s = z.detach().amax(1, keepdim=True) if shift else None
        e = torch.exp2((z if s is None else z - s) * _LOG2E)
        sums = e.new_zeros(b, g).index_add_(1, self.group, e)
        bad = self._check_sums(sums, shift)
        if bad is not None:
            return bad
        r = torch.exp2(self._log2_scales(zq, sums, s, grad=True))
        p = r.index_select(1, self.group[:k]) * e[:, :k]
        return torch.cat([p.new_ones(b, lead), p], dim=1) if lead else p

    def _fast_probs_no_grad(self, logits: torch.Tensor, k: int, lead: int, shift: bool) -> torch.Tensor | object:
        """:meth:`probs` without autograd: the exponentials live in the output buffer, every pass over
        ``[B, M]`` but the scale gather is in place, and the ancestor products run in probability space."""
        z = self._inputs_unordered(logits)
        b, m = z.shape[0], self.num_outputs
        order = self._buffers.get("input_order")
        out = z.new_empty(b, lead + m)
        if order is None:
            torch.mul(z, _LOG2E, out=out[:, lead:])
        else:  # the one reordering gather, into the output buffer
            _take_columns(z, order, out=out[:, lead:]).mul_(_LOG2E)
        if b == 0:
            return out[:, : lead + k]
        e = out[:, lead:]
        if shift:  # exp(z) as 2^(z log2 e): exp2 is the faster kernel on CPU
            e.sub_(e.amax(1, keepdim=True))
        e.exp2_()
        sums = self._group_sums(out, lead)
        bad = self._check_sums(sums, shift)
        if bad is not None:
            return bad
        # c[j] = P(parent of j) / (sum of group j) in the units of e: top groups 1 / sum, below them
        # (e of the parent * c of the parent's group) / sum, the product first so that no factor overflows.
        c = _take_columns(out, self._parent_lead(lead))
        top = self.num_top_groups
        torch.reciprocal(sums[:, :top], out=c[:, :top])
        for d, (lo, hi) in enumerate(self._levels, 1):
            c[:, lo:hi].mul_(_take_columns(c, self._buffers[f"level_parent_{d}"])).div_(sums[:, lo:hi])
        # P = scale of the group * exponential.
        e[:, :k].mul_(_take_columns(c, self.group[:k]))
        if lead:
            out[:, :lead] = 1.0
        return out if k == m else out[:, : lead + k].contiguous()

    def _group_sums(self, x: torch.Tensor, lead: int) -> torch.Tensor:
        """``[B, G]`` sums of ``x[:, lead:]`` over each group (the lead columns are never read).

        On CPU a product with a sparse 0/1 matrix (dense-times-sparse runs on the rows of ``x`` as they lie,
        about 1.5x faster than ``index_add_`` along dim 1); elsewhere ``index_add_``.
        """
        if x.device.type not in self._SPARSE_SUM_DEVICES:
            return x.new_zeros(x.shape[0], self.num_groups).index_add_(1, self.group, x[:, lead:])
        key = (x.device, x.dtype, lead, self.group.data_ptr())
        cache = _SUMS_CACHE.setdefault(self, {})
        mat = cache.get(key)
        if mat is None:
            pairs = torch.stack([torch.arange(self.num_outputs, device=x.device) + lead, self.group])
            shape = (lead + self.num_outputs, self.num_groups)
            mat = cache[key] = _sparse_csr(pairs, shape, csc=True, dtype=x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            return x @ mat

    def _parent_lead(self, lead: int) -> torch.Tensor:
        return self.parent if not lead else self.parent + lead


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
    """:meth:`TreeOps.marginals` of ``[..., num_leaves]`` leaf probabilities: numpy in, numpy out; torch in,
    torch out on the same device.

    Torch results are float32 (float64 input stays float64), even under fp16/bf16 autocast; numpy results have
    ``np.result_type(leaf_probs, np.float32)``.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> leaf_marginals(tax, np.array([0.5, 0.2, 0.3])).round(3).tolist()
        [1.0, 0.7, 0.5, 0.2, 0.3]
    """
    is_torch = isinstance(leaf_probs, torch.Tensor)
    if is_torch:
        x = leaf_probs.to(torch.float64 if leaf_probs.dtype == torch.float64 else torch.float32)
    else:
        arr = np.asarray(leaf_probs)
        out_dtype = np.result_type(arr, np.float32)
        work = np.float32 if out_dtype == np.float32 else np.float64
        x = torch.from_numpy(np.ascontiguousarray(arr, dtype=work))
    if x.dim() < 1 or x.shape[-1] != taxonomy.num_leaves:
        raise ValueError(
            f"leaf_probs must have shape [..., {taxonomy.num_leaves}] (one entry per leaf of taxonomy "
            f"{taxonomy.name!r}, in taxonomy.leaves order); got {list(x.shape)}"
        )
    lead, ops = x.shape[:-1], tree_ops(taxonomy, x.device)
    if is_torch:
        return ops.marginals(x.reshape(-1, taxonomy.num_leaves)).reshape(*lead, taxonomy.num_nodes)
    # NumPy: a transposed (Fortran-order) view of the node-major result saves a copy as large as the output.
    out = ops._marginals_node_major(x.reshape(-1, taxonomy.num_leaves)).numpy().T
    return out.reshape(*lead, taxonomy.num_nodes).astype(out_dtype, copy=False)


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

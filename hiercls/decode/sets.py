"""Set decoders for multi-label (label-set) probabilities: a threshold per node, and C-HMCNN's coherent decoding.

In multi-label hierarchical classification (a text with the labels ``CCAT/C15`` and ``ECAT/E11``) the answer is a
set of nodes, not one node. Both rules return boolean node sets ``[B, N]`` that contain the root.

* :func:`threshold_set` keeps every node whose probability exceeds ``threshold`` (the usual HTC decoding of
  per-node sigmoids). On probabilities that respect the hierarchy (a parent at least as likely as each
  child, as every hiercls head gives) the set is ancestor-closed; on raw per-node scores (a probability file
  from another model) it may not be.
* :func:`chmcnn` is C-HMCNN's coherent decoding (Giunchiglia & Lukasiewicz, NeurIPS 2020): the max-constraint
  ``P'(n) = max(P(d) for d descendant-or-self of n)`` then the threshold. Since ``P'(n) > t`` exactly when some
  descendant-or-self of ``n`` exceeds ``t``, the set is the ancestor closure of :func:`threshold_set`'s: always
  coherent, and equal to it on hierarchy-consistent probabilities (the ``multilabel`` head's
  :meth:`~hiercls.heads.MultiLabelHead.node_probs` are already the max-constraint output).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from hiercls.decode._common import (
    chunked,
    prefix_sums_t,
    prepare,
    prepare_torch,
    restore_sets,
    subtree_ends,
    subtree_ends_tensor,
    torch_kernels,
)
from hiercls.decode._rows import kernel_rows
from hiercls.taxonomy import Taxonomy

__all__ = ["chmcnn", "threshold_set"]


def _unit(value: float, name: str) -> float:
    v = float(value)
    if not np.isfinite(v) or v < 0 or v > 1:
        raise ValueError(f"{name} must be a probability in [0, 1]; got {value!r}")
    return v


def _above_torch(probs: Any, taxonomy: Taxonomy, threshold: float, leaf_probs: bool) -> Any:
    """``_above`` on the tensor's device: boolean ``[B, N]``, the root always in."""
    x = prepare_torch(probs, taxonomy, leaf_probs=leaf_probs, scores=True)
    sets = x > threshold
    sets[:, 0] = True
    return sets


def _ancestor_closure(sets: np.ndarray, taxonomy: Taxonomy) -> np.ndarray:
    """Every ancestor of a kept node kept too: ``sets [B, N]`` bool, NumPy.

    On a tree a node is kept when its id range ``[n, end[n])`` (its subtree, ids being the depth-first
    pre-order) holds a kept node, i.e. when the running count of kept nodes grows over that range: one
    cumulative sum and one gather per row, O(N) whatever the depth (a 10,000-deep chain costs what a bushy tree
    of the same size does). On a DAG, ``S @ A > 0`` with the sparse ancestor matrix.
    """
    if not taxonomy.is_tree:
        # Row d of the ancestor matrix lists d's ancestors-or-self: S @ A marks every ancestor of a kept node.
        return (sp.csr_matrix(sets, dtype=np.int32) @ taxonomy.ancestors_sparse.astype(np.int32)).toarray() > 0
    end = subtree_ends(taxonomy)
    if sets.shape[0] > 1 and sets.strides[0] < sets.strides[1]:  # node-major (e.g. a row block of Fortran order)
        counts = prefix_sums_t(sets.T, dtype=np.int32)
        return (counts[end] > counts[:-1]).T
    counts = np.zeros((sets.shape[0], sets.shape[1] + 1), dtype=np.int32)
    np.cumsum(sets, axis=1, dtype=np.int32, out=counts[:, 1:])
    return np.take(counts, end, axis=1) > counts[:, :-1]


def ancestor_closure_torch(sets: Any, taxonomy: Taxonomy) -> Any:
    """:func:`_ancestor_closure` on the tensor's device (trees: the running count; DAGs: a sparse product)."""
    import torch

    if not sets.shape[0]:
        return sets
    if taxonomy.is_tree:
        end = subtree_ends_tensor(taxonomy, sets.device)
        counts = sets.new_zeros(sets.shape[0], sets.shape[1] + 1, dtype=torch.int32)
        torch.cumsum(sets, 1, dtype=torch.int32, out=counts[:, 1:])
        return counts.index_select(1, end) > counts[:, :-1]
    cache = taxonomy.namespace_cache(__name__)
    key = ("ancestors_t", str(sets.device))
    if key not in cache:
        a = taxonomy.ancestors_sparse.tocoo()  # a[d, u] = 1 when u is an ancestor-or-self of d
        idx = torch.as_tensor(np.stack([a.col, a.row]).astype(np.int64), device=sets.device)
        n = taxonomy.num_nodes
        # A^T [u, d]: times S^T [d, B] it counts the kept descendants-or-self of each u (exact in float32).
        cache[key] = torch.sparse_coo_tensor(
            idx, torch.ones(idx.shape[1], device=sets.device), (n, n), check_invariants=False
        ).coalesce()
    at = cache[key]
    return (torch.sparse.mm(at, sets.T.float()) > 0).T.contiguous()


def _above_rows(probs: Any, taxonomy: Taxonomy, threshold: float, leaf_probs: bool, close: bool) -> Any:
    """:func:`_above` (``close``: and its ancestor closure) by the compiled kernel, or ``None`` (see ``_rows``)."""
    rows = kernel_rows(probs, taxonomy, leaf_probs=leaf_probs, scores=True)
    return rows and rows.sets("above_rows", rows.value(_unit(threshold, "threshold")), close)


def _above(probs: Any, taxonomy: Taxonomy, threshold: float, leaf_probs: bool) -> tuple[np.ndarray, Any]:
    t = _unit(threshold, "threshold")
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, exact=False, scores=True)
    sets = batch.node > t
    sets[:, 0] = True  # every set holds the root
    return sets, batch


@chunked
def threshold_set(probs: Any, taxonomy: Taxonomy, *, threshold: float = 0.5, leaf_probs: bool = False) -> Any:
    """The set of nodes whose probability exceeds ``threshold`` (plus the root).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.9, 0.7, 0.2, 0.6]])  # two paths: a/x and b
        >>> threshold_set(p, tax).astype(int).tolist()
        [[1, 1, 1, 0, 1]]
        >>> threshold_set(p, tax, threshold=0.65).astype(int).tolist()
        [[1, 1, 1, 0, 0]]
    """
    if torch_kernels(probs):
        return _above_torch(probs, taxonomy, _unit(threshold, "threshold"), leaf_probs)
    if (sets := _above_rows(probs, taxonomy, threshold, leaf_probs, close=False)) is not None:
        return sets
    sets, batch = _above(probs, taxonomy, threshold, leaf_probs)
    return restore_sets(sets, batch)


@chunked
def chmcnn(probs: Any, taxonomy: Taxonomy, *, threshold: float = 0.5, leaf_probs: bool = False) -> Any:
    """C-HMCNN's coherent decoding: threshold the max-constraint ``max(P(d), d descendant-or-self)``.

    The nodes above ``threshold`` and all their ancestors (every parent on a DAG): a coherent set even when the
    input scores are not (a child above its parent).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> raw = np.array([[1.0, 0.3, 0.7, 0.2, 0.1]])  # incoherent scores: x above its parent a
        >>> threshold_set(raw, tax).astype(int).tolist(), chmcnn(raw, tax).astype(int).tolist()
        ([[1, 0, 1, 0, 0]], [[1, 1, 1, 0, 0]])
    """
    if torch_kernels(probs):
        return ancestor_closure_torch(
            _above_torch(probs, taxonomy, _unit(threshold, "threshold"), leaf_probs), taxonomy
        )
    if (sets := _above_rows(probs, taxonomy, threshold, leaf_probs, close=True)) is not None:
        return sets
    sets, batch = _above(probs, taxonomy, threshold, leaf_probs)
    return restore_sets(_ancestor_closure(sets, taxonomy), batch)

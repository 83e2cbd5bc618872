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

Both are one compiled kernel (numba) per row, on trees and DAGs: the row check (scores: finite and in
``[0, 1]``), the threshold, and for ``chmcnn`` the closure, every edge once with children in decreasing id order
(ids are topological, so a node is final before its parents read it). Tensor input is decoded on the host and the
sets go back to its device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hiercls.decode.checks import NO_EDGES, check_row, edges, jit
from hiercls.decode.inputs import prepare, restore_sets
from hiercls.decode.registry import register_decoder
from hiercls.taxonomy import Taxonomy

__all__ = ["ancestor_closure", "chmcnn", "threshold_set"]


def _unit(value: float, name: str) -> float:
    v = float(value)
    if not np.isfinite(v) or v < 0 or v > 1:
        raise ValueError(f"{name} must be a probability in [0, 1]; got {value!r}")
    return v


@jit
def above_rows(x: Any, mode: int, child: Any, parent: Any, tol: Any, t: float, up_child: Any, up_parent: Any,
               out: Any, err: Any) -> None:  # fmt: skip
    """Per row: ``P > t`` and the root; then every edge ``(up_child[e], up_parent[e])`` (children in decreasing id
    order; none for :func:`threshold_set`) passes a kept child on to its parent."""
    for b in range(x.shape[0]):
        row = x[b]
        code, pos = check_row(row, mode, child, parent, tol)
        if code:
            err[0], err[1], err[2] = b, code, pos
            return
        keep = out[b]
        for j in range(row.shape[0]):
            keep[j] = np.float64(row[j]) > t
        keep[0] = True
        close_row(keep, up_child, up_parent)


@jit
def close_row(keep: Any, up_child: Any, up_parent: Any) -> None:
    """Add to the boolean node set ``keep`` every ancestor of its nodes, in place: every edge once, children in
    decreasing id order (``up_child``, ``up_parent``), so each node is final before its parents read it."""
    for e in range(up_child.shape[0]):
        if keep[up_child[e]]:
            keep[up_parent[e]] = True


@jit
def close_rows(sets: Any, up_child: Any, up_parent: Any) -> None:
    """:func:`close_row` on every row of ``sets [B, N]``."""
    for b in range(sets.shape[0]):
        close_row(sets[b], up_child, up_parent)


def ancestor_closure(sets: Any, taxonomy: Taxonomy) -> Any:
    """Boolean node sets ``[B, N]`` (NumPy or torch) with every ancestor of their nodes added (every parent on a
    DAG), in the input's framework and device; computed on the host by the kernel of :func:`chmcnn`.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> ancestor_closure(np.array([[False, False, False, True, False], [False] * 5]), tax).astype(int).tolist()
        [[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]]
    """
    device = sets.device if isinstance(sets, torch.Tensor) else None
    host = sets.detach().cpu().numpy() if device is not None else np.asarray(sets)
    out = np.array(host, dtype=bool, order="C", ndmin=2)
    close_rows(out, *_closure_edges(taxonomy))
    return torch.from_numpy(out).to(device) if device is not None else out


def _closure_edges(taxonomy: Taxonomy) -> tuple[np.ndarray, np.ndarray]:
    cache = taxonomy.namespace_cache(__name__)
    if "up" not in cache:
        child, parent = edges(taxonomy)
        order = np.argsort(-child.astype(np.int64), kind="stable")
        cache["up"] = (np.ascontiguousarray(child[order]), np.ascontiguousarray(parent[order]))
    return cache["up"]


def _above(probs: Any, taxonomy: Taxonomy, threshold: float, leaf_probs: bool, close: bool) -> Any:
    t = _unit(threshold, "threshold")
    batch = prepare(probs, taxonomy, leaf_probs=leaf_probs, scores=True, check=False)
    up = _closure_edges(batch.taxonomy) if close else (NO_EDGES, NO_EDGES)
    out = np.zeros(batch.x.shape, dtype=bool)
    err = np.zeros(3, dtype=np.int64)
    if out.size:
        above_rows(batch.x, *batch.check_args(scores=True), t, *up, out, err)
    batch.raise_if(err, scores=True)
    return restore_sets(out, batch)


@register_decoder("threshold_set", returns="set", multilabel=True, optimal_for="a threshold per node (multi-label)")
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
    return _above(probs, taxonomy, threshold, leaf_probs, close=False)


@register_decoder("chmcnn", returns="set", multilabel=True, optimal_for="coherent multi-label sets (C-HMCNN)")
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
    return _above(probs, taxonomy, threshold, leaf_probs, close=True)

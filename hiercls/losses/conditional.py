"""Conditional (per-parent) softmax, a.k.a. hierarchical softmax, and Huffman trees for flat label sets.

Layout: logit ``n - 1`` belongs to node ``n`` (every node but the root); with ``stop=True`` one more logit per
internal node (in id order) scores "the label stops here". Each internal node has one softmax over its children
(and its stop logit): ``log P(n | parent(n))``. A node's probability is the product along its root path.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from hiercls.losses.chained_softmax import ChainedSoftmax
from hiercls.losses.validation import check_node_targets, upcast
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.tensors import TreeOps, as_tensor, require_tree

__all__ = ["ConditionalSoftmax", "ConditionalSoftmaxLoss", "huffman_tree"]


class ConditionalSoftmax(nn.Module):
    """Per-parent softmaxes over a tree and their path products (buffers move with ``.to(device)``).

    Args:
        taxonomy: a tree.
        stop: add a "stop at this node" outcome to every internal node's softmax, so that a label may be an
            internal node and ``P(n) = sum of children + P(stop at n)``; without it a parent is exactly the sum of
            its children and an internal label is scored by its path only.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> cs = ConditionalSoftmax(tax)
        >>> cs.node_log_probs(torch.zeros(1, 4)).exp().tolist()  # uniform children at every node
        [[1.0, 0.5, 0.25, 0.25, 0.5]]
    """

    def __init__(self, taxonomy: Taxonomy, stop: bool = False) -> None:
        super().__init__()
        require_tree(taxonomy, "the conditional softmax")
        if taxonomy.num_nodes < 2:
            raise TaxonomyError(f"taxonomy {taxonomy.name!r} has a single node: nothing to classify")
        self.taxonomy, self.stop = taxonomy, bool(stop)
        n = taxonomy.num_nodes
        internal = np.flatnonzero(~taxonomy.is_leaf)
        self.num_internal = len(internal)
        internal_index = np.full(n, -1, dtype=np.int64)
        internal_index[internal] = np.arange(len(internal))
        group = internal_index[taxonomy.parent[1:]]
        if self.stop:
            group = np.concatenate([group, np.arange(len(internal))])
        self.num_outputs = len(group)
        self.register_buffer("internal_index", as_tensor(internal_index), persistent=False)
        self.register_buffer("paths", as_tensor(taxonomy.paths), persistent=False)
        self.ops = TreeOps(taxonomy)
        # The same softmaxes chained in one pass: group k (internal node internal[k]) hangs below its node's
        # logit (node n is logit n - 1; the root's group hangs below nothing).
        self.chained = ChainedSoftmax(group, np.where(internal > 0, internal - 1, -1))

    def check(self, logits: torch.Tensor) -> None:
        if not isinstance(logits, torch.Tensor) or logits.dim() < 2 or logits.shape[1] != self.num_outputs:
            shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(
                f"logits must have shape [B, {self.num_outputs}] (one per non-root node"
                f"{' plus one stop logit per internal node' if self.stop else ''}); got {shape}"
            )

    def _output_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B, num_outputs]``: each logit's log-probability within its parent's softmax."""
        self.check(logits)
        return self.chained.padded_log_softmax(upcast(logits)).index_select(1, self.chained.slot)

    def conditional_log_probs(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(log P(n | parent(n)) [B, N] with 0 at the root, log P(stop | n) [B, num_internal] or None)``."""
        cond = self._output_log_probs(logits)
        node_cond = torch.cat([cond.new_zeros(cond.shape[0], 1), cond[:, : self.taxonomy.num_nodes - 1]], dim=1)
        return node_cond, (cond[:, self.taxonomy.num_nodes - 1 :] if self.stop else None)

    def node_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``log P(n)`` for every node ``[B, N]``: sums of conditional log-probabilities down the root path."""
        self.check(logits)
        return self.chained.log_probs(upcast(logits), outputs=self.taxonomy.num_nodes - 1, lead=1)

    def node_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``P(n)`` for every node ``[B, N]`` (float32; float64 stays float64), in ``[0, 1]``, root 1.

        :meth:`~hiercls.losses.ChainedSoftmax.probs`: ``node_log_probs(...).exp()`` up to rounding.
        """
        self.check(logits)
        # Node n is output n - 1: the nodes are the first N - 1 outputs, after one lead column for the root.
        return self.chained.probs(upcast(logits), outputs=self.taxonomy.num_nodes - 1, lead=1)

    def label_log_likelihood(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``log P(label)`` per sample (targets >= 0); with ``stop`` internal labels include ``log P(stop)``.

        Every group's log-softmax, then only the label's path is read.
        """
        self.check(logits)
        log_q = self.chained.padded_log_softmax(upcast(logits))
        path = self.paths[targets][:, 1:]  # the root contributes nothing; node n is output n - 1
        outs = (path - 1).clamp(min=0)
        if self.stop:
            k = self.internal_index[targets]
            outs = torch.cat([outs, (k.clamp(min=0) + self.taxonomy.num_nodes - 1)[:, None]], 1)
            path = torch.cat([path, k[:, None]], 1)
        terms = log_q.gather(1, self.chained.slot[outs])
        return torch.where(path >= 0, terms, torch.zeros_like(terms)).sum(1)


class ConditionalSoftmaxLoss(nn.Module):
    """Negative log-likelihood of the label under the conditional softmax, averaged over non-ignored samples.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> loss = ConditionalSoftmaxLoss(tax)
        >>> round(loss(torch.zeros(1, 4), torch.tensor([2])).item(), 4)  # -log(1/2 * 1/2)
        1.3863
    """

    def __init__(self, taxonomy: Taxonomy, stop: bool = False) -> None:
        super().__init__()
        self.softmax = ConditionalSoftmax(taxonomy, stop=stop)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = check_node_targets(targets, self.softmax.taxonomy.num_nodes, batch=logits.shape[0])
        valid = t >= 0
        nll = -self.softmax.label_log_likelihood(logits, t.clamp(min=0))
        return (nll * valid).sum() / valid.sum().clamp(min=1)


def huffman_tree(labels: Sequence[str], counts: Sequence[float] | np.ndarray, *, name: str = "huffman") -> Taxonomy:
    """A binary Huffman tree over ``labels`` built from their frequencies (word2vec's hierarchical softmax).

    Frequent labels get short root paths: the expected path length is minimal. Internal nodes are named
    ``"<huffman:k>"``; ties are broken by label order, so the tree is deterministic.

    Raises:
        ValueError: lengths differ, fewer than 2 labels, or a negative / non-finite count.

    Example:
        >>> tree = huffman_tree(["a", "b", "c"], [5, 1, 1])
        >>> [tree.depth[tree.index(x)].item() for x in "abc"]
        [1, 2, 2]
    """
    labels = [str(x) for x in labels]
    c = np.asarray(counts, dtype=np.float64)
    if c.shape != (len(labels),):
        raise ValueError(f"counts must have one entry per label ({len(labels)}); got shape {c.shape}")
    if len(labels) < 2:
        raise ValueError(f"a Huffman tree needs at least 2 labels; got {len(labels)}")
    if not np.isfinite(c).all() or (c < 0).any():
        raise ValueError("counts must be finite and >= 0")
    if len(set(labels)) != len(labels):
        raise ValueError("labels must be unique")
    tick = itertools.count()
    heap = [(float(x), next(tick), lab) for x, lab in zip(c, labels, strict=True)]
    heapq.heapify(heap)
    edges: list[tuple[str, str]] = []
    k = 0
    while len(heap) > 1:
        c1, _, a = heapq.heappop(heap)
        c2, _, b = heapq.heappop(heap)
        parent = f"<huffman:{k}>"
        k += 1
        edges += [(parent, a), (parent, b)]
        heapq.heappush(heap, (c1 + c2, next(tick), parent))
    tax = Taxonomy(edges, name=name, classes=labels)
    expected = float((c / max(c.sum(), 1e-300)) @ tax.depth[tax.ids(labels)]) if c.sum() > 0 else math.nan
    return tax.replace(metadata={"expected_path_length": expected})

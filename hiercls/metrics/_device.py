"""Torch kernels of the metrics: node-id labels given as torch tensors are scored on their own device.

On a tree every single-node metric is a gather of per-node tables (depth, root paths, information content,
semantic-level classes) and a sum over the batch, so the labels never leave their device: only the sums (a
few scalars, or ``[N]`` node counts) come back as results. The tables are the taxonomy's own arrays, copied
once per device (``index_tensor``). Each kernel mirrors the NumPy computation of the same name
(``root_free_counts``, ``node_confusion``, ``pairwise_distance``, ``per_level_counts``); the tests compare
them on CPU tensors. DAGs run here too, from a padded ancestor table (shared ancestors by binary search; the
LCA is the deepest shared one), and so do node sets given as tensors (dense, closed on the device; an id side of
such a pair becomes its ancestor sets). CPU tensors are read as NumPy arrays (see :data:`ON_CPU`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hiercls.taxonomy import Taxonomy

_CHUNK = 1 << 17  # samples per [B, height] temporary, as the NumPy path

ON_CPU = False
"""Run the torch kernels for CPU tensors too. Off: CPU tensors are read as NumPy arrays (no copy) and scored by
the NumPy path, 2-4x faster there than many small torch operations; array results still come back as tensors.
The tests switch it on to compare the kernels with the NumPy path."""


def wanted(x: Any) -> bool:
    """Whether tensor ``x`` is scored by the torch kernels (any device but the CPU, unless :data:`ON_CPU`)."""
    return isinstance(x, torch.Tensor) and (ON_CPU or x.device.type != "cpu")


def table(taxonomy: Taxonomy, key: str, device: torch.device) -> torch.Tensor:
    """A per-taxonomy table on ``device``: ``depth``, ``paths``, ``ic``, ``heights``, ``semantic``."""
    from hiercls.decode._common import index_tensor  # the one per-taxonomy device cache (decode imports no metric)

    if key == "depth":
        values = taxonomy.depth.astype(np.int64)
    elif key == "paths":
        values = taxonomy.paths.astype(np.int64)
    elif key == "ic":
        values = np.asarray(taxonomy.information_content, dtype=np.float64)
    elif key == "heights":
        from hiercls.metrics.distance import node_heights

        values = node_heights(taxonomy)
    elif key == "leaf_index":
        values = np.asarray(taxonomy.leaf_index, dtype=np.int64)
    elif key == "semantic":
        from hiercls.metrics.distance import semantic_level_table

        values = semantic_level_table(taxonomy)
    elif key == "ancestors":
        values = taxonomy.ancestor_table
    else:  # pragma: no cover - internal keys only
        raise KeyError(key)
    return index_tensor(taxonomy, f"metrics/{key}", values, device)


def lca(t: torch.Tensor, p: torch.Tensor, taxonomy: Taxonomy) -> torch.Tensor:
    """Lowest common ancestors: on a tree the last position where the two root paths agree; on a DAG the deepest
    shared ancestor (by ``depth``, ties to the smaller id), as :meth:`Taxonomy.lca`."""
    if not taxonomy.is_tree:
        at, shared = _shared_ancestors(t, p, taxonomy)
        n = taxonomy.num_nodes
        rank = table(taxonomy, "depth", t.device)[at.clamp(min=0)] * (n + 1) + (n - at)  # deeper, then smaller id
        return at.gather(1, torch.where(shared, rank, -1).argmax(1, keepdim=True)).squeeze(1)
    paths = table(taxonomy, "paths", t.device)
    out = torch.empty_like(t)
    for s in range(0, len(t), _CHUNK):
        pa, pb = paths[t[s : s + _CHUNK]], paths[p[s : s + _CHUNK]]
        k = ((pa == pb) & (pa >= 0)).sum(1, keepdim=True) - 1
        out[s : s + _CHUNK] = pa.gather(1, k).squeeze(1)
    return out


def _shared_ancestors(t: torch.Tensor, p: torch.Tensor, taxonomy: Taxonomy) -> tuple[torch.Tensor, torch.Tensor]:
    """DAGs: ``(ancestors-or-self rows of t [B, K], which of them are also ancestors-or-self of p [B, K])``."""
    tab = table(taxonomy, "ancestors", t.device)
    at, ap = tab[t], tab[p]
    pos = torch.searchsorted(ap, at).clamp_(max=ap.shape[1] - 1)
    return at, (at >= 0) & (ap.gather(1, pos) == at)


def root_free_counts(t: torch.Tensor, p: torch.Tensor, taxonomy: Taxonomy) -> tuple[torch.Tensor, ...]:
    """Per sample ``(|T ∩ P|, |P|, |T|)`` of the ancestor-closed sets, root left out, float64.

    Trees: depths at the LCA and at both labels. DAGs: the ancestor sets are sorted rows of one table, and the
    intersection is counted by binary search of one row in the other, O(K log K) per sample.
    """
    if taxonomy.is_tree:
        d = table(taxonomy, "depth", t.device).to(torch.float64)
        return d[lca(t, p, taxonomy)], d[p], d[t]
    sizes = (table(taxonomy, "ancestors", t.device) >= 0).sum(1).to(torch.float64) - 1.0
    _, shared = _shared_ancestors(t, p, taxonomy)
    return shared.sum(1).to(torch.float64) - 1.0, sizes[p], sizes[t]


def ancestor_sets(ids: torch.Tensor, taxonomy: Taxonomy) -> torch.Tensor:
    """Closed node sets ``[B, N]`` bool of node ids: each row marks the ancestors-or-self (the padding of the
    table scatters onto the root, which every such set holds anyway)."""
    tab = table(taxonomy, "paths" if taxonomy.is_tree else "ancestors", ids.device)[ids].clamp_(min=0)
    out = torch.zeros(len(ids), taxonomy.num_nodes, dtype=torch.bool, device=ids.device)
    return out.scatter_(1, tab, True)


def sets_of(labels: Any, taxonomy: Taxonomy) -> torch.Tensor:
    """The closed node sets ``[B, N]`` of device :class:`~hiercls.metrics._validation.Labels` (ids: their
    ancestor sets), for the set kernels when a pair mixes ids and node sets."""
    return ancestor_sets(labels.ids, taxonomy) if labels.is_ids else labels.sets


def set_counts(ts: torch.Tensor, ps: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`root_free_counts` of closed node sets ``[B, N]``: ``(|T ∩ P|, |P|, |T|)`` without the root."""
    ts, ps = ts[:, 1:], ps[:, 1:]
    return ((ts & ps).sum(1, dtype=torch.float64), ps.sum(1, dtype=torch.float64), ts.sum(1, dtype=torch.float64))


def set_confusion(
    ts: torch.Tensor, ps: torch.Tensor, w: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`node_confusion` of closed node sets ``[B, N]``: weighted column sums of ``T & P``, ``P``, ``T``."""

    def colsum(x: torch.Tensor) -> torch.Tensor:
        return x.sum(0, dtype=torch.float64) if w is None else w.to(torch.float64) @ x.to(torch.float64)

    tp = colsum(ts & ps)
    return tp, colsum(ps) - tp, colsum(ts) - tp


def _bincount(x: torch.Tensor, w: torch.Tensor | None, n: int) -> torch.Tensor:
    return torch.bincount(x, weights=None if w is None else w, minlength=n).to(torch.float64)


def node_confusion(
    t: torch.Tensor, p: torch.Tensor, taxonomy: Taxonomy, w: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weighted per-node ``(tp, fp, fn)`` float64 ``[N]`` of the ancestor-closed sets.

    Count the samples per true and per predicted node, then push every count up to the node's ancestors (one
    scatter over the ``[N, K]`` ancestor table: root paths on trees). Node ``j`` is a true positive of sample
    ``b`` iff it is an ancestor of both labels: on a tree, of ``lca(t_b, p_b)``, counted the same way; on a DAG
    the shared ancestors of each sample are scattered directly.
    """
    n = taxonomy.num_nodes
    anc = table(taxonomy, "paths" if taxonomy.is_tree else "ancestors", t.device)
    valid = anc >= 0
    rows = torch.arange(n, device=t.device).unsqueeze(1).expand_as(anc)[valid]
    cols = anc[valid]

    def up(per_node: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.float64, device=t.device).index_add_(0, cols, per_node[rows])

    wf = None if w is None else w.to(torch.float64)
    if taxonomy.is_tree:
        tp = up(_bincount(lca(t, p, taxonomy), wf, n))
    else:
        at, shared = _shared_ancestors(t, p, taxonomy)
        per_sample = shared.to(torch.float64) if wf is None else shared * wf[:, None]
        tp = torch.zeros(n, dtype=torch.float64, device=t.device).index_add_(0, at[shared], per_sample[shared])
    return tp, up(_bincount(p, wf, n)) - tp, up(_bincount(t, wf, n)) - tp


def distance(t: torch.Tensor, p: torch.Tensor, taxonomy: Taxonomy, kind: str) -> torch.Tensor:
    """``Taxonomy.distance(kind)`` and ``"lca_node_height"`` between node ids, float64."""
    anc = lca(t, p, taxonomy)
    if kind == "lca_node_height":
        out = table(taxonomy, "heights", t.device)[anc].to(torch.float64)
    elif kind in ("shortest_path", "lca_height", "wu_palmer", "wu_palmer_root1"):
        d = table(taxonomy, "depth", t.device).to(torch.float64)
        if kind == "shortest_path":
            out = d[t] + d[p] - 2 * d[anc]
        elif kind == "lca_height":
            out = taxonomy.height - d[anc]
        else:
            if kind == "wu_palmer_root1":
                d = d + 1.0
            den = d[t] + d[p]
            out = 1.0 - 2.0 * d[anc] / torch.where(den > 0, den, torch.ones_like(den))
    elif kind in ("zhao", "ic_distance", "jiang_conrath"):
        ic = table(taxonomy, "ic", t.device)
        if kind == "zhao":
            den = ic[t] + ic[p]
            ratio = 1.0 - 2.0 * ic[anc] / torch.where(den > 0, den, torch.ones_like(den))
            out = torch.where(den > 0, ratio, torch.zeros_like(ratio))
        else:
            out = ic[t] + ic[p] - 2.0 * ic[anc]
    else:  # pragma: no cover - checked by pairwise_distance
        raise ValueError(kind)
    return torch.where(t == p, torch.zeros_like(out), out)


def per_level_counts(
    t: torch.Tensor, p: torch.Tensor, taxonomy: Taxonomy, w: torch.Tensor | None, levels: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weighted per-level ``(correct, both_valid, true_valid)`` float64 ``[num_levels]`` (trees).

    A level's node on a root path: the ancestor at that depth, or the class ancestor at that semantic level
    (a root path meets each semantic level at most once: a class's level counts its class ancestors).
    """
    tab = table(taxonomy, "paths", t.device)[:, 1:] if levels == "depth" else table(taxonomy, "semantic", t.device)
    out = torch.zeros((3, tab.shape[1]), dtype=torch.float64, device=t.device)
    for s in range(0, len(t), _CHUNK):
        at, ap = tab[t[s : s + _CHUNK]], tab[p[s : s + _CHUNK]]
        vt, vp = at >= 0, ap >= 0
        both = vt & vp
        stacked = torch.stack([both & (at == ap), both, vt]).to(torch.float64)  # [3, B, L]
        if w is None:
            out += stacked.sum(1)
        else:
            out += torch.einsum("kbl,b->kl", stacked, w[s : s + _CHUNK].to(torch.float64))
    return out[0], out[1], out[2]


def set_level_counts(
    t: torch.Tensor, p: torch.Tensor, taxonomy: Taxonomy, w: torch.Tensor | None, levels: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`per_level_counts` of closed node sets ``[B, N]``, or of DAG node ids ``[B]`` (read from their rows
    of the padded ancestor table, O(K) per sample, without any ``[B, N]`` array).

    At level ``l`` a set is present when it holds a node of level ``l``; a sample is correct there when both sets
    are present and their symmetric difference holds no node of ``l`` (the NumPy rule for node sets).
    """
    from hiercls.decode._common import index_tensor
    from hiercls.metrics.distance import _node_levels, num_levels

    dev = t.device
    node_level, n_lv = _node_levels(taxonomy, levels), num_levels(taxonomy, levels)
    level_of = index_tensor(taxonomy, ("metrics/level_of", levels), node_level, dev)

    def presence(nodes: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        """``[B, L]``: some member node of the row lies on level ``l`` (column ``L`` collects the rest)."""
        lv = level_of[nodes.clamp(min=0)]
        slot = torch.where(member & (lv >= 0), lv, n_lv)
        out = torch.zeros(nodes.shape[0], n_lv + 1, dtype=torch.bool, device=dev)
        return out.scatter_(1, slot, True)[:, :n_lv]

    if t.dim() == 1:  # DAG ids: the ancestor rows, and which of them the other label shares
        at, t_shared = _shared_ancestors(t, p, taxonomy)
        ap, p_shared = _shared_ancestors(p, t, taxonomy)
        vt, vp = presence(at, at >= 0), presence(ap, ap >= 0)
        differ = presence(at, (at >= 0) & ~t_shared) | presence(ap, (ap >= 0) & ~p_shared)
    else:  # closed node sets: every node is a candidate member
        nodes = torch.arange(taxonomy.num_nodes, device=dev).expand(t.shape[0], -1)
        vt, vp, differ = presence(nodes, t), presence(nodes, p), presence(nodes, t != p)
    both = vt & vp
    stacked = torch.stack([both & ~differ, both, vt]).to(torch.float64)  # [3, B, L]
    out = stacked.sum(1) if w is None else torch.einsum("kbl,b->kl", stacked, w.to(torch.float64))
    return out[0], out[1], out[2]


def is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def host(x: Any) -> np.ndarray:
    """A float64 NumPy copy of a (small, reduced) tensor; NumPy arrays unchanged."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


def weighted_sum(values: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """``Σ w·values`` (``Σ values`` without weights) as a 0-d float64 tensor on the values' device."""
    values = values.to(torch.float64)
    return values.sum() if w is None else values @ w.to(torch.float64)


def divide(num: torch.Tensor, den: torch.Tensor, zero_division: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``num / den`` with ``zero_division`` (``"warn"``: 0) where ``den == 0``, and the 0/0 mask (as NumPy's)."""
    zero = den == 0
    out = num / torch.where(zero, torch.ones_like(den), den)
    fill = 0.0 if zero_division == "warn" else float(zero_division)
    return torch.where(zero, torch.full_like(out, fill), out), zero

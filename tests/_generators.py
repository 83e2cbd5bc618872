"""Shared generators of the tests: random taxonomies (trees, DAGs) and labels on them. Plain functions, seeded."""

from __future__ import annotations

import numpy as np

from hiercls.taxonomy import Taxonomy


def _rng(seed: np.random.Generator | int) -> np.random.Generator:
    return np.random.default_rng(seed) if isinstance(seed, int | np.integer) else seed


def random_tree(n: int, seed: np.random.Generator | int) -> Taxonomy:
    """A random tree on ``n0 .. n{n-1}``: node ``i`` hangs under a uniformly drawn earlier node."""
    rng = _rng(seed)
    edges = [(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, n)]
    return Taxonomy(edges, nodes=[f"n{i}" for i in range(n)], name="random-tree")


def random_dag(n: int, seed: np.random.Generator | int, extra: int = 8) -> Taxonomy:
    """:func:`random_tree` plus up to ``extra`` second parents, each an earlier node that is neither an ancestor nor
    a descendant (so that the DAG really has several root paths)."""
    rng = _rng(seed)
    base = random_tree(n, rng)
    edges = [(base.name_of(int(base.parents(c)[0])), base.name_of(c)) for c in range(1, n)]
    anc = base.ancestors_sparse.toarray().astype(bool)
    for c in rng.choice(np.arange(2, n), max(0, min(extra, n - 2)), replace=False):
        options = [a for a in range(1, c) if not anc[c, a] and not anc[a, c]]
        if options:
            edges.append((base.name_of(int(rng.choice(options))), base.name_of(int(c))))
    return Taxonomy(edges, nodes=list(base.names), name="random-dag")


def tree_with_classes(n: int, seed: int) -> Taxonomy:
    """A random tree where about a third of the internal nodes are not classes (semantic levels skip them)."""
    base = random_tree(n, seed)
    rng = np.random.default_rng(seed)
    internal = [c for c in range(1, base.num_nodes) if len(base.children(c))]
    drop = set(rng.choice(internal, len(internal) // 3, replace=False).tolist())
    edges = [(base.name_of(int(base.parents(c)[0])), base.name_of(c)) for c in range(1, base.num_nodes)]
    return Taxonomy(edges, classes=[base.name_of(c) for c in range(1, base.num_nodes) if c not in drop])


def labels(tax: Taxonomy, n: int, seed: np.random.Generator | int, ignore: float = 0.0) -> tuple[np.ndarray, ...]:
    """``(y_true, y_pred)`` node ids ``[n]``: predictions right about 40 % of the time, else any node; a share
    ``ignore`` of the targets is ``-1``."""
    rng = _rng(seed)
    t = rng.integers(0, tax.num_nodes, n)
    p = np.where(rng.random(n) < 0.4, t, rng.integers(0, tax.num_nodes, n))
    t[rng.random(n) < ignore] = -1
    return t, p


def raw_sets(tax: Taxonomy, ids: np.ndarray, seed: int) -> np.ndarray:
    """Unclosed 0/1 node sets ``[B, N]``: each sample's node plus, half the time, a random extra node."""
    rng = np.random.default_rng(seed)
    out = np.zeros((len(ids), tax.num_nodes), dtype=np.int64)
    out[np.arange(len(ids)), np.maximum(ids, 0)] = 1
    extra = rng.random(len(ids)) < 0.5
    out[np.flatnonzero(extra), rng.integers(0, tax.num_nodes, int(extra.sum()))] = 1
    return out


def random_group_forest(rng: np.random.Generator, num_outputs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(group, parent, input_order)`` of a random chained softmax over ``num_outputs`` outputs.

    Groups of 1-5 outputs in random order; each group hangs below a random earlier output (or is a top group)
    that conditions no other group; the outputs read a random injective choice of ``num_outputs + 3`` logits.
    """
    group, parent, taken = [], [], set()
    while len(group) < num_outputs:
        size = min(int(rng.integers(1, 6)), num_outputs - len(group))
        free = [o for o in range(len(group)) if o not in taken]
        up = int(rng.choice(free)) if free and rng.random() < 0.8 else -1
        taken.add(up)
        group += [len(parent)] * size
        parent.append(up)
    perm = rng.permutation(len(parent))  # group ids in no particular order
    rank = np.argsort(perm)
    order = rng.permutation(num_outputs + 3)[:num_outputs]
    return rank[np.array(group)], np.array(parent)[perm], order

"""Shared generators for the tests: random taxonomies and posteriors (plain functions, no fixtures).

Every test module takes its trees and probabilities from here; no test module imports another.
"""

from __future__ import annotations

import math

import networkx as nx
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


def chain(n: int) -> Taxonomy:
    """``n0 -> n1 -> ... -> n{n-1}``."""
    return Taxonomy.from_parents({"n0": None, **{f"n{i}": f"n{i - 1}" for i in range(1, n)}}, name=f"chain_{n}")


def star(children: int) -> Taxonomy:
    """A root with ``children`` leaves."""
    return Taxonomy.from_parents({"r": None, **{f"c{i}": "r" for i in range(children)}}, name=f"star_{children}")


def symmetric_tree(depth: int = 3) -> Taxonomy:
    """A complete binary tree: every node of one depth is equivalent to every other of that depth."""
    edges, level = [], ["r"]
    for _ in range(depth):
        nxt = []
        for u in level:
            for k in "01":
                v = (u if u != "r" else "") + k
                edges.append((u, v))
                nxt.append(v)
        level = nxt
    return Taxonomy(edges)


def node_probs(tax: Taxonomy, rng: np.random.Generator, b: int, *, alpha: float = 0.3) -> np.ndarray:
    """Node probabilities of a Dirichlet label distribution over all nodes (labels may be internal): ``P = p A``."""
    p = rng.dirichlet(np.full(tax.num_nodes, alpha), size=b)
    return p @ tax.ancestors_sparse.toarray()


def random_taxonomy(rng: np.random.Generator, n: int, *, dag: bool = False) -> Taxonomy:
    shape = rng.choice(["random", "chain", "star", "caterpillar"], p=[0.7, 0.1, 0.1, 0.1])
    edges = []
    for i in range(1, n):
        if shape == "chain":
            ps = [i - 1]
        elif shape == "star":
            ps = [0]
        elif shape == "caterpillar":  # very unbalanced: a spine with leaves hanging off it
            ps = [max(0, i - 2) if i % 2 == 0 else max(0, i - 1)]
        else:
            ps = [int(rng.integers(0, i))]
        if dag and i > 1 and rng.random() < 0.4:
            extra = int(rng.integers(0, i))
            if extra not in ps:
                ps.append(extra)
        edges += [(f"n{p}", f"n{i}") for p in ps]
    names = [f"n{i}" for i in range(n)]
    order = [names[0], *rng.permutation(names[1:]).tolist()]  # sibling order shuffles the ids
    return Taxonomy(edges, nodes=order)


def ancestor_indicator(tax: Taxonomy) -> np.ndarray:
    """``A[y, n] = 1`` iff ``n`` is an ancestor-or-self of ``y``, from networkx (independent of core)."""
    g = nx.DiGraph([(tax.index(p), tax.index(c)) for p, c in tax.edge_list(names=True)])
    g.add_nodes_from(range(tax.num_nodes))
    a = np.eye(tax.num_nodes)
    for y in range(tax.num_nodes):
        a[y, list(nx.ancestors(g, y))] = 1
    return a


def random_label_distribution(rng: np.random.Generator, n: int, leaves: np.ndarray, batch: int) -> np.ndarray:
    out = np.zeros((batch, n))
    for b in range(batch):
        kind = rng.integers(0, 5)
        support = np.arange(n) if rng.random() < 0.6 else leaves
        p = np.zeros(n)
        if kind == 0:  # ties: a few equal masses
            k = int(rng.integers(1, len(support) + 1))
            p[rng.choice(support, size=k, replace=False)] = 1.0
        elif kind == 1:  # exact zeros and quantised (tie-prone) values
            p[support] = rng.integers(0, 4, size=len(support)).astype(float)
        elif kind == 2:  # one-hot
            p[rng.choice(support)] = 1.0
        else:
            p[support] = rng.dirichlet(np.full(len(support), float(rng.choice([0.1, 0.5, 2.0]))))
        if p.sum() == 0:
            p[rng.choice(support)] = 1.0
        out[b] = p / p.sum()
    return out


def sample_case(rng: np.random.Generator, *, dag: bool = False, batch: int = 3):
    """``(taxonomy, ancestor indicator, label distribution [B, N], node probabilities [B, N])`` of up to nine nodes;
    sometimes quantised to quarters, which makes ties common."""
    n = int(rng.integers(1, 10))
    tax = random_taxonomy(rng, n, dag=dag)
    a = ancestor_indicator(tax)
    p = random_label_distribution(rng, n, tax.leaves, batch)
    if rng.random() < 0.4:
        p = np.round(p * 4) / 4
    zero = p.sum(1) == 0  # quantising can empty a row: that is no distribution (the decoders refuse it)
    p[zero, 0] = 1.0
    p = p / p.sum(1, keepdims=True)
    return tax, a, p, p @ a


def nx_tree_distance(tax: Taxonomy, kind: str) -> np.ndarray:
    """Independent pairwise distances on a tree from networkx (LCA via ancestor sets)."""
    g = nx.DiGraph([(tax.index(p), tax.index(c)) for p, c in tax.edge_list(names=True)])
    g.add_nodes_from(range(tax.num_nodes))
    depth = nx.shortest_path_length(g, 0)
    anc = {n: nx.ancestors(g, n) | {n} for n in g}
    leaves_under = {n: sum(1 for d in nx.descendants(g, n) | {n} if g.out_degree(d) == 0) for n in g}
    nl = sum(1 for n in g if g.out_degree(n) == 0)
    ic = {n: -math.log(leaves_under[n] / nl) for n in g}
    h = max(depth.values())
    n = tax.num_nodes
    out = np.zeros((n, n))
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            lca = max(anc[a] & anc[b], key=lambda x: depth[x])
            if kind == "shortest_path":
                out[a, b] = depth[a] + depth[b] - 2 * depth[lca]
            elif kind == "lca_height":
                out[a, b] = h - depth[lca]
            elif kind == "wu_palmer":  # Plaud et al.: root at depth 0
                out[a, b] = 1 - 2 * depth[lca] / (depth[a] + depth[b])
            elif kind == "wu_palmer_root1":
                out[a, b] = 1 - 2 * (depth[lca] + 1) / (depth[a] + depth[b] + 2)
            elif kind == "zhao":  # Plaud et al.: 1 - 2 IC(lca) / (IC(a) + IC(b)); 0 between IC-0 nodes
                den = ic[a] + ic[b]
                out[a, b] = 1 - 2 * ic[lca] / den if den > 1e-12 else 0.0
            else:
                out[a, b] = ic[a] + ic[b] - 2 * ic[lca]
    return out


# Label alphabets: plain, CJK, emoji (with a skin-tone modifier and a ZWJ sequence), right-to-left scripts, accents
# (precomposed and combining); then the characters that are syntax or invisible somewhere.
LABEL_ALPHABETS = (
    "abcdefghijklmnopqrstuvwxyzABCXYZ0123456789-_.",
    "中文字猫狗鳥日本語한국어",
    ["\U0001f600", "\U0001f436", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f4bb", "\u2764\ufe0f"],
    "שלוםעבריתمرحباعربي",
    ["é", "e\u0301", "ñ", "ü", "ø", "ß"],
)
LABEL_SPECIALS = (
    *("\t", "\n", "\r", "\v", "\f", "\x1c", "\x85", "\u2028", "\x00", "\x1b"),  # controls; most break lines
    *(" ", "#", "/", "\\", ",", '"', "'", "\u200b", "\u200f", "\u202e"),
)


def random_label(rng: np.random.Generator, special: float = 0.1) -> str:
    """A label of 1-6 characters from one or two of :data:`LABEL_ALPHABETS`; with probability ``special`` one of
    :data:`LABEL_SPECIALS` goes in at a random place (start, middle or end)."""
    pools = [LABEL_ALPHABETS[int(i)] for i in rng.choice(len(LABEL_ALPHABETS), size=int(rng.integers(1, 3)))]
    chars = [str(pools[int(rng.integers(len(pools)))][0]) for _ in range(int(rng.integers(1, 7)))]
    chars = [str(p[int(rng.integers(len(p)))]) for p in (pools[int(rng.integers(len(pools)))] for _ in chars)]
    if rng.random() < special:
        chars.insert(int(rng.integers(0, len(chars) + 1)), LABEL_SPECIALS[int(rng.integers(len(LABEL_SPECIALS)))])
    return "".join(chars)


def unicode_taxonomy(rng: np.random.Generator, *, dag: bool = False) -> Taxonomy:
    """A small taxonomy with :func:`random_label` names and some display names: a random tree (or DAG) of up to
    12 nodes, a chain up to 40 deep or a star up to 40 wide."""
    shape = rng.choice(["random", "chain", "star"], p=[0.6, 0.2, 0.2])
    n = int(rng.integers(1, 13 if shape == "random" else 41))
    names: dict[str, None] = {}
    while len(names) < n:
        names[random_label(rng)] = None
    order = list(names)
    edges = []
    for i in range(1, n):
        ps = {i - 1} if shape == "chain" else {0} if shape == "star" else {int(rng.integers(0, i))}
        if dag and shape == "random" and i > 1 and rng.random() < 0.3:
            ps.add(int(rng.integers(0, i)))
        edges += [(order[p], order[i]) for p in sorted(ps)]
    display = {order[int(k)]: random_label(rng) for k in rng.choice(n, size=min(n, int(rng.integers(0, 4))))}
    return Taxonomy(edges, nodes=order, display_names=display)

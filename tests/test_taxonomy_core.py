"""The Taxonomy core checked against networkx (and brute force) on many seeded random trees and DAGs."""

from __future__ import annotations

import itertools
import math
import pickle
import random

import networkx as nx
import numpy as np
import pytest

from hiercls.taxonomy import Taxonomy, TaxonomyError

SEEDS = range(60)


def random_edges(seed: int, *, dag: bool, max_nodes: int = 30) -> tuple[list[tuple[str, str]], list[str]]:
    """Random rooted tree (or DAG with extra parents), shuffled names and edge order.

    Every node ``i > 0`` gets a parent among ``0..i-1`` (so the graph is rooted and acyclic); in a DAG some
    nodes get up to two more parents. Names are random so that ids cannot coincide with input positions.
    """
    rng = random.Random(seed)
    n = rng.randint(1, max_nodes)
    names = [f"{rng.choice('abcdefgh')}{i}_{rng.randint(0, 999)}" for i in range(n)]
    rng.shuffle(names)
    edges = []
    for i in range(1, n):
        parents = {rng.randrange(i)}
        if dag and i > 2 and rng.random() < 0.4:
            parents |= set(rng.sample(range(i), min(i, rng.randint(1, 2))))
        edges += [(names[p], names[i]) for p in sorted(parents, key=lambda _: rng.random())]
    rng.shuffle(edges)
    return edges, names


def build(seed: int, dag: bool) -> tuple[Taxonomy, nx.DiGraph]:
    edges, names = random_edges(seed, dag=dag)
    nodes = names if len(names) == 1 or random.Random(seed).random() < 0.5 else None
    tax = Taxonomy(edges, nodes=nodes)
    g = nx.DiGraph()
    g.add_nodes_from(names)
    g.add_edges_from(edges)
    return tax, g


CASES = [(s, False) for s in SEEDS] + [(s, True) for s in SEEDS]


def root_of(g: nx.DiGraph) -> str:
    (root,) = [n for n in g if g.in_degree(n) == 0]
    return root


@pytest.mark.parametrize(("seed", "dag"), CASES)
def test_structure_matches_networkx(seed: int, dag: bool) -> None:
    tax, g = build(seed, dag)
    names = tax.names
    assert sorted(names) == sorted(g.nodes)
    assert tax.num_nodes == g.number_of_nodes() == len(tax)
    root = root_of(g)
    assert names[0] == root and tax.root == 0
    # topological ids: every parent before its children
    for p, c in g.edges:
        assert tax.index(p) < tax.index(c)
    assert tax.is_tree == all(g.in_degree(n) <= 1 for n in g)
    sp_len = nx.single_source_shortest_path_length(g, root)
    longest = {root: 0}
    for n in nx.topological_sort(g):
        if n != root:
            longest[n] = max(longest[p] for p in g.predecessors(n)) + 1
    for i, n in enumerate(names):
        assert tax.name_of(i) == n and tax.index(n) == i
        assert set(tax.names[a] for a in tax.ancestors(i)) == nx.ancestors(g, n)
        assert set(tax.names[a] for a in tax.ancestors(i, include_self=True)) == nx.ancestors(g, n) | {n}
        assert set(tax.names[d] for d in tax.descendants(i)) == nx.descendants(g, n)
        assert set(tax.names[p] for p in tax.parents(i)) == set(g.predecessors(n))
        assert set(tax.names[c] for c in tax.children(i)) == set(g.successors(n))
        assert tax.depth[i] == sp_len[n]
        assert tax.max_depth[i] == longest[n]
        assert tax.subtree_size[i] == len(nx.descendants(g, n)) + 1
        leaves_below = [d for d in nx.descendants(g, n) | {n} if g.out_degree(d) == 0]
        assert tax.num_leaves_under[i] == len(leaves_below)
        assert tax.is_leaf[i] == (g.out_degree(n) == 0)
        assert tax.num_children[i] == g.out_degree(n)
        # CSR arrays agree with the tuples
        assert tuple(tax.parent_idx[tax.parent_ptr[i] : tax.parent_ptr[i + 1]]) == tax.parents(i)
        assert tuple(tax.child_idx[tax.child_ptr[i] : tax.child_ptr[i + 1]]) == tax.children(i)
    assert tax.height == max(longest.values())
    assert [names[i] for i in tax.leaves] == [n for n in names if g.out_degree(n) == 0]
    assert tax.num_leaves == len(tax.leaves)
    assert tax.leaf_index[tax.leaves].tolist() == list(range(tax.num_leaves))
    assert (tax.leaf_index[~tax.is_leaf] == -1).all()
    # levels partition the ids by depth
    assert sum(len(lv) for lv in tax.levels) == tax.num_nodes
    for d, lv in enumerate(tax.levels):
        assert (tax.depth[lv] == d).all()
    # the dense and sparse ancestor matrices agree
    dense = tax.ancestor_matrix()
    for i in range(tax.num_nodes):
        assert set(np.flatnonzero(dense[i])) == set(tax.ancestors(i, include_self=True))
    assert not tax.ancestor_matrix(include_self=False).diagonal().any()
    np.testing.assert_array_equal(tax.descendants_sparse.toarray(), tax.ancestors_sparse.toarray().T)


@pytest.mark.parametrize("seed", SEEDS)
def test_tree_ids_are_dfs_preorder_with_contiguous_subtrees(seed: int) -> None:
    tax, g = build(seed, dag=False)
    # Independent DFS pre-order, siblings in order of first appearance in the input.
    rank = {n: k for k, n in enumerate(tax_input_order(seed))}
    order: list[str] = []

    def dfs(n: str) -> None:
        order.append(n)
        for c in sorted(g.successors(n), key=rank.__getitem__):
            dfs(c)

    dfs(root_of(g))
    assert list(tax.names) == order
    for i in range(tax.num_nodes):
        assert tax.descendants(i, include_self=True).tolist() == list(range(i, i + tax.subtree_size[i]))
        assert tax.parent[i] == (tax.index(next(iter(g.predecessors(tax.names[i])))) if i else -1)
        path = [tax.index(n) for n in nx.shortest_path(g, root_of(g), tax.names[i])]
        assert tax.path(i) == path
        assert tax.paths[i, : len(path)].tolist() == path
        assert (tax.paths[i, len(path) :] == -1).all()
    assert tax.paths.shape == (tax.num_nodes, tax.height + 1)
    np.testing.assert_array_equal(tax.leaf_paths, tax.paths[tax.leaves])


def tax_input_order(seed: int) -> list[str]:
    """The tie-break order the Taxonomy saw: ``nodes`` when given, else first appearance in the edges."""
    edges, names = random_edges(seed, dag=False)
    if len(names) == 1 or random.Random(seed).random() < 0.5:
        return names
    return list(dict.fromkeys(n for e in edges for n in e))


@pytest.mark.parametrize(("seed", "dag"), CASES)
def test_ancestor_table_rows_are_the_sorted_ancestors_padded_in_front(seed: int, dag: bool) -> None:
    tax, g = build(seed, dag)
    tab = tax.ancestor_table
    width = max(len(nx.ancestors(g, name)) + 1 for name in tax.names)
    assert tab.shape == (tax.num_nodes, width) and not tab.flags.writeable
    for i, name in enumerate(tax.names):
        want = sorted(tax.index(a) for a in nx.ancestors(g, name) | {name})
        assert tab[i].tolist() == [-1] * (width - len(want)) + want


@pytest.mark.parametrize(("seed", "dag"), CASES)
def test_lca_matches_networkx_and_brute_force(seed: int, dag: bool) -> None:
    tax, g = build(seed, dag)
    n = tax.num_nodes
    pairs = list(itertools.product(range(n), repeat=2))
    random.Random(seed).shuffle(pairs)
    pairs = pairs[:150]
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    got = tax.lca(a, b)
    for (x, y), lca in zip(pairs, got.tolist(), strict=True):
        if not dag:
            expected = tax.index(nx.lowest_common_ancestor(g, tax.names[x], tax.names[y]))
        else:
            common = (nx.ancestors(g, tax.names[x]) | {tax.names[x]}) & (nx.ancestors(g, tax.names[y]) | {tax.names[y]})
            ids = [tax.index(c) for c in common]
            expected = min(ids, key=lambda i: (-tax.depth[i], i))
        assert lca == expected
        assert tax.lca(x, y) == expected  # scalar form
    assert isinstance(tax.lca(0, 0), int)
    assert tax.lca(a.reshape(-1, 1)[:6], b[None, :4]).shape == (min(6, len(a)), min(4, len(b)))


@pytest.mark.parametrize(("seed", "dag"), CASES[::3])
def test_distances_match_formulas(seed: int, dag: bool) -> None:
    tax, g = build(seed, dag)
    n = tax.num_nodes
    und = g.to_undirected()
    leaves = [nm for nm in g if g.out_degree(nm) == 0]
    ic = {nm: -math.log(len([d for d in nx.descendants(g, nm) | {nm} if d in leaves]) / len(leaves)) for nm in g}
    depth = nx.single_source_shortest_path_length(g, root_of(g))
    height = max(tax.max_depth)
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    dist = {
        k: tax.distance(a, b, k)
        for k in ("shortest_path", "lca_height", "wu_palmer", "wu_palmer_root1", "zhao", "ic_distance", "jiang_conrath")
    }
    for x in range(n):
        for y in range(n):
            nx_, ny_ = tax.names[x], tax.names[y]
            lca = tax.names[tax.lca(x, y)]
            if x == y:
                assert all(dist[k][x, y] == 0 for k in dist)
                continue
            if not dag:
                assert dist["shortest_path"][x, y] == nx.shortest_path_length(und, nx_, ny_)
            assert dist["shortest_path"][x, y] == depth[nx_] + depth[ny_] - 2 * depth[lca]
            assert dist["lca_height"][x, y] == height - depth[lca]
            wp = 2 * depth[lca] / (depth[nx_] + depth[ny_])  # Plaud et al.: root at depth 0
            assert dist["wu_palmer"][x, y] == pytest.approx(1 - wp)
            wp1 = 2 * (depth[lca] + 1) / (depth[nx_] + depth[ny_] + 2)
            assert dist["wu_palmer_root1"][x, y] == pytest.approx(1 - wp1)
            den = ic[nx_] + ic[ny_]
            assert dist["zhao"][x, y] == pytest.approx(1 - 2 * ic[lca] / den if den > 1e-12 else 0.0)
            assert dist["ic_distance"][x, y] == pytest.approx(ic[nx_] + ic[ny_] - 2 * ic[lca])
            assert dist["jiang_conrath"][x, y] == dist["ic_distance"][x, y]
    np.testing.assert_allclose(tax.information_content, [ic[nm] for nm in tax.names])
    m = tax.distance_matrix("shortest_path")
    assert m.shape == (n, tax.num_leaves)
    np.testing.assert_array_equal(m, dist["shortest_path"][:, tax.leaves])
    sub = tax.distance_matrix("zhao", nodes=np.array([0]), targets=np.arange(n))
    np.testing.assert_allclose(sub[0], dist["zhao"][0])
    with pytest.raises(ValueError, match="kind"):
        tax.distance(0, 0, "euclid")  # type: ignore[arg-type]


@pytest.mark.parametrize(("seed", "dag"), CASES[::4])
def test_marginals_numpy_and_torch(seed: int, dag: bool) -> None:
    torch = pytest.importorskip("torch")
    tax, _ = build(seed, dag)
    rng = np.random.default_rng(seed)
    leaf_probs = rng.dirichlet(np.ones(tax.num_leaves), size=(2, 3))
    expected = np.zeros((2, 3, tax.num_nodes))
    for i in range(tax.num_nodes):
        below = [tax.leaf_index[d] for d in tax.descendants(i, include_self=True) if tax.is_leaf[d]]
        expected[..., i] = leaf_probs[..., below].sum(-1)
    got = tax.marginals(leaf_probs)
    assert got.shape == (2, 3, tax.num_nodes)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9)
    if not dag:
        np.testing.assert_allclose(got[..., 0], 1.0, rtol=1e-6)
    t = tax.marginals(torch.from_numpy(leaf_probs.astype(np.float32)))
    assert t.dtype == torch.float32 and tuple(t.shape) == (2, 3, tax.num_nodes)
    np.testing.assert_allclose(t.numpy(), expected, rtol=1e-5, atol=1e-6)
    # Node probabilities are float32 at least (the architecture contract), even from bf16 / fp16 inputs.
    t16 = tax.marginals(torch.from_numpy(leaf_probs).to(torch.bfloat16))
    assert t16.dtype == torch.float32
    np.testing.assert_allclose(t16.numpy(), expected, rtol=3e-2, atol=3e-2)
    t64 = tax.marginals(torch.from_numpy(leaf_probs))
    assert t64.dtype == torch.float64
    np.testing.assert_allclose(t64.numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS[:40])
@pytest.mark.parametrize("strategy", ["first", "shortest", "longest"])
def test_to_tree_strategies(seed: int, strategy: str) -> None:
    edges, names = random_edges(seed, dag=True)
    dag = Taxonomy(edges, nodes=names)
    tree = dag.to_tree(strategy)  # type: ignore[arg-type]
    assert tree.is_tree
    assert set(tree.names) == set(dag.names)
    kept = set(tree.edge_list(names=True))
    dropped = set(tree.dropped_edges)
    assert kept | dropped == set(edges) and not kept & dropped
    assert len(tree.dropped_edges) == len(edges) - (dag.num_nodes - 1)
    g = nx.DiGraph()
    g.add_nodes_from(names)
    g.add_edges_from(edges)
    sp = nx.single_source_shortest_path_length(g, dag.names[0])
    longest = {dag.names[i]: int(dag.max_depth[i]) for i in range(dag.num_nodes)}
    for child in dag.names[1:]:
        (parent,) = [p for p, c in kept if c == child]
        candidates = [p for p, c in edges if c == child]  # in input (edge) order
        if strategy == "first":
            assert parent == candidates[0]
        elif strategy == "shortest":
            assert sp[parent] == min(sp[p] for p in candidates)
        else:
            assert longest[parent] == max(longest[p] for p in candidates)
    if dag.is_tree:
        assert dag.to_tree(strategy) is dag  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strategy"):
        dag.to_tree("random")  # type: ignore[arg-type]


def test_to_tree_first_follows_edge_order_not_node_order() -> None:
    # 'b' is named before 'a', but x's edges list 'a' first: "first" must keep the first listed parent.
    dag = Taxonomy([("r", "b"), ("r", "a"), ("a", "x"), ("b", "x")])
    tree = dag.to_tree("first")
    assert tree.names[tree.parent[tree.index("x")]] == "a"
    assert tree.dropped_edges == (("b", "x"),)
    assert dag.names[dag.primary_parent[dag.index("x")]] == "a"


@pytest.mark.parametrize(("seed", "dag"), CASES[::2])
def test_restrict_matches_induced_subgraph(seed: int, dag: bool) -> None:
    tax, g = build(seed, dag)
    rng = random.Random(seed)
    chosen = rng.sample(list(tax.names), k=min(3, tax.num_nodes))
    sub = tax.restrict(chosen)
    keep = set(chosen).union(*(nx.ancestors(g, c) for c in chosen))
    assert set(sub.names) == keep
    assert set(sub.edge_list(names=True)) == set(g.subgraph(keep).edges)
    assert sub.names[0] == tax.names[0]
    # classes default to the kept classes; ids stay topological
    assert {sub.names[c] for c in sub.classes} == {tax.names[c] for c in tax.classes} & keep
    for p, c in sub.edge_list():
        assert p < c
    by_id = tax.restrict([tax.index(c) for c in chosen])
    assert by_id == sub
    only = tax.restrict(chosen, classes=chosen)
    assert {only.names[c] for c in only.classes} == set(chosen)


@pytest.mark.parametrize(("seed", "dag"), CASES[::2])
def test_semantic_level_counts_class_ancestors(seed: int, dag: bool) -> None:
    tax, g = build(seed, dag)
    rng = random.Random(seed + 1000)
    classes = [n for n in tax.names if rng.random() < 0.6]
    t = Taxonomy(tax.edge_list(names=True), nodes=tax.names, classes=classes)
    for i, n in enumerate(t.names):
        if n in classes:
            assert t.semantic_level[i] == len(nx.ancestors(g, n) & set(classes))
        else:
            assert t.semantic_level[i] == -1
    assert t.class_mask.tolist() == [n in classes for n in t.names]


@pytest.mark.parametrize(("seed", "dag"), CASES[::5])
def test_fingerprint_is_stable_and_discriminating(seed: int, dag: bool) -> None:
    edges, names = random_edges(seed, dag=dag)
    a = Taxonomy(edges, nodes=names, name="one", metadata={"x": 1})
    b = Taxonomy(list(edges), nodes=list(names), name="two", display_names={names[0]: "Pretty"})
    assert a.fingerprint == b.fingerprint and a == b and hash(a) == hash(b)
    assert len(a.fingerprint) == 64
    clone = pickle.loads(pickle.dumps(a))
    assert clone.fingerprint == a.fingerprint and clone.names == a.names and clone.name == "one"
    np.testing.assert_array_equal(clone.depth, a.depth)
    np.testing.assert_array_equal(clone.ancestors_sparse.toarray(), a.ancestors_sparse.toarray())
    # A changed structure or class set changes the fingerprint.
    extra = Taxonomy([*edges, (a.names[0], "brand_new_node")], nodes=[*names, "brand_new_node"])
    assert extra.fingerprint != a.fingerprint
    if a.num_nodes > 2:
        fewer_classes = Taxonomy(edges, nodes=names, classes=[a.names[1]])
        assert fewer_classes.fingerprint != a.fingerprint
    if a.num_nodes > 1:
        renamed = Taxonomy([(p + "_", c + "_") for p, c in edges], nodes=[n + "_" for n in names])
        assert renamed.fingerprint != a.fingerprint


def test_fingerprint_depends_on_sibling_order() -> None:
    # Ids (and so head output layouts) change with sibling order: the fingerprint must too.
    a = Taxonomy([("r", "x"), ("r", "y")])
    b = Taxonomy([("r", "y"), ("r", "x")])
    assert a.names != b.names and a.fingerprint != b.fingerprint


def test_networkx_and_parents_round_trips() -> None:
    tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x")], display_names={"x": "Ex"})
    g = tax.to_networkx()
    assert g.nodes["x"]["display_name"] == "Ex" and g.nodes["x"]["id"] == tax.index("x")
    assert Taxonomy.from_networkx(g) == tax
    assert Taxonomy.from_networkx(g).display_names == tax.display_names
    fp = Taxonomy.from_parents({"r": None, "a": "r", "b": "r", "x": ["a", "b"]})
    assert fp == tax


def test_single_node_and_virtual_root() -> None:
    one = Taxonomy([], nodes=["only"])
    assert one.num_nodes == 1 and one.height == 0 and one.leaves.tolist() == [0]
    assert one.classes.tolist() == [0]
    vr = Taxonomy([("a", "x"), ("b", "y")], virtual_root="ROOT")
    assert vr.names[0] == "ROOT" and vr.virtual_root == "ROOT"
    assert vr.parents(vr.index("a")) == (0,)
    assert 0 not in vr.classes.tolist()
    plain = Taxonomy([("a", "x")], virtual_root="ROOT")
    assert plain.virtual_root is None and plain.names[0] == "a"


def test_counts_beyond_int8() -> None:
    # The ancestor matrix is int8: counts over it must not overflow.
    star = Taxonomy([("r", f"l{i}") for i in range(300)])
    assert star.subtree_size[0] == 301 and star.num_leaves_under[0] == 300
    chain = Taxonomy([(f"n{i}", f"n{i + 1}") for i in range(300)])
    assert chain.height == 300 and chain.subtree_size[0] == 301 and chain.distance(300, 0) == 300
    wide = Taxonomy([("r", "a"), ("r", "b")] + [(p, f"x{i}") for i in range(200) for p in ("a", "b")])
    assert wide.subtree_size[0] == 203
    np.testing.assert_allclose(wide.marginals(np.full(200, 1 / 200))[:3], 1.0, rtol=1e-6)


def test_stats() -> None:
    tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y")])
    s = tax.stats()
    assert s["nodes"] == 5 and s["edges"] == 5 and s["leaves"] == 2 and s["kind"] == "dag"
    assert s["multi_parent_nodes"] == 1 and s["height"] == 2
    assert s["nodes_per_depth"] == [1, 2, 2] and s["fingerprint"] == tax.fingerprint
    assert s["max_children"] == 2 and s["classes"] == 4


# ---------------------------------------------------------------------------------------------- validation
def test_empty() -> None:
    with pytest.raises(TaxonomyError, match="empty"):
        Taxonomy([])


def test_self_loop_names_location() -> None:
    with pytest.raises(TaxonomyError, match="self-loop") as err:
        Taxonomy([("r", "a"), ("a", "a")], locations=["t.tsv:1", "t.tsv:2"])
    assert err.value.source == "t.tsv" and err.value.line == 2 and err.value.label == "a"
    assert str(err.value).startswith("t.tsv:2:")


def test_duplicate_edge_names_both_lines() -> None:
    with pytest.raises(TaxonomyError, match=r"duplicate edge .*first at t.tsv:1") as err:
        Taxonomy([("r", "a"), ("r", "b"), ("r", "a")], locations=["t.tsv:1", "t.tsv:2", "t.tsv:3"])
    assert err.value.line == 3


def test_cycle_names_location() -> None:
    with pytest.raises(TaxonomyError, match="cycle") as err:
        Taxonomy([("r", "a"), ("a", "b"), ("b", "c"), ("c", "a")], locations=[f"f:{i}" for i in range(1, 5)])
    assert err.value.source == "f" and err.value.line in (2, 3, 4)
    with pytest.raises(TaxonomyError, match="cycle"):
        Taxonomy([("a", "b"), ("b", "a")])  # no root at all


def test_several_roots_suggest_virtual_root() -> None:
    with pytest.raises(TaxonomyError, match=r"2 roots .*virtual_root="):
        Taxonomy([("a", "x"), ("b", "y")])
    with pytest.raises(TaxonomyError, match="already a node"):
        Taxonomy([("a", "x"), ("b", "y")], virtual_root="x")


def test_unknown_and_duplicate_nodes() -> None:
    with pytest.raises(TaxonomyError, match="unknown node 'z'"):
        Taxonomy([("r", "a"), ("a", "z")], nodes=["r", "a"])
    with pytest.raises(TaxonomyError, match="duplicate node 'a'"):
        Taxonomy([("r", "a")], nodes=["r", "a", "a"])
    with pytest.raises(TaxonomyError, match="class 'q'"):
        Taxonomy([("r", "a")], classes=["q"])
    with pytest.raises(TaxonomyError, match="display_names"):
        Taxonomy([("r", "a")], display_names={"q": "Q"})
    with pytest.raises(ValueError, match="locations"):
        Taxonomy([("r", "a")], locations=["x:1", "x:2"])


def test_unknown_label_suggests_close_names() -> None:
    tax = Taxonomy([("root", "animal"), ("animal", "cat")])
    with pytest.raises(TaxonomyError, match="did you mean 'animal'"):
        tax.index("animl")


def test_parent_on_dag_is_an_error() -> None:
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x")])
    with pytest.raises(TaxonomyError, match="to_tree"):
        _ = dag.parent

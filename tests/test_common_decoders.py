"""A common suite over every registered decoder (the contract of docs/decoding.md).

Rules are enumerated from the registry; :data:`REFERENCES` holds an independent per-sample brute force of each
(networkx distances, enumeration of ancestor-closed sets), written with the documented tie rule: values within
``TIE_RTOL * max(1, |best|)`` of the best are tied, the smallest node id (the smallest set, then the smallest
ids) wins. A decoder registered without a reference fails :func:`test_every_decoder_has_a_reference`.
"""

from __future__ import annotations

import inspect
import itertools
import math

import networkx as nx
import numpy as np
import pytest
import torch
from _generators import node_probs, random_tree, sample_case, symmetric_tree

from hiercls.decode import RULES, SET_RULES, TIE_RTOL, ProbabilityError, bayes_node, decode, expected_cost
from hiercls.taxonomy import Taxonomy

OPTIONS: dict[str, dict[str, object]] = {"bayes_node": {"cost": "lca_height"}}
NAMES = sorted(RULES)
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def run(rule: str, probs: object, tax: Taxonomy, **kw: object) -> object:
    return decode(probs, tax, rule, **{**OPTIONS.get(rule, {}), **kw})


# ------------------------------------------------------------------------------------------ references
def tied_first(values: list[float], *, minimize: bool = False) -> int:
    """The tie rule on a list: the first index within TIE_RTOL of the best."""
    best = min(values) if minimize else max(values)
    margin = TIE_RTOL * max(1.0, abs(best))
    return next(i for i, v in enumerate(values) if (v <= best + margin if minimize else v >= best - margin))


def graph(tax: Taxonomy) -> nx.DiGraph:
    g = nx.DiGraph([(tax.index(p), tax.index(c)) for p, c in tax.edge_list(names=True)])
    g.add_nodes_from(range(tax.num_nodes))
    return g


def leaves_of(tax: Taxonomy) -> list[int]:
    return [n for n in range(tax.num_nodes) if not tax.children(n)]


def best_child(tax: Taxonomy, row: np.ndarray, u: int) -> int:
    kids = sorted(tax.children(u))
    return kids[tied_first([row[k] for k in kids])]


def ref_top_down(tax: Taxonomy, row: np.ndarray, threshold: float = 0.0) -> int:
    cur = 0
    while tax.children(cur):
        c = best_child(tax, row, cur)
        if (row[c] / row[cur] if row[cur] > 0 else 0.0) < threshold or row[c] <= 0:
            break
        cur = c
    return cur


def ref_plurality(tax: Taxonomy, row: np.ndarray) -> int:
    cur, m = 0, 0.0
    while tax.children(cur):
        kids = sorted(tax.children(cur))
        c = best_child(tax, row, cur)
        if len(kids) > 1:
            m = max(m, max(row[k] for k in kids if k != c))
            if row[c] < m - TIE_RTOL * max(1.0, m):
                break
        if row[c] <= 0:
            break
        cur = c
    return cur


def ref_deepest_above(tax: Taxonomy, row: np.ndarray, t: float, key: np.ndarray) -> int:
    above = [n for n in range(tax.num_nodes) if row[n] > t]
    if not above:
        return 0
    top = max(key[n] for n in above)
    best = [n for n in above if key[n] == top]
    return best[tied_first([row[n] for n in best])]


def information_content(tax: Taxonomy) -> np.ndarray:
    g = graph(tax)
    under = [sum(1 for d in nx.descendants(g, n) | {n} if g.out_degree(d) == 0) for n in range(tax.num_nodes)]
    return np.array([math.log(len(leaves_of(tax))) - math.log(u) for u in under])


def ref_info_gain(tax: Taxonomy, row: np.ndarray, lam: float = 0.0) -> int:
    ic = information_content(tax)
    return tied_first([(ic[n] + lam) * row[n] for n in range(tax.num_nodes)])


def ref_hie(tax: Taxonomy, row: np.ndarray) -> int:
    leaves = leaves_of(tax)
    return leaves[tied_first([row[x] * row[max(tax.parent[x], 0)] for x in leaves])]


def distances(tax: Taxonomy, kind: str) -> np.ndarray:
    """Pairwise tree distances from networkx (LCA from ancestor sets)."""
    g = graph(tax)
    depth = nx.shortest_path_length(g, 0)
    anc = {n: nx.ancestors(g, n) | {n} for n in g}
    h = max(depth.values())
    n = tax.num_nodes
    out = np.zeros((n, n))
    for a, b in itertools.permutations(range(n), 2):
        lca = max(anc[a] & anc[b], key=lambda x: depth[x])
        out[a, b] = depth[a] + depth[b] - 2 * depth[lca] if kind == "shortest_path" else h - depth[lca]
    return out


def label_distribution(tax: Taxonomy, row: np.ndarray) -> np.ndarray:
    """Solve ``P = p A`` with A from networkx (A[y, n] = 1: n is an ancestor-or-self of y)."""
    g = graph(tax)
    a = np.eye(tax.num_nodes)
    for y in range(tax.num_nodes):
        a[y, list(nx.ancestors(g, y))] = 1
    return np.clip(np.linalg.solve(a.T, row), 0, None)


def ref_bayes(tax: Taxonomy, row: np.ndarray, cost: str = "shortest_path", leaves_only: bool = False) -> int:
    exp = distances(tax, cost) @ label_distribution(tax, row)
    cand = leaves_of(tax) if leaves_only else list(range(tax.num_nodes))
    return cand[tied_first([exp[n] for n in cand], minimize=True)]


def ref_sets(tax: Taxonomy, row: np.ndarray, threshold: float = 0.5, close: bool = False) -> np.ndarray:
    keep = row > threshold
    keep[0] = True
    if close:
        g = graph(tax)
        for n in np.flatnonzero(keep):
            keep[list(nx.ancestors(g, int(n)))] = True
    return keep


def ref_optimal_hfbeta(tax: Taxonomy, row: np.ndarray, beta: float = 1.0) -> np.ndarray:
    """Every ancestor-closed set containing the root; the largest expected hF (root not counted), ties: the
    smallest set, then the smallest ids."""
    g = graph(tax)
    n = tax.num_nodes
    paths = [nx.ancestors(g, y) | {y} for y in range(n)]
    p = label_distribution(tax, row)
    scored = []
    for bits in itertools.product([False, True], repeat=n - 1):
        s = {0} | {i + 1 for i, bit in enumerate(bits) if bit}
        if any(not (nx.ancestors(g, m) <= s) for m in s):
            continue
        value = 0.0
        for y in range(n):
            inter, size_s, size_y = len((s & paths[y]) - {0}), len(s) - 1, len(paths[y]) - 1
            den = beta**2 * size_y + size_s
            value += p[y] * (1.0 if size_s == size_y == 0 else ((1 + beta**2) * inter / den if den else 0.0))
        scored.append((value, len(s), tuple(sorted(s))))
    top = max(v for v, _, _ in scored)
    tied = [c for c in scored if c[0] >= top - TIE_RTOL * max(1.0, abs(top))]
    best = min(tied, key=lambda c: (c[1], c[2]))
    out = np.zeros(n, dtype=bool)
    out[list(best[2])] = True
    return out


REFERENCES = {
    "argmax_leaf": lambda tax, row: leaves_of(tax)[tied_first([row[x] for x in leaves_of(tax)])],
    "top_down": ref_top_down,
    "plurality": ref_plurality,
    "threshold": lambda tax, row: ref_deepest_above(tax, row, 0.5, np.asarray(tax.depth)),
    "majority": lambda tax, row: ref_deepest_above(tax, row, 0.5, np.asarray(tax.depth)),
    "max_info": lambda tax, row: ref_deepest_above(tax, row, 0.5, information_content(tax)),
    "info_gain": ref_info_gain,
    "hie": ref_hie,
    "bayes_node": lambda tax, row: ref_bayes(tax, row, "lca_height"),
    "crm": lambda tax, row: ref_bayes(tax, row, "lca_height", leaves_only=True),
    "threshold_set": ref_sets,
    "chmcnn": lambda tax, row: ref_sets(tax, row, close=True),
    "optimal_hfbeta": ref_optimal_hfbeta,
}
DAG_RULES = {"argmax_leaf", "top_down", "plurality", "threshold", "majority", "max_info", "info_gain", "threshold_set",
             "chmcnn"}  # fmt: skip


def test_every_decoder_has_a_reference() -> None:
    assert set(REFERENCES) == set(RULES)
    assert set(OPTIONS) <= set(RULES) and set(RULES) >= SET_RULES


@pytest.mark.parametrize("rule", NAMES)
def test_brute_force_on_tiny_taxonomies(rule: str) -> None:
    """Random tiny trees and DAGs, probabilities often quantised (ties between nodes are common)."""
    rng = np.random.default_rng(sorted(RULES).index(rule))
    for _ in range(60):
        dag = rule in DAG_RULES and rng.random() < 0.3
        tax, _a, _p, node = sample_case(rng, dag=dag)
        got = run(rule, node, tax)
        for b, row in enumerate(node):
            want = REFERENCES[rule](tax, row)
            assert np.array_equal(got[b], want), (rule, row.tolist(), tax.edge_list(names=True))


@pytest.mark.parametrize("rule", sorted(set(NAMES) - set(SET_RULES)))
def test_exact_ties_go_to_the_smallest_id(rule: str) -> None:
    """Uniform leaf probabilities on a symmetric tree: every node of one depth has the same value, computed by the
    same operations: the smallest id of the chosen depth wins, in every row."""
    tax = symmetric_tree()
    leaf = np.full((3, len(tax.leaves)), 1.0 / len(tax.leaves))
    out = run(rule, tax.marginals(leaf), tax)
    depth = np.asarray(tax.depth)
    assert (out == out[0]).all()
    assert out[0] == np.flatnonzero(depth == depth[out[0]]).min()
    assert out[0] == REFERENCES[rule](tax, tax.marginals(leaf)[0])


def test_beta_zero_refused_and_recall_breaks_precision_ties() -> None:
    """beta = 0 scores precision alone, under which {r, x}, {r, y} and {r, x, y} tie exactly on a star with
    P(x) = P(y): it is refused (issue 28). Any beta > 0 adds recall, so the union is strictly best:
    (1 + b2) * 0.8 / (b2 + 2) > 0.4 = (1 + b2) * 0.4 / (b2 + 1)."""
    tax = Taxonomy([("r", "x"), ("r", "y"), ("r", "z")])
    probs = np.array([[1.0, 0.4, 0.4, 0.2]])
    assert decode(probs, tax, "optimal_hfbeta", beta=1e-3).tolist() == [[True, True, True, False]]
    with pytest.raises(ValueError, match="beta must be a finite number > 0; got 0"):
        decode(probs, tax, "optimal_hfbeta", beta=0.0)


@pytest.mark.parametrize("cost", ["shortest_path", "lca_height", "wu_palmer", "zhao"])
def test_bayes_ties_do_not_depend_on_return_cost(cost: str) -> None:
    """Expected costs that tie up to round-off (every node of ``r -> a -> x, r -> b`` with labels x, b at 1/2 under
    the shortest path; quantised leaf probabilities) give one answer with or without ``return_cost``, and the
    returned cost is that node's expected cost."""
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    leaf = np.round(np.random.default_rng(0).dirichlet(np.ones(3), 40) * 10)
    leaf = leaf[leaf.sum(1) > 0] / leaf[leaf.sum(1) > 0].sum(1, keepdims=True)
    node = np.vstack([[1.0, 0.5, 0.5, 0.0, 0.5], tax.marginals(leaf)])
    ids = bayes_node(node, tax, cost)
    ids2, costs = bayes_node(node, tax, cost, return_cost=True)
    assert np.array_equal(ids, ids2)
    assert np.allclose(costs, expected_cost(node, tax, cost)[np.arange(len(ids)), ids])
    if cost == "shortest_path":
        assert ids[0] == 0  # r, a, x and b all cost 1.5: the root


@pytest.mark.parametrize("rule", NAMES)
def test_numpy_in_numpy_out_shape_and_dtype(rule: str) -> None:
    tree = random_tree(15, 3)
    out = run(rule, node_probs(tree, np.random.default_rng(0), 9), tree)
    assert isinstance(out, np.ndarray)
    if rule in SET_RULES:
        assert out.shape == (9, tree.num_nodes) and out.dtype == np.bool_ and out[:, 0].all()
    else:
        assert out.shape == (9,) and out.dtype == np.int64 and ((out >= 0) & (out < tree.num_nodes)).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rule", NAMES)
def test_torch_round_trip_in_every_dtype(rule: str, dtype: torch.dtype, device: str) -> None:
    """A tensor in gives a tensor out on its device; low precision (a head under AMP) passes the checks; where
    the values are exact in the dtype (quarters) the answers are the float64 ones."""
    tree = random_tree(15, 3)
    leaf = np.random.default_rng(1).dirichlet(np.full(tree.num_leaves, 0.3), size=7)
    exact = tree.marginals(np.round(leaf * 4) / 4 / (np.round(leaf * 4) / 4).sum(1, keepdims=True))
    for probs, same in ((tree.marginals(leaf), dtype in (torch.float32, torch.float64)), (exact, True)):
        ref = run(rule, probs, tree)
        out = run(rule, torch.as_tensor(probs, device=device).to(dtype), tree)
        assert isinstance(out, torch.Tensor) and out.device.type == device
        assert out.dtype == (torch.bool if rule in SET_RULES else torch.int64)
        if same:
            assert np.array_equal(out.cpu().numpy(), ref)


@pytest.mark.parametrize("rule", NAMES)
def test_values_come_back_in_the_input_dtype(rule: str) -> None:
    tree = random_tree(12, 5)
    probs = torch.as_tensor(node_probs(tree, np.random.default_rng(2), 4), dtype=torch.float16)
    if rule == "bayes_node":
        assert bayes_node(probs, tree, return_cost=True)[1].dtype == torch.float16
    if rule == "optimal_hfbeta":
        assert decode(probs, tree, rule, return_value=True)[1].dtype == torch.float16


@pytest.mark.parametrize("rule", NAMES)
def test_layouts_integers_and_empty_batches(rule: str) -> None:
    """Node-major (Fortran) memory decodes as row-major; 0/1 integer and boolean inputs are probabilities; an
    empty batch gives an empty answer of the right type."""
    tree = random_tree(20, 4)
    probs = node_probs(tree, np.random.default_rng(3), 33)
    want = run(rule, probs, tree)
    assert np.array_equal(run(rule, np.asfortranarray(probs), tree), want)
    strided = probs.astype(np.float32)[::2]  # every other row: a view with gaps
    assert np.array_equal(run(rule, strided, tree), run(rule, np.ascontiguousarray(strided), tree))
    one_hot = tree.ancestors_sparse.toarray()[tree.leaves[:5]]
    for arr in (one_hot.astype(np.int64), one_hot.astype(bool), torch.as_tensor(one_hot, dtype=torch.int32)):
        out = run(rule, arr, tree)
        got = out.numpy() if isinstance(out, torch.Tensor) else out
        assert np.array_equal(got, run(rule, one_hot.astype(np.float64), tree))
    for empty in (np.zeros((0, tree.num_nodes)), torch.zeros(0, tree.num_nodes)):
        out = run(rule, empty, tree)
        assert tuple(out.shape) == ((0, tree.num_nodes) if rule in SET_RULES else (0,))


@pytest.mark.parametrize("rule", NAMES)
def test_rows_one_at_a_time_equal_the_batch(rule: str) -> None:
    tree = random_tree(15, 3)
    probs = node_probs(tree, np.random.default_rng(2), 11)
    whole = run(rule, probs, tree)
    rows = np.concatenate([run(rule, probs[i : i + 1], tree) for i in range(len(probs))])
    assert np.array_equal(rows, whole)
    assert np.array_equal(run(rule, probs[0], tree), whole[:1])  # one row [N]


@pytest.mark.parametrize("rule", [r for r in NAMES if "leaf_probs" in inspect.signature(RULES[r]).parameters])
def test_leaf_probs_equal_their_node_marginals(rule: str) -> None:
    tree = random_tree(15, 3)
    leaf = np.random.default_rng(4).dirichlet(np.full(len(tree.leaves), 0.5), size=8)
    by_leaf = run(rule, leaf, tree, leaf_probs=True)
    assert np.array_equal(by_leaf, run(rule, tree.marginals(leaf), tree))
    assert np.array_equal(run(rule, torch.as_tensor(leaf), tree, leaf_probs=True).numpy(), by_leaf)


@pytest.mark.parametrize("rule", NAMES)
def test_refusals_name_the_row(rule: str) -> None:
    """Every decoder refuses NaN and out-of-range values naming the caller's row; node-probability rules refuse a
    child above its parent; ``check=False`` keeps refusing NaN and negatives."""
    tree = random_tree(15, 3)
    probs = node_probs(tree, np.random.default_rng(5), 40)
    bad = probs.copy()
    bad[37, 4] = 1.5
    with pytest.raises(ProbabilityError, match="row 37"):
        run(rule, bad, tree)
    if rule not in ("threshold_set", "chmcnn"):
        child = int(np.flatnonzero(tree.parent > 0)[0])
        bad = probs.copy()
        bad[21, child] = min(1.0, bad[21, tree.parent[child]] + 0.1)
        with pytest.raises(ProbabilityError, match=rf"row 21: node .*\(id {child}\)"):
            run(rule, bad, tree)
    for value, match in ((np.nan, "NaN"), (-0.01, "negative")):
        bad = probs.copy()
        bad[3, 2] = value
        with pytest.raises(ValueError, match=match):
            run(rule, bad, tree, check=False)

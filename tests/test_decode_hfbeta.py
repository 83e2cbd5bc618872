"""The optimal hF-beta decoder against brute force over every ancestor-closed set, and Monte-Carlo checks.

The references here are independent of hiercls.decode: ancestors come from networkx, hF from its
definition, the optimum from enumerating every ancestor-closed subset.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from _generators import ancestor_indicator, random_label_distribution, random_taxonomy

from hiercls.decode import expected_hfbeta, optimal_hfbeta
from hiercls.taxonomy import Taxonomy


# ------------------------------------------------------------------------------------------ references
def closed_subsets(a: np.ndarray, include_root: bool) -> np.ndarray:
    """Every ancestor-closed set as a boolean matrix; the root is always in the set."""
    n = a.shape[0]
    rows = []
    for bits in itertools.product([False, True], repeat=n - 1):
        s = np.array([True, *bits])
        # closed: each member's ancestors are members
        if np.all(a[s][:, ~s] == 0):
            rows.append(s)
    return np.array(rows)


#: beta = 0 (precision) is refused; this beta is precision up to value differences far inside TIE_RTOL, so the
#: exact ties of precision stay exact ties for the tie rule.
TINY_BETA = 1e-6


def brute_expected(subsets: np.ndarray, p: np.ndarray, a: np.ndarray, beta: float, include_root: bool) -> np.ndarray:
    """``E[hF]`` of each subset under each label distribution: ``[num_subsets, batch]``."""
    s = subsets.astype(float).copy()
    anc = a.copy()
    if not include_root:
        s[:, 0] = 0
        anc[:, 0] = 0
    inter = s @ anc.T  # [S, y]
    size_s = s.sum(1)[:, None]
    size_y = anc.sum(1)[None, :]
    b2 = beta * beta
    denom = b2 * size_y + size_s
    hf = np.where(denom > 0, (1 + b2) * inter / np.where(denom > 0, denom, 1), 0.0)
    hf = np.where((size_s == 0) & (size_y == 0), 1.0, hf)
    return hf @ p.T


# ------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("dag", [False, True])
def test_optimal_hfbeta_matches_brute_force(dag: bool) -> None:
    rng = np.random.default_rng(1234 + dag)
    trials = 1500 if not dag else 500
    for trial in range(trials):
        n = int(rng.integers(1, 10))
        tax = random_taxonomy(rng, n, dag=dag)
        a = ancestor_indicator(tax)
        p = random_label_distribution(rng, n, tax.leaves, batch=4)
        node_probs = p @ a  # P(n) = sum of p(y) over labels y below n
        beta = float(rng.choice([TINY_BETA, 0.5, 1.0, 2.0, 4.0]))
        include_root = bool(rng.random() < 0.3)
        c0 = int(rng.choice([1, 2, 3, 64]))
        subsets = closed_subsets(a, include_root)
        exp = brute_expected(subsets, p, a, beta, include_root)
        best = exp.max(0)
        sets, value = optimal_hfbeta(
            node_probs, tax, beta, include_root=include_root, return_value=True, initial_candidates=c0
        )
        ctx = f"trial {trial} n={n} beta={beta} include_root={include_root} c0={c0} p={p.round(3).tolist()}"
        assert sets.dtype == bool and sets.shape == (4, n)
        assert sets[:, 0].all(), ctx
        own = brute_expected(sets, p, a, beta, include_root)
        achieved = own[np.arange(4), np.arange(4)]
        np.testing.assert_allclose(achieved, best, atol=1e-9, err_msg=ctx)
        np.testing.assert_allclose(value, best, atol=1e-9, err_msg=ctx)
        for s in sets:  # ancestor-closed
            assert np.all(a[s][:, ~s] == 0), ctx


def test_leaf_probabilities_input_matches_node_input() -> None:
    rng = np.random.default_rng(7)
    for _ in range(100):
        tax = random_taxonomy(rng, int(rng.integers(2, 10)))
        leaf = rng.dirichlet(np.ones(tax.num_leaves), size=3)
        node = np.asarray(tax.marginals(leaf))
        _s1, v1 = optimal_hfbeta(leaf, tax, 1.5, leaf_probs=True, return_value=True)
        _s2, v2 = optimal_hfbeta(node, tax, 1.5, return_value=True)
        np.testing.assert_allclose(v1, v2, atol=1e-9)


def test_expected_hfbeta_agrees_with_monte_carlo() -> None:
    rng = np.random.default_rng(3)
    for _ in range(5):
        tax = random_taxonomy(rng, 9)
        a = ancestor_indicator(tax)
        p = random_label_distribution(rng, 9, tax.leaves, batch=1)[0]
        s = closed_subsets(a, False)[rng.integers(0, len(closed_subsets(a, False)))]
        exact = float(expected_hfbeta(s[None], (p @ a)[None], tax, beta=2.0)[0])
        ys = rng.choice(9, size=40000, p=p)
        member = a[ys].astype(bool)  # label paths of the sampled labels
        member[:, 0] = False
        pred = s.copy()
        pred[0] = False
        inter = (member & pred).sum(1)
        size_y, size_s = member.sum(1), pred.sum()
        denom = 4.0 * size_y + size_s
        hf = np.where(denom > 0, 5.0 * inter / np.where(denom > 0, denom, 1), 0.0)
        hf = np.where((size_y == 0) & (size_s == 0), 1.0, hf)
        # 40k samples of a [0, 1] variable: standard error <= 0.0025
        assert abs(hf.mean() - exact) < 0.0125


def test_expected_hfbeta_matches_brute_force_formula() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        tax = random_taxonomy(rng, n, dag=bool(rng.random() < 0.5))
        a = ancestor_indicator(tax)
        p = random_label_distribution(rng, n, tax.leaves, batch=2)
        subsets = closed_subsets(a, False)
        for include_root in (False, True):
            ref = brute_expected(subsets, p, a, 1.7, include_root)
            for b in range(2):
                got = expected_hfbeta(
                    subsets, np.repeat((p @ a)[b : b + 1], len(subsets), 0), tax, 1.7, include_root=include_root
                )
                np.testing.assert_allclose(got, ref[:, b], atol=1e-9)


def test_multi_branch_optimum_and_example() -> None:
    tax = Taxonomy([("r", "animal"), ("animal", "cat"), ("animal", "dog"), ("r", "car")])
    probs = np.array([[1.0, 1.0, 0.5, 0.5, 0.0]])
    sets = optimal_hfbeta(probs, tax, beta=4.0)
    assert [tax.name_of(i) for i in np.flatnonzero(sets[0])] == ["r", "animal", "cat", "dog"]
    sets = optimal_hfbeta(probs, tax, beta=0.5)
    assert [tax.name_of(i) for i in np.flatnonzero(sets[0])] == ["r", "animal"]


def test_unbalanced_tree_deep_branch_wins() -> None:
    """A deep chain next to a shallow leaf: a bound assuming balanced depth would cut the deep answer."""
    edges = [("r", "s")] + [(f"c{i}", f"c{i + 1}") for i in range(11)] + [("r", "c0")]
    tax = Taxonomy(edges)
    leaf = np.zeros(tax.num_leaves)
    leaf[list(tax.leaves).index(tax.index("c11"))] = 0.6
    leaf[list(tax.leaves).index(tax.index("s"))] = 0.4
    sets, value = optimal_hfbeta(leaf[None], tax, beta=1.0, leaf_probs=True, return_value=True)
    a = ancestor_indicator(tax)
    subsets = closed_subsets(a, False) if tax.num_nodes <= 14 else None
    ref = brute_expected(subsets, np.asarray(tax.marginals(leaf[None])) @ np.linalg.inv(a), a, 1.0, False).max()
    assert value[0] == pytest.approx(ref, abs=1e-9)
    assert sets[0, tax.index("c11")]


def test_torch_and_numpy_agree_and_dtypes() -> None:
    rng = np.random.default_rng(5)
    tax = random_taxonomy(rng, 9)
    a = ancestor_indicator(tax)
    p = random_label_distribution(rng, 9, tax.leaves, batch=6)
    node = p @ a
    s_np, v_np = optimal_hfbeta(node, tax, return_value=True)
    for dt in (torch.float32, torch.float64):
        s_t, v_t = optimal_hfbeta(torch.tensor(node, dtype=dt), tax, return_value=True)
        assert isinstance(s_t, torch.Tensor) and s_t.dtype == torch.bool and v_t.dtype == dt
        np.testing.assert_allclose(v_t.numpy(), v_np, atol=1e-6)
    _s32, v32 = optimal_hfbeta(node.astype(np.float32), tax, return_value=True)
    np.testing.assert_allclose(v32, v_np, atol=1e-6)
    e = expected_hfbeta(torch.from_numpy(s_np), torch.tensor(node), tax)
    np.testing.assert_allclose(e.numpy(), v_np, atol=1e-9)


def test_empty_batch_single_node_and_errors() -> None:
    tax = Taxonomy([("r", "a"), ("r", "b")])
    s, v = optimal_hfbeta(np.zeros((0, 3)), tax, return_value=True)
    assert s.shape == (0, 3) and v.shape == (0,)
    one = Taxonomy([], nodes=["only"])
    s, v = optimal_hfbeta(np.ones((2, 1)), one, return_value=True)
    assert s.tolist() == [[True], [True]] and v.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="beta"):
        optimal_hfbeta(np.ones((1, 3)), tax, beta=-1)
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        optimal_hfbeta(np.ones((1, 4)), tax)
    with pytest.raises(ValueError, match="leaf_probs=True"):
        optimal_hfbeta(np.ones((1, 2)), tax)
    with pytest.raises(ValueError, match="initial_candidates"):
        optimal_hfbeta(np.ones((1, 3)), tax, initial_candidates=0)


def test_large_tree_escalation_agrees_with_full_search() -> None:
    """On a 400-node random tree, a tiny first candidate set must give the same optimum as all nodes."""
    rng = np.random.default_rng(9)
    parents = {"n0": None, **{f"n{i}": f"n{int(rng.integers(max(0, i - 30), i))}" for i in range(1, 400)}}
    tax = Taxonomy.from_parents(parents)
    logits = rng.normal(size=(64, tax.num_leaves)) * rng.choice([0.5, 3.0, 8.0], size=(64, 1))
    leaf = np.exp(logits - logits.max(1, keepdims=True))
    leaf /= leaf.sum(1, keepdims=True)
    for beta in (0.5, 1.0, 2.0):
        _, v_small = optimal_hfbeta(leaf, tax, beta, leaf_probs=True, return_value=True, initial_candidates=2)
        s_all, v_all = optimal_hfbeta(
            leaf, tax, beta, leaf_probs=True, return_value=True, initial_candidates=tax.num_nodes
        )
        np.testing.assert_allclose(v_small, v_all, atol=1e-10)
        np.testing.assert_allclose(expected_hfbeta(s_all, leaf, tax, beta, leaf_probs=True), v_all, atol=1e-9)


# ------------------------------------------------------------------------------------------ worst-case trees
def chain_taxonomy(n: int) -> Taxonomy:
    return Taxonomy.from_parents({"n0": None, **{f"n{i}": f"n{i - 1}" for i in range(1, n)}})


def caterpillar_taxonomy(n: int) -> Taxonomy:
    """A spine with one leaf hanging off each spine node: deep (height ~ n/2) and unbalanced."""
    return Taxonomy.from_parents(
        {"n0": None, **{f"n{i}": f"n{max(0, i - 2) if i % 2 == 0 else max(0, i - 1)}" for i in range(1, n)}}
    )


def worst_case_distributions(rng: np.random.Generator, n: int, batch: int) -> np.ndarray:
    """Label distributions over all n nodes: near-uniform (the flat worst case), exactly uniform (ties
    everywhere), a softmax band around a random node, one-hot, and sparse Dirichlet."""
    out = np.zeros((batch, n))
    for b in range(batch):
        kind = b % 5
        if kind == 0:
            p = rng.dirichlet(np.full(n, 50.0))
        elif kind == 1:
            p = np.full(n, 1.0 / n)
        elif kind == 2:
            z = np.cumsum(rng.normal(size=n)) * 0.3
            z[rng.integers(0, n)] += rng.uniform(2, 8)
            p = np.exp(z - z.max())
        elif kind == 3:
            p = np.zeros(n)
            p[rng.integers(0, n)] = 1.0
        else:
            p = rng.dirichlet(np.full(n, 0.1))
        out[b] = p / p.sum()
    return out


@pytest.mark.parametrize("shape", ["chain", "star", "caterpillar"])
def test_small_worst_case_trees_match_brute_force(shape: str) -> None:
    """Every small chain, star and caterpillar with flat, uniform (ties everywhere), banded, one-hot and sparse
    label distributions; ``initial_candidates=1`` skips the threshold rounds (every node a candidate)."""
    rng = np.random.default_rng({"chain": 21, "star": 22, "caterpillar": 23}[shape])
    make = {"chain": chain_taxonomy, "caterpillar": caterpillar_taxonomy}.get(shape)
    for n in range(2, 12):
        tax = make(n) if make else Taxonomy.from_parents({"r": None, **{f"c{i}": "r" for i in range(n - 1)}})
        a = ancestor_indicator(tax)
        p = worst_case_distributions(rng, n, 10)
        if shape == "star":
            p[::2, 0] = 0.0  # leaf labels only on half the rows: one label size
            p[p.sum(1) == 0, 1] = 1.0
            p /= p.sum(1, keepdims=True)
        node_probs = p @ a
        for beta in (0.5, 1.0, 3.0):
            for include_root in (False, True):
                best = brute_expected(closed_subsets(a, include_root), p, a, beta, include_root).max(0)
                for c0 in (1, 64):
                    sets, value = optimal_hfbeta(
                        node_probs, tax, beta, include_root=include_root, return_value=True, initial_candidates=c0
                    )
                    ctx = f"{shape} n={n} beta={beta} include_root={include_root} c0={c0}"
                    np.testing.assert_allclose(value, best, atol=1e-9, err_msg=ctx)
                    own = brute_expected(sets, p, a, beta, include_root)[np.arange(len(p)), np.arange(len(p))]
                    np.testing.assert_allclose(own, best, atol=1e-9, err_msg=ctx)
                    for s in sets:
                        assert s[0] and np.all(a[s][:, ~s] == 0), ctx


def test_long_chain_against_every_prefix() -> None:
    """A 300-node chain (the deep path without any patching): the optimum over all 301 prefixes, independently."""
    rng = np.random.default_rng(31)
    n = 300
    tax = chain_taxonomy(n)
    p = worst_case_distributions(rng, n, 10)
    node_probs = np.cumsum(p[:, ::-1], axis=1)[:, ::-1]  # node i: label mass at depth >= i
    for beta in (0.5, 1.0, 2.0):
        for include_root in (False, True):
            b2 = beta * beta
            size = np.arange(n) + include_root  # |Y| of the label at depth y
            k = np.arange(0 if not include_root else 1, n + 1)  # counted nodes of each prefix
            inter = np.minimum(k[:, None], size[None, :])
            denom = b2 * size[None, :] + k[:, None]
            hf = np.where(denom > 0, (1 + b2) * inter / np.where(denom > 0, denom, 1), 1.0)
            exp = hf @ p.T  # [prefixes, batch]
            sets, value = optimal_hfbeta(node_probs, tax, beta, include_root=include_root, return_value=True)
            np.testing.assert_allclose(value, exp.max(0), atol=1e-12)
            # the set is a prefix, and the shortest of the optimal prefixes
            counted = sets.sum(1) - (0 if include_root else 1)
            assert np.all(sets == (np.arange(n)[None, :] < sets.sum(1)[:, None]))
            np.testing.assert_allclose(exp[counted - k[0], np.arange(len(p))], exp.max(0), atol=1e-12)


def test_wide_star_against_the_best_top_k() -> None:
    """A 2,000-child star (uniform: every child is optimal; random; a few large; one-hot), from the threshold
    rounds and from every node at once; the reference is the best top-k set for every k."""
    rng = np.random.default_rng(41)
    n = 2000
    tax = Taxonomy.from_parents({"r": None, **{f"c{i}": "r" for i in range(n)}})
    leaf = np.stack(
        [np.full(n, 1.0 / n), rng.dirichlet(np.full(n, 50.0)), rng.dirichlet(np.full(n, 0.05)), np.eye(n)[7]]
    )
    node_probs = np.asarray(tax.marginals(leaf))
    for beta in (0.5, 1.0, 4.0):
        # Reference: on a star every size-k set's value is a sum of k child weights, so the best is the top k.
        order = np.argsort(-leaf, axis=1, kind="stable")
        top = np.cumsum(leaf[np.arange(len(leaf))[:, None], order], axis=1)
        ref = ((1 + beta**2) * top / (beta**2 + np.arange(1, n + 1))).max(1)
        for c0 in (1, 64):
            sets, value = optimal_hfbeta(node_probs, tax, beta, return_value=True, initial_candidates=c0)
            # The tie margin is absolute (1e-9 at values <= 1): the uniform star's sizes are tied that closely.
            np.testing.assert_allclose(value, ref, rtol=1e-12, atol=1e-9)
            np.testing.assert_allclose(expected_hfbeta(sets, node_probs, tax, beta), ref, rtol=1e-12, atol=1e-9)
        # Uniform children: predicting all of them is optimal for beta >= 1; at 2,000 children the sizes within a
        # few of 2,000 are worth less by under the tie margin, so the smallest of those wins.
        assert sets[0].sum() > n - 5 or beta < 1


def test_deep_branching_trees_against_the_per_size_optimum() -> None:
    """Deep caterpillars and random deep trees (height ~40-60) with flat, banded and sparse label distributions:
    the optimum equals the unpruned per-size maximum, from the threshold rounds and from every node at once."""
    rng = np.random.default_rng(51)
    for trial in range(4):
        n = 120
        if trial % 2:
            tax = caterpillar_taxonomy(n)
        else:
            tax = Taxonomy.from_parents(
                {"n0": None, **{f"n{i}": f"n{int(rng.integers(max(0, i - 3), i))}" for i in range(1, n)}}
            )
        p = worst_case_distributions(rng, n, 5)
        if trial == 3:  # leaf labels only
            leaf = p[:, tax.leaves] + 1e-3
            node_probs = np.asarray(tax.marginals(leaf / leaf.sum(1, keepdims=True)))
        else:
            node_probs = p @ ancestor_indicator(tax)
        for beta in (0.5, 2.0):
            want = _per_size_optimum(node_probs, tax, beta, False)
            for c0 in (1, 64):
                s, v = optimal_hfbeta(node_probs, tax, beta, return_value=True, initial_candidates=c0)
                np.testing.assert_allclose(v, want, atol=1e-9)
                np.testing.assert_allclose(expected_hfbeta(s, node_probs, tax, beta), want, atol=1e-9)


# ------------------------------------------------------------------------------------------ the tie rule
def _names(tax: Taxonomy, sets: np.ndarray) -> list[list[str]]:
    return [[tax.name_of(i) for i in np.flatnonzero(s)] for s in np.asarray(sets)]


def test_exact_ties_go_to_the_smaller_set_then_the_smaller_ids() -> None:
    """Constructed symmetric posteriors whose optimal sets tie exactly (in real numbers)."""
    # A star with children 0.5, 0.25, 0.25 at beta = 1: every size is worth 0.5, so one child wins.
    star = Taxonomy([("r", "x"), ("r", "y"), ("r", "z")])
    sets, value = optimal_hfbeta(np.array([[1.0, 0.5, 0.25, 0.25]]), star, 1.0, return_value=True)
    assert _names(star, sets) == [["r", "x"]] and value[0] == pytest.approx(0.5, abs=1e-12)
    # Four equal children at beta = 1 are worth 2k/(4(1+k)): growing, all four win (no tie).
    assert _names(star, optimal_hfbeta(np.array([[1.0, 1 / 3, 1 / 3, 1 / 3]]), star, 1.0)) == [["r", "x", "y", "z"]]
    # Half the mass on the root label: the empty prediction (0.5) ties with {x} (2 * 0.5 / 2): the root alone wins.
    sets = optimal_hfbeta(np.array([[1.0, 0.5, 0.0, 0.0]]), star, 1.0)
    assert _names(star, sets) == [["r"]]
    # Two symmetric subtrees at beta ~ 0 (precision): {a}, {b} and {a, b} are all worth 0.5: the single node with
    # the smaller id wins, whichever of the two names holds it.
    for first in ("a", "b"):
        second = "b" if first == "a" else "a"
        tax = Taxonomy(
            [("r", first), ("r", second)] + [(p, f"{p}{i}") for p in (first, second) for i in (1, 2)],
            nodes=["r", first, second, f"{first}1", f"{first}2", f"{second}1", f"{second}2"],
        )
        leaf = np.full((1, 4), 0.25)
        sets, value = optimal_hfbeta(leaf, tax, TINY_BETA, leaf_probs=True, return_value=True)
        assert _names(tax, sets) == [["r", first]] and value[0] == pytest.approx(0.5, abs=1e-12)
        # beta = 0.25: the two sibling leaves under the smaller id tie with the other pair at every size.
        sets = optimal_hfbeta(leaf, tax, 0.25, leaf_probs=True)
        chosen = _names(tax, sets)[0]
        assert first in chosen and np.all(ancestor_indicator(tax)[sets[0]][:, ~sets[0]] == 0)
        if second in chosen:  # both subtrees: then the leaves taken first are the smaller ids'
            assert not (f"{second}1" in chosen and f"{first}1" not in chosen)


def test_exact_ties_on_a_dag() -> None:
    """A diamond r -> {a, b} -> c with the label mass split evenly between a and b, at beta ~ 0: {a}, {b} and
    {a, b} are worth 0.5, the single node with the smaller id wins (beta = 0 is refused: a tiny beta is
    precision up to differences far inside the tie tolerance)."""
    tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "c"), ("b", "c")])
    probs = np.array([[1.0, 0.5, 0.5, 0.0]])
    sets, value = optimal_hfbeta(probs, tax, TINY_BETA, return_value=True)
    assert _names(tax, sets) == [["r", "a"]] and value[0] == pytest.approx(0.5, abs=1e-12)


def test_random_ties_agree_with_the_brute_force_tie_rule() -> None:
    """Quantised label distributions (many exact ties) on tiny trees and DAGs: the chosen set is the smallest of
    the optimal ones, and among those of its size the one whose sorted ids come first."""
    rng = np.random.default_rng(77)
    for trial in range(300):
        n = int(rng.integers(2, 8))
        tax = random_taxonomy(rng, n, dag=bool(trial % 3 == 0))
        a = ancestor_indicator(tax)
        p = np.zeros((1, n))
        p[0, rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)] = rng.integers(1, 3, size=1)
        p /= p.sum()
        beta = float(rng.choice([TINY_BETA, 0.5, 1.0, 2.0]))
        subsets = closed_subsets(a, False)
        exp = brute_expected(subsets, p, a, beta, False)[:, 0]
        tied = subsets[exp >= exp.max() - 1e-9]
        size = tied.sum(1)
        smallest = tied[size == size.min()]
        want = min(smallest, key=lambda s: np.flatnonzero(s).tolist())
        got = optimal_hfbeta(p @ a, tax, beta)[0]
        ctx = f"trial {trial} beta={beta} p={p.round(3).tolist()} edges={tax.edge_list(names=True)}"
        assert got.sum() == size.min(), ctx
        np.testing.assert_array_equal(got, want, err_msg=ctx)


# ------------------------------------------------------------------------------------------ node-major block path
def _per_size_optimum(node_probs: np.ndarray, tax: Taxonomy, beta: float, include_root: bool) -> np.ndarray:
    """``max_k V_k`` from every node (no pruning), with ``V_k`` the sum of the ``k`` largest ``w_k``.

    Independent of hiercls.decode: the label distribution is ``P(n)`` minus its children (clipped at 0),
    ``q_m(n)`` sums it over the labels of size ``m`` below ``n`` with networkx ancestors.
    """
    a = ancestor_indicator(tax)  # a[y, n]: n is an ancestor-or-self of y
    n = tax.num_nodes
    children = np.zeros((n, n))
    for c in range(1, n):
        children[tax.parent[c], c] = 1.0
    p = np.clip(node_probs.astype(np.float64) - node_probs.astype(np.float64) @ children.T, 0.0, None)
    size = a.sum(1) - (0 if include_root else 1)  # |Y| of each label
    b2 = beta * beta
    counted = np.arange(n) >= (0 if include_root else 1)
    out = []
    for row in p:
        best = row[0] if not include_root else -np.inf  # the empty prediction: only the root label scores
        for k in range(1, int(counted.sum()) + 1):
            coef = np.where(size > 0, (1 + b2) / (b2 * size + k), 0.0)
            w = (a * (row * coef)[:, None]).sum(0)[counted]  # w_k(n) = sum over labels y below n
            best = max(best, float(np.sort(w)[::-1][:k].sum()))
        out.append(best)
    return np.array(out)


def test_block_path_pruning_matches_per_size_reference() -> None:
    """Concentrated posteriors on 20-150-node trees: the top-down candidates and their depth-wise outside bound
    prune most nodes; the optimum must equal the unpruned per-size maximum, in both layouts and from torch."""
    rng = np.random.default_rng(31)
    for trial in range(12):
        n = int(rng.integers(20, 150))
        parents = {"n0": None, **{f"n{i}": f"n{int(rng.integers(max(0, i - 8), i))}" for i in range(1, n)}}
        tax = Taxonomy.from_parents(parents)
        logits = rng.normal(size=(24, tax.num_leaves)) * rng.choice([0.3, 1.0, 3.0, 8.0], size=(24, 1))
        leaf = np.exp(logits - logits.max(1, keepdims=True))
        leaf /= leaf.sum(1, keepdims=True)
        node = np.asarray(tax.marginals(leaf))
        node[:4] = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.05), size=4)))
        for arr in (node, node.astype(np.float32)):
            beta = float(rng.choice([0.5, 1.0, 2.0, 4.0, 8.0]))
            include_root = bool(rng.random() < 0.3)
            want = _per_size_optimum(arr, tax, beta, include_root)
            sets, value = optimal_hfbeta(arr, tax, beta, include_root=include_root, return_value=True)
            ctx = f"trial {trial} n={n} beta={beta} include_root={include_root} {arr.dtype}"
            np.testing.assert_allclose(value, want, atol=1e-9, err_msg=ctx)
            achieved = expected_hfbeta(sets, arr, tax, beta, include_root=include_root)
            np.testing.assert_allclose(achieved, want, atol=1e-9, err_msg=ctx)
            a = ancestor_indicator(tax)
            for s in sets:
                assert s[0] and np.all(a[s][:, ~s] == 0), ctx
            np.testing.assert_array_equal(
                optimal_hfbeta(np.asfortranarray(arr), tax, beta, include_root=include_root), sets, err_msg=ctx
            )
            np.testing.assert_array_equal(
                optimal_hfbeta(torch.tensor(arr), tax, beta, include_root=include_root).numpy(), sets, err_msg=ctx
            )


def test_children_heavier_than_their_parent_are_refused_naming_the_row() -> None:
    """Every edge passes (no child above its parent) but two children sum past their parent: the label mass check
    names the row, in a later row block too; with the checks off the negative label mass is clipped to 0."""
    from hiercls.decode import ProbabilityError, probability_checks

    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    good = np.array([1.0, 0.9, 0.6, 0.3, 0.1])
    bad = np.array([1.0, 0.6, 0.5, 0.4, 0.4])  # x + y = 0.9 > a = 0.6
    probs = np.stack([good, good, bad]).astype(np.float32)
    with pytest.raises(ProbabilityError, match="row 2"):
        optimal_hfbeta(probs, tax)
    with probability_checks(False):
        sets, value = optimal_hfbeta(probs, tax, return_value=True)
    assert sets.shape == (3, 5) and np.isfinite(value).all()


def test_one_label_size_rows_match_the_per_size_optimum() -> None:
    """Balanced trees with leaf labels only (every label one size: the rows the decoder solves in closed form,
    without the search over sizes): random, peaked, uniform and quantised (tied) posteriors, with and without
    the root, against the unpruned per-size maximum; the tied rows pick the smallest optimal set, and among
    those of its size the smallest ids (brute force)."""
    rng = np.random.default_rng(61)
    for fanout in ((3, 2, 2), (5, 3), (12,), (3, 3), (2, 2, 2)):
        edges, level = [], ["r"]
        for width in fanout:
            nxt = [f"{u}.{i}" for u in level for i in range(width)]
            edges += [(u, f"{u}.{i}") for u in level for i in range(width)]
            level = nxt
        tax = Taxonomy(edges)
        leaves = tax.num_leaves
        leaf = np.concatenate(
            [
                rng.dirichlet(np.full(leaves, 0.3), size=6),
                rng.dirichlet(np.full(leaves, 20.0), size=3),
                np.full((1, leaves), 1.0 / leaves),
                np.eye(leaves)[:2],
                rng.integers(0, 3, size=(4, leaves)).astype(float) + np.eye(leaves)[:4],
            ]
        )
        leaf /= leaf.sum(1, keepdims=True)
        node = np.asarray(tax.marginals(leaf))
        a = ancestor_indicator(tax)
        for beta in (TINY_BETA, 0.5, 1.0, 3.0):
            for include_root in (False, True):
                want = _per_size_optimum(node, tax, beta, include_root)
                sets, value = optimal_hfbeta(node, tax, beta, include_root=include_root, return_value=True)
                ctx = f"fanout {fanout} beta={beta} include_root={include_root}"
                np.testing.assert_allclose(value, want, atol=1e-9, err_msg=ctx)
                achieved = expected_hfbeta(sets, node, tax, beta, include_root=include_root)
                np.testing.assert_allclose(achieved, want, atol=1e-9, err_msg=ctx)
                assert all(s[0] and np.all(a[s][:, ~s] == 0) for s in sets), ctx
        if tax.num_nodes <= 15:  # brute force over every ancestor-closed set: the tie rule
            p = node @ np.linalg.inv(a)
            subsets = closed_subsets(a, False)
            for beta in (0.5, 1.0, 2.0):
                exp = brute_expected(subsets, p, a, beta, False)
                got = optimal_hfbeta(node, tax, beta)
                for row in range(len(node)):
                    tied = subsets[exp[:, row] >= exp[:, row].max() - 1e-9]
                    smallest = tied[tied.sum(1) == tied.sum(1).min()]
                    want_set = min(smallest, key=lambda s: np.flatnonzero(s).tolist())
                    np.testing.assert_array_equal(got[row], want_set, err_msg=f"{fanout} beta={beta} row {row}")

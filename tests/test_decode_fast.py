"""The fast paths of the decoders against brute force and the general paths, and the scale cases of issue 10.

Closed forms (Bayes node for shortest-path cost, CRM/Bayes node for LCA height, on trees) are checked against
brute-force risks from independent networkx distances, with the documented tie rule (the smallest id among
costs within round-off), and against the general dense path where no ties occur. The scale cases (a 10,000-node
chain, a 100,000-child star) run every decoder on a handful of samples and check the answers against per-sample
references; no timing is asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _generators import chain, nx_tree_distance, sample_case, star

from hiercls.decode import RULES, SET_RULES, bayes_node, crm, decode, optimal_hfbeta, plurality, top_down
from hiercls.taxonomy import Taxonomy


def smallest_best(risk: np.ndarray, cols: np.ndarray) -> np.ndarray:
    best = risk[:, cols].min(1)
    return np.array([cols[np.flatnonzero(risk[b, cols] <= best[b] + 1e-9)[0]] for b in range(len(best))])


@pytest.mark.parametrize("kind", ["shortest_path", "lca_height"])
def test_tree_closed_forms_match_brute_force_with_ties(kind: str) -> None:
    rng = np.random.default_rng(11 if kind == "shortest_path" else 12)
    for _ in range(150):
        tax, _, p, node = sample_case(rng)  # quantised probabilities: many exact ties
        risk = p @ nx_tree_distance(tax, kind).T
        masks = {
            "all": np.arange(tax.num_nodes),
            "leaves": tax.leaves,
            "some": np.flatnonzero(rng.random(tax.num_nodes) < 0.5) if tax.num_nodes > 1 else np.array([0]),
        }
        for name, cols in masks.items():
            if cols.size == 0:
                continue
            cands = None if name == "all" else cols
            got = bayes_node(node, tax, kind, candidates=cands)
            np.testing.assert_array_equal(got, smallest_best(risk, cols), err_msg=f"{kind} {name}")
        np.testing.assert_array_equal(crm(node, tax, kind), smallest_best(risk, tax.leaves))


# ---------------------------------------------------------------------------------------------- scale
def chain_probs(n: int, rng: np.random.Generator, b: int) -> tuple[np.ndarray, np.ndarray]:
    p = rng.dirichlet(np.full(n, 0.5), size=b)  # label at depth m with probability p[:, m]
    return p, np.cumsum(p[:, ::-1], axis=1)[:, ::-1]  # P(node m) = P(depth >= m)


def star_probs(n: int, rng: np.random.Generator, b: int) -> tuple[np.ndarray, np.ndarray]:
    p = rng.dirichlet(np.full(n + 1, 0.5), size=b)
    node = p.copy()
    node[:, 0] = p.sum(1)
    return p, node


def hf_value_chain(p: np.ndarray, k: int, b2: float) -> float:
    m = np.arange(len(p), dtype=np.float64)  # |Y| of the label at depth m (root not counted)
    val = np.where(m > 0, (1 + b2) * np.minimum(k, m) / np.maximum(b2 * m + k, 1e-300), 0.0)
    return float((p * val).sum() + (p[0] if k == 0 else 0.0))


@pytest.fixture(scope="module")
def big_chain() -> Taxonomy:
    return chain(10_000)


@pytest.fixture(scope="module")
def big_star() -> Taxonomy:
    return star(100_000)


def test_descent_rules_on_a_deep_chain_and_a_wide_star(big_chain: Taxonomy, big_star: Taxonomy) -> None:
    rng = np.random.default_rng(3)
    for tax, probs in ((big_chain, chain_probs), (big_star, star_probs)):
        _, node = probs(tax.num_nodes - 1 if tax is big_star else tax.num_nodes, rng, 4)
        node = node.astype(np.float64)
        small = tax if tax is big_star else None
        td, pl = top_down(node, tax), plurality(node, tax)
        for b in range(node.shape[0]):
            row = node[b]
            if small is not None:  # the star: the best child directly
                kid = int(np.argmax(row[1:])) + 1
                assert td[b] == (kid if row[kid] > 0 else 0)
                assert pl[b] == td[b]  # the first family's runner-up never exceeds the best child
            else:  # the chain: every child is entered while its probability is positive
                assert td[b] == pl[b] == int(np.flatnonzero(row > 0).max())


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_decoder_runs_on_a_deep_chain_and_a_wide_star(rule: str, big_chain: Taxonomy, big_star: Taxonomy) -> None:
    rng = np.random.default_rng(5)
    opts = {"cost": "lca_height"} if rule == "bayes_node" else {}
    for tax, probs, n in ((big_chain, chain_probs, 10_000), (big_star, star_probs, 100_000)):
        if rule == "optimal_hfbeta" and tax is big_chain:
            continue  # O(N * sizes tried) per sample on a chain: the 3,000-node chain below
        _, node = probs(n, rng, 3)
        out = decode(node, tax, rule, **opts)
        if rule in SET_RULES:
            assert out.shape == node.shape and out[:, 0].all()
        else:
            assert out.shape == (3,) and ((out >= 0) & (out < tax.num_nodes)).all()


def test_optimal_hfbeta_on_a_deep_chain_is_the_best_prefix() -> None:
    rng = np.random.default_rng(6)
    big_chain = chain(3_000)
    p, node = chain_probs(big_chain.num_nodes, rng, 2)
    for beta in (1.0, 2.0):
        sets, value = optimal_hfbeta(node, big_chain, beta=beta, return_value=True)
        for b in range(2):
            vals = [hf_value_chain(p[b], k, beta * beta) for k in range(big_chain.num_nodes)]
            k = int(sets[b].sum()) - 1
            assert sets[b, : k + 1].all()  # a prefix
            np.testing.assert_allclose(value[b], max(vals), atol=1e-9)
            np.testing.assert_allclose(vals[k], max(vals), atol=1e-9)


def test_optimal_hfbeta_on_a_wide_star_is_the_best_top_k(big_star: Taxonomy) -> None:
    rng = np.random.default_rng(7)
    n = big_star.num_nodes - 1
    p, node = star_probs(n, rng, 2)
    sets, value = optimal_hfbeta(node, big_star, beta=1.0, return_value=True)
    for b in range(2):
        sp = np.concatenate([[0.0], np.cumsum(np.sort(p[b, 1:])[::-1])])
        vals = 2.0 * sp / (1.0 + np.arange(n + 1))
        vals[0] = p[b, 0]  # the empty prediction scores the root label
        np.testing.assert_allclose(value[b], vals.max(), atol=1e-9)
        chosen = np.flatnonzero(sets[b, 1:])
        np.testing.assert_allclose(vals[chosen.size], vals.max(), atol=1e-9)


# ---------------------------------------------------------------------------------------------- torch


def _chmcnn_brute(scores: np.ndarray, tax: Taxonomy, t: float) -> np.ndarray:
    """C-HMCNN by its definition: n is kept when max(P(d), d descendant-or-self of n) > t (the root always)."""
    out = np.zeros(scores.shape, dtype=bool)
    for n in range(tax.num_nodes):
        desc = [d for d in range(tax.num_nodes) if n in tax.path(d)]
        out[:, n] = scores[:, desc].max(1) > t
    out[:, 0] = True
    return out


@pytest.mark.parametrize("shape", ["random", "chain", "star", "caterpillar"])
def test_chmcnn_is_the_max_constraint_on_trees_and_chains(shape: str) -> None:
    rng = np.random.default_rng(31)
    n = 40
    if shape == "random":
        edges = [(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, n)]
    elif shape == "chain":
        edges = [(f"n{i - 1}", f"n{i}") for i in range(1, n)]
    elif shape == "star":
        edges = [("n0", f"n{i}") for i in range(1, n)]
    else:  # a spine with one leaf hanging off each spine node
        edges = [(f"s{i - 1}" if i > 1 else "n0", f"s{i}") for i in range(1, n // 2)]
        edges += [(f"s{i}", f"l{i}") for i in range(1, n // 2)]
    tax = Taxonomy(edges)
    scores = rng.uniform(size=(13, tax.num_nodes)) ** 3  # raw, incoherent scores: children above parents
    for t in (0.1, 0.5, 0.9):
        want = _chmcnn_brute(scores, tax, t)
        for arr in (scores, np.asfortranarray(scores), scores.astype(np.float32)):
            np.testing.assert_array_equal(decode(arr, tax, "chmcnn", threshold=t), want, err_msg=f"{shape} {t}")
        got = decode(torch.as_tensor(scores), tax, "chmcnn", threshold=t)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{shape} {t} torch")

"""A common suite over every decoder of :data:`hiercls.decode.RULES` (the contract of docs/decoding.md).

Rules are enumerated from ``RULES``; :data:`OPTIONS` only gives the options a rule cannot run without.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from _trees import random_tree

from hiercls.decode import RULES, SET_RULES, decode
from hiercls.taxonomy import Taxonomy

OPTIONS: dict[str, dict[str, object]] = {"bayes_node": {"cost": "lca_height"}}
NAMES = sorted(RULES)
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def node_probs(tax: Taxonomy, rng: np.random.Generator, b: int) -> np.ndarray:
    """Node probabilities of a label distribution over all nodes (labels may be internal): ``P = p A``."""
    p = rng.dirichlet(np.full(tax.num_nodes, 0.3), size=b)
    return p @ tax.ancestors_sparse.toarray()


def run(rule: str, probs: object, tax: Taxonomy, **kw: object) -> object:
    return decode(probs, tax, rule, **OPTIONS.get(rule, {}), **kw)


@pytest.fixture(scope="module")
def tree() -> Taxonomy:
    return random_tree(15, 3)


@pytest.mark.parametrize("rule", NAMES)
def test_numpy_in_numpy_out_shape_and_dtype(rule: str, tree: Taxonomy) -> None:
    probs = node_probs(tree, np.random.default_rng(0), 9)
    out = run(rule, probs, tree)
    assert isinstance(out, np.ndarray)
    if rule in SET_RULES:
        assert out.shape == (9, tree.num_nodes) and out.dtype == np.bool_
        assert out[:, 0].all()  # sets contain the root
    else:
        assert out.shape == (9,) and out.dtype == np.int64
        assert ((out >= 0) & (out < tree.num_nodes)).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rule", NAMES)
def test_torch_in_torch_out_on_the_input_device(rule: str, dtype: torch.dtype, device: str, tree: Taxonomy) -> None:
    probs = node_probs(tree, np.random.default_rng(1), 7)
    ref = run(rule, probs.astype(np.float32) if dtype == torch.float32 else probs, tree)
    out = run(rule, torch.as_tensor(probs, dtype=dtype, device=device), tree)
    assert isinstance(out, torch.Tensor) and out.device.type == device
    assert out.dtype == (torch.bool if rule in SET_RULES else torch.int64)
    assert np.array_equal(out.cpu().numpy(), ref)


@pytest.mark.parametrize("rule", NAMES)
def test_rows_one_at_a_time_equal_the_batch(rule: str, tree: Taxonomy) -> None:
    probs = node_probs(tree, np.random.default_rng(2), 11)
    whole = run(rule, probs, tree)
    rows = np.concatenate([run(rule, probs[i : i + 1], tree) for i in range(len(probs))])
    assert np.array_equal(rows, whole)
    perm = np.random.default_rng(3).permutation(len(probs))
    assert np.array_equal(run(rule, probs[perm], tree), whole[perm])


@pytest.mark.parametrize("rule", [r for r in NAMES if "leaf_probs" in inspect.signature(RULES[r]).parameters])
def test_leaf_probs_equal_their_node_marginals(rule: str, tree: Taxonomy) -> None:
    leaf = np.random.default_rng(4).dirichlet(np.full(len(tree.leaves), 0.5), size=8)
    by_leaf = run(rule, leaf, tree, leaf_probs=True)
    assert np.array_equal(by_leaf, run(rule, tree.marginals(leaf), tree))
    assert np.array_equal(run(rule, torch.as_tensor(leaf), tree, leaf_probs=True).numpy(), by_leaf)


def symmetric_tree() -> Taxonomy:
    """A complete binary tree of depth 3: every node of one depth is equivalent to every other."""
    edges = [("r", "a"), ("r", "b")]
    for u in ("a", "b"):
        edges += [(u, u + "0"), (u, u + "1")]
        for v in (u + "0", u + "1"):
            edges += [(v, v + "0"), (v, v + "1")]
    return Taxonomy(edges)


@pytest.mark.parametrize("rule", sorted(set(NAMES) - SET_RULES))
def test_ties_go_to_the_smallest_id(rule: str) -> None:
    """Uniform leaf probabilities on a symmetric tree: every node of the chosen depth ties, the smallest id wins."""
    tax = symmetric_tree()
    leaf = np.full((2, len(tax.leaves)), 1.0 / len(tax.leaves))
    out = run(rule, tax.marginals(leaf), tax)
    depth = np.asarray(tax.depth)
    assert out[0] == out[1]
    assert out[0] == np.flatnonzero(depth == depth[out[0]]).min()


def test_every_rule_is_covered() -> None:
    """The suite enumerates RULES; the options table names only rules that exist."""
    assert set(OPTIONS) <= set(RULES)
    assert SET_RULES.issubset(RULES)
    assert len(NAMES) >= 11

"""Expected costs of tensors (CPU, and CUDA when present): ``expected_cost``, ``bayes_node`` (any cost,
``return_cost``), ``crm``, ``prediction_expected_cost``, ``expected_hfbeta`` and ``optimal_hfbeta``, checked against
the definition ``sum_y p(y) cost(n, y)`` with the cost from ``Taxonomy.distance_matrix`` and the label distribution
built by hand; results come back on the tensor's device.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _generators import random_dag, random_tree

import hiercls.decode as D
from hiercls.decode import ProbabilityError
from hiercls.decode.inputs import label_distribution
from hiercls.taxonomy import Taxonomy, TaxonomyError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _probs(tax: Taxonomy, rows: int, seed: int, internal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(label distribution ``p [B, N]``, node probabilities ``P = p @ A``), some mass on internal nodes."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(tax.num_nodes, 0.3), rows)
    if not internal:
        p[:, ~tax.is_leaf] = 0.0
        p /= p.sum(1, keepdims=True)
    a = tax.ancestors_sparse.toarray().astype(np.float64)  # A[y, n] = 1: n is an ancestor-or-self of y
    return p, p @ a


def _brute_expected(tax: Taxonomy, p: np.ndarray, cost: object) -> np.ndarray:
    if isinstance(cost, str):
        return p @ tax.distance_matrix(cost, targets=np.arange(tax.num_nodes)).T
    mat = np.asarray(cost)
    return p[:, tax.leaves] @ mat.T if mat.shape[1] == tax.num_leaves else p @ mat.T


TREES = [random_tree(25, 1), random_tree(40, 2), random_dag(30, 3, extra=30 // 4)]
COSTS = [*D.COST_KINDS, "node_to_label", "node_to_leaf"]


def _cost(tax: Taxonomy, name: str, seed: int) -> object:
    rng = np.random.default_rng(seed)
    if name == "node_to_label":
        return torch.as_tensor(rng.random((tax.num_nodes, tax.num_nodes)))
    if name == "node_to_leaf":
        return rng.random((tax.num_nodes, tax.num_leaves))
    return name


@pytest.mark.parametrize("tree", range(len(TREES)), ids=["tree25", "tree40", "dag30"])
@pytest.mark.parametrize("name", COSTS)
def test_expected_cost_of_tensors_is_the_definition(tree: int, name: str) -> None:
    tax = TREES[tree]
    internal = name != "node_to_leaf"
    p, node = _probs(tax, 9, tree, internal=internal)
    cost = _cost(tax, name, tree)
    want = _brute_expected(tax, p, cost)
    x = torch.as_tensor(node, device=DEVICE)
    got = D.expected_cost(x, tax, cost)
    ids, best = D.bayes_node(x, tax, cost, return_cost=True)
    leaves_only, leaf_best = D.crm(x, tax, cost, return_cost=True)
    scored = D.prediction_expected_cost(x, ids, tax, cost)
    assert got.dtype == torch.float64 and got.shape == want.shape and got.device == x.device == ids.device
    got, ids, best, leaves_only, leaf_best, scored = (t.cpu() for t in (got, ids, best, leaves_only, leaf_best, scored))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    # the argmin of the definition (ties within round-off: either side of it is optimal)
    np.testing.assert_allclose(want[np.arange(len(p)), ids.numpy()], want.min(1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(best.numpy(), want.min(1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(scored.numpy(), best.numpy(), rtol=1e-12, atol=1e-14)
    on_leaves = want[:, tax.leaves]
    assert tax.is_leaf[leaves_only.numpy()].all()
    np.testing.assert_allclose(leaf_best.numpy(), on_leaves.min(1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tree", range(len(TREES)), ids=["tree25", "tree40", "dag30"])
def test_label_distribution_inverts_the_marginals(tree: int) -> None:
    tax = TREES[tree]
    p, node = _probs(tax, 6, 10 + tree)
    np.testing.assert_allclose(label_distribution(node, tax), p, rtol=0, atol=1e-12)


def test_results_keep_the_input_dtype_candidates_and_leaf_input() -> None:
    tax = TREES[1]
    p, node = _probs(tax, 8, 4, internal=False)
    leaf = torch.as_tensor(p[:, tax.leaves], dtype=torch.float32, device=DEVICE)
    x32 = torch.as_tensor(node, dtype=torch.float32, device=DEVICE)
    want = _brute_expected(tax, p, "wu_palmer")
    internal = np.flatnonzero(~tax.is_leaf)
    got = D.expected_cost(x32, tax, "wu_palmer")
    from_leaves = D.expected_cost(leaf, tax, "wu_palmer", leaf_probs=True)
    ids, cost = D.bayes_node(x32, tax, "zhao", candidates=internal, return_cost=True)
    assert got.dtype == from_leaves.dtype == cost.dtype == torch.float32
    got, from_leaves, ids, cost = (t.cpu() for t in (got, from_leaves, ids, cost))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(from_leaves.numpy(), want, rtol=1e-5, atol=1e-6)
    zhao = _brute_expected(tax, p, "zhao")[:, internal]
    assert set(ids.tolist()) <= set(internal.tolist())
    np.testing.assert_allclose(cost.numpy(), zhao.min(1), rtol=1e-5, atol=1e-6)


def test_refusals_name_the_culprit() -> None:
    tax = TREES[0]
    _, node = _probs(tax, 5, 6)
    x = torch.as_tensor(node)
    bad = np.random.default_rng(0).random((tax.num_nodes, tax.num_nodes))
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        D.expected_cost(x, tax, torch.as_tensor(bad))
    with pytest.raises(ValueError, match=r"cost matrix must be \[N, L\]"):
        D.bayes_node(x, tax, torch.ones(tax.num_nodes, 3), return_cost=True)
    with pytest.raises(ValueError, match="internal nodes"):
        D.expected_cost(x, tax, torch.ones(tax.num_nodes, tax.num_leaves))
    with pytest.raises(ValueError, match="cost must be one of"):
        D.expected_cost(x, tax, "manhattan")
    with pytest.raises(TaxonomyError, match=rf"predictions\[0\] = {tax.num_nodes} is not a node id.*\[0, "):
        D.prediction_expected_cost(x, torch.full((5,), tax.num_nodes), tax)
    with pytest.raises(ValueError, match=r"predictions must hold one node id or name per sample, shape \[5\]; got \[4"):
        D.prediction_expected_cost(x, torch.zeros(4, dtype=torch.int64), tax)
    names = [tax.name_of(int(i)) for i in D.bayes_node(x, tax, "zhao")]
    assert D.prediction_expected_cost(x, names, tax, "zhao").shape == (5,)
    broken = node.copy()
    child = int(tax.children(0)[0])
    broken[3, child] = 0.0  # its children now exceed it: not single-label probabilities
    with pytest.raises(ProbabilityError, match="row 3"):
        D.bayes_node(torch.as_tensor(broken), tax, "zhao")


def _brute_hf(tax: Taxonomy, p: np.ndarray, sets: np.ndarray, beta: float, include_root: bool) -> np.ndarray:
    """``sum_y p(y) hF_beta(S, ancestors-or-self of y)`` set by set, from the definition."""
    anc = tax.ancestors_sparse.toarray().astype(bool)
    out = np.zeros(len(p))
    for i, s in enumerate(sets):
        s = s.copy()
        s[0] = include_root
        for y in range(tax.num_nodes):
            a = anc[y].copy()
            a[0] = include_root
            inter, ns, na = (s & a).sum(), s.sum(), a.sum()
            hf = 1.0 if ns == na == 0 else (1 + beta**2) * inter / (beta**2 * na + ns)
            out[i] += p[i, y] * hf
    return out


@pytest.mark.parametrize("tree", range(len(TREES)), ids=["tree25", "tree40", "dag30"])
@pytest.mark.parametrize(("beta", "include_root"), [(1.0, False), (2.0, True), (0.5, False)])
def test_expected_hfbeta_of_tensors_is_the_definition(tree: int, beta: float, include_root: bool) -> None:
    tax = TREES[tree]
    p, node = _probs(tax, 6, 20 + tree)
    rng = np.random.default_rng(tree)
    sets = rng.random((6, tax.num_nodes)) < 0.3
    sets[0] = False  # the empty set
    want = _brute_hf(tax, p, sets, beta, include_root)
    q = np.where(tax.is_leaf[None, :], p, 0.0)
    q /= q.sum(1, keepdims=True)  # leaf probabilities: all the mass on leaves
    got = D.expected_hfbeta(torch.as_tensor(sets), torch.as_tensor(node), tax, beta, include_root=include_root)
    leaf = torch.as_tensor(q[:, tax.leaves])
    from_leaves = D.expected_hfbeta(torch.as_tensor(sets), leaf, tax, beta, include_root=include_root, leaf_probs=True)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(from_leaves.numpy(), _brute_hf(tax, q, sets, beta, include_root), rtol=1e-12)
    with pytest.raises(ValueError, match=r"sets must be boolean node sets \[B, N\]"):
        D.expected_hfbeta(torch.ones(2, tax.num_nodes, dtype=torch.bool), torch.as_tensor(node), tax)


@pytest.mark.parametrize("tree", range(len(TREES)), ids=["tree25", "tree40", "dag30"])
@pytest.mark.parametrize(("beta", "include_root"), [(1.0, False), (2.0, True), (0.5, False), (3.0, False)])
@pytest.mark.parametrize("concentration", [0.05, 1.0])
def test_optimal_hfbeta_of_tensors_is_the_numpy_optimum(
    tree: int, beta: float, include_root: bool, concentration: float
) -> None:
    """The same sets as the NumPy decoder (tested against brute force in test_decode_hfbeta.py), and the value
    returned is the definition's expected hF of the set returned."""
    tax = TREES[tree]
    rng = np.random.default_rng(30 + tree)
    p = rng.dirichlet(np.full(tax.num_nodes, concentration), 12)  # peaked (0.05) and flat (1.0) posteriors
    node = p @ tax.ancestors_sparse.toarray().astype(np.float64)
    want_sets, want_value = D.optimal_hfbeta(node, tax, beta, include_root=include_root, return_value=True)
    x = torch.as_tensor(node, device=DEVICE)
    sets, value = D.optimal_hfbeta(x, tax, beta, include_root=include_root, return_value=True)
    single = D.optimal_hfbeta(x.float(), tax, beta, include_root=include_root).cpu()
    assert sets.dtype == torch.bool and value.dtype == torch.float64 and sets.device == x.device
    sets, value = sets.cpu(), value.cpu()
    np.testing.assert_array_equal(sets.numpy(), want_sets)
    np.testing.assert_allclose(value.numpy(), want_value, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(value.numpy(), _brute_hf(tax, p, sets.numpy(), beta, include_root), rtol=1e-12)
    # float32 input: an optimum of the rounded probabilities, no worse than the float64 one beyond float32 round-off
    got32 = _brute_hf(tax, p, single.numpy(), beta, include_root)
    np.testing.assert_array_less(want_value - got32, 1e-5)


def test_optimal_hfbeta_of_tensors_from_leaf_probabilities() -> None:
    tax = TREES[1]
    p, _ = _probs(tax, 10, 40, internal=False)
    leaf = p[:, tax.leaves]
    want = D.optimal_hfbeta(leaf, tax, 2.0, leaf_probs=True)
    got = D.optimal_hfbeta(torch.as_tensor(leaf), tax, 2.0, leaf_probs=True)
    empty = D.optimal_hfbeta(torch.zeros(0, tax.num_nodes), tax)
    np.testing.assert_array_equal(got.numpy(), want)
    assert empty.shape == (0, tax.num_nodes)

"""hiercls.taxonomy.tensors: leaf->node marginals against brute force, and exact monotonicity in floating point."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _generators import random_dag, random_tree

from hiercls.taxonomy import Taxonomy
from hiercls.taxonomy.tensors import TreeOps, leaf_marginals, leaf_ranges, node_probs_from_leaves, tree_ops

DAG = Taxonomy(
    [("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y"), ("b", "w"), ("x", "x1"), ("x", "x2"), ("y", "x2")]
)


def brute(tax: Taxonomy, leaf: np.ndarray) -> np.ndarray:
    """Marginals by definition, in exact-ish float64: each node sums the leaves among its descendants."""
    out = np.zeros((leaf.shape[0], tax.num_nodes))
    for n in range(tax.num_nodes):
        below = [tax.leaf_index[d] for d in tax.descendants(n, include_self=True) if tax.is_leaf[d]]
        out[:, n] = leaf[:, below].astype(np.float64).sum(1)
    return out


def adversarial(rng: np.random.Generator, b: int, num_leaves: int, dtype: torch.dtype) -> torch.Tensor:
    """Leaf values over ~30 orders of magnitude with ties and zeros: where summation order shows in rounding."""
    expo = rng.integers(-30, 1, size=(b, num_leaves)).astype(np.float64)
    mant = rng.choice([1.0, 1.0 + 2**-23, 3.0, 1 / 3, 0.1, 0.0], size=(b, num_leaves))
    return torch.from_numpy(mant * 10.0**expo).to(dtype)


def assert_monotone(tax: Taxonomy, node: np.ndarray) -> None:
    child = np.repeat(np.arange(tax.num_nodes), np.diff(tax.parent_ptr))
    parent = tax.parent_idx
    bad = node[:, parent] < node[:, child]
    assert not bad.any(), f"parent < child at edges {np.argwhere(bad)[:3].tolist()}"


@pytest.mark.parametrize("make", [random_tree, random_dag], ids=["tree", "dag"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_marginals_brute_force_and_exact_monotone(make, seed, dtype):
    tax = make(40, seed)
    leaf = adversarial(np.random.default_rng(seed), 16, tax.num_leaves, dtype)
    got = TreeOps(tax).marginals(leaf)
    assert got.dtype == dtype
    ref = brute(tax, leaf.double().numpy())
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0)
    assert_monotone(tax, got.numpy())
    probs = TreeOps(tax).node_probs(leaf / leaf.sum(1, keepdim=True).clamp(min=1e-300))
    assert_monotone(tax, probs.numpy())
    assert (probs[:, 0] == 1).all() and (probs <= 1).all() and (probs >= 0).all()


def test_hand_made_rounding_case():
    # Summed in leaf order, r = (1 + u) + u = 1 but a = (u + u) + 1 = 1 + 2u (u = 2^-24): a leaf-sum per node can
    # put a parent below its child. Bottom-up, r includes a's rounded value and cannot.
    tax = Taxonomy([("r", "a"), ("a", "y"), ("a", "z"), ("a", "x"), ("r", "w")])
    u = 2.0**-24
    leaf = torch.tensor([[u, u, 1.0, 0.0]], dtype=torch.float32)  # leaves y, z, x, w
    assert [tax.names[i] for i in tax.leaves] == ["y", "z", "x", "w"]
    a_naive = (np.float32(u) + np.float32(u)) + np.float32(1.0)
    r_naive = (np.float32(1.0) + np.float32(u)) + np.float32(u) + np.float32(0.0)
    assert r_naive < a_naive  # the failure mode exists
    out = TreeOps(tax).marginals(leaf)[0]
    assert out[0] >= out[1] and out[1] >= out[2:].max()


def test_leaf_marginals_numpy_torch_shapes_and_dtypes():
    tax = random_tree(20, 3)
    leaf = np.random.default_rng(1).dirichlet(np.ones(tax.num_leaves), size=(2, 3))
    ref = brute(tax, leaf.reshape(6, -1)).reshape(2, 3, -1)
    out = leaf_marginals(tax, leaf)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == (2, 3, tax.num_nodes)
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    assert leaf_marginals(tax, leaf.astype(np.float16)).dtype == np.float32
    assert tax.marginals(leaf[0, 0]).shape == (tax.num_nodes,)
    t = tax.marginals(torch.from_numpy(leaf).to(torch.bfloat16))
    assert t.dtype == torch.float32 and t.shape == (2, 3, tax.num_nodes)
    assert tax.marginals(torch.from_numpy(leaf)).dtype == torch.float64
    with pytest.raises(ValueError, match=f"leaf_probs must have shape \\[..., {tax.num_leaves}\\]"):
        leaf_marginals(tax, np.zeros(tax.num_leaves + 1))


def test_node_probs_contract_and_gradients():
    tax = random_tree(15, 2)
    x = torch.randn(3, tax.num_leaves, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: tree_ops(tax).marginals(torch.softmax(z, 1)), (x,))
    assert torch.autograd.gradcheck(lambda z: node_probs_from_leaves(tax, torch.softmax(z, 1)), (x,))
    dag = TreeOps(DAG)
    y = torch.rand(2, DAG.num_leaves, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(dag.marginals, (y,))
    half = node_probs_from_leaves(tax, torch.softmax(x.detach(), 1).half())
    assert half.dtype == torch.float32 and half.is_contiguous()
    assert tree_ops(tax) is tree_ops(tax, "cpu")  # cached on the taxonomy


def test_leaf_ranges_match_descendants():
    tax = random_tree(30, 5)
    lo, hi = leaf_ranges(tax)
    for n in range(tax.num_nodes):
        below = sorted(tax.leaf_index[d] for d in tax.descendants(n, include_self=True) if tax.is_leaf[d])
        assert list(range(lo[n], hi[n])) == below

"""The path-only HXE and the vectorised semantic softmax loss against their exact all-node / per-level forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _generators import random_tree

from hiercls.losses import HXELoss, SemanticSoftmaxLoss
from hiercls.losses.leaf import _block_size, _path_masses, _spread_path_weights


def _labels(tax, rng, batch):
    # Leaves, internal nodes, the root and ignored samples.
    y = rng.integers(0, tax.num_nodes, size=batch)
    y[0] = -1
    y[1] = int(tax.leaves[0])
    return torch.as_tensor(y)


def _value_and_grad(fn, z):
    z = z.detach().clone().requires_grad_(True)
    out = fn(z)
    (g,) = torch.autograd.grad(out, z)
    return out.detach(), g


@pytest.mark.parametrize(("n", "seed"), [(2, 0), (7, 1), (40, 2), (40, 3)])
@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_hxe_path_only_matches_all_nodes(n, seed, alpha):
    rng = np.random.default_rng(seed)
    tax = random_tree(n, rng)
    if tax.num_leaves < 2:
        pytest.skip("needs two leaves")
    loss = HXELoss(tax, alpha=alpha)
    y = _labels(tax, rng, 9)
    z = torch.tensor(rng.normal(scale=4.0, size=(9, tax.num_leaves)))
    fast, g_fast = _value_and_grad(lambda x: loss(x, y), z)
    t, valid = loss.targets(z, y)
    exact, g_exact = _value_and_grad(lambda x: loss._forward_all_nodes(x, t, valid), z)
    assert torch.allclose(fast, exact, rtol=1e-10, atol=1e-12)
    assert torch.allclose(g_fast, g_exact, rtol=1e-8, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: loss(x, y), (z.clone().requires_grad_(True),))


def test_hxe_label_far_below_the_maximum_falls_back_to_exact():
    tax = random_tree(20, 4)
    loss = HXELoss(tax, alpha=0.3)
    y = torch.as_tensor(tax.leaves[:2].copy())
    z = torch.zeros(2, tax.num_leaves, dtype=torch.float32)
    z[:, 2:] = 150.0  # the labels' leaves (positions 0, 1) sit 150 below the rest
    got = loss(z, y)
    t, valid = loss.targets(z, y)
    assert torch.isfinite(got) and torch.allclose(got, loss._forward_all_nodes(z.double(), t, valid).float())


@pytest.mark.parametrize(("n", "seed"), [(3, 0), (30, 1), (60, 2)])
@pytest.mark.parametrize("options", [{}, {"normalize": "present"}, {"drop_deepest_level": True}])
@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_semantic_loss_matches_per_level_cross_entropies(n, seed, options, eps, dtype):
    rng = np.random.default_rng(seed)
    tax = random_tree(n, rng)
    lay_levels = SemanticSoftmaxLoss(tax).layout.num_levels
    if options.get("drop_deepest_level") and lay_levels < 2:
        pytest.skip("needs two levels")
    loss = SemanticSoftmaxLoss(tax, label_smoothing=eps, **options)
    y = _labels(tax, rng, 8)
    z = torch.tensor(rng.normal(scale=5.0, size=(8, loss.layout.num_classes)), dtype=dtype)

    def reference(x):  # independent: one F.cross_entropy per level, weights and normalisation by hand
        lt = loss.layout.targets(y)
        w = torch.tensor(loss._loss_weights, dtype=x.dtype)
        present = (lt >= 0).to(x.dtype)
        coef = present * w
        if loss.normalize == "present":
            coef = coef / coef.sum(1, keepdim=True).clamp(min=1e-12)
        per = torch.stack(
            [
                torch.nn.functional.cross_entropy(zk, lt[:, k].clamp(min=0), reduction="none", label_smoothing=eps)
                for k, zk in enumerate(loss.layout.split(x))
            ],
            dim=1,
        )
        return (coef * per).sum() / (y >= 0).sum().clamp(min=1)

    got, g = _value_and_grad(lambda x: loss(x, y), z)
    want, g_want = _value_and_grad(reference, z)
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    assert got.dtype == dtype and g.dtype == dtype
    assert torch.allclose(got, want, **tol)
    assert torch.allclose(g, g_want, **tol)


def test_semantic_loss_level_far_below_the_row_maximum():
    tax = random_tree(30, 5)
    loss = SemanticSoftmaxLoss(tax, label_smoothing=0.0)
    y = torch.as_tensor(tax.leaves[:3].copy())
    z = torch.zeros(3, loss.layout.num_classes)
    z[:, loss.layout.slices[0]] = 200.0  # every deeper level sits 200 below the row maximum
    z64 = z.double()
    assert torch.isfinite(loss(z, y))
    assert torch.allclose(loss(z, y).double(), loss(z64, y), rtol=1e-6)


@pytest.mark.parametrize("num_leaves", [1, 7, 8, 9, 64, 100, 257])
@pytest.mark.parametrize("block", [8, 16])
def test_blocked_range_sums_and_spread_against_brute_force(num_leaves, block):
    rng = np.random.default_rng(num_leaves * block)
    b, ranges = 5, 6
    p = torch.tensor(rng.random((b, num_leaves)))
    ends = np.sort(rng.integers(0, num_leaves + 1, size=(b, ranges, 2)), axis=2)
    ends[:, 0] = (0, num_leaves)  # the whole row
    ends[:, 1] = (3 % (num_leaves + 1),) * 2  # empty
    lo, hi = torch.as_tensor(ends[..., 0]), torch.as_tensor(ends[..., 1])
    weights = torch.tensor(rng.normal(size=(b, ranges)))
    got, geometry = _path_masses(p, lo, hi, block)
    want = torch.zeros(b, ranges, dtype=p.dtype)
    spread = torch.zeros_like(p)
    for i in range(b):
        for j in range(ranges):
            want[i, j] = p[i, lo[i, j] : hi[i, j]].sum()
            spread[i, lo[i, j] : hi[i, j]] += weights[i, j] * p[i, lo[i, j] : hi[i, j]]
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
    assert torch.allclose(_spread_path_weights(p, weights, geometry, block), spread, rtol=1e-12, atol=1e-15)


def test_block_size_grows_with_the_leaves():
    assert _block_size(2) == 8 and _block_size(8146) == 64
    assert all(_block_size(n) & (_block_size(n) - 1) == 0 for n in (10, 1000, 100_000))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hxe_path_only_on_a_wide_tree(dtype):
    rng = np.random.default_rng(7)
    tax = random_tree(600, rng)  # a few hundred leaves: ranges span many blocks
    loss = HXELoss(tax, alpha=0.4)
    assert loss._block < tax.num_leaves
    y = _labels(tax, rng, 12)
    z = torch.tensor(rng.normal(scale=3.0, size=(12, tax.num_leaves)), dtype=dtype)
    fast, g_fast = _value_and_grad(lambda x: loss(x, y), z)
    t, valid = loss.targets(z, y)
    exact, g_exact = _value_and_grad(lambda x: loss._forward_all_nodes(x, t, valid), z)
    tol = {"rtol": 1e-9, "atol": 1e-14} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-9}
    assert fast.dtype == dtype and g_fast.dtype == dtype
    assert torch.allclose(fast, exact, **tol)
    assert torch.allclose(g_fast, g_exact, **tol)

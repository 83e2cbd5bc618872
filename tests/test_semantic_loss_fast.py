"""The compiled CPU kernels of the semantic softmax loss against its torch ops (value and gradient).

``_LevelSmoothedCE.KERNEL_DEVICES = ()`` runs the torch ops on CPU tensors, what every other device runs; the
independent per-level references are in ``tests/test_loss_fast_paths.py``, which runs the kernels.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hiercls.losses import SemanticSoftmaxLoss
from hiercls.losses.semantic import _LevelSmoothedCE
from tests._trees import random_tree


def _value_and_grad(loss, z, y):
    z = z.detach().clone().requires_grad_(True)
    out = loss(z, y)
    (g,) = torch.autograd.grad(out, z)
    return out.detach(), g


def _both_paths(loss, z, y, monkeypatch):
    fast = _value_and_grad(loss, z, y)
    with monkeypatch.context() as m:
        m.setattr(_LevelSmoothedCE, "KERNEL_DEVICES", ())
        slow = _value_and_grad(loss, z, y)
    return fast, slow


@pytest.mark.parametrize(("n", "seed"), [(3, 0), (30, 1), (80, 2)])
@pytest.mark.parametrize("options", [{}, {"normalize": "present"}, {"drop_deepest_level": True}])
@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernels_match_the_torch_ops(n, seed, options, eps, dtype, monkeypatch):
    rng = np.random.default_rng(seed)
    tax = random_tree(n, rng)
    if options.get("drop_deepest_level") and SemanticSoftmaxLoss(tax).layout.num_levels < 2:
        pytest.skip("needs two levels")
    loss = SemanticSoftmaxLoss(tax, label_smoothing=eps, **options)
    for batch in (1, 7, 33):
        y = torch.as_tensor(rng.integers(-1, tax.num_nodes, size=batch))
        z = torch.tensor(rng.normal(scale=5.0, size=(batch, loss.layout.num_classes)), dtype=dtype)
        (got, g), (want, g_want) = _both_paths(loss, z, y, monkeypatch)
        tol = {"rtol": 1e-12, "atol": 1e-14} if dtype == torch.float64 else {"rtol": 2e-6, "atol": 1e-7}
        assert got.dtype == dtype and g.dtype == dtype
        assert torch.allclose(got, want, **tol) and torch.allclose(g, g_want, **tol)


def test_levels_far_below_the_maximum_and_non_finite_logits(monkeypatch):
    tax = random_tree(30, 5)
    loss = SemanticSoftmaxLoss(tax)
    y = torch.as_tensor(tax.leaves[:4].copy())
    z = torch.randn(4, loss.layout.num_classes)
    z[1, loss.layout.slices[0]] = 200.0  # the shared shift underflows the deeper levels: per-level shifts
    (got, g), (want, g_want) = _both_paths(loss, z, y, monkeypatch)
    assert torch.isfinite(got) and torch.allclose(got, want, rtol=1e-6) and torch.allclose(g, g_want, atol=1e-7)
    z[2, 0] = math.nan
    (got, _), (want, _) = _both_paths(loss, z, y, monkeypatch)
    assert math.isnan(got.item()) and math.isnan(want.item())


def test_empty_batch_and_21k_rows(monkeypatch):
    from hiercls.taxonomy import load_taxonomy

    tax = load_taxonomy("imagenet21k_winter21")
    loss = SemanticSoftmaxLoss(tax)
    rng = np.random.default_rng(4)
    y = torch.as_tensor(rng.choice(tax.leaves, size=5))
    y[0] = -1
    z = torch.tensor(rng.normal(scale=2.0, size=(5, loss.layout.num_classes)), dtype=torch.float32)
    from hiercls.losses import _semantic_kernels

    calls = []
    kernel = _semantic_kernels.level_cross_entropy
    monkeypatch.setattr(_semantic_kernels, "level_cross_entropy", lambda *a: calls.append(kernel(*a)) or calls[-1])
    (got, g), (want, g_want) = _both_paths(loss, z, y, monkeypatch)
    assert calls == [True]  # the kernel took the batch (and the torch ops the second one)
    assert torch.allclose(got, want, rtol=2e-6) and torch.allclose(g, g_want, rtol=1e-5, atol=1e-9)
    assert torch.all(g[0] == 0)  # the ignored sample
    (got, g), (want, _) = _both_paths(loss, z[:0], y[:0], monkeypatch)
    assert got.item() == want.item() == 0.0 and g.shape == (0, loss.layout.num_classes)

"""The compiled CPU kernel of ``ChainedSoftmax.probs`` (inference) against brute force and the torch path.

Without autograd, CPU logits go through ``hiercls.taxonomy._ops_kernels.chained_probs_rows``; the torch path
(``_KERNEL_DEVICES = ()``, what CUDA tensors and autograd always run) and a float64 brute-force definition, one
softmax per group multiplied up the chain of conditioning outputs with ``math``, are the references. They agree
to float32 rounding: the kernel takes ``exp`` directly where the torch path takes ``exp2(z log2 e)``, and sums in
another order. No timing is asserted here (``bench/bench_heads.py`` measures it).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hiercls.heads import ConditionalSoftmaxHead, SemanticSoftmaxHead
from hiercls.taxonomy import _ops_kernels
from hiercls.taxonomy.ops import ChainedSoftmax
from tests._trees import random_tree
from tests.test_chained_softmax import conditional_reference, semantic_reference


def brute_force(group: np.ndarray, parent: np.ndarray, order: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``P(i)`` output by output: the softmax of output ``i``'s group times that of each conditioning output."""
    z = np.asarray(z, dtype=np.float64)
    members = {int(g): [int(i) for i in np.flatnonzero(group == g)] for g in np.unique(group)}
    out = np.zeros((z.shape[0], len(group)))
    for b in range(z.shape[0]):
        for i in range(len(group)):
            value, j = 1.0, i
            while j >= 0:
                vals = [float(z[b, order[m]]) for m in members[int(group[j])]]
                top = max(vals)
                value *= math.exp(float(z[b, order[j]]) - top) / sum(math.exp(v - top) for v in vals)
                j = int(parent[group[j]])
            out[b, i] = value
    return out


def random_groups(rng: np.random.Generator, num_outputs: int, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """A random forest of groups: group ``j`` hangs below an output of an earlier group, or below nothing."""
    group = np.concatenate([np.arange(num_groups), rng.integers(0, num_groups, num_outputs - num_groups)])
    group = rng.permutation(group)
    parent = np.full(num_groups, -1)
    for j in range(1, num_groups):
        if rng.random() < 0.85:
            parent[j] = rng.choice(np.flatnonzero(group < j))
    return group, parent


def torch_path(cs: ChainedSoftmax, z: torch.Tensor, **kwargs) -> torch.Tensor:
    cs._KERNEL_DEVICES = ()
    try:
        return cs.probs(z, **kwargs)
    finally:
        del cs._KERNEL_DEVICES


#: Rows of each call of the compiled kernel in the running test (the spy below records them).
CALLS: list[int] = []


@pytest.fixture(autouse=True)
def spy_on_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the rows of every kernel call (``_kernel_probs`` looks the kernel up at each call)."""
    kernel = _ops_kernels.chained_probs_rows

    def spy(e, *args):
        CALLS.append(e.shape[0])
        return kernel(e, *args)

    CALLS.clear()
    monkeypatch.setattr(_ops_kernels, "chained_probs_rows", spy)


def kernel_path(cs: ChainedSoftmax, z: torch.Tensor, **kwargs) -> torch.Tensor:
    start = len(CALLS)
    with torch.no_grad():
        p = cs.probs(z, **kwargs)
    if kwargs.get("outputs", 1):
        assert sum(CALLS[start:]) == z.shape[0]  # the kernel took every row
    return p


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch", [1, 3, 5, 17, 37])
def test_kernel_matches_brute_force_on_random_groups(seed: int, batch: int) -> None:
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 40))
    group, parent = random_groups(rng, m, int(rng.integers(1, m + 1)))
    # input orders: none, a permutation, and one with repeated and unused logits
    orders = [None, rng.permutation(m), rng.integers(0, m + 3, m)]
    for order in orders:
        cs = ChainedSoftmax(group, parent, input_order=order)
        z = torch.from_numpy(rng.normal(scale=3.0, size=(batch, cs.num_inputs))).float()
        want = brute_force(group, parent, np.arange(m) if order is None else order, z.numpy())
        for k, lead in ((m, 0), (m, 1), (max(m - 3, 0), 2), (0, 1)):
            got = kernel_path(cs, z, outputs=k, lead=lead)
            assert got.shape == (batch, lead + k) and got.dtype == torch.float32 and got.is_contiguous()
            assert torch.all(got[:, :lead] == 1.0)
            np.testing.assert_allclose(got[:, lead:].numpy(), want[:, :k], rtol=2e-5, atol=1e-7)
            np.testing.assert_allclose(
                got.numpy(), torch_path(cs, z, outputs=k, lead=lead).numpy(), rtol=1e-5, atol=1e-7
            )


TREES = [(n, seed) for n in (2, 9, 40) for seed in range(2)]


@pytest.mark.parametrize(("n", "seed"), TREES)
def test_heads_through_the_kernel_match_their_references(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tax = random_tree(n, rng)
    sem = SemanticSoftmaxHead(tax, 4)
    z = torch.from_numpy(rng.normal(scale=3.0, size=(6, sem.num_outputs))).float()
    want = semantic_reference(tax, sem.layout.class_ids.tolist(), z.double().numpy())
    with torch.no_grad():
        np.testing.assert_allclose(sem.node_probs(z).numpy(), want, rtol=1e-5, atol=1e-6)
    assert sum(CALLS) == 6
    for stop in (False, True):
        head = ConditionalSoftmaxHead(tax, 4, stop=stop)
        z = torch.from_numpy(rng.normal(scale=3.0, size=(6, head.num_outputs))).float()
        want = conditional_reference(tax, z.double().numpy(), stop)
        CALLS.clear()
        with torch.no_grad():
            np.testing.assert_allclose(head.node_probs(z).numpy(), want, rtol=1e-5, atol=1e-6)
        assert sum(CALLS) == 6


@pytest.fixture(scope="module")
def heads_21k() -> list[tuple[str, ChainedSoftmax, int]]:
    from hiercls.heads import create_head
    from hiercls.taxonomy import load_taxonomy

    tax = load_taxonomy("imagenet21k_winter21")
    sem = create_head("semantic_softmax", tax, 4)
    con = create_head("conditional_softmax", tax, 4)
    return [("semantic", sem.node_softmax, sem.num_outputs), ("conditional", con.softmax.chained, tax.num_nodes - 1)]


def test_21k_tree_rows_match_the_torch_path_and_the_exact_log_path(heads_21k) -> None:
    rng = np.random.default_rng(21)
    for name, cs, k in heads_21k:
        z = torch.from_numpy(rng.normal(scale=3.0, size=(7, cs.num_inputs))).float()
        got = kernel_path(cs, z, outputs=k, lead=1)
        exact = cs.log_probs(z.double()).exp()[:, :k].numpy()
        np.testing.assert_allclose(got[:, 1:].numpy(), exact, rtol=2e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(got.numpy(), torch_path(cs, z, outputs=k, lead=1).numpy(), rtol=2e-5, atol=1e-7)
        # the children of every group sum to their parent output (the chained softmax's consistency)
        sums = torch.zeros(7, cs.num_groups, dtype=torch.float64).index_add_(1, cs.group[:k], got[:, 1:].double())
        top = cs.num_top_groups
        has = cs.has_parent[top:] & (cs.parent[top:] < k)
        if k == cs.num_outputs:
            parents = got[:, 1:].double()[:, cs.parent[top:][has]]
            np.testing.assert_allclose(sums[:, top:][:, has].numpy(), parents.numpy(), rtol=1e-4, atol=1e-7)


def test_non_contiguous_float64_and_half_inputs() -> None:
    rng = np.random.default_rng(3)
    group, parent = random_groups(rng, 30, 8)
    cs = ChainedSoftmax(group, parent, input_order=rng.permutation(30))
    base = torch.from_numpy(rng.normal(scale=3.0, size=(9, 30))).float()
    want = kernel_path(cs, base.contiguous(), lead=1)
    transposed = base.t().contiguous().t()  # column-major
    wide = torch.zeros(9, 40)
    wide[:, 5:35] = base
    for z in (transposed, wide[:, 5:35], base[::1]):
        assert z.shape == base.shape
        np.testing.assert_allclose(kernel_path(cs, z, lead=1).numpy(), want.numpy(), rtol=1e-6, atol=1e-8)
    z64 = base.double()
    got64 = kernel_path(cs, z64, lead=1)
    assert got64.dtype == torch.float64
    np.testing.assert_allclose(got64[:, 1:].numpy(), cs.log_probs(z64).exp().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(kernel_path(cs, z64.t().contiguous().t(), lead=1).numpy(), got64.numpy(), rtol=1e-14)
    for half in (torch.float16, torch.bfloat16):
        got = kernel_path(cs, base.to(half))
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), torch_path(cs, base.to(half)).numpy(), rtol=1e-5, atol=1e-7)


# outputs 0, 1 | 2, 3, 4 below output 0 | 5, 6 below output 3 | 7 below output 6 (a group of one)
GROUP, PARENT = np.array([2, 2, 0, 0, 0, 1, 1, 3]), np.array([0, 3, -1, 6])


def test_rows_out_of_range_take_the_torch_path_row_by_row() -> None:
    rng = np.random.default_rng(7)
    cs = ChainedSoftmax(GROUP, PARENT)
    z = rng.normal(scale=3.0, size=(9, 8))
    z[1] += 75.0  # sums too large unshifted
    z[4] += 150.0  # exponentials overflow unshifted
    z[6] = [60.0, 0.0, -60.0, -61.0, -62.0, 1.0, 2.0, 3.0]  # parent far above its group
    z[7, [5, 6]] = [-200.0, -201.0]  # a group far below the rest: its sum underflows
    z = torch.from_numpy(z).float()
    want = brute_force(GROUP, PARENT, np.arange(8), z.double().numpy())
    got = kernel_path(cs, z)
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=1e-7)
    # the rows in range are those of the kernel alone, whatever their neighbours
    normal = [0, 2, 3, 5, 8]
    np.testing.assert_array_equal(kernel_path(cs, z[normal]).numpy(), got[normal].numpy())


def test_nan_and_inf_rows_agree_with_the_torch_path() -> None:
    rng = np.random.default_rng(8)
    cs = ChainedSoftmax(GROUP, PARENT)
    z = torch.from_numpy(rng.normal(size=(6, 8))).float()
    z[1, 3] = float("nan")
    z[3, 0] = float("inf")
    got = kernel_path(cs, z)
    for row in range(6):
        want = torch_path(cs, z[row : row + 1])[0]
        np.testing.assert_allclose(got[row].numpy(), want.numpy(), rtol=1e-5, atol=1e-7, equal_nan=True)
    assert torch.isnan(got[1]).any() and not torch.isnan(got[[0, 2, 4, 5]]).any()


def test_empty_batches_outputs_and_autograd_stay_on_the_torch_path() -> None:
    cs = ChainedSoftmax(GROUP, PARENT)
    assert kernel_path(cs, torch.zeros(0, 8), lead=1).shape == (0, 9)
    assert torch.equal(kernel_path(cs, torch.zeros(3, 8), outputs=0, lead=2), torch.ones(3, 2))
    z = torch.randn(4, 8, requires_grad=True)
    CALLS.clear()
    p = cs.probs(z, lead=1)  # autograd: the torch path
    assert p.requires_grad and not CALLS
    p[:, 1:].sum().backward()
    assert z.grad is not None
    with torch.inference_mode():
        q = cs.probs(z.detach(), lead=1)
    assert sum(CALLS) == 4
    np.testing.assert_allclose(q.numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match=r"shape \[B, 8\]"):
        cs.probs(torch.zeros(2, 7))


def test_deep_trees_of_groups_and_wide_index_tables() -> None:
    depth = ChainedSoftmax._MAX_LEVELS + 6  # deeper than the torch path's per-depth loop
    group = np.repeat(np.arange(depth), 2)
    parent = np.concatenate([[-1], 2 * np.arange(depth - 1)])
    cs = ChainedSoftmax(group, parent)
    z = torch.from_numpy(np.random.default_rng(9).normal(size=(5, 2 * depth)) + 3.0).float()
    np.testing.assert_allclose(
        kernel_path(cs, z).numpy(), cs.log_probs(z.double()).exp().numpy(), rtol=1e-4, atol=1e-30
    )
    # more inputs than 16-bit indices address: 32-bit tables
    m = 70_000
    group = np.concatenate([[0, 0, 0], np.ones(m - 3, dtype=np.int64)])
    cs = ChainedSoftmax(group, np.array([-1, 1]), input_order=np.random.default_rng(10).permutation(m))
    z = torch.from_numpy(np.random.default_rng(11).normal(size=(3, m))).float()
    got = kernel_path(cs, z, lead=1)
    assert cs._kernel_tables.members.dtype == np.uint32
    np.testing.assert_allclose(got.numpy(), torch_path(cs, z, lead=1).numpy(), rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("shift", [0.0, 75.0, 150.0])
def test_the_torch_paths_kernel_off(shift: float) -> None:
    """With the kernel off, the sparse-product and index_add sums (other devices) still match brute force."""
    rng = np.random.default_rng(12)
    z = torch.from_numpy(rng.normal(scale=3.0, size=(4, 8)) + shift).float()
    want = brute_force(GROUP, PARENT, np.arange(8), z.double().numpy())
    cs = ChainedSoftmax(GROUP, PARENT)
    np.testing.assert_allclose(torch_path(cs, z).numpy(), want, rtol=2e-5, atol=1e-7)
    cs._SPARSE_SUM_DEVICES = ()
    np.testing.assert_allclose(torch_path(cs, z).numpy(), want, rtol=2e-5, atol=1e-7)


def test_the_kernel_paths_view_no_tensor_as_an_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like tests/test_device_agnostic.py, without autograd: the kernels work on NumPy-owned memory only."""
    from hiercls.losses import SemanticSoftmaxLoss

    def refuse(*_args, **_kwargs):
        raise AssertionError("torch tensor viewed as an array (.cpu() / .numpy())")

    tax = random_tree(25, 7)
    sem, con = SemanticSoftmaxHead(tax, 8), ConditionalSoftmaxHead(tax, 8, stop=True)
    loss = SemanticSoftmaxLoss(tax)
    x = torch.randn(5, 8)
    with torch.no_grad():
        outs = [sem(x), con(x)]
    z = torch.randn(5, loss.layout.num_classes, requires_grad=True)
    y = torch.as_tensor([int(tax.leaves[0]), 1, -1, int(tax.leaves[-1]), 2])
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "cpu", refuse)
        m.setattr(torch.Tensor, "numpy", refuse)
        with torch.no_grad():
            probs = [sem.node_probs(outs[0]), con.node_probs(outs[1])]
        loss(z, y).backward()
    assert sum(CALLS) == 10 and all(torch.isfinite(p).all() for p in probs) and torch.isfinite(z.grad).all()

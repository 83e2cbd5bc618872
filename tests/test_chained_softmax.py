"""The chained softmaxes (semantic and conditional node probabilities) against slow references.

The references below walk the tree node by node in float64 with ``math``; they share no code with
``hiercls.losses.ChainedSoftmax``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from _generators import random_group_forest, random_tree

from hiercls.heads import ConditionalSoftmaxHead, SemanticSoftmaxHead
from hiercls.losses import ChainedSoftmax
from hiercls.losses.chained_softmax import bucket_widths
from hiercls.taxonomy import Taxonomy


def _softmax(values: list[float]) -> list[float]:
    m = max(values)
    e = [math.exp(v - m) for v in values]
    s = sum(e)
    return [x / s for x in e]


def semantic_reference(tax: Taxonomy, class_ids: list[int], logits: np.ndarray) -> np.ndarray:
    """P(c) = P(nearest class ancestor) * softmax over the classes sharing it; other nodes sum their children."""
    is_class = set(class_ids)
    col = {c: i for i, c in enumerate(class_ids)}
    parent = tax.parent

    def nearest_class_ancestor(n: int) -> int:  # -1 = the root side
        p = int(parent[n])
        while p >= 0 and p not in is_class:
            p = int(parent[p])
        return p

    out = np.zeros((logits.shape[0], tax.num_nodes))
    groups: dict[int, list[int]] = {}
    for c in class_ids:
        groups.setdefault(nearest_class_ancestor(c), []).append(c)
    by_depth = sorted(class_ids, key=lambda c: int(tax.depth[c]))  # a class after its class ancestors
    for b in range(logits.shape[0]):
        prob = {-1: 1.0}
        for c in by_depth:
            q = nearest_class_ancestor(c)
            members = groups[q]
            sm = _softmax([float(logits[b, col[m]]) for m in members])
            prob[c] = prob[q] * sm[members.index(c)]
            out[b, c] = prob[c]
        for d in range(tax.height, -1, -1):  # non-class nodes: the sum of their children, deepest first
            for n in np.flatnonzero(tax.depth == d):
                if int(n) not in is_class and not tax.is_leaf[n]:
                    out[b, n] = sum(out[b, int(k)] for k in np.flatnonzero(parent == n))
        out[b, 0] = 1.0
    return out


def conditional_reference(tax: Taxonomy, logits: np.ndarray, stop: bool) -> np.ndarray:
    """P(n) = product down the root path of softmax(children [+ stop]) entries; logit n - 1 is node n."""
    internal = [int(i) for i in np.flatnonzero(~tax.is_leaf)]
    out = np.zeros((logits.shape[0], tax.num_nodes))
    for b in range(logits.shape[0]):
        out[b, 0] = 1.0
        for d in range(1, tax.height + 1):
            for u in internal:
                if tax.depth[u] != d - 1:
                    continue
                kids = [int(k) for k in np.flatnonzero(tax.parent == u)]
                vals = [float(logits[b, k - 1]) for k in kids]
                if stop:
                    vals.append(float(logits[b, tax.num_nodes - 1 + internal.index(u)]))
                sm = _softmax(vals)
                for k, s in zip(kids, sm, strict=False):
                    out[b, k] = out[b, u] * s
    return out


def tolerance(z: torch.Tensor) -> float:
    # Float32 logits carry ``|z| * 2^-23`` of absolute precision; the probabilities are no better than that.
    return 1e-6 * max(1.0, float(z.abs().max()))


def check_contract(tax: Taxonomy, p: torch.Tensor, tol: float = 1e-6) -> None:
    assert p.dtype == torch.float32 and p.shape[1] == tax.num_nodes
    assert torch.all(p[:, 0] == 1.0) and torch.all((p >= 0) & (p <= 1))
    child = torch.as_tensor(np.flatnonzero(tax.parent >= 0))
    parent = torch.as_tensor(tax.parent[child.numpy()])
    assert torch.all(p[:, parent] >= p[:, child] - tol)


TREES = [(n, seed) for n in (2, 3, 9, 30) for seed in range(2)]


@pytest.mark.parametrize(("n", "seed"), TREES)
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_semantic_node_probs_match_reference(n, seed, scale):
    rng = np.random.default_rng(seed)
    tax = random_tree(n, rng)
    head = SemanticSoftmaxHead(tax, 4)
    z = torch.from_numpy(rng.normal(scale=scale, size=(5, head.num_outputs))).float()
    want = semantic_reference(tax, head.layout.class_ids.tolist(), z.double().numpy())
    got = head.node_probs(z)
    check_contract(tax, got, tolerance(z))
    np.testing.assert_allclose(got.numpy(), want, atol=tolerance(z), rtol=1e-5)
    # the exact log path agrees with the fast path
    logp = head.layout.class_log_probs(z.double())
    np.testing.assert_allclose(logp.exp().numpy(), want[:, head.layout.class_ids.numpy()], atol=1e-12, rtol=1e-9)


def test_semantic_node_probs_with_non_class_nodes():
    rng = np.random.default_rng(5)
    base = random_tree(25, rng)
    internal = [base.name_of(i) for i in np.flatnonzero(~base.is_leaf)][1:]
    classes = [base.name_of(i) for i in range(1, base.num_nodes) if base.name_of(i) not in internal[::2]]
    tax = Taxonomy(base.edge_list(names=True), classes=classes)
    head = SemanticSoftmaxHead(tax, 4)
    z = torch.from_numpy(rng.normal(scale=3.0, size=(4, head.num_outputs))).float()
    want = semantic_reference(tax, head.layout.class_ids.tolist(), z.double().numpy())
    got = head.node_probs(z)
    check_contract(tax, got, tolerance(z))
    np.testing.assert_allclose(got.numpy(), want, atol=tolerance(z), rtol=1e-5)


@pytest.mark.parametrize(("n", "seed"), TREES)
@pytest.mark.parametrize("stop", [False, True])
def test_conditional_node_probs_match_reference(n, seed, stop):
    rng = np.random.default_rng(100 + seed)
    tax = random_tree(n, rng)
    head = ConditionalSoftmaxHead(tax, 4, stop=stop)
    z = torch.from_numpy(rng.normal(scale=3.0, size=(5, head.num_outputs))).float()
    want = conditional_reference(tax, z.double().numpy(), stop)
    got = head.node_probs(z)
    check_contract(tax, got, tolerance(z))
    np.testing.assert_allclose(got.numpy(), want, atol=tolerance(z), rtol=1e-5)
    np.testing.assert_allclose(head.softmax.node_log_probs(z.double()).exp().numpy(), want, atol=1e-12, rtol=1e-9)


def test_groups_far_below_the_row_maximum_are_exact():
    # One group sits 200 below the rest: a shared shift would underflow it, each group's own shift does not.
    tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")])
    head = ConditionalSoftmaxHead(tax, 4)
    z = torch.zeros(2, head.num_outputs)
    for name, value in (("a", 0.0), ("b", 0.0), ("a1", -200.0), ("a2", -201.0), ("b1", 100.0), ("b2", 100.0)):
        z[:, tax.index(name) - 1] = value
    want = conditional_reference(tax, z.double().numpy(), stop=False)
    got = head.node_probs(z)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-6)
    assert math.isclose(float(got[0, tax.index("a1")]), 0.5 / (1 + math.exp(-1)), rel_tol=1e-6)


def test_chained_softmax_probs_gradient_and_validation():
    cs = ChainedSoftmax(np.array([0, 0, 1, 1, 1]), np.array([-1, 1]))
    z = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(cs.probs, (z,))
    assert torch.autograd.gradcheck(cs.log_probs, (z,))
    p = cs.probs(z.detach())
    assert torch.allclose(p[:, 2:].sum(1), p[:, 1])  # the children of output 1 sum to it
    with pytest.raises(ValueError, match="cycle"):
        ChainedSoftmax(np.array([0, 1]), np.array([1, 0]))
    with pytest.raises(ValueError, match="at least one output"):
        ChainedSoftmax(np.array([0, 0]), np.array([-1, 0, -1]))
    with pytest.raises(ValueError, match=r"shape \[B, 5\]"):
        cs.probs(torch.zeros(2, 4))


def test_half_precision_logits_and_devices_follow_the_input():
    tax = random_tree(12, 3)
    for head in (SemanticSoftmaxHead(tax, 4), ConditionalSoftmaxHead(tax, 4, stop=True)):
        z = torch.randn(3, head.num_outputs)
        p32, p16 = head.node_probs(z), head.node_probs(z.bfloat16())
        assert p16.dtype == torch.float32 and p16.device == z.device
        assert torch.allclose(p32, p16, atol=2e-2)


def test_heads_survive_deepcopy_as_ema_and_teachers_need():
    """copy.deepcopy (timm's ModelEmaV3, a KD teacher) copies the head and the copy gives the same probabilities."""
    import copy

    from hiercls.heads import create_head
    from hiercls.taxonomy import Taxonomy

    tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("a", "y"), ("b", "z"), ("b", "w")])
    for name in ("semantic_softmax", "conditional_softmax"):
        head = create_head(name, tax, 8)
        feats = torch.randn(3, 8)
        want = head.node_probs(head(feats))
        twin = copy.deepcopy(head)
        torch.testing.assert_close(twin.node_probs(twin(feats)), want)


def _chained_reference(group: np.ndarray, parent: np.ndarray, z: np.ndarray) -> np.ndarray:
    """P(i) = P(parent of i's group) * softmax over i's group, output by output in float64 with ``math``."""
    out = np.zeros(z.shape)
    for b in range(z.shape[0]):
        for i in range(z.shape[1]):
            value, j = 1.0, i
            while j >= 0:  # up the chain of conditioning outputs
                members = [int(m) for m in np.flatnonzero(group == group[j])]
                value *= _softmax([float(z[b, m]) for m in members])[members.index(j)]
                j = int(parent[group[j]])
            out[b, i] = value
    return out


# outputs 0, 1 | 2, 3, 4 below output 0 | 5, 6 below output 3 | 7 below output 6 (a group of one)
GROUP, PARENT = np.array([2, 2, 0, 0, 0, 1, 1, 3]), np.array([0, 3, -1, 6])


@pytest.mark.parametrize(
    ("values", "why"),
    [
        (lambda rng: rng.normal(scale=3.0, size=(4, 8)), "plain"),
        (lambda rng: rng.normal(scale=3.0, size=(4, 8)) + 75.0, "sums too large unshifted"),
        (lambda rng: rng.normal(scale=3.0, size=(4, 8)) + 150.0, "exp overflows unshifted"),
        (lambda rng: np.array([[60.0, 0.0, -60.0, -61.0, -62.0, 1.0, 2.0, 3.0]]), "parent far above its group"),
    ],
)
def test_chained_probs_agree_with_a_reference(values, why):
    rng = np.random.default_rng(7)
    z = torch.from_numpy(values(rng)).float()
    cs = ChainedSoftmax(GROUP, PARENT)
    want = _chained_reference(GROUP, PARENT, z.double().numpy())
    got = cs.probs(z)
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=1e-7, err_msg=why)
    # with autograd on, and the log-probabilities, give the same
    np.testing.assert_allclose(cs.probs(z.requires_grad_()).detach().numpy(), want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(cs.log_probs(z.detach().double()).exp().numpy(), want, rtol=1e-9, atol=1e-12)


def test_chained_probs_outputs_and_lead_columns():
    rng = np.random.default_rng(8)
    order = rng.permutation(8)
    cs = ChainedSoftmax(GROUP, PARENT, input_order=order)
    z = torch.from_numpy(rng.normal(scale=2.0, size=(3, 8))).float()
    want = _chained_reference(GROUP, PARENT, z.double().numpy()[:, order])
    for k, lead in ((8, 0), (5, 1), (8, 2), (0, 1)):
        got = cs.probs(z, outputs=k, lead=lead)
        assert got.shape == (3, lead + k) and got.is_contiguous()
        assert torch.all(got[:, :lead] == 1.0)
        np.testing.assert_allclose(got[:, lead:].numpy(), want[:, :k], rtol=2e-5, atol=1e-7)
        grad = cs.probs(z.requires_grad_(), outputs=k, lead=lead)
        np.testing.assert_allclose(grad.detach().numpy(), got.numpy(), rtol=2e-5, atol=1e-7)
        z = z.detach()
    assert cs.probs(torch.zeros(0, 8), lead=1).shape == (0, 9)
    zd = z.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: cs.probs(x, outputs=6, lead=1), (zd,))
    with pytest.raises(ValueError, match=r"outputs must be in 0\.\.8"):
        cs.probs(z, outputs=9)


def test_deep_trees_of_groups():
    # A chain of 150 groups (pointer doubling: 8 steps), with a sibling at every depth.
    depth = 150
    group = np.repeat(np.arange(depth), 2)  # group d = outputs 2d, 2d + 1
    parent = np.concatenate([[-1], 2 * np.arange(depth - 1)])  # group d + 1 below output 2d
    cs = ChainedSoftmax(group, parent)
    z = torch.from_numpy(np.random.default_rng(9).normal(size=(2, 2 * depth)) + 3.0)
    want = np.log(_chained_reference(group, parent, z.numpy()))
    np.testing.assert_allclose(cs.log_probs(z).numpy(), want, rtol=1e-9)
    p32, normal = cs.probs(z.float()).double().numpy(), want > -80.0  # float32 keeps the normal range
    np.testing.assert_allclose(np.log(p32[normal]), want[normal], rtol=1e-4)
    assert np.all(p32[~normal] < 1e-30)


@pytest.mark.parametrize("seed", range(12))
def test_random_forests_of_groups_against_the_reference(seed):
    """Any forest of groups, logits read in any order, any outputs and lead columns; float64 by tolerance."""
    rng = np.random.default_rng(seed)
    group, parent, order = random_group_forest(rng, int(rng.integers(1, 30)))
    cs = ChainedSoftmax(group, parent, input_order=order)
    z = torch.from_numpy(rng.normal(scale=4.0, size=(3, cs.num_inputs)))
    want = _chained_reference(group, parent, z.numpy()[:, order])
    k, lead = int(rng.integers(0, len(group) + 1)), int(rng.integers(0, 3))
    p, logp = cs.probs(z, outputs=k, lead=lead), cs.log_probs(z, outputs=k, lead=lead)
    assert p.shape == logp.shape == (3, lead + k) and p.dtype == torch.float64
    assert torch.all(p[:, :lead] == 1.0) and torch.all(logp[:, :lead] == 0.0)
    np.testing.assert_allclose(p[:, lead:].numpy(), want[:, :k], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(logp[:, lead:].numpy(), np.log(want[:, :k]), rtol=1e-12, atol=1e-12)
    within = cs.padded_log_softmax(z)[:, cs.slot]  # each output's log-probability within its group
    for g in np.unique(group):
        members = np.flatnonzero(group == g)
        np.testing.assert_allclose(within[:, members].numpy(), torch.log_softmax(z[:, order[members]], 1).numpy())


@pytest.mark.parametrize("seed", range(4))
def test_gradients_by_gradcheck(seed):
    rng = np.random.default_rng(50 + seed)
    group, parent, order = random_group_forest(rng, 9)
    cs = ChainedSoftmax(group, parent, input_order=order)
    z = torch.from_numpy(rng.normal(scale=2.0, size=(2, cs.num_inputs))).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: cs.probs(x, outputs=7, lead=1), (z,))
    assert torch.autograd.gradcheck(lambda x: cs.log_probs(x), (z,))
    assert torch.autograd.gradcheck(lambda x: cs.padded_log_softmax(x)[:, cs.slot], (z,))


def _cheapest_padding(sizes: np.ndarray, cost: int) -> int:
    """Brute force: every split of the sorted distinct sizes into runs, each run padded to its largest size."""
    distinct = np.unique(sizes)
    best = None
    for r in range(len(distinct)):
        for cuts in itertools.combinations(range(len(distinct) - 1), r):
            ends = np.array([*cuts, len(distinct) - 1])  # the last distinct size of each run
            widths = distinct[ends[np.searchsorted(ends, np.searchsorted(distinct, sizes))]]
            total = int(widths.sum()) + cost * len(ends)
            best = total if best is None else min(best, total)
    return best


def test_bucket_widths_are_the_cheapest_partition():
    rng = np.random.default_rng(3)
    for _ in range(20):
        sizes = rng.integers(1, 40, size=int(rng.integers(1, 12)))
        cost = int(rng.integers(0, 30))
        got = bucket_widths(sizes, cost)
        assert np.all(got >= sizes)
        assert int(got.sum()) + cost * len(np.unique(got)) == _cheapest_padding(sizes, cost)


def test_input_order_must_be_distinct():
    with pytest.raises(ValueError, match="distinct logit indices"):
        ChainedSoftmax(np.array([0, 0]), np.array([-1]), input_order=np.array([1, 1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_probs_stay_in_the_unit_interval_without_a_clamp(dtype):
    # Large logits: a shift rounded as one fused multiply-add can leave a positive residue, e > 1 and P > 1.
    rng = np.random.default_rng(7)
    group, parent, order = random_group_forest(rng, 40)
    cs = ChainedSoftmax(group, parent, input_order=order)
    z = torch.from_numpy(rng.normal(scale=300.0, size=(64, cs.num_inputs))).to(dtype)
    p = cs.probs(z)
    assert bool((p >= 0).all()) and bool((p <= 1).all())
    want = _chained_reference(group, parent, z.double().numpy()[:, order])
    np.testing.assert_allclose(p.double().numpy(), want, atol=1e-6 if dtype == torch.float32 else 1e-12)

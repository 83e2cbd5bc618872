"""Losses against hand-derived values and independent brute-force references on small trees."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _generators import random_tree

from hiercls.losses import (
    ConditionalSoftmax,
    ConditionalSoftmaxLoss,
    HierarchicalBCELoss,
    HXELoss,
    LeafCrossEntropy,
    NestedRegionLoss,
    NestedSigmoid,
    SemanticKDLoss,
    SemanticLayout,
    SemanticSoftmaxLoss,
    SoftLabelLoss,
    TreeOps,
    huffman_tree,
    hxe_weights,
    node_ids_to_regions,
    segment_logsumexp,
    semantic_level_weights,
    soft_dice_loss,
    soft_label_targets,
)
from hiercls.taxonomy import Taxonomy, TaxonomyError

torch.set_num_threads(1)

# r -> a, b ; a -> x, y ; x -> x1, x2 ; b -> z      (leaves at depths 2 and 3)
TREE = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("a", "y"), ("x", "x1"), ("x", "x2"), ("b", "z")])
SMALL = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
DAG = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y"), ("b", "w")])


def desc_leaves(tax: Taxonomy, node: int) -> list[int]:
    return [int(tax.leaf_index[d]) for d in tax.descendants(node, include_self=True) if tax.is_leaf[d]]


def brute_marginals(tax: Taxonomy, leaf_probs: np.ndarray) -> np.ndarray:
    return np.array([[row[desc_leaves(tax, n)].sum() for n in range(tax.num_nodes)] for row in leaf_probs])


# ---------------------------------------------------------------------------------------------- tree ops
@pytest.mark.parametrize("seed", range(4))
def test_tree_ops_against_brute_force(seed):
    tax = random_tree(25, seed)
    ops = TreeOps(tax)
    rng = np.random.default_rng(seed)
    leaf = torch.tensor(rng.random((3, tax.num_leaves)), dtype=torch.float64)
    np.testing.assert_allclose(ops.bottom_up(leaf, "sum").numpy(), brute_marginals(tax, leaf.numpy()), rtol=1e-12)
    lse = ops.bottom_up(leaf.log(), "logsumexp").exp().numpy()
    np.testing.assert_allclose(lse, brute_marginals(tax, leaf.numpy()), rtol=1e-10)
    vals = torch.tensor(rng.normal(size=(3, tax.num_nodes)))
    want_sum = np.stack([[vals[b, tax.path(n)].sum().item() for n in range(tax.num_nodes)] for b in range(3)])
    np.testing.assert_allclose(ops.top_down_sum(vals).numpy(), want_sum, rtol=1e-12)
    want_max = np.stack(
        [[vals[b, tax.descendants(n, include_self=True)].max().item() for n in range(tax.num_nodes)] for b in range(3)]
    )
    np.testing.assert_allclose(ops.descendant_max(vals).numpy(), want_max)


def test_descendant_max_on_dag_and_segment_logsumexp():
    ops = TreeOps(DAG)
    vals = torch.arange(DAG.num_nodes, dtype=torch.float64)[None].flip(1)
    want = [[vals[0, DAG.descendants(n, include_self=True)].max().item() for n in range(DAG.num_nodes)]]
    assert ops.descendant_max(vals).tolist() == want
    with pytest.raises(TaxonomyError):
        ops.bottom_up(torch.zeros(1, DAG.num_leaves))
    v = torch.tensor([[1e4, -1e4, 3.0, -math.inf]])
    out = segment_logsumexp(v, torch.tensor([0, 0, 1, 1]), 2)
    assert out.tolist() == [[1e4, 3.0]]


# ---------------------------------------------------------------------------------------------- flat CE
def test_leaf_cross_entropy_matches_torch_and_marginals():
    torch.manual_seed(0)
    logits = torch.randn(6, TREE.num_leaves, dtype=torch.float64)
    leaves = torch.tensor(TREE.leaves)
    y = leaves[torch.tensor([0, 1, 2, 3, 0, 2])]
    ce = LeafCrossEntropy(TREE)
    assert torch.allclose(ce(logits, y), F.cross_entropy(logits, torch.tensor(TREE.leaf_index)[y]))
    sm = LeafCrossEntropy(TREE, label_smoothing=0.3)
    assert torch.allclose(sm(logits, y), F.cross_entropy(logits, torch.tensor(TREE.leaf_index)[y], label_smoothing=0.3))
    # internal labels: -log of the summed leaf probabilities (brute force)
    internal = torch.tensor([TREE.index("a"), TREE.index("x"), TREE.index("b"), 0, -1, TREE.index("x1")])
    p = torch.softmax(logits, 1).numpy()
    want = [-math.log(p[i, desc_leaves(TREE, int(t))].sum()) for i, t in enumerate(internal) if t >= 0]
    assert math.isclose(ce(logits, internal).item(), float(np.mean(want)), rel_tol=1e-12)


def test_leaf_cross_entropy_on_dag():
    logits = torch.tensor([[0.3, -1.0, 2.0]], dtype=torch.float64).repeat(3, 1)
    y = torch.tensor([DAG.index("a"), DAG.index("b"), DAG.index("x")])
    p = torch.softmax(logits[0], 0).numpy()
    want = [-math.log(p[desc_leaves(DAG, int(t))].sum()) for t in y]
    assert math.isclose(LeafCrossEntropy(DAG)(logits, y).item(), float(np.mean(want)), rel_tol=1e-12)


def test_all_ignored_gives_zero_with_gradient():
    logits = torch.randn(2, TREE.num_leaves, requires_grad=True)
    loss = LeafCrossEntropy(TREE)(logits, torch.tensor([-1, -1]))
    loss.backward()
    assert loss.item() == 0.0 and logits.grad is not None


# ---------------------------------------------------------------------------------------------- HXE
def test_hxe_alpha_zero_is_ce_over_node_count():
    torch.manual_seed(1)
    logits = torch.randn(5, TREE.num_leaves, dtype=torch.float64)
    y = torch.tensor(TREE.leaves)[torch.tensor([0, 1, 2, 3, 1])]
    ce = F.cross_entropy(logits, torch.tensor(TREE.leaf_index)[y])
    assert torch.allclose(HXELoss(TREE, alpha=0.0)(logits, y), ce / TREE.num_nodes)
    assert torch.allclose(HXELoss(TREE, alpha=0.0, normalize=False)(logits, y), ce)


def test_hxe_hand_computed():
    # leaves x, y, b with probabilities .5, .3, .2; label x: edges r->a (depth 1) and a->x (depth 2)
    alpha = 0.7
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    z = 1 + 2 * math.exp(-alpha) + 2 * math.exp(-2 * alpha)  # depths 0, 1, 2, 2, 1
    want = -(math.exp(-alpha) / z) * math.log(0.8) - (math.exp(-2 * alpha) / z) * math.log(0.5 / 0.8)
    got = HXELoss(SMALL, alpha=alpha)(logits, torch.tensor([SMALL.index("x")]))
    assert math.isclose(got.item(), want, rel_tol=1e-6)
    assert np.allclose(hxe_weights(SMALL, alpha) * z, np.exp(-alpha * SMALL.depth))


@pytest.mark.parametrize("alpha", [0.1, 0.5, 2.0])
def test_hxe_brute_force(alpha):
    tax = random_tree(20, 3)
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(8, tax.num_leaves)))
    y = torch.tensor(rng.integers(0, tax.num_nodes, 8))
    p = torch.softmax(logits, 1).numpy()
    w = np.exp(-alpha * tax.depth)
    w /= w.sum()
    want = []
    for b, t in enumerate(y.tolist()):
        path = tax.path(t)
        marg = [p[b, desc_leaves(tax, n)].sum() for n in path]
        want.append(-sum(w[path[k]] * math.log(marg[k] / marg[k - 1]) for k in range(1, len(path))))
    assert math.isclose(HXELoss(tax, alpha=alpha)(logits, y).item(), float(np.mean(want)), rel_tol=1e-10)


# ---------------------------------------------------------------------------------------------- soft labels
@pytest.mark.parametrize("kind", ["shortest_path", "lca_height", "wu_palmer", "wu_palmer_root1", "zhao", "ic_distance"])
def test_soft_labels_table_and_on_the_fly_agree(kind):
    tax = random_tree(30, 5)
    y = torch.arange(tax.num_nodes)
    table = SoftLabelLoss(tax, beta=2.0, kind=kind)
    fly = SoftLabelLoss(tax, beta=2.0, kind=kind, table_limit=0)
    assert table.use_table and not fly.use_table
    ref = soft_label_targets(tax, np.arange(tax.num_nodes), 2.0, kind)
    np.testing.assert_allclose(fly.soft_targets(y).numpy(), ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(table.soft_targets(y).numpy(), ref, rtol=1e-6)
    logits = torch.randn(tax.num_nodes, tax.num_leaves)
    assert torch.allclose(table(logits, y), fly(logits, y), rtol=1e-5)


def test_soft_labels_hand_and_limits():
    # label x in SMALL, lca_height (H = 2): d(x, x) = 0, d(x, y) = 1, d(x, b) = 2; Bertinetto et al. divide
    # by the largest leaf-to-leaf distance, 2
    beta = 1.5
    logits = torch.tensor([[0.2, -0.4, 1.0]])
    for scale, options in ((2.0, {}), (1.0, {"normalize_distances": False})):
        q = np.exp(-beta * np.array([0.0, 1.0, 2.0]) / scale)
        q /= q.sum()
        want = -(q * F.log_softmax(logits, 1).numpy()).sum()
        got = SoftLabelLoss(SMALL, beta=beta, **options)(logits, torch.tensor([2])).item()
        assert math.isclose(got, want, rel_tol=1e-6)
    assert torch.allclose(SoftLabelLoss(SMALL, beta=0.0).soft_targets(torch.tensor([2])), torch.full((1, 3), 1 / 3))
    with pytest.raises(ValueError, match="kind"):
        SoftLabelLoss(SMALL, kind="euclid")


# ---------------------------------------------------------------------------------------------- semantic
def test_semantic_layout_and_weights():
    lay = SemanticLayout(TREE)
    assert lay.level_sizes == [2, 3, 2]  # {a, b}, {x, y, z}, {x1, x2}
    assert semantic_level_weights([2, 3, 2]).tolist() == [1.0, 7 / 5, 7 / 2]
    assert semantic_level_weights([1, 100], max_weight=20).tolist() == [1.0, 101 / 100]
    assert semantic_level_weights([100, 1]).tolist() == [1.0, 20.0]
    t = lay.targets(torch.tensor([TREE.index("x2"), TREE.index("b"), 0, -1]))
    # x2: a (pos 0), x (pos 0), x2 (pos 1); b: level 0 only; root and ignore: nothing
    assert t.tolist() == [[0, 0, 1], [1, -1, -1], [-1, -1, -1], [-1, -1, -1]]


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_semantic_softmax_hand_computed(eps):
    # SMALL layout [a, b | x, y]; sample 1 labelled x (levels 0 and 1), sample 2 labelled b (level 0 only).
    logits = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, -1.0, 1.0]])
    w0, w1 = 4 / 4, 4 / 2

    def ce(z, k):
        logp = [zi - math.log(sum(math.exp(v) for v in z)) for zi in z]
        return -(1 - eps) * logp[k] - eps * sum(logp) / len(z)

    l_x = w0 * ce([1.0, 0.0], 0) + w1 * ce([2.0, 0.0], 0)
    l_b = w0 * ce([0.0, 3.0], 1)
    got = SemanticSoftmaxLoss(SMALL, label_smoothing=eps)(logits, torch.tensor([SMALL.index("x"), SMALL.index("b")]))
    assert math.isclose(got.item(), (l_x + l_b) / 2, rel_tol=1e-6)
    got_n = SemanticSoftmaxLoss(SMALL, label_smoothing=eps, normalize="present")(
        logits, torch.tensor([SMALL.index("x"), SMALL.index("b")])
    )
    assert math.isclose(got_n.item(), (l_x / (w0 + w1) + l_b / w0) / 2, rel_tol=1e-6)


def test_semantic_softmax_brute_force_and_deepest_level_trained():
    tax = random_tree(40, 11)
    loss = SemanticSoftmaxLoss(tax)
    lay = loss.layout
    rng = np.random.default_rng(2)
    logits = torch.tensor(rng.normal(size=(16, lay.num_classes)), requires_grad=True)
    y = torch.tensor(rng.integers(1, tax.num_nodes, 16))
    y[0] = lay.class_ids[lay.slices[-1]][0]  # a sample labelled at the deepest level
    ids = lay.class_ids.tolist()
    level = tax.semantic_level
    w = semantic_level_weights(lay.level_sizes)
    total = 0.0
    for b, t in enumerate(y.tolist()):
        for anc in tax.path(t)[1:]:  # every class ancestor-or-self (all non-root nodes are classes)
            k = level[anc]
            z = logits[b, lay.slices[k]].detach().numpy()
            logp = z - np.log(np.exp(z).sum())
            pos = ids[lay.slices[k]].index(anc)
            total += w[k] * (-(0.8) * logp[pos] - 0.2 * logp.mean())
    out = loss(logits, y)
    assert math.isclose(out.item(), total / 16, rel_tol=1e-9)
    out.backward()
    deepest = lay.slices[-1]
    assert logits.grad[:, deepest].abs().sum() > 0  # the published code would leave this zero


def test_semantic_kd_against_reference():
    tax = random_tree(30, 4)
    kd = SemanticKDLoss(tax)
    lay = kd.layout
    rng = np.random.default_rng(3)
    s, t = (torch.tensor(rng.normal(size=(5, lay.num_classes))) for _ in range(2))
    want = 0.0
    for sl in lay.slices:
        ps, pt = torch.softmax(s[:, sl], 1), torch.softmax(t[:, sl], 1)
        k = math.ceil(pt.shape[1] / 20)
        conf = pt.sort(1, descending=True).values[:, :k].sum(1)
        want += (conf[:, None] * (ps - pt) ** 2).sum().item() / 5
    assert math.isclose(kd(s, t).item(), want, rel_tol=1e-9)
    kl = SemanticKDLoss(tax, distance="kl")(s, t)
    assert kl.item() > 0 and SemanticKDLoss(tax, distance="kl")(t, t).abs().item() < 1e-12


def test_semantic_needs_tree():
    with pytest.raises(TaxonomyError, match="to_tree"):
        SemanticSoftmaxLoss(DAG)


# ---------------------------------------------------------------------------------------------- conditional
def brute_conditional(tax: Taxonomy, z: np.ndarray, stop: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-node P(n) and P(stop at n) by explicit loops over each parent's children."""
    internal = [n for n in range(tax.num_nodes) if not tax.is_leaf[n]]
    p = np.zeros(tax.num_nodes)
    ps = np.zeros(tax.num_nodes)
    p[0] = 1.0
    for n in range(tax.num_nodes):  # parents before children
        if tax.is_leaf[n]:
            continue
        kids = list(tax.children(n))
        scores = [z[c - 1] for c in kids] + ([z[tax.num_nodes - 1 + internal.index(n)]] if stop else [])
        e = np.exp(np.array(scores) - max(scores))
        e /= e.sum()
        for c, q in zip(kids, e, strict=False):
            p[c] = p[n] * q
        if stop:
            ps[n] = p[n] * e[-1]
    return p, ps


@pytest.mark.parametrize("stop", [False, True])
def test_conditional_softmax_brute_force(stop):
    tax = random_tree(18, 7)
    cs = ConditionalSoftmax(tax, stop=stop)
    rng = np.random.default_rng(1)
    z = rng.normal(size=(4, cs.num_outputs))
    logp = cs.node_log_probs(torch.tensor(z)).numpy()
    y = torch.tensor(rng.integers(0, tax.num_nodes, 4))
    want_loss = []
    for b in range(4):
        p, ps = brute_conditional(tax, z[b], stop)
        np.testing.assert_allclose(np.exp(logp[b]), p, rtol=1e-10)
        t = int(y[b])
        want_loss.append(-math.log(ps[t] if stop and not tax.is_leaf[t] else p[t]))
    got = ConditionalSoftmaxLoss(tax, stop=stop)(torch.tensor(z), y)
    assert math.isclose(got.item(), float(np.mean(want_loss)), rel_tol=1e-10)


def test_conditional_hand_computed():
    # SMALL, logits for a, x, y, b = log 3, log 1, log 4, log 1: P(a) = 3/4, P(x | a) = 1/5
    z = torch.tensor([[math.log(3), 0.0, math.log(4), 0.0]])
    got = ConditionalSoftmaxLoss(SMALL)(z, torch.tensor([SMALL.index("x")]))
    assert math.isclose(got.item(), -math.log(0.75 * 0.2), rel_tol=1e-6)


def test_huffman_tree_is_optimal():
    counts = [45, 13, 12, 16, 9, 5]  # the textbook example: cost 224
    tree = huffman_tree(list("abcdef"), counts)
    depths = tree.depth[tree.ids(list("abcdef"))]
    assert int(np.dot(depths, counts)) == 224
    assert tree.is_tree and tree.num_leaves == 6 and tree.num_nodes == 11
    # brute-force optimality on small random sets: the cost equals the sum of all merged weights
    rng = np.random.default_rng(0)
    for _ in range(5):
        c = rng.integers(1, 50, size=7).tolist()
        t = huffman_tree([f"l{i}" for i in range(7)], c)
        merged, heap = 0, sorted(c)
        while len(heap) > 1:
            a, b = heap.pop(0), heap.pop(0)
            merged += a + b
            heap = sorted([*heap, a + b])
        assert int(np.dot(t.depth[t.ids([f"l{i}" for i in range(7)])], c)) == merged
    with pytest.raises(ValueError, match="counts"):
        huffman_tree(["a", "b"], [1, -1])


# ---------------------------------------------------------------------------------------------- nested
CHAIN = Taxonomy([("root", "WT"), ("WT", "TC"), ("TC", "ET")])


def test_nested_sigmoid_values_and_log_complement():
    z = torch.tensor([[0.3, -1.2, 2.0], [1e4, 1e4, -1e4]], dtype=torch.float64)
    logp, logq = NestedSigmoid(CHAIN)(z)
    s = torch.sigmoid(z[0])
    want = torch.stack([torch.tensor(1.0, dtype=torch.float64), s[0], s[0] * s[1], s[0] * s[1] * s[2]])
    assert torch.allclose(logp[0].exp(), want)
    assert torch.allclose(logq[0, 1:], torch.log1p(-want[1:]))
    assert torch.isfinite(logq[1, 1:]).all() and logq[1, 3].item() == pytest.approx(0.0)
    assert logq[1, 1].item() == pytest.approx(-1e4)  # log(1 - sigmoid(1e4)) = log sigmoid(-1e4)


def test_nested_region_loss_references():
    z = torch.tensor([[0.5, -0.2, 0.1], [-1.0, 2.0, 0.3]], dtype=torch.float64)
    y_ids = torch.tensor([2, 0])
    regions = node_ids_to_regions(y_ids, CHAIN).double()
    assert regions.tolist() == [[1, 1, 0], [0, 0, 0]]
    p = NestedSigmoid(CHAIN)(z)[0].exp()[:, 1:]
    bce_ref = F.binary_cross_entropy(p, regions)
    assert torch.allclose(NestedRegionLoss(CHAIN, loss="bce")(z, y_ids), bce_ref)
    assert torch.allclose(NestedRegionLoss(CHAIN, loss="bce")(z, regions), bce_ref)
    inter, den = (p * regions).sum(0), p.sum(0) + regions.sum(0)
    dice_ref = (1 - (2 * inter + 1) / (den + 1)).mean()
    assert torch.allclose(NestedRegionLoss(CHAIN, loss="dice")(z, y_ids), dice_ref)
    both = NestedRegionLoss(CHAIN, loss="bce+dice", dice_weight=0.5)(z, y_ids)
    assert torch.allclose(both, bce_ref + 0.5 * dice_ref)


def test_nested_dense_and_brats_regions():
    from hiercls.taxonomy.regions import brats_regions

    spec = brats_regions()
    vol = torch.tensor([[[0, 1, 2], [4, 4, 2]]])  # [B=1, H=2, W=3] raw BraTS labels
    tax = spec.taxonomy
    masks = spec.labels_to_regions(vol, spatial_dims=2, dtype=torch.float64)  # [1, 3, 2, 3]
    nodes = spec.labels_to_nodes(vol)
    assert torch.equal(node_ids_to_regions(nodes, tax).double(), masks)
    z = torch.randn(1, 3, 2, 3, dtype=torch.float64)
    loss = NestedRegionLoss(tax)
    assert torch.allclose(loss(z, masks), loss(z, nodes))
    # ignored voxels do not count
    ignored = nodes.clone()
    ignored[0, 0, 0] = -1
    z2 = z.clone()
    z2[0, :, 0, 0] = 50.0
    assert torch.allclose(NestedRegionLoss(tax, loss="bce")(z, ignored), NestedRegionLoss(tax, loss="bce")(z2, ignored))
    z3 = torch.randn(2, 3, 2, 2, 2)
    assert NestedRegionLoss(tax)(z3, torch.randint(0, 4, (2, 2, 2, 2))).isfinite()
    with pytest.raises(ValueError, match="node-id targets must have shape"):
        loss(z, nodes[:, :1])


def test_soft_dice_hand():
    p = torch.tensor([[0.5, 1.0], [0.5, 0.0]])
    y = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    # region 0: inter .5, sums 1 + 1; region 1: inter 1, sums 1 + 1
    want = ((1 - (1 + 0) / 2) + (1 - 2 / 2)) / 2
    assert math.isclose(soft_dice_loss(p, y, smooth=0.0).item(), want)


# ---------------------------------------------------------------------------------------------- multi-label
def reference_mcloss(tax: Taxonomy, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """C-HMCNN as published: dense R[i, j] = j is a descendant-or-self of i, in probability space."""
    r = torch.tensor(tax.ancestor_matrix().T, dtype=z.dtype)[1:, 1:]  # R[i, j] = i ancestor-or-self of j
    h = torch.sigmoid(z)

    def constr(x):
        return (r[None] * x[:, None, :]).max(2).values

    c_out = constr(h)
    train_out = constr(y * h)
    final = (1 - y) * c_out + y * train_out
    return F.binary_cross_entropy(final, y)


@pytest.mark.parametrize("tax", [TREE, DAG], ids=["tree", "dag"])
def test_multilabel_bce_and_mcloss(tax):
    rng = np.random.default_rng(4)
    z = torch.tensor(rng.normal(size=(6, tax.num_nodes - 1)))
    ids = torch.tensor(rng.integers(1, tax.num_nodes, 6))
    closed = torch.tensor(tax.ancestor_matrix(ids.numpy()), dtype=torch.float64)[:, 1:]
    plain = HierarchicalBCELoss(tax)
    assert torch.allclose(plain(z, ids), F.binary_cross_entropy_with_logits(z, closed))
    multi_hot = torch.zeros(6, tax.num_nodes, dtype=torch.float64)
    multi_hot[torch.arange(6), ids] = 1  # not closed: the loss closes it
    assert torch.allclose(plain(z, multi_hot), F.binary_cross_entropy_with_logits(z, closed))
    coherent = HierarchicalBCELoss(tax, coherent=True)
    assert torch.allclose(coherent(z, ids), reference_mcloss(tax, z, closed))


def test_multilabel_ignore_and_errors():
    z = torch.zeros(2, TREE.num_nodes - 1)
    loss = HierarchicalBCELoss(TREE)
    assert math.isclose(loss(z, torch.tensor([3, -1])).item(), math.log(2), rel_tol=1e-6)
    with pytest.raises(ValueError, match="multi-hot"):
        loss(z, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="node ids"):
        loss(z, torch.tensor([3, 99]))


# ---------------------------------------------------------------------------------------------- all losses
def _loss_cases():
    tax = TREE
    y = torch.tensor([TREE.index("x1"), TREE.index("a"), TREE.index("z"), TREE.index("y")])
    lay = SemanticLayout(tax)
    return [
        ("flat", LeafCrossEntropy(tax, label_smoothing=0.1), tax.num_leaves, y),
        ("hxe", HXELoss(tax, alpha=0.5), tax.num_leaves, y),
        ("soft", SoftLabelLoss(tax, beta=3.0), tax.num_leaves, y),
        ("soft_fly", SoftLabelLoss(tax, beta=3.0, kind="zhao", table_limit=0), tax.num_leaves, y),
        ("semantic", SemanticSoftmaxLoss(tax), lay.num_classes, y),
        ("semantic_present", SemanticSoftmaxLoss(tax, normalize="present"), lay.num_classes, y),
        ("conditional", ConditionalSoftmaxLoss(tax), tax.num_nodes - 1, y),
        ("conditional_stop", ConditionalSoftmaxLoss(tax, stop=True), ConditionalSoftmax(tax, True).num_outputs, y),
        ("nested", NestedRegionLoss(tax), tax.num_nodes - 1, y),
        ("multilabel", HierarchicalBCELoss(tax), tax.num_nodes - 1, y),
        ("mcloss", HierarchicalBCELoss(tax, coherent=True), tax.num_nodes - 1, y),
    ]


@pytest.mark.parametrize("case", _loss_cases(), ids=lambda c: c[0])
def test_gradcheck_float64(case):
    _, loss, width, y = case
    torch.manual_seed(0)
    z = torch.randn(len(y), width, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: loss(x, y), (z,), eps=1e-6, atol=1e-5)


def test_gradcheck_semantic_kd_and_dense_nested():
    lay = SemanticLayout(TREE)
    kd = SemanticKDLoss(TREE, distance="kl", level_weights=True)
    t = torch.randn(3, lay.num_classes, dtype=torch.float64)
    s = torch.randn(3, lay.num_classes, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: kd(x, t), (s,))
    assert torch.autograd.gradcheck(lambda x: SemanticKDLoss(TREE)(x, t), (s,))
    nested = NestedRegionLoss(CHAIN)
    labels = torch.randint(-1, 4, (2, 3, 2))
    zd = torch.randn(2, 3, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: nested(x, labels), (zd,))


@pytest.mark.parametrize("case", _loss_cases(), ids=lambda c: c[0])
def test_extreme_logits_finite(case):
    _, loss, width, y = case
    g = torch.Generator().manual_seed(0)
    z = (torch.randint(0, 2, (len(y), width), generator=g).float() * 2 - 1) * 1e4
    z.requires_grad_(True)
    out = loss(z, y)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(z.grad).all()
    for dtype in (torch.float16, torch.bfloat16):
        out = loss(z.detach().to(dtype), y)
        assert torch.isfinite(out) and out.dtype == torch.float32

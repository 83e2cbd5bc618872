"""The head contract, checked across every registered head: shapes, consistent node probabilities, training."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _generators import random_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiercls.heads import (
    ConditionalSoftmaxHead,
    HierarchicalHead,
    MultiLabelHead,
    NestedSigmoidHead,
    SemanticSoftmaxHead,
    create_head,
    get_head_class,
    leaf_probs_to_node_probs,
    list_heads,
    register_head,
)
from hiercls.taxonomy import Taxonomy, TaxonomyError

torch.set_num_threads(1)

TREE = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("a", "y"), ("x", "x1"), ("x", "x2"), ("b", "z"), ("r", "c")])
DAG = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y"), ("b", "w")])
D = 6

# name -> (options, "sum" = parent equals sum of children / "ge_sum" = parent >= sum / "ge" = parent >= child)
VARIANTS: dict[str, tuple[str, dict, str]] = {
    "flat": ("flat", {}, "sum"),
    "flat_smooth": ("flat", {"label_smoothing": 0.1}, "sum"),
    "hxe": ("hxe", {"alpha": 0.5}, "sum"),
    "soft_labels": ("soft_labels", {"beta": 15.0}, "sum"),  # the paper's beta: distances over d_max = 3
    "semantic_softmax": ("semantic_softmax", {}, "sum"),
    "conditional_softmax": ("conditional_softmax", {}, "sum"),
    "conditional_stop": ("conditional_softmax", {"stop": True}, "ge_sum"),
    "conditional_huffman": ("conditional_softmax", {"huffman_counts": "auto"}, "sum"),
    "nested_sigmoid": ("nested_sigmoid", {}, "ge"),
    "multilabel": ("multilabel", {}, "ge"),
    "multilabel_coherent": ("multilabel", {"coherent": True}, "ge"),
}


def make(variant: str, tax: Taxonomy = TREE, in_features: int = D) -> HierarchicalHead:
    name, opts, _ = VARIANTS[variant]
    opts = dict(opts)
    if opts.get("huffman_counts") == "auto":
        opts["huffman_counts"] = np.arange(1, tax.num_leaves + 1, dtype=float)
    return create_head(name, tax, in_features, **opts)


def check_consistent(tax: Taxonomy, p: torch.Tensor, rule: str, tol: float = 1e-5) -> None:
    assert p.dtype == torch.float32 and p.shape[1] == tax.num_nodes
    assert torch.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()
    assert torch.all(p[:, 0] == 1.0)
    child = torch.as_tensor(np.repeat(np.arange(tax.num_nodes), np.diff(tax.parent_ptr)))
    parent = torch.as_tensor(tax.parent_idx.copy())
    assert torch.all(p[:, parent] >= p[:, child] - tol)
    if rule in ("sum", "ge_sum") and tax.is_tree:
        sums = torch.zeros_like(p).index_add(1, parent, p[:, child])
        internal = torch.as_tensor(~tax.is_leaf)
        gap = p[:, internal] - sums[:, internal]
        assert torch.all(gap >= -tol)
        if rule == "sum":
            assert torch.all(gap.abs() <= tol)


def test_registry_lists_every_builtin_head():
    assert set(list_heads()) >= {
        "flat",
        "semantic_softmax",
        "conditional_softmax",
        "nested_sigmoid",
        "multilabel",
        "hxe",
        "soft_labels",
    }
    assert get_head_class("flat").head_name == "flat"
    with pytest.raises(ValueError, match="did you mean 'flat'"):
        create_head("flatt", TREE, D)


def test_register_head_rejects_duplicates_and_non_heads():
    with pytest.raises(ValueError, match="already registered"):

        @register_head("flat")
        class Other(HierarchicalHead):  # pragma: no cover - never instantiated
            pass

    with pytest.raises(TypeError, match="HierarchicalHead subclass"):
        register_head("not_a_head")(int)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_contract(variant):
    _, _, rule = VARIANTS[variant]
    torch.manual_seed(0)
    head = make(variant)
    assert head.taxonomy is TREE and head.in_features == D and head.num_outputs > 0
    out = head(torch.randn(5, D))
    assert out.shape == (5, head.num_outputs)
    check_consistent(TREE, head.node_probs(out), rule)
    y = torch.tensor([TREE.index("x1"), TREE.index("y"), TREE.index("z"), -1, TREE.index("c")])
    loss = head.loss(out, y)
    assert loss.ndim == 0 and torch.isfinite(loss)
    # taxonomy index tables are buffers that move with .to() but are not checkpointed
    assert set(head.state_dict()) <= {"fc.weight", "fc.bias"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_training_decreases_loss_and_reset(variant):
    torch.manual_seed(1)
    head = make(variant)
    feats = torch.randn(32, D)
    labels = torch.tensor(TREE.leaves)[torch.randint(0, TREE.num_leaves, (32,))]
    labels[::5] = TREE.index("a")  # some internal labels
    opt = torch.optim.Adam(head.parameters(), lr=0.05)  # scale-free: HXE is normalised by N
    first = None
    for _ in range(25):
        opt.zero_grad()
        loss = head.loss(head(feats), labels)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert head.loss(head(feats), labels).item() < 0.9 * first
    trained = head.fc.weight.detach().clone()
    head.reset_parameters()
    assert not torch.equal(trained, head.fc.weight) and torch.all(head.fc.bias == 0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dtypes_autocast_and_extreme_features(variant):
    head = make(variant)
    y = torch.tensor([TREE.index("x2"), TREE.index("b")])
    h64 = make(variant).double()
    out = h64(torch.randn(2, D, dtype=torch.float64))
    assert out.dtype == torch.float64 and h64.node_probs(out).dtype == torch.float32
    assert torch.isfinite(h64.loss(out, y))
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            out = head(torch.randn(2, D))
            loss = head.loss(out, y)
            p = head.node_probs(out)
        assert torch.isfinite(loss) and loss.dtype == torch.float32
        check_consistent(TREE, p, "ge", tol=1e-3)
    with torch.no_grad():
        head.fc.weight.copy_(torch.sign(torch.randn_like(head.fc.weight)) * 1e3)
    feats = torch.randn(2, D) * 10  # logits around +-1e4
    out = head(feats)
    out.retain_grad()
    loss = head.loss(out, y)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(out.grad).all()
    check_consistent(TREE, head.node_probs(out), "ge")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_input_errors(variant):
    head = make(variant)
    with pytest.raises(ValueError, match=r"features must have shape \[B, 6"):
        head(torch.randn(2, D + 1))
    with pytest.raises(TypeError, match="floating-point"):
        head(torch.ones(2, D, dtype=torch.long))
    out = head(torch.randn(2, D))
    with pytest.raises(ValueError, match="node id"):
        head.loss(out, torch.tensor([0, TREE.num_nodes]))
    with pytest.raises(TypeError, match="unknown option"):
        create_head(VARIANTS[variant][0], TREE, D, colour="red")


@pytest.mark.parametrize("name", ["flat", "multilabel", "soft_labels"])
def test_dag_capable_heads(name):
    head = create_head(name, DAG, D)
    out = head(torch.randn(4, D))
    check_consistent(DAG, head.node_probs(out), "ge")
    assert torch.isfinite(head.loss(out, torch.tensor([DAG.index("x"), DAG.index("a"), DAG.index("w"), 0])))


@pytest.mark.parametrize("name", ["semantic_softmax", "conditional_softmax", "hxe", "nested_sigmoid"])
def test_tree_only_heads_reject_dags(name):
    with pytest.raises(TaxonomyError, match="to_tree"):
        create_head(name, DAG, D)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 30), seed=st.integers(0, 10_000), variant=st.sampled_from(list(VARIANTS)))
def test_node_probs_consistent_on_random_trees(n, seed, variant):
    tax = random_tree(n, seed)
    if variant == "conditional_huffman" and tax.num_leaves < 2:
        return
    torch.manual_seed(seed)
    head = make(variant, tax)
    out = head(torch.randn(3, D) * 3)
    check_consistent(tax, head.node_probs(out), VARIANTS[variant][2])
    y = torch.randint(0, tax.num_nodes, (3,))
    assert torch.isfinite(head.loss(out, y))


# ---------------------------------------------------------------------------------------------- per head
def test_flat_node_probs_are_leaf_marginals():
    head = create_head("flat", TREE, D)
    out = head(torch.randn(3, D))
    p = torch.softmax(out, 1)
    want = torch.tensor(TREE.marginals(p.detach().numpy()))
    assert torch.allclose(head.node_probs(out), want, atol=1e-6)
    assert torch.allclose(leaf_probs_to_node_probs(TREE, p), want, atol=1e-6)


def test_semantic_head_levels_and_nonclass_nodes():
    head = SemanticSoftmaxHead(TREE, D)
    out = head(torch.randn(4, D))
    levels = head.predict_levels(out)
    assert levels.shape == (4, head.layout.num_levels)
    sem = TREE.semantic_level
    for k in range(levels.shape[1]):
        assert all(sem[int(i)] == k for i in levels[:, k])
    assert [lp.shape[1] for lp in head.level_probs(out)] == head.layout.level_sizes
    # Level-0 node probabilities are exactly the level-0 softmax (no renormalisation above level 0).
    p = head.node_probs(out)
    assert torch.allclose(p[:, head.layout.class_ids[head.layout.slices[0]]], head.level_probs(out)[0])
    # classes that skip a node: 'x' is not a class, so x1/x2 are level 1 below 'a' and x = x1 + x2
    tax = Taxonomy(TREE.edge_list(names=True), classes=[c for c in TREE.names if c not in ("r", "x")])
    h2 = SemanticSoftmaxHead(tax, D)
    p2 = h2.node_probs(h2(torch.randn(4, D)))
    check_consistent(tax, p2, "sum")
    assert torch.allclose(p2[:, tax.index("x")], p2[:, tax.index("x1")] + p2[:, tax.index("x2")])
    t = torch.randn(4, h2.num_outputs)
    assert h2.distillation_loss(t, t).item() == pytest.approx(0.0, abs=1e-12)


def test_conditional_stop_probs_and_huffman():
    head = ConditionalSoftmaxHead(TREE, D, stop=True)
    out = head(torch.randn(3, D))
    p, stop = head.node_probs(out), head.stop_probs(out)
    child = torch.as_tensor(TREE.child_idx.copy())
    parent = torch.as_tensor(np.repeat(np.arange(TREE.num_nodes), np.diff(TREE.child_ptr)))
    sums = torch.zeros_like(p).index_add(1, parent, p[:, child])
    internal = torch.as_tensor(~TREE.is_leaf)
    assert torch.allclose(p[:, internal], sums[:, internal] + stop[:, internal], atol=1e-6)
    total_stop = stop[:, torch.tensor(TREE.leaves)].sum(1) + stop[:, internal].sum(1)
    assert torch.allclose(total_stop, torch.ones(3), atol=1e-6)  # every label stops somewhere
    counts = np.array([100, 1, 1, 1, 50], dtype=float)  # leaves x1, x2, y, z, c
    huff = ConditionalSoftmaxHead(TREE, D, huffman_counts=counts)
    assert huff.num_outputs == 2 * (TREE.num_leaves - 1)
    assert huff.tree.depth[huff.tree.index("x1")] == 1
    out = huff(torch.randn(3, D))
    y = torch.tensor(TREE.leaves[[0, 3, 4]])
    want = -torch.log(huff.node_probs(out)[torch.arange(3), y]).mean()
    assert torch.allclose(huff.loss(out, y), want, atol=1e-5)
    internal_y = torch.tensor([TREE.index("x"), TREE.index("a"), TREE.index("c")])
    want = -torch.log(huff.node_probs(out)[torch.arange(3), internal_y]).mean()
    assert torch.allclose(huff.loss(out, internal_y), want, atol=1e-5)
    with pytest.raises(ValueError, match="one count per leaf"):
        ConditionalSoftmaxHead(TREE, D, huffman_counts=[1, 2])


@pytest.mark.parametrize("spatial", [(5, 4), (3, 2, 2)])
def test_nested_head_dense(spatial):
    from hiercls.taxonomy.regions import brats_regions

    spec = brats_regions()
    tax = spec.taxonomy
    head = NestedSigmoidHead(tax, D)
    feats = torch.randn(2, D, *spatial)
    out = head(feats)
    assert out.shape == (2, 3, *spatial)
    # the dense map is the vector head applied per voxel
    vec = head(feats.movedim(1, -1).reshape(-1, D)).reshape(2, *spatial, 3).movedim(-1, 1)
    assert torch.allclose(out, vec, atol=1e-6)
    p = head.node_probs(out)
    assert p.shape == (2, 4, *spatial) and torch.all(p[:, 0] == 1)
    assert torch.all(p[:, 1] >= p[:, 2]) and torch.all(p[:, 2] >= p[:, 3])
    raw = torch.tensor([0, 1, 2, 4])[torch.randint(0, 4, (2, *spatial))]
    masks = spec.labels_to_regions(raw, spatial_dims=len(spatial), dtype=torch.float32)
    loss = head.loss(out, masks)
    assert torch.allclose(loss, head.loss(out, spec.labels_to_nodes(raw)))
    loss.backward()
    assert torch.isfinite(head.fc.weight.grad).all()
    labels = spec.regions_to_labels(head.region_probs(out), spatial_dims=len(spatial))
    assert labels.shape == (2, *spatial)


def test_multilabel_head_probs_are_mcm():
    head = MultiLabelHead(DAG, D)
    out = head(torch.randn(3, D))
    s = torch.sigmoid(out)
    want = torch.stack(
        [
            torch.stack(
                [
                    s[b, torch.as_tensor(DAG.descendants(n, include_self=True) - 1)].max()
                    for n in range(1, DAG.num_nodes)
                ]
            )
            for b in range(3)
        ]
    )
    assert torch.allclose(head.node_probs(out)[:, 1:], want)
    assert math.isclose(
        head.loss(torch.zeros(1, DAG.num_nodes - 1), torch.tensor([1])).item(), math.log(2), rel_tol=1e-6
    )


def test_semantic_and_conditional_node_probs_hand_computed():
    small = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    # semantic layout [a, b | x, y]: P(a) = 3/4, P(b) = 1/4; x, y renormalised within a: 1/5, 4/5
    sem = SemanticSoftmaxHead(small, D)
    z = torch.tensor([[math.log(3), 0.0, 0.0, math.log(4)]])
    want = torch.tensor([[1.0, 0.75, 0.75 * 0.2, 0.75 * 0.8, 0.25]])
    assert torch.allclose(sem.node_probs(z), want, atol=1e-6)
    # conditional with stop: logits a, x, y, b, then stop(r), stop(a)
    cond = ConditionalSoftmaxHead(small, D, stop=True)
    z = torch.tensor([[math.log(2), 0.0, 0.0, math.log(1), math.log(1), math.log(2)]])
    # at r: a 2, b 1, stop 1 -> 1/2, 1/4, 1/4; at a: x 1, y 1, stop 2 -> 1/4, 1/4, 1/2
    want = torch.tensor([[1.0, 0.5, 0.125, 0.125, 0.25]])
    assert torch.allclose(cond.node_probs(z), want, atol=1e-6)
    assert torch.allclose(cond.stop_probs(z), torch.tensor([[0.25, 0.25, 0.125, 0.125, 0.25]]), atol=1e-6)
    y = torch.tensor([small.index("a"), small.index("x")])
    assert torch.allclose(cond.loss(z.repeat(2, 1), y), -torch.tensor([0.25, 0.125]).log().mean(), atol=1e-6)


def test_degenerate_taxonomies_are_clear_errors():
    single = Taxonomy([], nodes=["only"])
    for name in ("conditional_softmax", "multilabel", "nested_sigmoid"):
        with pytest.raises(TaxonomyError, match=r"single node|no region"):
            create_head(name, single, D)
    with pytest.raises(ValueError, match="in_features"):
        create_head("flat", TREE, 0)
    with pytest.raises(TypeError, match="Taxonomy"):
        create_head("flat", {"r": None}, D)


def test_every_builtin_head_is_covered_by_the_contract_tests():
    builtin = {
        n
        for n in list_heads()
        if get_head_class(n).__module__.startswith("hiercls.heads.")
        and get_head_class(n).__module__ != "hiercls.heads.prompt"
    }
    assert builtin <= {name for name, _, _ in VARIANTS.values()}


def test_soft_label_head_passes_normalize_distances_to_its_loss() -> None:
    # TREE: leaves x1, x2, y, z, c; x1 vs c has the LCA at the root, lca_height 3 = d_max
    feats = torch.randn(4, D, generator=torch.Generator().manual_seed(0))
    y = torch.as_tensor(TREE.leaves[[0, 1, 3, 4]])
    for normalize in (True, False):
        head = create_head("soft_labels", TREE, D, beta=3.0, normalize_distances=normalize)
        assert head.criterion.normalize_distances is normalize
        logp = torch.log_softmax(head(feats), dim=1)
        d = torch.as_tensor(TREE.distance_matrix("lca_height", nodes=y.numpy()), dtype=torch.float32)
        q = torch.softmax(-3.0 * d / (3.0 if normalize else 1.0), dim=1)  # softmax(-beta d / d_max)
        assert torch.allclose(head.loss(head(feats), y), -(q * logp).sum(1).mean(), atol=1e-6)

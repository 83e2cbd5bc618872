"""Each paper-named function against a case computed by hand from the paper's definition."""

from __future__ import annotations

import json
import math

import networkx as nx
import numpy as np
import pytest
import torch

import hiercls.metrics as M
from hiercls.decode import bayes_node, plurality, prediction_expected_cost, top_down
from hiercls.losses import SemanticSoftmaxLoss
from hiercls.losses.leaf import max_leaf_distance
from hiercls.taxonomy import Taxonomy, TaxonomyError, read_taxonomy

# Issue 9's tree: R -> {X, c, d}, X -> {Y, b}, Y -> {a1, a2}
ISSUE = Taxonomy([("R", "X"), ("X", "Y"), ("Y", "a1"), ("Y", "a2"), ("X", "b"), ("R", "c"), ("R", "d")])


def test_plurality_is_the_published_rule():
    leaf = np.array([[0.23, 0.29, 0.15, 0.31, 0.02]])  # a1, a2, b, c, d
    # second-best child probabilities on the greedy path R -> X -> Y: c = .31, b = .15, a1 = .23; the running
    # max .31 beats a2 = .29, so the rule stops at Y (P(Y) = .52 >= .31)
    assert ISSUE.name_of(int(plurality(leaf, ISSUE, leaf_probs=True)[0])) == "Y"
    assert ISSUE.name_of(int(top_down(leaf, ISSUE, leaf_probs=True)[0])) == "a2"
    # with c = .25 instead the threshold is .25 and a2 (.29) passes it
    leaf2 = np.array([[0.23, 0.29, 0.15, 0.25, 0.08]])
    assert ISSUE.name_of(int(plurality(leaf2, ISSUE, leaf_probs=True)[0])) == "a2"


def test_wu_palmer_and_zhao_paper_forms_by_hand():
    t = ISSUE
    a1, a2, b, c = (t.index(n) for n in ("a1", "a2", "b", "c"))
    # depths (root 0): a1 = a2 = 3, b = 2, c = 1; lca(a1, a2) = Y (2), lca(a1, b) = X (1), lca(a1, c) = R (0)
    assert t.distance(a1, a2, "wu_palmer") == pytest.approx(1 - 2 * 2 / 6)
    assert t.distance(a1, b, "wu_palmer") == pytest.approx(1 - 2 * 1 / 5)
    assert t.distance(a1, c, "wu_palmer") == pytest.approx(1.0)
    assert t.distance(a1, b, "wu_palmer_root1") == pytest.approx(1 - 2 * 2 / 7)
    # IC = log2(5 / leaves under): a1: log2 5, b: log2 5, X: log2(5/3), Y: log2(5/2)
    assert t.distance(a1, b, "zhao") == pytest.approx(1 - 2 * math.log2(5 / 3) / (2 * math.log2(5)))
    assert t.distance(a1, a2, "zhao") == pytest.approx(1 - 2 * math.log2(5 / 2) / (2 * math.log2(5)))
    assert t.distance(a1, b, "ic_distance") == pytest.approx(2 * math.log(5) - 2 * math.log(5 / 3))
    # 0/0 cases: root with itself; the root and its only child (both IC 0) under zhao
    chain = Taxonomy([("r", "s"), ("s", "x"), ("s", "y")])
    assert chain.distance(0, 0, "wu_palmer") == 0.0
    assert chain.distance(0, 1, "zhao") == 0.0
    assert chain.distance(0, 1, "wu_palmer") == pytest.approx(1.0)


def test_realized_and_expected_cost_with_a_node_to_leaf_matrix():
    t = ISSUE
    rng = np.random.default_rng(0)
    cost = rng.random((t.num_nodes, t.num_leaves))
    leaf = rng.dirichlet(np.ones(t.num_leaves), size=6)
    # brute force: expected cost of node n is sum_l p(l) cost[n, l]
    exp = leaf @ cost.T
    best = bayes_node(leaf, t, cost, leaf_probs=True)
    np.testing.assert_array_equal(best, exp.argmin(1))
    for pred in (best, top_down(leaf, t, leaf_probs=True), plurality(leaf, t, leaf_probs=True)):
        got = prediction_expected_cost(leaf, pred, t, cost, leaf_probs=True)
        np.testing.assert_allclose(got, exp[np.arange(6), pred])
        assert (got >= exp.min(1) - 1e-12).all()
    y = t.leaves[[0, 3, 4]]
    pred = np.array([t.index("Y"), t.index("c"), 0])
    want = np.mean([cost[pred[0], 0], cost[pred[1], 3], cost[0, 4]])
    assert M.realized_cost(y, pred, taxonomy=t, cost=cost) == pytest.approx(want)
    with pytest.raises(ValueError, match="'Y'"):
        M.realized_cost([t.index("Y")], [0], taxonomy=t, cost=cost)
    # named costs: shortest path a1 -> X is 2 edges, c -> c is 0
    assert M.realized_cost(["a1", "c"], ["X", "c"], taxonomy=t) == 1.0


def test_mistake_severity_conventions():
    t = ISSUE
    # Bertinetto et al.: LCA height over mistakes only (H = 3): a1 vs b: lca X at depth 1 -> 2
    assert M.mistake_severity(["a1", "a1"], ["b", "a1"], taxonomy=t) == 2.0
    # Plaud et al.: mean shortest path over all samples: (3 + 0) / 2
    assert M.hierarchical_distance_loss(["a1", "a1"], ["b", "a1"], taxonomy=t) == 1.5


def test_soft_label_beta_is_the_papers():
    # lca_height on ISSUE: largest leaf-to-leaf distance is H - depth(R) = 3; shortest path a1 .. c = 4
    assert max_leaf_distance(ISSUE, "lca_height") == 3.0
    assert max_leaf_distance(ISSUE, "shortest_path") == 4.0
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(2, 12))
        edges = [(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, n)]
        tax = Taxonomy(edges)
        for kind in ("lca_height", "shortest_path", "wu_palmer", "zhao"):
            lv = tax.leaves
            brute = max((float(tax.distance(a, b, kind)) for a in lv for b in lv), default=0.0)
            assert max_leaf_distance(tax, kind) == pytest.approx(brute)


def test_semantic_softmax_drop_deepest_level_and_level_argmax_accuracy():
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    logits = torch.tensor([[0.3, -0.2, 1.0, 0.1]])  # level 0: a, b; level 1: x, y
    y = torch.tensor([tax.index("x")])
    # published loss without smoothing: only level 0 with weight w_0 = 4 / 4 = 1: CE of a among (a, b)
    want = -torch.log_softmax(logits[0, :2], 0)[0].item()
    got = SemanticSoftmaxLoss(tax, label_smoothing=0.0, drop_deepest_level=True)(logits, y).item()
    assert got == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="two semantic levels"):
        SemanticSoftmaxLoss(Taxonomy([("r", "a")]), drop_deepest_level=True)
    # independent level argmaxes (b, x) for truth x: level 0 wrong (a), level 1 right -> 1/2; truth b has one
    # level: (b, y) -> right at level 0, level 1 not valid -> total (1 + 1) / (2 + 1)
    lp = np.array([[tax.index("b"), tax.index("x")], [tax.index("b"), tax.index("y")]])
    assert M.level_argmax_accuracy_score(["x", "b"], lp, taxonomy=tax) == pytest.approx(2 / 3)


def test_hiclass_one_dimensional_and_zero_division():
    assert M.hiclass_precision_recall_fscore(np.array([1, 2]), np.array([1, 3])) == (0.5, 0.5, 0.5)
    assert M.hiclass_precision_recall_fscore(["a"], ["b"], zero_division=1.0) == (0.0, 0.0, 1.0)


def test_top_k_ties_smallest_id_first():
    tax = Taxonomy([("r", "a"), ("r", "b"), ("r", "c")])
    scores = np.array([[0.2, 0.4, 0.4]])  # b and c tie: b (id 2) ranks before c (id 3)
    assert M.top_k_predictions(scores, 2, taxonomy=tax).tolist() == [[2, 3]]
    assert M.top_k_predictions(np.array([[0.5, 0.5, 0.5]]), 1, taxonomy=tax).tolist() == [[1]]


def test_constructors_and_children_json(tmp_path):
    mapping = {"root": ["animal", "car"], "animal": ["cat", "dog"]}
    tax = Taxonomy.from_children(mapping)
    assert tax.edge_list(names=True) == [("root", "animal"), ("root", "car"), ("animal", "cat"), ("animal", "dog")]
    assert Taxonomy.from_networkx(nx.DiGraph(tax.edge_list(names=True))) == tax
    p = tmp_path / "h.json"
    p.write_text(json.dumps(mapping))
    assert read_taxonomy(p).edge_list(names=True) == tax.edge_list(names=True)
    with pytest.raises(TaxonomyError, match="'animal'"):
        Taxonomy.from_children({"root": ["animal"], "animal": "cat"})
    with pytest.raises(TypeError, match="undirected"):
        Taxonomy.from_networkx(nx.Graph([("r", "a")]))


def test_references_table_names_every_public_decoder_metric_loss_and_head() -> None:
    import importlib
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "references.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)", text))
    missing = {
        m: [n for n in importlib.import_module(m).__all__ if n not in named]
        for m in ("hiercls.decode", "hiercls.metrics", "hiercls.losses", "hiercls.heads")
    }
    missing["hiercls.evaluation"] = [
        n for n in ("decoder_metric_table", "DecoderMetricTable", "TABLE_DECODERS", "TABLE_METRICS") if n not in named
    ]
    assert not any(missing.values()), f"docs/references.md lacks rows for {missing}"

"""scikit-learn conventions of hiercls.metrics: ``average="weighted"``, ``y_score``, the text report, warnings.

The references are scikit-learn itself: on a one-level tree the closed node sets are one-hot, so the
hierarchical and node scores are multiclass scores; on deeper trees the node averages are scikit-learn's
multilabel averages over the indicator matrix of the closed sets.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import sklearn.metrics as skm
from _generators import random_tree

from hiercls import metrics as M
from hiercls.taxonomy import Taxonomy

FLAT = Taxonomy([("root", f"c{i}") for i in range(8)])  # node i + 1 is class c{i}
TAX = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])


def _flat_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t, p = rng.integers(1, 8, 60), rng.integers(1, 8, 60)  # class c7 (node 8) never occurs
    p[:4] = 7
    return t, p, rng.random(60)


@pytest.mark.parametrize("average", ["micro", "macro", "weighted"])
def test_one_level_tree_equals_sklearn_multiclass(average: str) -> None:
    t, p, w = _flat_data(1)
    for weights in (None, w):
        want = skm.precision_recall_fscore_support(t, p, average=average, sample_weight=weights, zero_division=0.0)
        kw = {"taxonomy": FLAT, "sample_weight": weights, "zero_division": 0.0}
        labels = {} if average == "micro" else {"labels": "present"}
        got = M.hierarchical_precision_recall_fscore(t, p, average=average, **labels, **kw)
        assert got == pytest.approx(want[:3])
        node = M.node_precision_recall_fscore_support(t, p, average=average, **labels, **kw)
        assert node[:3] == pytest.approx(want[:3])
        assert M.node_f1_score(t, p, average=average, **labels, **kw) == pytest.approx(want[2])
        assert M.constrained_f1_score(t, p, average=average, **labels, **kw) == pytest.approx(want[2])
        assert M.path_constrained_f1_score(t, p, average=average, **labels, **kw) == pytest.approx(want[2])
        want_b = skm.fbeta_score(t, p, beta=2.0, average=average, sample_weight=weights, zero_division=0.0)
        assert M.hierarchical_fbeta_score(t, p, beta=2.0, average=average, **labels, **kw) == pytest.approx(want_b)
    # weighted: nodes without support weigh nothing, so every node or only the present ones agree
    if average == "weighted":
        every = M.hierarchical_f1_score(t, p, average="weighted", taxonomy=FLAT, zero_division=0.0)
        assert every == pytest.approx(skm.f1_score(t, p, average="weighted", zero_division=0.0))


def test_node_averages_equal_sklearn_multilabel_on_random_trees() -> None:
    rng = np.random.default_rng(4)
    for _ in range(5):
        tax = random_tree(15, rng)
        t, p = rng.integers(1, tax.num_nodes, 30), rng.integers(0, tax.num_nodes, 30)
        anc = tax.ancestors_sparse.toarray()[:, 1:]  # closed sets without the root, as indicator rows
        yt, yp = anc[t], anc[p]
        present = (yt | yp).any(0)
        for average in ("micro", "macro", "weighted"):
            want = skm.precision_recall_fscore_support(
                yt[:, present], yp[:, present], average=average, zero_division=0.0
            )[:3]
            got = M.hierarchical_precision_recall_fscore(
                t,
                p,
                taxonomy=tax,
                average=average,
                zero_division=0.0,
                **({} if average == "micro" else {"labels": "present"}),
            )
            assert got == pytest.approx(want)
        m = M.HierarchicalFBeta(tax, average="weighted", zero_division=0.0, labels="present")
        m.update(p[:11], t[:11])
        m.update(p[11:], t[11:])
        assert m.results()["fbeta"] == pytest.approx(skm.f1_score(yt[:, present], yp[:, present], average="weighted"))
        node = M.NodeF1(tax, labels="present", zero_division=0.0)
        node.update(p, t)
        assert node.results()["weighted_f1"] == pytest.approx(
            skm.f1_score(yt[:, present], yp[:, present], average="weighted")
        )
        report = M.hierarchical_report(t, p, taxonomy=tax, k=(), output_dict=True)
        assert report["hF1_weighted"] == pytest.approx(node.results()["weighted_f1"])


def _count_undefined(fn, *args, **kwargs) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args, **kwargs)
    return sum(issubclass(w.category, M.UndefinedMetricWarning) for w in caught)


def test_one_warning_per_undefined_metric_per_call() -> None:
    kw = {"taxonomy": TAX}
    # the root against the root: |T| = |P| = |T & P| = 0, so hP, hR and hF are all 0/0
    for average in ("micro", "samples"):
        assert _count_undefined(M.hierarchical_f1_score, [0], [0], average=average, **kw) == 1
        assert _count_undefined(M.hierarchical_precision_score, [0], [0], average=average, **kw) == 1
        assert _count_undefined(M.hierarchical_recall_score, [0], [0], average=average, **kw) == 1
        assert _count_undefined(M.hierarchical_precision_recall_fscore, [0], [0], average=average, **kw) == 3
    # macro over every node: y and b are neither true nor predicted (P, R, F 0/0), x never predicted
    assert _count_undefined(M.hierarchical_f1_score, [2, 2], [1, 2], average="macro", **kw) == 1
    assert _count_undefined(M.node_f1_score, [2, 2], [1, 2], average="macro", **kw) == 1
    assert _count_undefined(M.node_precision_recall_fscore_support, [2, 2], [1, 2], average="macro", **kw) == 3
    # weighted: nodes without support weigh nothing; a supported node never predicted makes precision 0/0
    assert _count_undefined(M.hierarchical_f1_score, [2, 2], [1, 2], average="weighted", **kw) == 0
    assert _count_undefined(M.hierarchical_precision_score, [2, 4], [2, 2], average="weighted", **kw) == 1
    # a defined score never warns
    assert _count_undefined(M.hierarchical_f1_score, [2], [3], **kw) == 0
    # stateful per-sample F: silent updates, one warning per metric at compute, however many updates
    m = M.HierarchicalFBeta(TAX, average="samples")
    assert _count_undefined(m.update, [0], [0]) == 0
    assert _count_undefined(m.update, [0, 2], [0, 2]) == 0
    assert _count_undefined(m.compute) == 3
    # results are not cached (a cache would outlive load_state_dict and merge): each compute() warns as a call does
    assert _count_undefined(m.compute) == 3
    assert m.results()["fbeta"] == pytest.approx(1 / 3)  # 0, 0 (warned), 1


def test_y_score_and_the_deprecated_scores_keyword() -> None:
    y, s = ["x", "b"], np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    want = M.top_k_accuracy_score(y, y_score=s, taxonomy=TAX, k=1)
    assert want == 0.5 and M.top_k_accuracy_score(y, s, taxonomy=TAX, k=1) == want
    with pytest.warns(FutureWarning, match=r"scores= is deprecated .* pass y_score="):
        assert M.top_k_accuracy_score(y, scores=s, taxonomy=TAX, k=1) == want
    with pytest.warns(FutureWarning):
        assert M.average_hierarchical_distance_at_k(y, scores=s, taxonomy=TAX, k=2) == pytest.approx(
            M.average_hierarchical_distance_at_k(y, y_score=s, taxonomy=TAX, k=2)
        )
    with pytest.raises(TypeError, match="got both y_score= and its deprecated name scores="):
        M.top_k_accuracy_score(y, y_score=s, scores=s, taxonomy=TAX)
    with pytest.warns(FutureWarning):
        old = M.hierarchical_report(y, ["y", "b"], taxonomy=TAX, scores=s, k=(1,), output_dict=True)
    assert old == M.hierarchical_report(y, ["y", "b"], taxonomy=TAX, y_score=s, k=(1,), output_dict=True)
    m = M.HierarchicalMetrics(TAX, k=(1,))
    with pytest.warns(FutureWarning):
        m.update(["y", "b"], y, scores=s)
    assert m.results()["top1_accuracy"] == want


def test_text_report_by_hand() -> None:
    # truths x, y, b; predictions x, x, a. Level 1: truths a, a, b and predictions a, a, a: 2 right of 3 and 3.
    # Level 2: truths x, y; predictions x, x (a stops above): 1 right of 2 and 2.
    text = M.hierarchical_report(["x", "y", "b"], ["x", "x", "a"], taxonomy=TAX, k=(), digits=3)
    rows = {" ".join(line.split()[:-4]): line.split()[-4:] for line in text.splitlines() if len(line.split()) >= 5}
    assert rows["level 1"] == ["0.667", "0.667", "0.667", "3"]
    assert rows["level 2"] == ["0.500", "0.500", "0.500", "2"]
    # |T & P| = 2 + 1 + 0 of |P| = 5 and |T| = 5
    assert rows["hierarchical micro"] == ["0.600", "0.600", "0.600", "3"]
    lines = {" ".join(line.split()[:-2]): line.split()[-2:] for line in text.splitlines() if line.strip()}
    assert lines["accuracy"] == ["0.333", "3"]
    assert lines["mistake severity"] == ["1.500", "2"]  # lca heights 1 (x, y under a) and 2; two mistakes
    r = M.hierarchical_report(["x", "y", "b"], ["x", "x", "a"], taxonomy=TAX, k=(), output_dict=True)
    assert r["per_level_support"] == [3.0, 2.0]
    # weighted supports are weighted sums
    rw = M.hierarchical_report(
        ["x", "y", "b"], ["x", "x", "a"], taxonomy=TAX, k=(), sample_weight=[2.0, 1.0, 0.5], output_dict=True
    )
    assert rw["per_level_support"] == [3.5, 3.0]
    wtext = M.hierarchical_report(["x", "y", "b"], ["x", "x", "a"], taxonomy=TAX, k=(), sample_weight=[2.0, 1.0, 0.5])
    assert "3.50" in wtext
    # node sets: no mistake severity row
    ml = M.hierarchical_report([["x", "b"], ["y"]], [["x"], ["y", "b"]], taxonomy=TAX)
    assert "mistake severity" not in ml and "node weighted" in ml


def test_report_refuses_empty_input() -> None:
    with pytest.raises(ValueError, match="hierarchical_report: no samples to score"):
        M.hierarchical_report([], [], taxonomy=TAX)
    with pytest.raises(ValueError, match="hierarchical_report: no samples to score"):
        M.hierarchical_report([-1, -1], [2, 3], taxonomy=TAX, output_dict=True)

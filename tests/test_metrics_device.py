"""Node-id tensors are scored on their own device: the torch kernels against the NumPy path, on CPU tensors.

The NumPy path is the reference (itself tested against brute force in tests/test_metrics.py); "no host round
trip" is checked by making ``Tensor.cpu`` / ``Tensor.numpy`` raise while the metric runs, as
tests/test_device_agnostic.py does for the heads.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

import hiercls.metrics as M
from hiercls.taxonomy import Taxonomy
from tests._trees import random_tree


@pytest.fixture(autouse=True, params=[True, False], ids=["torch-kernels", "cpu-tensors-via-numpy"])
def kernels_on_cpu(request, monkeypatch):
    """Both CPU-tensor routes: the torch kernels (what CUDA tensors run) and the default NumPy reading."""
    from hiercls.metrics import _device

    monkeypatch.setattr(_device, "ON_CPU", request.param)
    return request.param


def _tree_with_classes(seed: int) -> Taxonomy:
    """A random tree where about a third of the internal nodes are not classes (semantic levels skip them)."""
    base = random_tree(40, seed)
    rng = np.random.default_rng(seed)
    internal = [n for n in range(1, base.num_nodes) if len(base.children(n))]
    drop = set(rng.choice(internal, len(internal) // 3, replace=False).tolist())
    edges = [(base.name_of(int(base.parents(c)[0])), base.name_of(c)) for c in range(1, base.num_nodes)]
    return Taxonomy(edges, classes=[base.name_of(c) for c in range(1, base.num_nodes) if c not in drop])


def _data(seed: int, n: int = 200, weighted: bool = False):
    tax = _tree_with_classes(seed)
    rng = np.random.default_rng(seed)
    t = rng.integers(0, tax.num_nodes, n)
    t[rng.random(n) < 0.1] = -1  # ignored samples
    p = np.where(rng.random(n) < 0.4, np.maximum(t, 0), rng.integers(0, tax.num_nodes, n))
    w = rng.random(n) if weighted else None
    return tax, t, p, w


def _tensor(x):
    return None if x is None else torch.as_tensor(x)


FUNCTIONS = {
    "hprf_micro": lambda a, b, **k: M.hierarchical_precision_recall_fscore(a, b, zero_division=0.0, **k),
    "hprf_samples": lambda a, b, **k: M.hierarchical_precision_recall_fscore(
        a, b, average="samples", zero_division=0.0, **k
    ),
    "hf_samples_root": lambda a, b, **k: M.hierarchical_f1_score(a, b, average="samples", include_root=True, **k),
    "hprf_macro": lambda a, b, **k: M.hierarchical_precision_recall_fscore(
        a, b, average="macro", zero_division=0.0, **k
    ),
    "hprf_weighted": lambda a, b, **k: M.hierarchical_precision_recall_fscore(
        a, b, average="weighted", labels="present", zero_division=0.0, **k
    ),
    "node_macro": lambda a, b, **k: M.node_precision_recall_fscore_support(
        a, b, average="macro", zero_division=0.0, **k
    ),
    "hamming": lambda a, b, **k: M.hamming_loss(a, b, **k),
    "exact": lambda a, b, **k: M.exact_match_score(a, b, **k),
    "per_level_depth": lambda a, b, **k: M.per_level_accuracy_score(a, b, **k),
    "per_level_semantic": lambda a, b, **k: M.per_level_accuracy_score(a, b, levels="semantic", **k),
    "semantic_accuracy": lambda a, b, **k: M.semantic_accuracy_score(a, b, **k),
    "semantic_accuracy_depth": lambda a, b, **k: M.semantic_accuracy_score(a, b, levels="depth", **k),
    "wu_palmer_loss": lambda a, b, **k: M.wu_palmer_loss(a, b, **k),
    "zhao_loss": lambda a, b, **k: M.zhao_loss(a, b, **k),
    "realized_cost": lambda a, b, **k: M.realized_cost(a, b, **k),
    **{f"severity_{d}": functools.partial(M.mistake_severity, distance=d) for d in M.DISTANCES},
    **{f"distance_loss_{d}": functools.partial(M.hierarchical_distance_loss, distance=d) for d in M.DISTANCES},
}
# these average [N] node counts on the host (the counts themselves are summed on the device)
HOST_REDUCTION = {"hprf_macro", "hprf_weighted", "node_macro", "hamming"}


def _refuse(*_args, **_kwargs):
    raise AssertionError("host round trip (.cpu() / .numpy()) of the labels")


def _forbid_host(m):
    """Make host copies raise where the torch kernels run (CPU tensors are otherwise read as NumPy arrays)."""
    from hiercls.metrics import _device

    if _device.ON_CPU:
        m.setattr(torch.Tensor, "cpu", _refuse)
        m.setattr(torch.Tensor, "numpy", _refuse)


def _device_equals_numpy(name, yt, yp, tax, w, monkeypatch):
    """``FUNCTIONS[name]`` on tensors (host copies raising, but for the host reductions) equals the NumPy path."""
    fn = FUNCTIONS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # undefined ratios warn alike on both paths
        want = fn(yt, yp, taxonomy=tax, sample_weight=w)
        with monkeypatch.context() as m:
            if name not in HOST_REDUCTION:
                _forbid_host(m)
            got = fn(torch.as_tensor(yt), torch.as_tensor(yp), taxonomy=tax, sample_weight=_tensor(w))
    np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float), rtol=1e-12, atol=1e-15)
    return want, got


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("weighted", [False, True])
def test_functions_on_tensors_equal_the_numpy_path(name, weighted, monkeypatch):
    tax, t, p, w = _data(len(name) + weighted, weighted=weighted)
    want, got = _device_equals_numpy(name, t, p, tax, w, monkeypatch)
    if isinstance(want, np.ndarray):  # per-level accuracies: a float64 tensor on the labels' device
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    else:
        assert all(isinstance(x, float) for x in np.atleast_1d(np.asarray(got, dtype=object)))


def test_mixed_inputs_names_and_cost_matrices_on_tensors():
    tax, t, p, _ = _data(3)
    names = np.array(tax.names)
    keep = t >= 0
    ref = M.mistake_severity(t[keep], p[keep], taxonomy=tax)
    # names or NumPy on one side, a tensor on the other: the pair is scored on the tensor's device
    assert M.mistake_severity(names[t[keep]], torch.as_tensor(p[keep]), taxonomy=tax) == pytest.approx(ref, rel=1e-12)
    assert M.mistake_severity(torch.as_tensor(t), p, taxonomy=tax) == pytest.approx(ref, rel=1e-12)
    nn_cost = np.random.default_rng(0).random((tax.num_nodes, tax.num_nodes))
    for cost in (nn_cost, torch.as_tensor(nn_cost)):
        got = M.realized_cost(torch.as_tensor(t), torch.as_tensor(p), taxonomy=tax, cost=cost)
        assert got == pytest.approx(M.realized_cost(t, p, taxonomy=tax, cost=nn_cost), rel=1e-12)
    leaves = tax.leaves
    nl_cost = np.random.default_rng(1).random((tax.num_nodes, tax.num_leaves))
    tl = torch.as_tensor(leaves[np.arange(50) % len(leaves)])
    got = M.realized_cost(tl, torch.as_tensor(p[:50]), taxonomy=tax, cost=nl_cost)
    assert got == pytest.approx(M.realized_cost(tl.numpy(), p[:50], taxonomy=tax, cost=nl_cost), rel=1e-12)
    with pytest.raises(ValueError, match="internal node"):
        M.realized_cost(torch.as_tensor([1]), torch.as_tensor([1]), taxonomy=tax, cost=nl_cost)


def test_bad_tensor_ids_are_named_and_dags_score_as_the_numpy_path():
    tax, t, p, _ = _data(4)
    bad = torch.as_tensor(p).clone()
    bad[17] = tax.num_nodes
    with pytest.raises(ValueError, match=rf"y_pred\[17\] = {tax.num_nodes} is not a node id"):
        M.hierarchical_f1_score(torch.as_tensor(t), bad, taxonomy=tax)
    with pytest.raises(ValueError, match=r"y_true\[3\] = -2"):
        M.mistake_severity(torch.as_tensor([0, 1, 2, -2]), torch.as_tensor([0, 1, 2, 3]), taxonomy=tax)
    with pytest.raises(TypeError, match="must be integers"):
        M.mistake_severity(torch.as_tensor([1.0, 2.0]), torch.as_tensor([1, 2]), taxonomy=tax)
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y")])
    yt, yp = np.array([3, 4, 3, 1]), np.array([4, 3, 2, 3])
    for fn in (M.hierarchical_f1_score, M.mistake_severity, M.per_level_accuracy_score):
        np.testing.assert_allclose(
            np.asarray(fn(torch.as_tensor(yt), torch.as_tensor(yp), taxonomy=dag)), fn(yt, yp, taxonomy=dag)
        )


def _dag_data(seed: int, n: int = 150):
    """A random DAG (a tree plus second parents from earlier, unrelated nodes) and labels on it."""
    base = random_tree(40, seed)
    rng = np.random.default_rng(seed)
    edges = [(base.name_of(int(base.parents(c)[0])), base.name_of(c)) for c in range(1, base.num_nodes)]
    anc = base.ancestors_sparse.toarray().astype(bool)
    for c in rng.choice(np.arange(2, base.num_nodes), 12, replace=False):
        options = [a for a in range(1, c) if not anc[c, a] and not anc[a, c]]
        if options:
            edges.append((base.name_of(int(rng.choice(options))), base.name_of(int(c))))
    dag = Taxonomy(edges)
    assert not dag.is_tree
    t = rng.integers(0, dag.num_nodes, n)
    t[rng.random(n) < 0.1] = -1
    p = np.where(rng.random(n) < 0.4, np.maximum(t, 0), rng.integers(0, dag.num_nodes, n))
    return dag, t, p, rng.random(n)


# every metric runs on the device on DAGs too
DAG_FUNCTIONS = sorted(FUNCTIONS)


@pytest.mark.parametrize("name", DAG_FUNCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_metrics_of_dags_on_tensors_equal_the_numpy_path(name, weighted, monkeypatch):
    tax, t, p, w = _dag_data(len(name) + weighted)
    _device_equals_numpy(name, t, p, tax, w if weighted else None, monkeypatch)


@pytest.mark.parametrize(
    "name",
    [
        "HierarchicalFBeta_samples",
        "HierarchicalFBeta_macro",
        "NodeF1",
        "MistakeSeverity_zhao",
        "LevelAccuracy_semantic",
    ],
)
def test_stateful_metrics_of_dags_stay_on_the_device(name, monkeypatch):
    tax, t, p, w = _dag_data(7)
    ref, dev = STATEFUL[name](tax), STATEFUL[name](tax)
    for s in range(0, len(t), 50):
        ref.update(t[s : s + 50], p[s : s + 50], sample_weight=w[s : s + 50])
        with monkeypatch.context() as m:
            _forbid_host(m)
            dev.update(
                torch.as_tensor(t[s : s + 50]), torch.as_tensor(p[s : s + 50]), sample_weight=_tensor(w[s : s + 50])
            )
    for key, value in ref.states().items():
        torch.testing.assert_close(dev.states()[key], value, rtol=1e-12, atol=1e-12, msg=key)


STATEFUL = {
    "HierarchicalMetrics": lambda tax: M.HierarchicalMetrics(tax, k=()),
    "HierarchicalFBeta_samples": lambda tax: M.HierarchicalFBeta(tax, average="samples", zero_division=0.0),
    "HierarchicalFBeta_macro": lambda tax: M.HierarchicalFBeta(tax, average="macro", zero_division=0.0),
    "NodeF1": lambda tax: M.NodeF1(tax, zero_division=0.0),
    "LevelAccuracy_semantic": lambda tax: M.LevelAccuracy(tax, levels="semantic"),
    "MistakeSeverity_zhao": lambda tax: M.MistakeSeverity(tax, distance="zhao"),
}


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_stateful_updates_on_tensors_stay_on_the_device_and_equal_the_numpy_path(name, monkeypatch):
    tax, t, p, w = _data(len(name), weighted=True)
    ref, dev = STATEFUL[name](tax), STATEFUL[name](tax)
    for s in range(0, len(t), 70):  # three batches, weighted
        ref.update(t[s : s + 70], p[s : s + 70], sample_weight=w[s : s + 70])
        with monkeypatch.context() as m:
            _forbid_host(m)
            dev.update(
                torch.as_tensor(t[s : s + 70]),
                torch.as_tensor(p[s : s + 70]),
                sample_weight=torch.as_tensor(w[s : s + 70]),
            )
    for key, value in ref.states().items():
        torch.testing.assert_close(dev.states()[key], value, rtol=1e-12, atol=1e-12, msg=key)
    want, got = ref.compute(), dev.compute()
    assert got.keys() == want.keys()
    for key in want:
        if isinstance(want[key], str):  # the name of the severity's distance
            assert got[key] == want[key]
            continue
        np.testing.assert_allclose(np.asarray(got[key], dtype=float), np.asarray(want[key], dtype=float), rtol=1e-12)


@pytest.mark.parametrize("candidates", [None, "nodes", "explicit"])
def test_top_k_on_tensors_ranks_on_the_device_with_the_same_ties(candidates, monkeypatch):
    tax, t, _, w = _data(9, weighted=True)
    rng = np.random.default_rng(9)
    cand = None if candidates is None else ("nodes" if candidates == "nodes" else rng.permutation(tax.num_nodes)[:12])
    width = tax.num_leaves if candidates is None else (tax.num_nodes if candidates == "nodes" else 12)
    scores = rng.integers(0, 4, (len(t), width)).astype(np.float32)  # many ties: the smaller node id first
    kw = {"taxonomy": tax, "candidates": cand}
    with monkeypatch.context() as m:
        _forbid_host(m)
        top = M.top_k_predictions(torch.as_tensor(scores), 5, **kw)
        acc = M.top_k_accuracy_score(torch.as_tensor(t), torch.as_tensor(scores), k=3, sample_weight=_tensor(w), **kw)
        hd = M.average_hierarchical_distance_at_k(t, torch.as_tensor(scores), k=4, sample_weight=w, **kw)
    np.testing.assert_array_equal(top.numpy(), M.top_k_predictions(scores, 5, **kw))
    assert acc == pytest.approx(M.top_k_accuracy_score(t, scores, k=3, sample_weight=w, **kw), rel=1e-12)
    assert hd == pytest.approx(M.average_hierarchical_distance_at_k(t, scores, k=4, sample_weight=w, **kw), rel=1e-12)


def test_collection_with_scores_on_tensors_equals_the_numpy_path(monkeypatch):
    tax, t, p, w = _data(10, weighted=True)
    scores = np.random.default_rng(10).random((len(t), tax.num_leaves))
    ref, dev = M.HierarchicalMetrics(tax, k=(1, 3)), M.HierarchicalMetrics(tax, k=(1, 3))
    ref.update(t, p, y_score=scores, sample_weight=w)
    with monkeypatch.context() as m:
        _forbid_host(m)
        dev.update(torch.as_tensor(t), torch.as_tensor(p), y_score=torch.as_tensor(scores), sample_weight=_tensor(w))
    want, got = ref.compute(), dev.compute()
    for key in ("top1_accuracy", "top3_accuracy", "hdist@1", "hdist@3", "hF1_micro", "mistake_severity"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    topk = M.TopKMetrics(tax, k=(2,))
    topk.update(torch.as_tensor(t), torch.as_tensor(scores))
    assert topk.compute()["hdist@2"] == pytest.approx(
        M.average_hierarchical_distance_at_k(t, scores, k=2, taxonomy=tax)
    )


def test_dag_lca_on_the_device_is_the_deepest_shared_ancestor_ties_to_the_smaller_id():
    from hiercls.metrics import _device

    # x and y share a and b (both at depth 1): the smaller id wins; w has two parents at different depths
    edges = [("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y"), ("b", "y"), ("r", "c"), ("x", "w"), ("c", "w")]
    dag = Taxonomy(edges)
    a, b = np.meshgrid(np.arange(dag.num_nodes), np.arange(dag.num_nodes))
    a, b = a.ravel(), b.ravel()
    got = _device.lca(torch.as_tensor(a), torch.as_tensor(b), dag)
    np.testing.assert_array_equal(got.numpy(), dag.lca(a, b))
    assert int(_device.lca(torch.tensor([dag.index("x")]), torch.tensor([dag.index("y")]), dag)) == dag.index("a")


SET_FUNCTIONS = ["hprf_micro", "hprf_samples", "hf_samples_root", "hprf_macro", "hprf_weighted", "node_macro"]
SET_FUNCTIONS += ["hamming", "exact", "per_level_depth", "per_level_semantic", "semantic_accuracy"]
SET_FUNCTIONS += ["semantic_accuracy_depth"]


def _raw_sets(tax: Taxonomy, ids: np.ndarray, seed: int) -> np.ndarray:
    """Unclosed 0/1 node sets [B, N]: each sample's node plus a random extra node (ancestors left to closing)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((len(ids), tax.num_nodes), dtype=np.int64)
    out[np.arange(len(ids)), np.maximum(ids, 0)] = 1
    extra = rng.random(len(ids)) < 0.5
    out[np.flatnonzero(extra), rng.integers(0, tax.num_nodes, int(extra.sum()))] = 1
    return out


@pytest.mark.parametrize("name", SET_FUNCTIONS)
@pytest.mark.parametrize("shape", ["tree", "dag"])
@pytest.mark.parametrize("pair", ["sets-sets", "ids-sets", "sets-ids"])
def test_node_set_tensors_are_scored_on_the_device_as_the_numpy_path(name, shape, pair, monkeypatch):
    tax, t, p, w = _dag_data(len(name)) if shape == "dag" else _data(len(name), weighted=True)
    keep = t >= 0
    tsets, psets = _raw_sets(tax, t, 1), _raw_sets(tax, p, 2)
    if pair == "sets-sets":  # sets on both sides: no ignored samples
        t, p, w = t[keep], p[keep], w[keep]
        yt, yp = tsets[keep], psets[keep].astype(bool)
    elif pair == "ids-sets":
        yt, yp = t, psets.astype(np.float32)
    else:
        t, p, w = t[keep], p[keep], w[keep]
        yt, yp = tsets[keep], p
    _device_equals_numpy(name, yt, yp, tax, w, monkeypatch)


def test_node_set_tensors_refusals_and_stateful_updates(monkeypatch):
    tax, t, p, w = _data(5, weighted=True)
    keep = t >= 0
    tsets, psets = _raw_sets(tax, t[keep], 3), _raw_sets(tax, p[keep], 4)
    bad = torch.as_tensor(psets).clone()
    bad[4, 7] = 2
    from hiercls.metrics import _device

    if _device.ON_CPU:  # the device check names the culprit as the host one does
        with pytest.raises(ValueError, match=r"y_pred\[4, 7\] = 2; node sets must hold only 0/1"):
            M.hierarchical_f1_score(torch.as_tensor(tsets), bad, taxonomy=tax)
        with pytest.raises(ValueError, match=r"expected \[B\] node ids or \[B, \d+\] node sets"):
            M.hierarchical_f1_score(torch.as_tensor(tsets), torch.ones(len(tsets), 3), taxonomy=tax)
    for cls in (lambda: M.HierarchicalFBeta(tax, average="macro", zero_division=0.0), lambda: M.NodeF1(tax)):
        ref, dev = cls(), cls()
        ref.update(tsets, psets, sample_weight=w[keep])
        with monkeypatch.context() as m:
            _forbid_host(m)
            dev.update(torch.as_tensor(tsets), torch.as_tensor(psets), sample_weight=torch.as_tensor(w[keep]))
        for key, value in ref.states().items():
            torch.testing.assert_close(dev.states()[key], value, rtol=1e-12, atol=1e-12, msg=key)
    with pytest.raises(ValueError, match="needs single node ids"):  # distances need ids, on either path
        M.MistakeSeverity(tax).update(torch.as_tensor(tsets), torch.as_tensor(psets))
    with pytest.raises(ValueError, match=r"y_pred must be single node ids or names \[B\]"):  # the set side is named
        M.mistake_severity(torch.as_tensor(t[keep]), torch.as_tensor(psets), taxonomy=tax)
    ref, dev = M.HierarchicalMetrics(tax, multilabel=True), M.HierarchicalMetrics(tax, multilabel=True)
    ref.update(t, np.vstack([psets, psets[: len(t) - len(psets)]]), sample_weight=w)
    with monkeypatch.context() as m:
        _forbid_host(m)
        dev.update(
            torch.as_tensor(t),
            torch.as_tensor(np.vstack([psets, psets[: len(t) - len(psets)]])),
            sample_weight=torch.as_tensor(w),
        )
    want, got = ref.compute(), dev.compute()
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key], dtype=float), np.asarray(want[key], dtype=float), rtol=1e-12)

"""The common suites of :mod:`hiercls.metrics`: every metric function, and every stateful metric class.

Functions (scikit-learn style): every public function with a ``sample_weight`` has an entry in :data:`FUNCTIONS`
(a new one fails :func:`test_every_function_has_a_case`), run on a tree and on a DAG through the same checks:
torch tensors (int64 and int32, CPU; CUDA where there is one) give the NumPy result, array results coming back as
float64 tensors on the labels' device; lists, names and ids agree; permutations, unit weights, integer weights
(= repeated samples) and ignored targets (``-1`` = the sample removed) behave as they must.

Classes (torchmetrics style): enumerated from the module, so a new class fails :func:`test_every_class_has_a_case`
until it is given a case here. Each case says how to build the metric, how to draw a batch of inputs, and the
functional value the whole-data result must equal (the independent reference).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib
import matplotlib.pyplot
import numpy as np
import pytest
import torch
import torchmetrics
import torchmetrics.classification
from _generators import labels, random_dag, random_tree, raw_sets, tree_with_classes

import hiercls.metrics as M
from hiercls.metrics import stateful
from hiercls.taxonomy import Taxonomy

METRIC_CLASSES = sorted(
    (
        obj
        for obj in vars(stateful).values()
        if inspect.isclass(obj)
        and issubclass(obj, stateful.Metric)
        and obj is not stateful.Metric
        and obj.__module__ == stateful.__name__
    ),
    key=lambda c: c.__name__,
)

N_SAMPLES = 23


@dataclass
class Case:
    """``make(**kw)`` builds a fresh metric (``kw``: more constructor arguments, e.g. ``output=``); ``data`` holds
    whole-data arrays; ``reference(*data, w)`` is the functional value of the whole data (a dict: some of the keys
    of ``results()``); ``update(metric, *arrays, w)`` feeds a slice (through ``metric.update(preds, target, ...)``)."""

    make: Callable[[], stateful.Metric]
    data: tuple[np.ndarray, ...]
    reference: Callable[..., Any]
    update: Callable[..., None]


def _ids(tax: Taxonomy, rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, tax.num_nodes, n)


def _leaf_ids(tax: Taxonomy, rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.choice(np.asarray(tax.leaves), n)


def _plain(m: stateful.Metric, t: Any, p: Any, w: Any = None) -> None:
    m.update(p, t, sample_weight=w)


def case_for(cls: type, rng: np.random.Generator) -> Case:
    tax = random_tree(12, rng)
    n = N_SAMPLES
    name = cls.__name__
    if name in ("HierarchicalFBeta", "HierarchicalPrecision", "HierarchicalRecall"):
        t, p = _ids(tax, rng, n), _ids(tax, rng, n)

        def ref(t: Any, p: Any, w: Any = None) -> dict[str, float]:
            pr, rc, f = M.hierarchical_precision_recall_fscore(
                t, p, taxonomy=tax, average="samples", zero_division=0.0, sample_weight=w
            )
            return {"precision": pr, "recall": rc, "fbeta": f}

        return Case(lambda **kw: cls(tax, average="samples", zero_division=0.0, **kw), (t, p), ref, _plain)
    if name == "NodeF1":
        t, p = _ids(tax, rng, n), _ids(tax, rng, n)

        def ref(t: Any, p: Any, w: Any = None) -> dict[str, float]:
            kw = {"taxonomy": tax, "zero_division": 0.0, "sample_weight": w}
            return {
                "micro_f1": M.node_f1_score(t, p, average="micro", **kw),
                "macro_f1": M.node_f1_score(t, p, average="macro", **kw),
                "hamming_loss": M.hamming_loss(t, p, taxonomy=tax, sample_weight=w),
            }

        return Case(lambda **kw: cls(tax, zero_division=0.0, **kw), (t, p), ref, _plain)
    if name == "ConstrainedF1":
        t = _ids(tax, rng, n)
        p = rng.random((n, tax.num_nodes)) < 0.3  # raw sets: a node may come without its parent

        def ref(t: Any, p: Any, w: Any = None) -> dict[str, float]:
            kw = {"taxonomy": tax, "zero_division": 0.0, "sample_weight": w, "labels": "present"}
            return {
                "C_micro_f1": M.constrained_f1_score(t, p, average="micro", **kw),
                "C_macro_f1": M.constrained_f1_score(t, p, average="macro", **kw),
                "P_micro_f1": M.path_constrained_f1_score(t, p, average="micro", **kw),
                "P_macro_f1": M.path_constrained_f1_score(t, p, average="macro", **kw),
            }

        return Case(lambda **kw: cls(tax, **kw), (t, p), ref, _plain)
    if name == "MistakeSeverity":
        t, p = _ids(tax, rng, n), _ids(tax, rng, n)
        return Case(
            lambda **kw: cls(tax, **kw),
            (t, p),
            lambda t, p, w=None: {"mistake_severity": M.mistake_severity(t, p, taxonomy=tax, sample_weight=w)},
            _plain,
        )
    if name == "TopKMetrics":
        t = _leaf_ids(tax, rng, n)
        scores = rng.random((n, len(tax.leaves)))

        def ref(t: Any, s: Any, w: Any = None) -> dict[str, float]:
            out = {}
            for k in (1, 3):
                out[f"top{k}_accuracy"] = M.top_k_accuracy_score(t, s, taxonomy=tax, k=k, sample_weight=w)
                out[f"hdist@{k}"] = M.average_hierarchical_distance_at_k(t, s, taxonomy=tax, k=k, sample_weight=w)
            return out

        return Case(lambda **kw: cls(tax, k=(1, 3), **kw), (t, scores), ref, _plain)
    if name == "LevelAccuracy":
        t, p = _ids(tax, rng, n), _ids(tax, rng, n)
        return Case(
            lambda **kw: cls(tax, **kw),
            (t, p),
            lambda t, p, w=None: {
                "per_level_accuracy": M.per_level_accuracy_score(t, p, taxonomy=tax, levels="depth", sample_weight=w)
            },
            _plain,
        )
    if name == "NestedDice":
        t = rng.integers(0, tax.num_nodes, (n, 5, 4))
        p = rng.integers(0, tax.num_nodes, (n, 5, 4))
        return Case(
            lambda **kw: cls(tax, **kw),
            (t, p),
            lambda t, p, w=None: {"dice": M.nested_dice_score(t, p, taxonomy=tax, sample_weight=w)},
            _plain,
        )
    if name == "HierarchicalMetrics":
        t, p = _leaf_ids(tax, rng, n), _ids(tax, rng, n)
        scores = rng.random((n, len(tax.leaves)))

        def update(m: stateful.Metric, t: Any, p: Any, s: Any, w: Any = None) -> None:
            m.update(p, t, y_score=s, sample_weight=w)

        return Case(
            lambda **kw: cls(tax, k=(1, 2), **kw),
            (t, p, scores),
            lambda t, p, s, w=None: M.hierarchical_report(
                t, p, taxonomy=tax, y_score=s, k=(1, 2), sample_weight=w, output_dict=True
            ),
            update,
        )
    raise KeyError(name)


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Equal up to float rounding; NaN equals NaN; dicts compared key by key (``b``'s keys must be in ``a``)."""
    if isinstance(b, dict):
        assert isinstance(a, dict), path
        for k in b:
            assert k in a, f"{path}{k} missing"
            assert_same(a[k], b[k], f"{path}{k}.")
        return
    if isinstance(b, str) or isinstance(a, str):
        assert a == b, path
        return
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert x.shape == y.shape, f"{path}: {x.shape} vs {y.shape}"
    assert np.allclose(x, y, rtol=1e-10, atol=1e-12, equal_nan=True), f"{path}: {a} vs {b}"


def run(case: Case, slices: list[np.ndarray], weights: np.ndarray | None = None) -> Any:
    m = case.make()
    for idx in slices:
        case.update(m, *(d[idx] for d in case.data), None if weights is None else weights[idx])
    return m.results()


def _all() -> list[np.ndarray]:
    return [np.arange(N_SAMPLES)]


def _batches(rng: np.random.Generator) -> list[np.ndarray]:
    cuts = np.sort(rng.choice(np.arange(1, N_SAMPLES), 3, replace=False))
    return np.split(np.arange(N_SAMPLES), cuts)


@pytest.fixture(params=METRIC_CLASSES, ids=[c.__name__ for c in METRIC_CLASSES])
def case(request: pytest.FixtureRequest) -> Case:
    return case_for(request.param, np.random.default_rng(7))


def test_every_class_has_a_case() -> None:
    assert len(METRIC_CLASSES) >= 7
    rng = np.random.default_rng(0)
    for cls in METRIC_CLASSES:
        case_for(cls, rng)  # KeyError names a class without a case


def test_one_update_equals_functional(case: Case) -> None:
    assert_same(run(case, _all()), case.reference(*case.data))


def test_batches_equal_one_update(case: Case) -> None:
    assert_same(run(case, _batches(np.random.default_rng(1))), run(case, _all()))


def test_compute_is_repeatable_and_does_not_change_state(case: Case) -> None:
    m = case.make()
    case.update(m, *case.data, None)
    before = m.state_dict()
    first = m.results()
    assert_same(m.results(), first)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_reset(case: Case) -> None:
    fresh = case.make()
    m = case.make()
    case.update(m, *case.data, None)
    m.reset()
    for k, v in m.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k]), k
    half = np.arange(N_SAMPLES // 2)
    case.update(m, *(d[half] for d in case.data), None)
    assert_same(m.results(), run(case, [half]))


def test_merge_and_state_dict_round_trip(case: Case) -> None:
    parts = _batches(np.random.default_rng(2))
    metrics = []
    for idx in parts:
        m = case.make()
        case.update(m, *(d[idx] for d in case.data), None)
        metrics.append(m)
    merged = metrics[0]
    for other in metrics[1:]:
        merged.merge(other)
    whole = run(case, _all())
    assert_same(merged.results(), whole)
    loaded = case.make()
    loaded.load_state_dict(merged.state_dict())
    assert_same(loaded.results(), whole)


def test_unit_weights_equal_no_weights(case: Case) -> None:
    assert_same(run(case, _batches(np.random.default_rng(3)), np.ones(N_SAMPLES)), run(case, _all()))


def test_integer_weights_equal_repeated_samples(case: Case) -> None:
    w = np.random.default_rng(4).integers(0, 3, N_SAMPLES)
    w[0] = 1  # at least one sample counts
    weighted = run(case, _all(), w.astype(float))
    m = case.make()
    rep = np.repeat(np.arange(N_SAMPLES), w)
    case.update(m, *(d[rep] for d in case.data), None)
    assert_same(weighted, m.results())
    assert_same(weighted, case.reference(*case.data, w.astype(float)))


def test_permutation_invariance(case: Case) -> None:
    perm = np.random.default_rng(5).permutation(N_SAMPLES)
    assert_same(run(case, [perm]), run(case, _all()))


def test_numpy_torch_and_list_inputs_agree(case: Case) -> None:
    ref = run(case, _all())
    m = case.make()
    case.update(m, *(torch.as_tensor(d) for d in case.data), None)
    assert_same(m.results(), ref)
    m = case.make()
    case.update(m, *(d.tolist() for d in case.data), torch.ones(N_SAMPLES, dtype=torch.float64))
    assert_same(m.results(), ref)


def test_merge_refuses_another_kind(case: Case) -> None:
    m = case.make()
    other = next(c for c in METRIC_CLASSES if c is not type(m))
    with pytest.raises(TypeError, match=type(m).__name__):
        m.merge(case_for(other, np.random.default_rng(0)).make())


class _Forward:
    """Feeds a case's batch through ``metric(...)`` (torchmetrics' ``forward``) instead of ``update``."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.values: list[torch.Tensor] = []

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.values.append(self.metric(*args, **kwargs))


def _ids_data(case: Case) -> bool:
    return all(np.ndim(d) == 1 and np.asarray(d).dtype.kind in "iu" for d in case.data[:2])


def test_compute_is_one_scalar_tensor_equal_to_the_function(case: Case) -> None:
    m = case.make()
    case.update(m, *case.data, None)
    value = m.compute()
    assert isinstance(value, torch.Tensor) and value.ndim == 0 and value.dtype == torch.float64
    assert_same(value.item(), M.flatten_results(m.results())[m.output])
    assert m.higher_is_better in (True, False) and m.is_differentiable is False and m.full_state_update is False
    for key, want in M.flatten_results(case.reference(*case.data)).items():  # every output against the function
        one = case.make(output=key)
        case.update(one, *case.data, None)
        assert_same(one.compute().item(), want, key)
    with pytest.raises(ValueError, match=r"output: .* computes"):
        case.make(output="no_such_result")


def test_torchmetrics_usage_patterns(case: Case) -> None:
    """forward vs update, clone, state_dict round trip, a MetricCollection beside a flat metric, plot, and the
    old keywords refused, each as torchmetrics' own metrics are used."""
    batches = _batches(np.random.default_rng(8))
    fwd = _Forward(case.make())
    for idx in batches:
        case.update(fwd, *(d[idx] for d in case.data), None)
    for idx, got in zip(batches, fwd.values, strict=True):  # forward returns the batch's own value
        alone = case.make()
        case.update(alone, *(d[idx] for d in case.data), None)
        assert_same(got.item(), alone.compute().item())
    m = case.make()
    case.update(m, *case.data, None)
    assert_same(fwd.metric.compute().item(), m.compute().item())  # and accumulates as update does
    twin = m.clone()
    assert_same(twin.compute().item(), m.compute().item())
    case.update(twin, *case.data, None)
    assert_same(m.results(), run(case, _all()))  # the clone's updates leave the original alone
    loaded = case.make()
    loaded.load_state_dict(m.state_dict())
    assert_same(loaded.compute().item(), m.compute().item())
    members: dict[str, Any] = {"h": case.make()}
    if _ids_data(case):  # node ids: a flat accuracy over node ids takes the same (preds, target)
        members["acc"] = torchmetrics.classification.MulticlassAccuracy(num_classes=10_000, average="micro")
    coll = torchmetrics.MetricCollection(members)
    case.update(coll, *(torch.as_tensor(d) for d in case.data), None)  # torchmetrics needs tensors
    res = coll.compute()
    assert_same(res["h"].item(), m.compute().item())
    if "acc" in res:
        t, p = case.data[0], case.data[1]
        assert res["acc"].item() == pytest.approx(np.mean(t == p))
    fig, ax = m.plot()
    assert ax.get_title() or fig is not None
    matplotlib.pyplot.close(fig)
    with pytest.raises(TypeError, match=r"update\(preds, target\)"):
        m.update(y_true=case.data[0], y_pred=case.data[1])


# ----------------------------------------------------------------------------- the functions
ZD = {"zero_division": 0.0}
# name -> (kind of inputs, call(a, b, taxonomy, sample_weight), trees only). Kinds: "ids" (node ids, ignorable
# targets), "raw" (ids and raw predicted node sets), "scores" (leaf targets and leaf scores), "levels" (ids and
# per-level predictions), "maps" (label maps [B, 4, 3]).
FUNCTIONS: dict[str, tuple[str, Callable[..., Any], bool]] = {
    "hprf_micro": ("ids", lambda a, b, **k: M.hierarchical_precision_recall_fscore(a, b, **ZD, **k), False),
    "hprf_samples": (
        "ids",
        lambda a, b, **k: M.hierarchical_precision_recall_fscore(a, b, average="samples", **ZD, **k),
        False,
    ),
    "hprf_macro": (
        "ids",
        lambda a, b, **k: M.hierarchical_precision_recall_fscore(a, b, average="macro", **ZD, **k),
        False,
    ),
    "hprf_weighted_root": (
        "ids",
        lambda a, b, **k: M.hierarchical_precision_recall_fscore(
            a, b, average="weighted", include_root=True, labels="present", **ZD, **k
        ),
        False,
    ),
    "hfbeta": (
        "ids",
        lambda a, b, **k: M.hierarchical_fbeta_score(a, b, beta=2.0, average="samples", **ZD, **k),
        False,
    ),
    "hf1": ("ids", lambda a, b, **k: M.hierarchical_f1_score(a, b, include_root=True, **k), False),
    "hprecision": ("ids", lambda a, b, **k: M.hierarchical_precision_score(a, b, average="macro", **ZD, **k), False),
    "hrecall": ("ids", lambda a, b, **k: M.hierarchical_recall_score(a, b, **k), False),
    "node_prfs": ("ids", lambda a, b, **k: M.node_precision_recall_fscore_support(a, b, **ZD, **k), False),
    "node_f1": ("ids", lambda a, b, **k: M.node_f1_score(a, b, average="weighted", labels="present", **ZD, **k), False),
    "hamming": ("ids", lambda a, b, **k: M.hamming_loss(a, b, **k), False),
    "exact": ("ids", lambda a, b, **k: M.exact_match_score(a, b, **k), False),
    "constrained": ("raw", lambda a, b, **k: M.constrained_f1_score(a, b, average="macro", **ZD, **k), False),
    "path_constrained": ("raw", lambda a, b, **k: M.path_constrained_f1_score(a, b, **ZD, **k), False),
    "severity": ("ids", lambda a, b, **k: M.mistake_severity(a, b, **ZD, **k), False),
    "severity_node_height": (
        "ids",
        lambda a, b, **k: M.mistake_severity(a, b, distance="lca_node_height", **ZD, **k),
        False,
    ),
    "distance_loss": ("ids", lambda a, b, **k: M.hierarchical_distance_loss(a, b, **k), False),
    "wu_palmer": ("ids", lambda a, b, **k: M.wu_palmer_loss(a, b, **k), False),
    "zhao": ("ids", lambda a, b, **k: M.zhao_loss(a, b, **k), False),
    "realized_cost": ("ids", lambda a, b, **k: M.realized_cost(a, b, cost="ic_distance", **k), False),
    "per_level": ("ids", lambda a, b, **k: M.per_level_accuracy_score(a, b, **k), False),
    "per_semantic_level": ("ids", lambda a, b, **k: M.per_level_accuracy_score(a, b, levels="semantic", **k), True),
    "level_counts": ("ids", lambda a, b, **k: M.level_counts(a, b, **k), False),
    "semantic_accuracy": ("ids", lambda a, b, **k: M.semantic_accuracy_score(a, b, **k), True),
    "top_k": ("scores", lambda a, b, **k: M.top_k_accuracy_score(a, b, k=3, **k), False),
    "hdist_at_k": ("scores", lambda a, b, **k: M.average_hierarchical_distance_at_k(a, b, k=2, **k), False),
    "level_argmax": ("levels", lambda a, b, **k: M.level_argmax_accuracy_score(a, b, **k), True),
    "dice": ("maps", lambda a, b, **k: M.nested_dice_score(a, b, **k), False),
    "dice_per_sample": ("maps", lambda a, b, **k: M.nested_dice_score(a, b, per_sample=True, **k), False),
    "report": ("ids", lambda a, b, **k: _numbers(M.hierarchical_report(a, b, k=(), output_dict=True, **k)), False),
}
N_ROWS = 40


def _numbers(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if not isinstance(v, str)}


def _inputs(kind: str, tax: Taxonomy, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t, p = labels(tax, N_ROWS, rng, ignore=0.1 if kind == "ids" else 0.0)
    if kind == "raw":
        return t, raw_sets(tax, p, seed)
    if kind == "scores":
        return rng.choice(tax.leaves, N_ROWS), rng.integers(0, 5, (N_ROWS, tax.num_leaves)).astype(np.float32)
    if kind == "levels":
        return t, np.where(rng.random((N_ROWS, 3)) < 0.2, -1, rng.integers(0, tax.num_nodes, (N_ROWS, 3)))
    if kind == "maps":
        return rng.integers(-1, tax.num_nodes, (N_ROWS, 4, 3)), rng.integers(0, tax.num_nodes, (N_ROWS, 4, 3))
    return t, p


def _taxonomy(shape: str) -> Taxonomy:
    return tree_with_classes(30, 3) if shape == "tree" else random_dag(30, 3)


def _same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _same(got[k], want[k])
    elif isinstance(want, tuple):
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    else:
        got = got.cpu().numpy() if isinstance(got, torch.Tensor) else got
        np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float), rtol=1e-12, atol=1e-15)


FUNCTION_CASES = [
    (name, shape) for name in FUNCTIONS for shape in ("tree", "dag") if not FUNCTIONS[name][2] or shape == "tree"
]


@pytest.fixture(params=FUNCTION_CASES, ids=[f"{n}-{s}" for n, s in FUNCTION_CASES])
def function_case(request: pytest.FixtureRequest) -> tuple[Callable[..., Any], str, Taxonomy, np.ndarray, np.ndarray]:
    name, shape = request.param
    kind, fn, _ = FUNCTIONS[name]
    tax = _taxonomy(shape)
    if kind == "levels":
        tax = tree_with_classes(30, 3)
        k = int(tax.semantic_level.max()) + 1
        t, lp = _inputs(kind, tax, len(name))
        lp = np.where(np.random.default_rng(0).random((N_ROWS, k)) < 0.2, -1, np.resize(lp, (N_ROWS, k)))
        return fn, kind, tax, t, lp
    return fn, kind, tax, *_inputs(kind, tax, len(name))


def test_every_function_has_a_case() -> None:
    # every public function that takes sample_weight scores (y_true, y_pred): it has an entry in FUNCTIONS
    called = {inspect.getsource(fn).split("M.")[1].split("(")[0] for _, fn, _ in FUNCTIONS.values()}
    public = {
        name
        for name in M.__all__
        if inspect.isfunction(getattr(M, name)) and "sample_weight" in inspect.signature(getattr(M, name)).parameters
    }
    assert public <= called, sorted(public - called)


def test_torch_tensors_give_the_numpy_result(function_case: Any) -> None:
    fn, kind, tax, a, b = function_case
    want = fn(a, b, taxonomy=tax)
    for dtype in (torch.int64, torch.int32):
        ta = torch.as_tensor(a).to(dtype)
        tb = torch.as_tensor(b) if b.dtype.kind == "f" else torch.as_tensor(b).to(dtype)
        got = fn(ta, tb, taxonomy=tax, sample_weight=torch.ones(len(a), dtype=torch.float64))
        _same(got, want)
        if isinstance(want, np.ndarray) and kind == "ids":  # array results come back where the labels are
            assert isinstance(got, torch.Tensor) and got.dtype == torch.float64 and got.device == ta.device


def test_lists_names_and_ids_agree(function_case: Any) -> None:
    fn, kind, tax, a, b = function_case
    want = fn(a, b, taxonomy=tax)
    _same(fn(a.tolist(), b.tolist(), taxonomy=tax), want)
    if kind == "ids":
        names = np.array(tax.names)
        keep = a >= 0  # names have no ignore marker: the kept samples only
        _same(fn(names[a[keep]], names[b[keep]].tolist(), taxonomy=tax), fn(a[keep], b[keep], taxonomy=tax))


def test_permutation_and_ignored_samples(function_case: Any) -> None:
    fn, kind, tax, a, b = function_case
    want = fn(a, b, taxonomy=tax)
    perm = np.random.default_rng(1).permutation(N_ROWS)
    if kind == "maps":  # pixels ignored, not samples: the samples are what is permuted
        _same(fn(a[perm], b[perm], taxonomy=tax), want)
        return
    _same(fn(a[perm], b[perm], taxonomy=tax), want)
    keep = a >= 0
    if not keep.all():
        _same(fn(a[keep], b[keep], taxonomy=tax), want)


def test_unit_and_integer_weights(function_case: Any) -> None:
    fn, _, tax, a, b = function_case
    _same(fn(a, b, taxonomy=tax, sample_weight=np.ones(N_ROWS)), fn(a, b, taxonomy=tax))
    reps = np.random.default_rng(2).integers(0, 3, N_ROWS)
    reps[a.reshape(N_ROWS, -1)[:, 0] >= 0] |= 1  # at least every kept sample once
    weighted = fn(a, b, taxonomy=tax, sample_weight=reps.astype(float))
    _same(weighted, fn(np.repeat(a, reps, axis=0), np.repeat(b, reps, axis=0), taxonomy=tax))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("name", ["hprf_macro", "severity", "per_level", "top_k", "exact", "report"])
def test_cuda_tensors_give_the_numpy_result(name: str) -> None:
    kind, fn, _ = FUNCTIONS[name]
    tax = _taxonomy("tree")
    a, b = _inputs(kind, tax, 0)
    got = fn(torch.as_tensor(a).cuda(), torch.as_tensor(b).cuda(), taxonomy=tax)
    _same(got, fn(a, b, taxonomy=tax))
    if name == "per_level":
        assert got.device.type == "cuda"
    if name == "top_k":
        assert M.top_k_predictions(torch.as_tensor(b).cuda(), 2, taxonomy=tax).device.type == "cuda"


def test_tensor_inputs_are_checked_as_arrays_and_mix_with_other_forms() -> None:
    tax = _taxonomy("tree")
    t, p = labels(tax, N_ROWS, 5)
    bad = torch.as_tensor(p).clone()
    bad[17] = tax.num_nodes
    with pytest.raises(ValueError, match=rf"y_pred\[17\] = {tax.num_nodes} is not a node id"):
        M.hierarchical_f1_score(torch.as_tensor(t), bad, taxonomy=tax)
    with pytest.raises(TypeError, match="must be integers"):
        M.mistake_severity(torch.as_tensor([1.0, 2.0]), torch.as_tensor([1, 2]), taxonomy=tax)
    sets = torch.as_tensor(raw_sets(tax, p, 0))
    sets[4, 7] = 2
    with pytest.raises(ValueError, match=r"y_pred\[4, 7\] = 2; node sets must hold only 0/1"):
        M.hierarchical_f1_score(torch.as_tensor(t), sets, taxonomy=tax)
    with pytest.raises(ValueError, match=r"y_pred must be single node ids or names \[B\]"):
        M.mistake_severity(torch.as_tensor(t), torch.as_tensor(raw_sets(tax, p, 0)), taxonomy=tax)
    names = np.array(tax.names)
    ref = M.mistake_severity(t, p, taxonomy=tax)
    assert M.mistake_severity(names[t].tolist(), torch.as_tensor(p), taxonomy=tax) == pytest.approx(ref, rel=1e-12)
    cost = np.random.default_rng(0).random((tax.num_nodes, tax.num_nodes))
    got = M.realized_cost(torch.as_tensor(t), p, taxonomy=tax, cost=torch.as_tensor(cost))
    assert got == pytest.approx(M.realized_cost(t, p, taxonomy=tax, cost=cost), rel=1e-12)
    top = M.top_k_predictions(torch.as_tensor(np.eye(tax.num_leaves)[:3]), 2, taxonomy=tax)
    assert isinstance(top, torch.Tensor) and top[:, 0].tolist() == tax.leaves[:3].tolist()

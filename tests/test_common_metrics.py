"""A torchmetrics-style common suite over every stateful metric class of :mod:`hiercls.metrics.stateful`.

The classes are enumerated from the module, so a new metric class fails :func:`test_every_class_has_a_case`
until it is given a case here. Each case says how to build the metric, how to draw a batch of inputs, and the
functional value the whole-data result must equal (the independent reference).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from _trees import random_tree

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
    """``make()`` builds a fresh metric; ``data`` holds whole-data arrays; ``reference(*data, w)`` is the
    functional value of the whole data; ``update(metric, *arrays, w)`` feeds a slice."""

    make: Callable[[], stateful.Metric]
    data: tuple[np.ndarray, ...]
    reference: Callable[..., Any]
    update: Callable[..., None]


def _ids(tax: Taxonomy, rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, tax.num_nodes, n)


def _leaf_ids(tax: Taxonomy, rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.choice(np.asarray(tax.leaves), n)


def _plain(m: stateful.Metric, t: Any, p: Any, w: Any = None) -> None:
    m.update(t, p, sample_weight=w)


def case_for(cls: type, rng: np.random.Generator) -> Case:
    tax = random_tree(12, rng)
    n = N_SAMPLES
    name = cls.__name__
    if name == "HierarchicalFBeta":
        t, p = _ids(tax, rng, n), _ids(tax, rng, n)

        def ref(t: Any, p: Any, w: Any = None) -> dict[str, float]:
            pr, rc, f = M.hierarchical_precision_recall_fscore(
                t, p, taxonomy=tax, average="samples", zero_division=0.0, sample_weight=w
            )
            return {"precision": pr, "recall": rc, "fbeta": f}

        return Case(lambda: cls(tax, average="samples", zero_division=0.0), (t, p), ref, _plain)
    if name == "NodeF1":
        t, p = _ids(tax, rng, n), _ids(tax, rng, n)

        def ref(t: Any, p: Any, w: Any = None) -> dict[str, float]:
            kw = {"taxonomy": tax, "zero_division": 0.0, "sample_weight": w}
            return {
                "micro_f1": M.node_f1_score(t, p, average="micro", **kw),
                "macro_f1": M.node_f1_score(t, p, average="macro", **kw),
                "hamming_loss": M.hamming_loss(t, p, taxonomy=tax, sample_weight=w),
            }

        return Case(lambda: cls(tax, zero_division=0.0), (t, p), ref, _plain)
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

        return Case(lambda: cls(tax), (t, p), ref, _plain)
    if name == "MistakeSeverity":
        t, p = _ids(tax, rng, n), _ids(tax, rng, n)
        return Case(
            lambda: cls(tax),
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

        return Case(lambda: cls(tax, k=(1, 3)), (t, scores), ref, _plain)
    if name == "LevelAccuracy":
        t, p = _ids(tax, rng, n), _ids(tax, rng, n)
        return Case(
            lambda: cls(tax),
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
            lambda: cls(tax),
            (t, p),
            lambda t, p, w=None: {"dice": M.nested_dice_score(t, p, taxonomy=tax, sample_weight=w)},
            _plain,
        )
    if name == "HierarchicalMetrics":
        t, p = _leaf_ids(tax, rng, n), _ids(tax, rng, n)
        scores = rng.random((n, len(tax.leaves)))

        def update(m: stateful.Metric, t: Any, p: Any, s: Any, w: Any = None) -> None:
            m.update(t, p, y_score=s, sample_weight=w)

        return Case(
            lambda: cls(tax, k=(1, 2)),
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
    return m.compute()


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
    first = m.compute()
    assert_same(m.compute(), first)
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
    assert_same(m.compute(), run(case, [half]))


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
    assert_same(merged.compute(), whole)
    loaded = case.make()
    loaded.load_state_dict(merged.state_dict())
    assert_same(loaded.compute(), whole)


def test_unit_weights_equal_no_weights(case: Case) -> None:
    assert_same(run(case, _batches(np.random.default_rng(3)), np.ones(N_SAMPLES)), run(case, _all()))


def test_integer_weights_equal_repeated_samples(case: Case) -> None:
    w = np.random.default_rng(4).integers(0, 3, N_SAMPLES)
    w[0] = 1  # at least one sample counts
    weighted = run(case, _all(), w.astype(float))
    m = case.make()
    rep = np.repeat(np.arange(N_SAMPLES), w)
    case.update(m, *(d[rep] for d in case.data), None)
    assert_same(weighted, m.compute())
    assert_same(weighted, case.reference(*case.data, w.astype(float)))


def test_permutation_invariance(case: Case) -> None:
    perm = np.random.default_rng(5).permutation(N_SAMPLES)
    assert_same(run(case, [perm]), run(case, _all()))


def test_numpy_torch_and_list_inputs_agree(case: Case) -> None:
    ref = run(case, _all())
    m = case.make()
    case.update(m, *(torch.as_tensor(d) for d in case.data), None)
    assert_same(m.compute(), ref)
    m = case.make()
    case.update(m, *(d.tolist() for d in case.data), torch.ones(N_SAMPLES, dtype=torch.float64))
    assert_same(m.compute(), ref)


def test_merge_refuses_another_kind(case: Case) -> None:
    m = case.make()
    other = next(c for c in METRIC_CLASSES if c is not type(m))
    with pytest.raises(TypeError, match=type(m).__name__):
        m.merge(case_for(other, np.random.default_rng(0)).make())

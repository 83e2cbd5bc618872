"""Reliability round 3, leftovers of issue 28: metric devices and empty computes, evaluate's split names, bounded
reads of NumPy probability files, hand-edited display names in hiercls JSON taxonomies."""

from __future__ import annotations

import warnings

import pytest
import torch

import hiercls.metrics as metrics
from hiercls.taxonomy import Taxonomy

TAX = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
STATEFUL = sorted(
    name
    for name in metrics.__all__
    if isinstance(getattr(metrics, name), type)
    and issubclass(getattr(metrics, name), metrics.Metric)
    and getattr(metrics, name) is not metrics.Metric
)
# Device types torch names here (it has a torch.<type> module with is_available()) but cannot use.
UNAVAILABLE = [d for d in ("cuda", "mps", "xpu") if not getattr(torch, d).is_available()]


def test_every_stateful_metric_is_listed() -> None:
    assert {"HierarchicalMetrics", "HierarchicalFBeta", "NodeF1", "TopKMetrics", "NestedDice"} <= set(STATEFUL)


@pytest.mark.parametrize("device", UNAVAILABLE or [pytest.param("cuda", marks=pytest.mark.skip("every device works"))])
@pytest.mark.parametrize("name", STATEFUL)
def test_metric_to_an_unavailable_device_is_explained(name: str, device: str) -> None:
    # Before: torch's raw driver error ("Found no NVIDIA driver on your system ..."), naming neither.
    label = "CUDA" if device == "cuda" else device.upper()
    metric = getattr(metrics, name)(TAX)
    for move in (
        lambda: metric.to(device),
        lambda: metric.to(device=f"{device}:0"),
        lambda: metric.to(device, torch.float64),
    ):
        with pytest.raises(
            RuntimeError, match=rf"^{name}: cannot move to device '{device}(:0)?': {label} is not available"
        ):
            move()
    if device == "cuda":
        with pytest.raises(RuntimeError, match=rf"^{name}: cannot move to device 'cuda': CUDA is not available"):
            metric.cuda()
    assert metric.device == torch.device("cpu")  # nothing moved
    assert metric.to("cpu") is metric


@pytest.mark.parametrize("name", STATEFUL)
def test_compute_before_update_names_the_metric_and_the_call(name: str) -> None:
    # Before: torchmetrics's "compute called before update ... may lead to errors" warning, then a RuntimeError
    # that said "call update()" without the order of its arguments.
    metric = getattr(metrics, name)(TAX)
    want = rf"^{name}\.compute\(\) was called before any update\(\).*call {name}\.update\(preds, target\)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning before the error
        with pytest.raises(RuntimeError, match=want):
            metric.compute()
        with pytest.raises(RuntimeError, match=want):
            metric.results()


def test_loaded_states_compute_without_a_warning() -> None:
    # torchmetrics counts update() calls, not states: a metric restored by load_state_dict warned "compute was
    # called before update" although its states hold data; the result is the source metric's.
    source = metrics.HierarchicalFBeta(TAX)
    source.update(["a", "b"], ["x", "b"])
    restored = metrics.HierarchicalFBeta(TAX)
    restored.load_state_dict(source.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert restored.compute().item() == source.compute().item() == pytest.approx(0.8)

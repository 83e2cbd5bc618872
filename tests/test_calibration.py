"""Calibration: temperature scaling on the validation split and the ECE per level.

References: a known temperature (logits of a calibrated model multiplied by T0 must give back T0), ECE values
computed by hand, and the invariance of the argmax under a temperature.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hiercls.evaluation import (
    LevelCalibration,
    calibrate_outputs,
    expected_calibration_error,
    fit_temperature,
    format_calibration,
    format_results,
)
from hiercls.models import HierarchicalClassifier, create_model
from hiercls.taxonomy import Taxonomy

TREE = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "u"), ("b", "v"), ("b", "w")])


def test_ece_hand_values() -> None:
    # 10 bins. (0.95, hit) (0.95, miss) in (0.9, 1]: |1 - 1.9| = 0.9; (0.55, hit) in (0.5, 0.6]: 0.45;
    # (0.3, miss) in (0.2, 0.3]: 0.3; (0.0, miss) in the first bin: 0. ECE = (0.9 + 0.45 + 0.3) / 5.
    conf, ok = [0.95, 0.95, 0.55, 0.3, 0.0], [1, 0, 1, 0, 0]
    assert expected_calibration_error(conf, ok, n_bins=10) == pytest.approx(1.65 / 5)
    # One bin: |mean accuracy - mean confidence|.
    assert expected_calibration_error(conf, ok, n_bins=1) == pytest.approx(abs(2 / 5 - sum(conf) / 5))
    assert math.isnan(expected_calibration_error([], []))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_calibration_error([1.2], [1])


def test_level_ece_single_label_and_label_sets_by_hand() -> None:
    #          r    a    x    y    b    u    v    w
    p = np.array(
        [
            [1.0, 0.7, 0.5, 0.2, 0.3, 0.1, 0.1, 0.1],  # label x: level 1 a (0.7, hit), level 2 x (0.5, hit)
            [1.0, 0.4, 0.2, 0.2, 0.6, 0.3, 0.2, 0.1],  # label v: level 1 b (0.6, hit), level 2 u (0.3, miss)
            [1.0, 0.9, 0.5, 0.4, 0.1, 0.0, 0.1, 0.0],  # label b: level 1 a (0.9, miss), no level 2
        ]
    )
    m = LevelCalibration(TREE, n_bins=5)
    m.update(p, np.array([2, 6, 4]))
    r = m.results()
    # Level 1, bins of 0.2: 0.7 and 0.6 share (0.6, 0.8]: |2 - 1.3| = 0.7; 0.9 in (0.8, 1]: 0.9. -> 1.6 / 3.
    # Level 2: 0.5 in (0.4, 0.6]: |1 - 0.5|; 0.3 in (0.2, 0.4]: 0.3. -> 0.8 / 2.
    assert r["ece_per_level"] == pytest.approx([1.6 / 3, 0.4])
    assert r["pairs_per_level"] == [3, 2]
    # Label sets: every (sample, node of the level) pair is (P(n), n in the set).
    sets = TREE.ancestors_sparse[[2, 6]].toarray().astype(float)  # {a, x} and {b, v}
    sets[0, TREE.index("b")] = 1  # a second path for sample 0: {a, x, b}
    m = LevelCalibration(TREE, n_bins=1)
    m.update(p[:2], sets)
    levels = [np.flatnonzero(TREE.depth == d) for d in (1, 2)]
    want = [abs(sets[:, nodes].mean() - p[:2, nodes].mean()) for nodes in levels]  # one bin: |freq - mean p|
    assert m.results()["ece_per_level"] == pytest.approx(want)
    assert m.results()["pairs_per_level"] == [4, 10]


def test_fit_temperature_recovers_a_known_temperature() -> None:
    rng = np.random.default_rng(0)
    z = torch.as_tensor(rng.normal(0, 2.0, (20000, 10)))
    gen = torch.Generator().manual_seed(0)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=gen).squeeze(1)  # labels drawn from the true model
    for t0 in (0.5, 2.5):
        observed = z * t0  # over- (t0 > 1) or under-confident logits of the same ranking

        def nll(t: float, observed: torch.Tensor = observed) -> float:
            return float(torch.nn.functional.cross_entropy(observed / t, y))

        assert fit_temperature(nll) == pytest.approx(t0, rel=0.05)


@pytest.fixture(scope="module")
def flat_model() -> HierarchicalClassifier:
    return create_model("timm:resnet10t", TREE, head="flat").eval()


def test_calibrate_outputs_fits_and_scores_before_and_after(flat_model: HierarchicalClassifier) -> None:
    gen = torch.Generator().manual_seed(1)
    leaves = torch.as_tensor(np.array(TREE.leaves))
    z = torch.randn(6000, len(leaves), generator=gen) * 1.5
    y = leaves[torch.multinomial(torch.softmax(z, 1), 1, generator=gen).squeeze(1)]
    observed = z * 3.0
    batches = [(observed[i : i + 1000], y[i : i + 1000]) for i in range(0, 6000, 1000)]
    res = calibrate_outputs(flat_model, batches, TREE, ["argmax_leaf", "optimal_hf1"], n_bins=10)
    cal = res["calibration"]
    assert cal["temperature"] == pytest.approx(3.0, rel=0.05) and flat_model.temperature == cal["temperature"]
    assert cal["nll_after"] < cal["nll_before"]
    assert all(a < b for a, b in zip(cal["ece_per_level_after"], cal["ece_per_level_before"], strict=True))
    assert cal["pairs_per_level"] == [6000, 6000]
    # A temperature keeps the argmax: argmax_leaf's accuracy is the same before and after.
    raw = (observed.argmax(1) == (y[:, None] == leaves).long().argmax(1)).double().mean().item()
    assert res["argmax_leaf (calibrated)/accuracy"] == pytest.approx(raw)
    assert "optimal_hf1 (calibrated)/hF1_samples" in res
    # The model now applies its temperature, and keeps it through save / load.
    want = flat_model.head.node_probs(observed[:3] / cal["temperature"])
    assert torch.allclose(flat_model.node_probs(observed[:3]), want)
    flat_model.temperature = 1.0


def test_label_smoothing_is_left_out_of_the_fit_and_restored() -> None:
    model = create_model("timm:resnet10t", TREE, head="semantic_softmax").eval()
    assert model.head.criterion.label_smoothing == 0.2
    out = torch.randn(64, model.head.num_outputs, generator=torch.Generator().manual_seed(0))
    y = torch.as_tensor(np.random.default_rng(0).choice(TREE.leaves, 64))
    res = calibrate_outputs(model, [(out, y)], TREE, ["argmax_leaf"])
    assert model.head.criterion.label_smoothing == 0.2
    with torch.no_grad():
        model.head.criterion.label_smoothing = 0.0
        t = res["calibration"]["temperature"]
        direct = fit_temperature(lambda s: float(model.loss(out / s, y)))
        model.head.criterion.label_smoothing = 0.2
        smoothed = fit_temperature(lambda s: float(model.loss(out / s, y)))
    assert t == pytest.approx(direct, rel=1e-6)
    assert abs(smoothed - direct) > 1e-3 * direct  # smoothing does change the fit: leaving it out matters


def test_training_with_calibrate_reports_both_and_saves_the_temperature(tmp_path: Path) -> None:
    from hiercls.train.config import config_from_dict
    from hiercls.train.loop import train

    tax_file = tmp_path / "tax.txt"
    tax_file.write_text("root animal\nroot vehicle\nanimal cat\nanimal dog\nvehicle car\nvehicle bike\n")
    cfg = config_from_dict(
        {
            "taxonomy": str(tax_file),
            "model": {"backbone": "timm:test_vit", "head": "flat", "backbone_options": {"img_size": 16}},
            "data": {
                "dataset": "synthetic",
                "batch_size": 8,
                "options": {"kind": "image", "image_size": 16, "train_samples": 16, "val_samples": 12},
            },
            "optim": {"lr": 3e-3, "warmup_steps": 1},
            "schedule": {"epochs": 1},
            "eval": {"decoders": ["argmax_leaf", "optimal_hf1"], "calibrate": True},
            "run": {"out_dir": str(tmp_path / "run"), "progress": False, "plot": False},
        }
    )
    result = train(cfg)
    t = result["calibration"]["temperature"]
    assert 0.05 <= t <= 20 and len(result["calibration"]["ece_per_level_before"]) == 2
    assert result["argmax_leaf (calibrated)/accuracy"] == pytest.approx(result["argmax_leaf/accuracy"])
    table = format_results({"flat": result})
    assert "argmax_leaf (calibrated)" in table and "optimal_hf1 (calibrated)" in table
    assert "ECE level 1" in format_calibration({"flat": result})
    best = tmp_path / "run" / "checkpoints" / "best"
    assert json.loads((best / "config.json").read_text())["temperature"] == pytest.approx(t)
    assert HierarchicalClassifier.from_pretrained(best).temperature == pytest.approx(t)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["calibration"]["temperature"] == pytest.approx(t)

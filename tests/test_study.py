"""The multi-seed head study: label prior, paired bootstrap, and a tiny end-to-end study on synthetic images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hiercls.cli import main
from hiercls.data import build_dataset, image_transform
from hiercls.evaluation import evaluate_run
from hiercls.taxonomy import Taxonomy
from hiercls.train import config_from_dict
from hiercls.train.inference import load_trained_model
from hiercls.train.study import format_study, label_prior, paired_bootstrap, run_study

EDGES = [("root", "a"), ("root", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2"), ("a1", "a1x"), ("a1", "a1y")]


def test_label_prior_on_a_dag_counts_each_ancestor_once():
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("b", "y")])
    x, y, a = dag.index("x"), dag.index("y"), dag.index("a")
    prior = label_prior([x, x, y, -1], dag)
    assert prior[dag.root] == 1.0
    assert prior[dag.index("b")] == 1.0 and prior[a] == pytest.approx(2 / 3) and prior[y] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="no labels"):
        label_prior([-1], dag)


def _hf1(c):
    return 2 * c[0] / (c[1] + c[2])


def test_paired_bootstrap_equals_explicit_resampling():
    rng = np.random.default_rng(5)
    n = 40
    ntrue = rng.integers(1, 5, n).astype(float)
    a = (np.minimum(ntrue, rng.integers(0, 5, n)).astype(float), rng.integers(1, 5, n).astype(float), ntrue)
    b = (np.minimum(ntrue, rng.integers(0, 3, n)).astype(float), rng.integers(1, 5, n).astype(float), ntrue)
    res = paired_bootstrap(a, b, resamples=300, confidence=0.9, seed=11)
    # the same draws, one resample at a time
    idx = np.random.default_rng(11).integers(0, n, size=(300, n))
    diffs = [_hf1([c[i].sum() for c in a]) - _hf1([c[i].sum() for c in b]) for i in idx]
    assert res["difference"] == pytest.approx(_hf1([c.sum() for c in a]) - _hf1([c.sum() for c in b]))
    assert res["low"] == pytest.approx(np.quantile(diffs, 0.05))
    assert res["high"] == pytest.approx(np.quantile(diffs, 0.95))
    same = paired_bootstrap(a, a, resamples=200)
    assert same["difference"] == same["low"] == same["high"] == 0.0
    with pytest.raises(ValueError, match="different samples"):
        paired_bootstrap(a, tuple(c[:-1] for c in b))


def _recipe(tmp: Path) -> dict:
    tax_file = tmp / "tax.txt"
    tax_file.write_text("".join(f"{p} {c}\n" for p, c in EDGES), encoding="utf-8")
    return {
        "name": "tiny_study",
        "taxonomy": str(tax_file),
        "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
        "data": {
            "dataset": "synthetic",
            "batch_size": 8,
            "options": {"kind": "image", "train_samples": 32, "val_samples": 12, "test_samples": 20},
        },
        "optim": {"lr": 3e-3},
        "schedule": {"epochs": 1},
        "eval": {"decoders": ["argmax_leaf", "optimal_hf1"], "conformal": 0.2},
        "run": {"out_dir": str(tmp / "study"), "progress": False, "plot": False},
        "compare_heads": ["flat"],
        "study": {"seeds": [0, 1], "bootstrap": 200, "head_settings": {"flat": {"optim.lr": 1e-3}}},
    }


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    cfg = config_from_dict(_recipe(tmp))
    return cfg, run_study(cfg)


def test_study_rows_match_independent_evaluations(study):
    cfg, report = study
    assert report["heads"] == ["semantic_softmax", "flat"] and report["seeds"] == [0, 1]
    assert [r["head"] for r in report["rows"]].count("label prior") == 2
    assert report["samples"] == 20 and report["levels"][0] == 20  # every label reaches depth 1
    for head in ("semantic_softmax", "flat"):
        row = next(r for r in report["rows"] if r["head"] == head and r["decoder"] == "optimal_hf1")
        for seed, value in zip([0, 1], row["per_seed_hF1_micro"], strict=True):
            run = cfg.out_dir / "runs" / f"{head}-seed{seed}"
            model, tax, run_cfg = load_trained_model(run, which="best")
            again = evaluate_run(model, tax, run_cfg, split="test", decoders=["optimal_hf1"])
            assert value == pytest.approx(again["optimal_hf1/hF1_micro"])
        assert row["hF1_micro"][0] == pytest.approx(np.mean(row["per_seed_hF1_micro"]))
        assert row["hF1_micro"][1] == pytest.approx(np.std(row["per_seed_hF1_micro"], ddof=1))
    flat_cfg = cfg.out_dir / "runs" / "flat-seed0" / "config.yaml"
    assert "lr: 0.001" in flat_cfg.read_text(encoding="utf-8")  # the flat head's own setting


def test_study_prior_row_is_the_most_frequent_training_leaf(study):
    cfg, report = study
    from hiercls.data import build_dataset
    from hiercls.taxonomy import read_taxonomy

    tax = read_taxonomy(cfg.taxonomy)
    train_y = build_dataset("synthetic", "train", tax, cfg.data.options).targets
    test_y = build_dataset("synthetic", "test", tax, cfg.data.options).targets
    leaves, counts = np.unique(train_y, return_counts=True)
    top = leaves[counts == counts.max()].min()  # ties: the smallest id, the decoders' rule
    prior = next(r for r in report["rows"] if r["head"] == "label prior" and r["decoder"] == "argmax_leaf")
    assert prior["accuracy"][0] == pytest.approx(np.mean(test_y == top))
    assert prior["prediction"].startswith("1 node")


def test_study_report_text_and_files(study):
    cfg, report = study
    text = format_study(report)
    assert "95% CI [" in text and "paired bootstrap over 20 samples" in text and "label prior" in text
    assert "d1 (n=20)" in text and "nan" not in text
    assert "-node set, depth" in text  # the hF1-optimal decoder's sets are described, not shown as nan
    for name in ("study.json", "study.txt", "study.png"):
        assert (cfg.out_dir / name).is_file()


def test_cli_quick_study(tmp_path, capsys):
    import yaml

    recipe = _recipe(tmp_path)
    recipe["study"]["seeds"] = [3, 4]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    assert main(["train", str(path), "--quick"]) == 0
    out = capsys.readouterr().out
    assert "1 seed" in out and "CI [" in out
    assert not (tmp_path / "study" / "runs" / "flat-seed4").exists()


def test_study_records_its_best_run_on_the_checkpoint_split(study):
    """study.json's best run is the run whose best checkpoint scored highest on val (read back from results.json)."""
    cfg, report = study
    values = {}
    for d in sorted((cfg.out_dir / "runs").iterdir()):
        res = json.loads((d / "results.json").read_text(encoding="utf-8"))
        assert res["best_key"] == "argmax_leaf/hF1_micro"  # the first decoder's
        values[f"runs/{d.name}"] = res["best_value"]
    top = max(values.values())
    best = json.loads((cfg.out_dir / "study.json").read_text(encoding="utf-8"))["best_run"]
    assert best == report["best_run"]
    assert best["run"] == next(k for k in _run_order(report) if values[k] == top)  # ties: the first run trained
    assert best["value"] == pytest.approx(top) and best["split"] == "val" and best["of"] == 4
    assert f"best run (what evaluate/predict --model <this folder> load): {best['run']}" in format_study(report)


def _run_order(report):
    return [f"runs/{h}-seed{s}" for h in report["heads"] for s in report["seeds"]]


def test_evaluate_and_predict_on_a_study_folder_use_its_best_run(study, tmp_path, capsys):
    cfg, report = study
    best = cfg.out_dir / report["best_run"]["run"]
    capsys.readouterr()
    args = ["--data", "test", "--decoder", "argmax_leaf"]
    assert main(["evaluate", "--model", str(cfg.out_dir), *args, "--out", str(tmp_path / "s.json")]) == 0
    err = capsys.readouterr().err
    assert f"is a study: using its best run {best}" in err
    assert main(["evaluate", "--model", str(best), *args, "--out", str(tmp_path / "r.json")]) == 0
    assert capsys.readouterr().err == ""  # a run folder is used as given, silently
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads((tmp_path / "r.json").read_text())

    from PIL import Image

    Image.new("RGB", (16, 16), "red").save(tmp_path / "x.png")
    for model in (cfg.out_dir, best):
        assert main(["predict", "--model", str(model), str(tmp_path / "x.png"), "--out", str(tmp_path / "p.json")]) == 0
    err = capsys.readouterr().err
    assert err.count("using its best run") == 1


def test_a_study_folder_without_a_best_run_lists_its_runs(study, tmp_path, capsys):
    cfg, _ = study
    copy = tmp_path / "old_study"
    shutil.copytree(cfg.out_dir / "runs" / "flat-seed0", copy / "runs" / "flat-seed0")
    shutil.copytree(cfg.out_dir / "runs" / "flat-seed1", copy / "runs" / "flat-seed1")
    assert main(["evaluate", "--model", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "is a study folder that has no study.json (the study did not finish)" in err
    assert f"{copy / 'runs' / 'flat-seed0'}, {copy / 'runs' / 'flat-seed1'}" in err
    report = json.loads((cfg.out_dir / "study.json").read_text(encoding="utf-8"))
    del report["best_run"]  # a study written before studies recorded one
    (copy / "study.json").write_text(json.dumps(report), encoding="utf-8")
    assert main(["predict", "--model", str(copy), "x"]) == 2
    assert "is a study folder that has no best run recorded; give one of its runs:" in capsys.readouterr().err


def test_study_reports_conformal_rows_calibrated_on_val_and_checked_on_test(study):
    """eval.conformal: each run's node predictor is fitted on val and scored on test (checked here by hand), the
    rows go to the run's results.json, and the study reports their mean over seeds."""
    from hiercls.conformal import NodeConformal

    cfg, report = study
    conf = report["conformal"]
    assert (conf["alpha"], conf["calibration_split"], conf["split"]) == (0.2, "val", "test")
    assert (conf["n_calibration"], conf["n_test"]) == (12, 20)
    seen = {}
    for head in ("semantic_softmax", "flat"):
        for seed in (0, 1):
            run = cfg.out_dir / "runs" / f"{head}-seed{seed}"
            model, tax, _ = load_trained_model(run, which="best")
            probs = {}
            for split in ("val", "test"):
                transform = image_transform(model, train=False, image_size=cfg.data.image_size)
                ds = build_dataset("synthetic", split, tax, cfg.data.options, transform)
                x = torch.stack([ds[i][0] for i in range(len(ds))])
                with torch.no_grad():
                    probs[split] = model.node_probs(model(x)).numpy()
                probs[split + "_y"] = np.asarray(ds.targets)
            pred = NodeConformal(tax, alpha=0.2).fit(probs["val"], probs["val_y"]).predict(probs["test"])
            pred = np.asarray(pred)
            covered = [
                int(p) in tax.ancestors(int(y)) or int(p) == int(y) for p, y in zip(pred, probs["test_y"], strict=True)
            ]
            stored = json.loads((run / "results.json").read_text(encoding="utf-8"))["conformal"]
            assert stored["rows"]["node"]["coverage"] == pytest.approx(np.mean(covered))
            assert stored["rows"]["node"]["mean_depth"] == pytest.approx(tax.depth[pred].mean())
            assert set(stored["rows"]) == {"node", "set:r=2", "risk:overshoot", "threshold"}
            seen.setdefault(head, []).append(stored["rows"]["node"]["coverage"])
    for head, cov in seen.items():
        row = next(r for r in conf["rows"] if r["head"] == head and r["method"] == "node")
        assert row["per_seed_coverage"] == pytest.approx(cov) and row["coverage"][0] == pytest.approx(np.mean(cov))
    text = format_study(report)
    assert "conformal: alpha = 0.2 (target coverage 0.8" in text and "risk:overshoot" in text
    assert "calibrated on 12 samples of split 'val', checked on 20 samples of split 'test'" in text
    assert (cfg.out_dir / "study.txt").read_text(encoding="utf-8").count("set:r=2") == 2  # one row per head


def test_eval_conformal_is_checked():
    from hiercls.train.config import ConfigError

    with pytest.raises(ConfigError, match=r"eval.conformal: must be an alpha in \(0, 1\)"):
        config_from_dict({"eval": {"conformal": 1.5}})
    with pytest.raises(
        ConfigError, match=r"eval\.conformal: calibrates on data\.eval_split and checks on study\.split"
    ):
        config_from_dict({"eval": {"conformal": 0.1}, "data": {"eval_split": "test"}})

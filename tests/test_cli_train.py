"""``hiercls train`` / ``evaluate`` / ``predict`` end to end on tiny models (in-process ``main(argv)``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from hiercls.cli import main
from hiercls.evaluation import format_results
from hiercls.taxonomy import load_taxonomy

DECODERS = ["argmax_leaf", "optimal_hf1", "optimal_hfbeta:beta=2"]
TAXONOMY = "root animal\nroot vehicle\nanimal cat\nanimal dog\nvehicle car\nvehicle bike\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    (d / "tax.txt").write_text(TAXONOMY, encoding="utf-8")
    recipe = {
        "name": "tiny",
        "description": "tiny synthetic run",
        "taxonomy": str(d / "tax.txt"),
        "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
        "data": {
            "dataset": "synthetic",
            "batch_size": 8,
            "image_size": 16,
            "options": {"kind": "image", "image_size": 16, "train_samples": 16, "val_samples": 10},
        },
        "schedule": {"epochs": 1},
        "eval": {"decoders": DECODERS, "save_probs": True},
        "run": {"out_dir": str(d / "run"), "progress": False},
        "compare_heads": ["flat"],
    }
    (d / "recipe.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return {"dir": d, "recipe": d / "recipe.yaml", "run": d / "run"}


def test_train_prints_comparison_table(trained: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(trained["recipe"]), "--set", "optim.lr=2e-3"]) == 0
    out = capsys.readouterr().out
    assert "tiny: tiny synthetic run" in out
    lines = [line.split() for line in out.splitlines()]
    heads = [(row[0], row[1]) for row in lines if row and row[0] in ("semantic_softmax", "flat")]
    assert heads == [(head, d) for head in ("semantic_softmax", "flat") for d in DECODERS]
    run = trained["run"]
    comparison = json.loads((run / "comparison.json").read_text())
    assert set(comparison) == {"semantic_softmax", "flat"}
    assert (run / "compare" / "flat" / "results.json").is_file()
    assert yaml.safe_load((run / "config.yaml").read_text())["optim"]["lr"] == 2e-3


def test_train_errors_are_one_line(
    trained: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  backbone: timm:test_vit\n  haed: flat\n", encoding="utf-8")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: model.haed: unknown key 'haed'" in err and "did you mean 'head'" in err
    assert "Traceback" not in err
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["train", str(trained["recipe"]), "--set", "optim.lr=abc"]) == 2
    assert "--set optim.lr: expected float, got 'abc'" in capsys.readouterr().err


def test_print_config(trained: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(trained["recipe"]), "--print-config", "--set", "schedule.epochs=7"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["schedule"]["epochs"] == 7 and cfg["model"]["head"] == "semantic_softmax"


def _metrics(results: dict) -> dict:
    return {k: v for k, v in results.items() if "/" in k}


def _assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key, value in a.items():
        if isinstance(value, str):
            assert b[key] == value, key
        else:
            assert b[key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), key


def _table_rows(text: str) -> list[list[str]]:
    """The metric rows of a printed result table, without the run column (a head or a file name)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[1:3] == ["decoder", "accuracy"])
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip() or line.startswith("wrote"):
            break
        rows.append(line.split()[1:])
    return [lines[start].split()[1:], *rows]


def test_every_path_reports_the_same_metrics(
    trained: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Training, ``evaluate --model``, ``evaluate --probs`` and ``decode --labels``: same names, same numbers."""
    run = trained["run"]
    if not (run / "results.json").exists():
        assert main(["train", str(trained["recipe"]), "--no-compare"]) == 0
    final = json.loads((run / "results.json").read_text())
    training = _metrics(final)
    assert "optimal_hfbeta:beta=2/hF2_samples" in training and "argmax_leaf/hF2_micro" in training
    assert "optimal_hf1/hF1_samples" in training and "eval_loss" in final
    training_table = _table_rows(format_results({"semantic_softmax": final}))
    assert training_table[0][:4] == ["decoder", "accuracy", "hF1", "hF2"]

    capsys.readouterr()
    out_json = tmp_path / "m.json"
    # The last checkpoint is the final model: evaluating it again gives the training run's final metrics.
    assert main(["evaluate", "--model", str(run), "--checkpoint", "last", "--out", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "10 samples of split 'val'" in text
    _assert_same(training, _metrics(json.loads(out_json.read_text())))
    assert _table_rows(text) == training_table

    probs, labels = np.load(run / "eval_probs.npy"), np.load(run / "eval_labels.npy")
    assert probs.shape == (10, 7) and labels.shape == (10,)
    files = [
        "--probs",
        str(run / "eval_probs.npy"),
        "--labels",
        str(run / "eval_labels.npy"),
        "--taxonomy",
        str(trained["dir"] / "tax.txt"),
    ]
    saved_json = tmp_path / "s.json"
    assert main(["evaluate", *files, *[a for d in DECODERS for a in ("--decoder", d)], "--out", str(saved_json)]) == 0
    text = capsys.readouterr().out
    saved = json.loads(saved_json.read_text())
    assert saved["samples"] == 10
    _assert_same(training, _metrics(saved))
    assert _table_rows(text) == training_table

    decoded_json = tmp_path / "d.json"
    assert main(["decode", *files, *[a for d in DECODERS for a in ("--rule", d)], "--out", str(decoded_json)]) == 0
    text = capsys.readouterr().out
    _assert_same(training, _metrics(json.loads(decoded_json.read_text())["metrics"]))
    assert _table_rows(text) == training_table

    assert main(["evaluate", "--probs", str(run / "eval_probs.npy")]) == 2
    assert "--probs needs --labels" in capsys.readouterr().err


def test_evaluate_probs_with_an_hfbeta_decoder_reports_its_hfbeta(
    trained: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = trained["dir"]
    rng = np.random.default_rng(0)
    leaf = rng.dirichlet(np.ones(4), size=6)
    tax = load_taxonomy(str(d / "tax.txt"))
    np.save(tmp_path / "p.npy", np.asarray(tax.marginals(leaf), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.asarray(tax.leaves)[[0, 1, 2, 3, 0, 1]])
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "evaluate",
                "--probs",
                str(tmp_path / "p.npy"),
                "--labels",
                str(tmp_path / "y.npy"),
                "--taxonomy",
                str(d / "tax.txt"),
                "--decoder",
                "optimal_hfbeta:beta=2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    header = capsys.readouterr().out.splitlines()[1].split()
    assert header[:5] == ["probs", "decoder", "accuracy", "hF1", "hF2"]
    res = json.loads(out.read_text())
    assert 0.0 <= res["optimal_hfbeta:beta=2/hF2_samples"] <= 1.0
    assert (
        main(
            [
                "evaluate",
                "--probs",
                str(tmp_path / "p.npy"),
                "--labels",
                str(tmp_path / "y.npy"),
                "--taxonomy",
                str(d / "tax.txt"),
                "--decoder",
                "optimal_hfbeta:bta=2",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "unknown option 'bta'" in err and "did you mean 'beta'" in err


def test_predict_images(trained: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    run = trained["run"]
    if not (run / "checkpoints" / "best").exists():
        assert main(["train", str(trained["recipe"]), "--no-compare"]) == 0
    paths = []
    for i, colour in enumerate(["red", "blue"]):
        p = tmp_path / f"img{i}.png"
        Image.new("RGB", (20, 20), colour).save(p)
        paths.append(str(p))
    out = tmp_path / "p.json"
    capsys.readouterr()
    assert main(["predict", "--model", str(run), *paths, "--top-k", "2", "--out", str(out)]) == 0
    assert "img0.png" in capsys.readouterr().out
    preds = json.loads(out.read_text())["predictions"]
    assert len(preds) == 2
    names = {"cat", "dog", "car", "bike"}
    for p in preds:
        assert p["prediction"]["name"] in names and len(p["top_k"]) == 2
        assert p["path"][0] == "root" and p["path"][-1] == p["prediction"]["display_name"]
        assert p["top_k"][0]["prob"] >= p["top_k"][1]["prob"]
    assert main(["predict", "--model", str(run), "some text"]) == 2
    assert "image model" in capsys.readouterr().err
    assert main(["predict", "--model", str(tmp_path / "nope"), "x"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_torchrun_two_processes_match_one_process(trained: dict[str, Path], tmp_path: Path) -> None:
    """``torchrun --nproc_per_node 2 -m hiercls train`` (gloo on CPU) gives the single-process run's metrics."""
    import os
    import subprocess
    import sys

    single, ddp = tmp_path / "single", tmp_path / "ddp"
    # No dropout in test_vit; a global batch of 8 splits evenly (16 samples), so both runs see the same batches.
    overrides = ["--no-compare", "--set", "optim.eps=1e-4"]
    assert main(["train", str(trained["recipe"]), "--out-dir", str(single), *overrides]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        "-m",
        "hiercls",
        "train",
        str(trained["recipe"]),
        "--out-dir",
        str(ddp),
        *overrides,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("run folder:") == 1  # only rank 0 reports
    a = json.loads((single / "results.json").read_text())
    b = json.loads((ddp / "results.json").read_text())
    for key in ("argmax_leaf/accuracy", "argmax_leaf/hF1_micro", "eval_loss"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key


def test_predict_batch_folder_to_csv_and_jsonl(trained: dict[str, Path], tmp_path: Path, capsys) -> None:
    import csv

    from PIL import Image

    run = trained["run"]
    if not (run / "checkpoints" / "best").exists():
        assert main(["train", str(trained["recipe"]), "--no-compare"]) == 0
    folder = tmp_path / "photos" / "sub"
    folder.mkdir(parents=True)
    for i, colour in enumerate(["red", "blue", "green"]):
        Image.new("RGB", (20, 20), colour).save(folder / f"img{i}.png")
    (folder / "notes.md").write_text("not an image", encoding="utf-8")
    out_csv, out_jsonl = tmp_path / "p.csv", tmp_path / "p.jsonl"
    assert main(["predict", "--model", str(run), str(tmp_path / "photos"), "--out", str(out_csv)]) == 0
    assert "wrote 3 predictions" in capsys.readouterr().out
    with out_csv.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [Path(r["input"]).name for r in rows] == ["img0.png", "img1.png", "img2.png"]
    assert all(r["path"].split(" > ")[-1] == r["display_name"] and r["set_size"] == "1" for r in rows)
    args = ["predict", "--model", str(run), str(tmp_path / "photos"), "--decoder", "optimal_hf1"]
    assert main([*args, "--out", str(out_jsonl)]) == 0
    lines = [json.loads(line) for line in out_jsonl.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 3
    from hiercls.train import load_trained_model

    tax_of_run = load_trained_model(run)[1]
    for rec in lines:
        pred = rec["prediction"]
        assert pred["size"] == len(pred["ids"]) and {t["id"] for t in pred["tips"]} <= set(pred["ids"])
        common = pred["common"]["id"]
        assert rec["path"][-1] == pred["common"]["display_name"]  # the path leads to what the set is sure of
        assert all(common == t["id"] or common in tax_of_run.ancestors(t["id"]) for t in pred["tips"])
    assert main(["predict", "--model", str(run), str(tmp_path / "photos"), "--out", str(tmp_path / "p.txt")]) == 2
    assert "suffix must be one of .json, .jsonl, .csv" in capsys.readouterr().err
    assert not (tmp_path / "p.txt").exists()


def test_predict_texts_from_csv_and_jsonl(tiny_bert, small_tree, tmp_path: Path, capsys) -> None:
    from hiercls.models import create_model

    model_dir = create_model(f"hf:{tiny_bert}", small_tree, head="flat").save_pretrained(tmp_path / "m")
    data = tmp_path / "texts.csv"
    data.write_text('id,body\n1,"a cat, purrs"\n2,the dog barks\n3,\n', encoding="utf-8")
    out = tmp_path / "p.jsonl"
    args = ["predict", "--model", str(model_dir), str(data), "--text-column", "body", "--out", str(out)]
    assert main(args) == 2  # the empty text of row 3 (line 4) is named, not dropped
    assert f"{data}:4: empty text in column 'body'" in capsys.readouterr().err
    assert main([*args, "--on-error", "skip"]) == 0
    assert f"skipped {data}:4: empty text in column 'body'\nskipped 1 of 3 rows" in capsys.readouterr().err
    recs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["input"] for r in recs] == ["a cat, purrs", "the dog barks"]
    assert [r["row"] for r in recs] == [f"{data}:2", f"{data}:3"]
    jl = tmp_path / "texts.jsonl"
    jl.write_text('{"body": "a cat"}\n{"text": "no body"}\n', encoding="utf-8")
    assert main(["predict", "--model", str(model_dir), str(jl), "--text-column", "body"]) == 2
    assert f"{jl}:2: expected a JSON object with key 'body'" in capsys.readouterr().err
    assert main(["predict", "--model", str(model_dir), str(data), "--text-column", "txt"]) == 2
    assert "no column 'txt'" in capsys.readouterr().err


def test_evaluate_model_table_equals_the_table_of_the_saved_probabilities(
    trained: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``evaluate --model RUN --table`` scores the model's probabilities on the split: the table that
    ``evaluate --probs`` gives for the probabilities training saved of the same (last) checkpoint."""
    run = trained["run"]
    if not (run / "results.json").exists():
        assert main(["train", str(trained["recipe"]), "--no-compare"]) == 0
    model_json, probs_json = tmp_path / "m.json", tmp_path / "p.json"
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--checkpoint", "last", "--table", "--out", str(model_json)]) == 0
    assert f"{run} (split 'val'): 10 samples (0 ignored)" in capsys.readouterr().out
    files = ["--probs", str(run / "eval_probs.npy"), "--labels", str(run / "eval_labels.npy")]
    files += ["--taxonomy", str(trained["dir"] / "tax.txt")]
    assert main(["evaluate", *files, "--table", "--out", str(probs_json)]) == 0
    a, b = json.loads(model_json.read_text()), json.loads(probs_json.read_text())
    assert a.keys() == b.keys() and a["optimal"] == b["optimal"] and a["samples"] == b["samples"] == 10
    for part in ("realised", "expected"):
        for decoder, row in b[part].items():
            for metric, value in row.items():  # None: a distance of a node-set decoder
                got = a[part][decoder][metric]
                assert got == value if value is None else got == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True)
    assert main(["evaluate", "--model", str(run), "--labels", str(run / "eval_labels.npy")]) == 2
    assert "--labels and --taxonomy go with --probs" in capsys.readouterr().err


def test_training_off_a_terminal_writes_no_bars_and_one_line_per_eval(
    trained: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Redirected (stderr is no terminal), training writes no progress bar; each evaluation logs one line."""
    caplog.set_level("INFO", logger="hiercls.train")
    args = [
        "--no-compare",
        "--out-dir",
        str(tmp_path / "q"),
        "--set",
        "schedule.epochs=2",
        "--set",
        "run.progress=true",
    ]
    assert main(["train", str(trained["recipe"]), *args]) == 0
    err = capsys.readouterr().err
    assert "it/s" not in err and "\r" not in err and "train:" not in err, err[-500:]
    evals = [r for r in caplog.records if r.name == "hiercls.train.loop" and r.getMessage().startswith("eval after")]
    assert [r.getMessage().split(":")[0] for r in evals] == ["eval after step 2", "eval after step 4"]


def test_loading_a_text_model_shows_no_transformers_bars(tiny_bert, small_tree, capsys) -> None:
    """hiercls silences transformers' "Loading weights" bar while it loads, and leaves the user's setting as it was."""
    from transformers.utils import logging as hf_logging

    from hiercls.models import create_model

    assert hf_logging.is_progress_bar_enabled()
    create_model(f"hf:{tiny_bert}", small_tree, head="flat")
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # put back: a user's own transformers loads still show it
    hf_logging.disable_progress_bar()
    try:
        create_model(f"hf:{tiny_bert}", small_tree, head="flat")
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_a_plain_run_reports_its_conformal_rows_as_evaluate_conformal_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """eval.conformal on a run without a study: calibrated on val, checked on test, the same rows as
    ``hiercls evaluate --model RUN --conformal ALPHA`` (which calibrates and checks the same splits)."""
    (tmp_path / "tax.txt").write_text(TAXONOMY, encoding="utf-8")
    recipe = {
        "name": "tiny_conformal",
        "taxonomy": str(tmp_path / "tax.txt"),
        "model": {"backbone": "timm:test_vit", "head": "flat", "backbone_options": {"img_size": 16}},
        "data": {
            "dataset": "synthetic",
            "batch_size": 8,
            "image_size": 16,
            "options": {"kind": "image", "image_size": 16, "train_samples": 8, "val_samples": 12, "test_samples": 9},
        },
        "schedule": {"epochs": 1},
        "eval": {"conformal": 0.2},
        "run": {"out_dir": str(tmp_path / "run"), "progress": False, "plot": False},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    assert main(["train", str(tmp_path / "r.yaml")]) == 0
    out = capsys.readouterr().out
    assert "conformal: alpha = 0.2 (target coverage 0.8), calibrated on split 'val' (12 samples)" in out
    stored = json.loads((tmp_path / "run" / "results.json").read_text())["conformal"]
    assert (stored["split"], stored["n_calibration"], stored["n_test"]) == ("test", 12, 9)
    args = ["--conformal", "0.2", "--data", "test", "--out", str(tmp_path / "e.json")]
    assert main(["evaluate", "--model", str(tmp_path / "run"), *args]) == 0
    again = json.loads((tmp_path / "e.json").read_text())["conformal"]
    assert again["rows"].keys() == stored["rows"].keys()
    for method, row in again["rows"].items():
        assert stored["rows"][method] == pytest.approx(row), method

"""Saved probabilities and labels, the Evaluator / evaluate_probabilities / format_results, ``hiercls decode``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from _generators import random_tree

from hiercls.cli import main
from hiercls.decode import decode, optimal_hfbeta
from hiercls.evaluation import Evaluator, evaluate_probabilities, format_results, load_labels, load_probabilities
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import write_json

TAX = Taxonomy([("r", "animal"), ("animal", "cat"), ("animal", "dog"), ("r", "car")], name="toy")
# ids: r 0, animal 1, cat 2, dog 3, car 4
PROBS = np.array([[1.0, 0.6, 0.3, 0.3, 0.4], [1.0, 0.9, 0.8, 0.1, 0.1], [1.0, 0.2, 0.1, 0.1, 0.8]], dtype=np.float32)


def test_load_probabilities_formats(tmp_path) -> None:
    np.save(tmp_path / "p.npy", PROBS)
    np.testing.assert_array_equal(load_probabilities(tmp_path / "p.npy"), PROBS)
    np.savez(tmp_path / "one.npz", whatever=PROBS)
    np.testing.assert_array_equal(load_probabilities(tmp_path / "one.npz"), PROBS)
    np.savez(tmp_path / "two.npz", probs=PROBS, labels=np.arange(3))
    np.testing.assert_array_equal(load_probabilities(tmp_path / "two.npz"), PROBS)
    np.savez(tmp_path / "amb.npz", a=PROBS, b=PROBS)
    with pytest.raises(ValueError, match="several arrays"):
        load_probabilities(tmp_path / "amb.npz")
    np.testing.assert_array_equal(load_probabilities(tmp_path / "amb.npz", key="b"), PROBS)
    with pytest.raises(ValueError, match="no array named 'c'"):
        load_probabilities(tmp_path / "amb.npz", key="c")
    torch.save(torch.from_numpy(PROBS), tmp_path / "p.pt")
    np.testing.assert_array_equal(load_probabilities(tmp_path / "p.pt"), PROBS)
    torch.save({"node_probs": torch.from_numpy(PROBS).half(), "epoch": torch.tensor(3)}, tmp_path / "d.pt")
    np.testing.assert_allclose(load_probabilities(tmp_path / "d.pt"), PROBS, atol=1e-3)
    (tmp_path / "p.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match=r"unsupported probabilities file type '.csv'"):
        load_probabilities(tmp_path / "p.csv")
    with pytest.raises(FileNotFoundError, match=r"missing\.npy"):
        load_probabilities(tmp_path / "missing.npy")
    np.save(tmp_path / "cube.npy", np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="2-D"):
        load_probabilities(tmp_path / "cube.npy")
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(ValueError, match="cannot read"):
        load_probabilities(tmp_path / "bad.npy")


def test_load_labels_formats_and_errors(tmp_path) -> None:
    np.save(tmp_path / "y.npy", np.array([2, 4, -1]))
    assert load_labels(tmp_path / "y.npy", TAX).tolist() == [2, 4, -1]
    np.save(tmp_path / "bad.npy", np.array([2, 9]))
    with pytest.raises(ValueError, match=r"\[1\] = 9 is not a node id"):
        load_labels(tmp_path / "bad.npy", TAX)
    np.save(tmp_path / "names.npy", np.array(["cat", "car"]))
    assert load_labels(tmp_path / "names.npy", TAX).tolist() == [2, 4]
    (tmp_path / "y.txt").write_text("# header comment\ncat\n\nanimal/dog\nr > animal\ncar\n")
    assert load_labels(tmp_path / "y.txt", TAX).tolist() == [2, 3, 1, 4]
    (tmp_path / "typo.txt").write_text("cat\ncta\n")
    with pytest.raises(TaxonomyError, match=r"typo.txt:2: unknown label 'cta'.*did you mean 'cat'") as info:
        load_labels(tmp_path / "typo.txt", TAX)
    assert info.value.line == 2 and info.value.label == "cta"
    (tmp_path / "chain.txt").write_text("car/cat\n")
    with pytest.raises(TaxonomyError, match=r"chain\.txt:1: label path 'car/cat'"):
        load_labels(tmp_path / "chain.txt", TAX)
    (tmp_path / "y.csv").write_text("image,label\na.jpg,dog\nb.jpg,animal/cat\n")
    assert load_labels(tmp_path / "y.csv", TAX).tolist() == [3, 2]
    (tmp_path / "y.tsv").write_text("a.jpg\tcar\nb.jpg\tcat\n")
    assert load_labels(tmp_path / "y.tsv", TAX).tolist() == [4, 2]
    (tmp_path / "nolabel.csv").write_text("image,target\na.jpg,dog\n")
    with pytest.raises(ValueError, match="no column 'klass'"):
        load_labels(tmp_path / "nolabel.csv", TAX, column="klass")


def _brute_force(pred: np.ndarray, labels: np.ndarray, tax: Taxonomy, beta: float) -> dict[str, float]:
    """Per-sample and micro hP/hR/hF-beta over ancestor sets without the root, by explicit set arithmetic."""
    b2 = beta**2
    inter = npred = ntrue = 0
    per_f, exact = [], []
    for p, y in zip(pred, labels, strict=True):
        t = set(tax.ancestors(int(y))) | {int(y)}
        s = (set(np.flatnonzero(p)) if np.ndim(p) else set(tax.ancestors(int(p))) | {int(p)}) - {tax.root}
        t -= {tax.root}
        i = len(s & t)
        inter, npred, ntrue = inter + i, npred + len(s), ntrue + len(t)
        den = b2 * len(t) + len(s)
        per_f.append((1 + b2) * i / den if den else 0.0)
        exact.append(s == t)
    den = b2 * ntrue + npred
    return {
        "micro": (1 + b2) * inter / den if den else 0.0,
        "samples": float(np.mean(per_f)),
        "hP_micro": inter / npred,
        "hR_micro": inter / ntrue,
        "accuracy": float(np.mean(exact)),
    }


def test_evaluate_probabilities_by_hand() -> None:
    # label cat (path animal, cat); predictions: dog (animal, dog) -> hP = hR = 1/2; cat -> 1; car -> 0
    probs = np.array([[1.0, 0.9, 0.2, 0.7, 0.1], [1.0, 0.9, 0.8, 0.1, 0.1], [1.0, 0.1, 0.05, 0.05, 0.9]])
    res = evaluate_probabilities(probs, np.array([2, 2, 2]), TAX, ["argmax_leaf"], k=())
    assert res["argmax_leaf/accuracy"] == pytest.approx(1 / 3)
    assert res["argmax_leaf/hF1_samples"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert res["argmax_leaf/hF1_micro"] == pytest.approx(2 * 3 / (6 + 5))  # |S & Y| = 1 + 2 + 0; |Y| 6, |S| 5
    assert res["argmax_leaf/mistake_severity"] == pytest.approx((1 + 2) / 2)  # lca heights: animal 1, root 2
    assert (res["samples"], res["ignored"]) == (3, 0)


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])  # beta > 0 (issue 28)
def test_evaluator_matches_brute_force_on_random_trees(beta: float) -> None:
    rng = np.random.default_rng(int(beta * 10))
    for _ in range(3):
        tax = random_tree(12, rng)
        leaf = rng.dirichlet(np.ones(tax.num_leaves), size=40)
        node = np.asarray(tax.marginals(leaf))
        labels = np.asarray(tax.leaves)[[rng.choice(tax.num_leaves, p=row) for row in leaf]]
        spec = f"optimal_hfbeta:beta={beta:g}"
        ev = Evaluator(tax, ["argmax_leaf", spec], k=())
        for chunk in np.array_split(np.arange(40), 3):  # batches accumulate like one call
            ev.update(node[chunk], labels[chunk])
        res = ev.compute()
        name, label = f"hF{beta:g}", spec
        for dec, pred in (("argmax_leaf", decode(node, tax)), (label, optimal_hfbeta(node, tax, beta=beta))):
            ref = _brute_force(pred, labels, tax, beta)
            assert res[f"{dec}/{name}_micro"] == pytest.approx(ref["micro"])
            assert res[f"{dec}/{name}_samples"] == pytest.approx(ref["samples"])
            ref1 = _brute_force(pred, labels, tax, 1.0)
            assert res[f"{dec}/hF1_micro"] == pytest.approx(ref1["micro"])
            assert res[f"{dec}/hP_micro"] == pytest.approx(ref1["hP_micro"])
            assert res[f"{dec}/accuracy"] == pytest.approx(ref1["accuracy"])


def test_evaluator_reset_and_labels() -> None:
    ev = Evaluator(TAX, ["argmax_leaf", "optimal_hf1", "optimal_hfbeta:beta=2"], k=(1,))
    assert list(ev.decoders) == ["argmax_leaf", "optimal_hf1", "optimal_hfbeta:beta=2"]
    ev.update(PROBS, np.array([2, 2, 4]))
    first = ev.compute()
    assert "optimal_hf1/hF2_samples" in first and "argmax_leaf/hF2_micro" in first
    assert "argmax_leaf/top1_accuracy" in first and "optimal_hf1/top1_accuracy" not in first
    ev.reset()
    ev.update(PROBS, np.array([2, 2, 4]))
    assert ev.compute() == first
    with pytest.raises(ValueError, match="given twice"):
        Evaluator(TAX, ["optimal_hf1", "optimal_hfbeta:beta=1"])
    with pytest.raises(ValueError, match="unknown decoder 'best'"):
        Evaluator(TAX, ["best"])
    with pytest.raises(ValueError, match="2 entries but probs has 3 rows"):
        ev.update(PROBS, np.array([2, 2]))


def test_evaluate_probabilities_ignores_minus_one_and_reads_files(tmp_path) -> None:
    res = evaluate_probabilities(PROBS, np.array([2, -1, 4]), TAX, ["argmax_leaf"])
    assert res["samples"] == 2 and res["ignored"] == 1
    assert res["argmax_leaf/accuracy"] == pytest.approx(0.5)  # car for cat wrong, car for car right
    np.save(tmp_path / "p.npy", PROBS)
    (tmp_path / "y.txt").write_text("cat\n-1\ncar\n")
    assert evaluate_probabilities(tmp_path / "p.npy", tmp_path / "y.txt", TAX, ["argmax_leaf"]) == res
    table = format_results({"p.npy": res}, name="probs")
    assert table.splitlines()[0].split()[:4] == ["probs", "decoder", "accuracy", "hF1"]


def test_one_label_parser_for_files_and_datasets(tmp_path) -> None:
    from hiercls.data import LabelEncoder

    # "r/cat" skips a level: both the data sets and the label files refuse it (one parser)
    with pytest.raises(TaxonomyError, match="not a child"):
        LabelEncoder(TAX).encode("r/cat", "path")
    (tmp_path / "skip.txt").write_text("r/cat\n")
    with pytest.raises(TaxonomyError, match=r"skip\.txt:1: label path 'r/cat'"):
        load_labels(tmp_path / "skip.txt", TAX)


def test_cli_decode_writes_json_and_prints_table(tmp_path, capsys) -> None:
    write_json(TAX, tmp_path / "tax.json")
    np.save(tmp_path / "p.npy", PROBS)
    (tmp_path / "y.txt").write_text("cat\ncat\ncar\n")
    out = tmp_path / "preds.json"
    rc = main(
        [
            "decode",
            "--probs",
            str(tmp_path / "p.npy"),
            "--taxonomy",
            str(tmp_path / "tax.json"),
            "--rule",
            "crm",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert [p["name"] for p in data["rules"]["crm"]["predictions"]] == ["cat", "cat", "car"]
    assert "crm: 3 predictions" in capsys.readouterr().out

    rc = main(
        [
            "decode",
            "--probs",
            str(tmp_path / "p.npy"),
            "--taxonomy",
            str(tmp_path / "tax.json"),
            "--labels",
            str(tmp_path / "y.txt"),
            "--rule",
            "optimal_hfbeta",
            "--beta",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["probs", "decoder", "accuracy", "hF1", "hF2", "level", "1", "level", "2"]
    assert "optimal_hfbeta:beta=2" in printed
    data = json.loads(out.read_text())
    sets = data["rules"]["optimal_hfbeta:beta=2"]["predictions"]
    want = optimal_hfbeta(PROBS, TAX, beta=2.0)
    assert [s["ids"] for s in sets] == [np.flatnonzero(w).tolist() for w in want]
    ref = evaluate_probabilities(PROBS, load_labels(tmp_path / "y.txt", TAX), TAX, ["optimal_hfbeta:beta=2"])
    assert {k: v for k, v in data["metrics"].items() if "/" in k} == {k: v for k, v in ref.items() if "/" in k}
    # the spec string and the flag are the same decoder
    rc = main(
        [
            "decode",
            "--probs",
            str(tmp_path / "p.npy"),
            "--taxonomy",
            str(tmp_path / "tax.json"),
            "--labels",
            str(tmp_path / "y.txt"),
            "--rule",
            "optimal_hfbeta:beta=2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0 and json.loads(out.read_text())["metrics"] == data["metrics"]
    capsys.readouterr()

    rc = main(
        [
            "decode",
            "--probs",
            str(tmp_path / "p.npy"),
            "--taxonomy",
            str(tmp_path / "tax.json"),
            "--labels",
            str(tmp_path / "y.txt"),
            "--rule",
            "all",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert all(r in printed for r in ("argmax_leaf", "plurality", "bayes_node", "optimal_hfbeta"))
    rc = main(["decode", "--probs", str(tmp_path / "p.npy"), "--taxonomy", str(tmp_path / "tax.json"), "--rule", "all"])
    assert rc == 2 and "pass --labels" in capsys.readouterr().err


def test_cli_decode_errors_are_one_line(tmp_path, capsys) -> None:
    write_json(TAX, tmp_path / "tax.json")
    np.save(tmp_path / "p.npy", PROBS)
    (tmp_path / "y.txt").write_text("cat\nkitten\ncar\n")
    rc = main(
        [
            "decode",
            "--probs",
            str(tmp_path / "p.npy"),
            "--taxonomy",
            str(tmp_path / "tax.json"),
            "--labels",
            str(tmp_path / "y.txt"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "y.txt:2" in err and "kitten" in err and "Traceback" not in err
    np.save(tmp_path / "wide.npy", np.ones((2, 7)))
    rc = main(["decode", "--probs", str(tmp_path / "wide.npy"), "--taxonomy", str(tmp_path / "tax.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "[B, 5]" in err
    rc = main(["decode", "--probs", str(tmp_path / "nope.npy"), "--taxonomy", str(tmp_path / "tax.json")])
    assert rc == 2 and "nope.npy" in capsys.readouterr().err
    rc = main(
        [
            "decode",
            "--probs",
            str(tmp_path / "p.npy"),
            "--taxonomy",
            str(tmp_path / "tax.json"),
            "--rule",
            "optimal_hfbeta:beta=-2",
        ]
    )
    assert rc == 2 and "beta must be a finite number > 0; got -2" in capsys.readouterr().err
    rc = main(
        [
            "decode",
            "--probs",
            str(tmp_path / "p.npy"),
            "--taxonomy",
            str(tmp_path / "tax.json"),
            "--rule",
            "crm:cots=zhao",
        ]
    )
    assert rc == 2 and "unknown option 'cots'" in capsys.readouterr().err


def test_format_results_shows_unreached_levels_as_a_dash_not_nan() -> None:
    from hiercls.evaluation import format_results

    res = {"optimal_hf1/accuracy": 0.0, "optimal_hf1/hF1_micro": 0.4, "optimal_hf1/per_level_accuracy": [0.5, math.nan]}
    row = format_results({"flat": res}).splitlines()[-1].split()
    assert row[-2:] == ["0.500", "-"] and "nan" not in row

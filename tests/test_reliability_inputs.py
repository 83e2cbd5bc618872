"""Reliability under bad input: one table of bad inputs a user can hand hiercls, each with its expected outcome.

Every case either raises an error whose message names the culprit (the file, the key, the label, the row and
node), or gives the correct result (checked against an independent computation); and in every case the user's
input files are byte-for-byte unchanged afterwards. CLI cases must exit 2 with one line on stderr. A separate test
hands hiercls crafted pickles under every file type it reads probabilities, labels, taxonomies or recipes from,
and checks that none of them runs.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hiercls._textio import TextFileError, read_limit
from hiercls.cli import main
from hiercls.data.text import read_text_rows
from hiercls.decode import ProbabilityError, check_probabilities, decode, optimal_hfbeta
from hiercls.evaluation import Evaluator, evaluate_probabilities, load_labels, load_probabilities
from hiercls.metrics import hierarchical_fbeta_score, top_k_accuracy_score
from hiercls.models.inference import read_input_rows
from hiercls.taxonomy import Taxonomy, TaxonomyError, read_taxonomy, write_taxonomy
from hiercls.train.config import ConfigError, load_config

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
assert NFC != NFD
TREE = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])  # ids: r0 a1 x2 y3 b4; leaves x, y, b
DAG = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x")])  # ids: r0 a1 b2 x3
GOOD = np.array([[1.0, 0.6, 0.3, 0.3, 0.4], [1.0, 0.9, 0.8, 0.1, 0.1]])
JSON_ID = "hiercls-taxonomy"


class Ctx:
    """What a case gets: a folder for the user's files (``inp``), one for outputs (``out``), and the CLI."""

    def __init__(self, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.inp, self.out, self.capsys = tmp / "in", tmp / "out", capsys
        self.inp.mkdir()
        self.out.mkdir()
        self.arrays: list[tuple[np.ndarray, np.ndarray]] = []

    def write(self, name: str, content: str | bytes) -> Path:
        p = self.inp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
        return p

    def npy(self, name: str, arr: Any) -> Path:
        p = self.inp / name
        np.save(p, np.asarray(arr))
        return p

    def array(self, arr: Any) -> np.ndarray:
        """An in-memory input, checked unchanged after the case like the files."""
        a = np.array(arr, dtype=np.float64)
        self.arrays.append((a, a.copy()))
        return a

    def cli(self, *argv: Any) -> tuple[int, str, str]:
        self.capsys.readouterr()
        rc = main([str(a) for a in argv])
        cap = self.capsys.readouterr()
        return rc, cap.out, cap.err


@dataclass
class Err:
    """The case raises ``exc`` with every string of ``culprits`` in its message."""

    exc: type[BaseException]
    culprits: tuple[str, ...]

    def __init__(self, exc: type[BaseException], *culprits: str) -> None:
        self.exc, self.culprits = exc, culprits


@dataclass
class CliErr:
    """The CLI exits 2 with one line ``hiercls <cmd>: error: ...`` holding every culprit, and no traceback."""

    culprits: tuple[str, ...]

    def __init__(self, *culprits: str) -> None:
        self.culprits = culprits


@dataclass
class Ok:
    """The case returns a value ``check`` accepts (an independent computation of the right answer)."""

    check: Callable[[Any], bool]


CASES: dict[str, tuple[Callable[[Ctx], Any], Any]] = {}


def case(name: str, expect: Any) -> Callable[[Callable[[Ctx], Any]], Callable[[Ctx], Any]]:
    def register(fn: Callable[[Ctx], Any]) -> Callable[[Ctx], Any]:
        assert name not in CASES, name
        CASES[name] = (fn, expect)
        return fn

    return register


def _chain_nested(depth: int) -> str:
    return "".join(f'{{"n{i}":' for i in range(depth)) + "{}" + "}" * depth


def _node_probs_of_leaves(tax: Taxonomy, leaf: np.ndarray) -> np.ndarray:
    """Node probabilities by brute force: each node sums the leaves below it (independent of Taxonomy.marginals)."""
    out = np.zeros((leaf.shape[0], tax.num_nodes))
    for j, lf in enumerate(tax.leaves):
        for n in [int(lf), *tax.ancestors(int(lf))]:
            out[:, n] += leaf[:, j]
    return out


# ---------------------------------------------------------------------------------------------- taxonomy files
@case("json_nested_duplicate_key", Err(TaxonomyError, "t.json:3", "duplicate key 'a'", "first at line 2"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("t.json", '{"r": {\n  "a": {"x": {}},\n  "a": {"y": {}}}}'))


@case("json_deeply_nested_duplicate_key", Err(TaxonomyError, "t.json:4", "duplicate key 'k'"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("t.json", '{"r": {"a": {"b": {\n"k": {},\n"z": {},\n"k": {"q": {}}}}}}'))


@case("json_hiercls_duplicate_field", Err(TaxonomyError, "h.json:2", "duplicate key 'edges'"))
def _(c: Ctx) -> Any:
    body = f'{{"format": "{JSON_ID}", "edges": [["r", "a"]],\n"edges": [["r", "b"]]}}'
    return read_taxonomy(c.write("h.json", body))


@case("json_node_link_duplicate_key", Err(TaxonomyError, "nl.json:3", "duplicate key 'id'"))
def _(c: Ctx) -> Any:
    body = '{"directed": true, "nodes": [\n{"id": "r"}, {"id": "a",\n"id": "b"}],'
    body += ' "edges": [{"source": "r", "target": "a"}]}'
    return read_taxonomy(c.write("nl.json", body))


@case("json_children_duplicate_parent", Err(TaxonomyError, "ch.json:3", "duplicate key 'a'"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("ch.json", '{"r": ["a", "b"],\n"a": ["x"],\n"a": ["y"]}'))


@case("json_nested_100k_levels", Err(TaxonomyError, "deep.json", "nesting deeper than 10000 levels"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("deep.json", _chain_nested(100_000)))


@case("json_array_100k_levels", Err(TaxonomyError, "arr.json"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("arr.json", "[" * 100_000 + "]" * 100_000))


@case("json_nested_3000_levels_reads", Ok(lambda t: t.height == 2999 and t.num_nodes == 3000))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("deep.json", _chain_nested(3000)))


@case("json_invalid_names_line", Err(TaxonomyError, "bad.json:2", "invalid JSON"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("bad.json", '{"r":\n {"a": }}'))


@case("tsv_nfc_nfd_labels", Err(TaxonomyError, "t.tsv", ascii(NFC), ascii(NFD), "Unicode normalisation"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("t.tsv", f"r\t{NFC}\tb\nb\t{NFD}\n"))


@case("edges_csv_nfc_nfd_labels", Err(TaxonomyError, "e.csv:3", ascii(NFC), ascii(NFD)))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("e.csv", f"parent,child\nr,{NFC}\nr,{NFD}\n"))


@case("nested_json_nfc_nfd_labels", Err(TaxonomyError, "n.json", ascii(NFC), ascii(NFD)))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("n.json", json.dumps({"r": {NFC: {}, "b": {NFD: {}}}}, ensure_ascii=False)))


@case("children_json_nfc_nfd_labels", Err(TaxonomyError, "c.json", ascii(NFC), ascii(NFD)))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("c.json", json.dumps({"r": [NFC, "b"], "b": [NFD]}, ensure_ascii=False)))


@case("paths_nfc_nfd_labels", Err(TaxonomyError, "l.paths", ascii(NFC)[1:-1], ascii(NFD)[1:-1]))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("l.paths", f"animal/{NFC}\nanimal/{NFD}\n"))


@case("edges_zero_width_space_twin", Err(TaxonomyError, "z.edges:2", "'cat'", "cat\\u200b", "invisible"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("z.edges", "r cat\nr cat\u200b\n"))


@case("tsv_label_only_invisible", Err(TaxonomyError, "i.tsv:2", "\\u2060", "only invisible"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("i.tsv", "r\ta\tb\na\t\u2060\n"))


@case("folders_nfc_nfd_siblings", Err(TaxonomyError, ascii(NFC), ascii(NFD)))
def _(c: Ctx) -> Any:
    (c.inp / "tree" / NFC).mkdir(parents=True)
    (c.inp / "tree" / NFD).mkdir(parents=True)
    return read_taxonomy(c.inp / "tree")


@case("yaml_taxonomy_refused", Err(TaxonomyError, "t.yaml", "not a taxonomy format", "edge list"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("t.yaml", "r:\n  a: [x, y]\n"))


@case("yml_taxonomy_refused", Err(TaxonomyError, "t.yml", "not a taxonomy format"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("t.yml", "- r a\n"))


@case("tsv_latin1", Err(TaxonomyError, "l.tsv:2", "not UTF-8", "offset 11", "0xe9"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("l.tsv", "r\ta\tb\na\tcaf\xe9\n".encode("latin-1")))


@case("edges_latin1", Err(TaxonomyError, "l.edges:1", "not UTF-8", "iconv"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("l.edges", "r \xe9t\xe9\n".encode("latin-1")))


@case("json_latin1", Err(TaxonomyError, "l.json:1", "not UTF-8"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("l.json", '{"r": {"caf\xe9": {}}}'.encode("latin-1")))


@case("paths_latin1", Err(TaxonomyError, "l.paths:2", "not UTF-8"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("l.paths", "a/b\na/\xe9\n".encode("latin-1")))


@case("gz_corrupt", Err(TaxonomyError, "t.tsv.gz", "corrupt gzip"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("t.tsv.gz", gzip.compress(b"r\ta\tb\n")[:12]))


@case("edges_cycle", Err(TaxonomyError, "cyc.edges", "cycle"))
def _(c: Ctx) -> Any:
    return read_taxonomy(c.write("cyc.edges", "r a\na b\nb a\n"))


# ---------------------------------------------------------------------------------------------- taxonomy writers
@case("write_json_onto_folder", Err(IsADirectoryError, "x.json", "is a folder"))
def _(c: Ctx) -> Any:
    (c.out / "x.json").mkdir()
    return write_taxonomy(TREE, c.out / "x.json")


@case("write_under_a_file", Err(NotADirectoryError, "notes.txt is a file"))
def _(c: Ctx) -> Any:
    notes = c.write("notes.txt", "keep me")
    return write_taxonomy(TREE, notes / "x.tsv")


@case("write_folders_onto_existing", Err(FileExistsError, "tree", "already exists"))
def _(c: Ctx) -> Any:
    c.write("tree/keep.txt", "mine")
    return write_taxonomy(TREE, c.inp / "tree", format="folders")


def _no_half_tree(c: Ctx) -> Any:
    # 'a' and 'b' are made, then the folder of 'k' fails (a name over the file system's 255 bytes)
    tax = Taxonomy([("r", "a"), ("r", "b"), ("b", "k")], display_names={"k": "k" * 300})
    try:
        write_taxonomy(tax, c.out / "tree", format="folders")
    finally:
        assert os.listdir(c.out) == [], os.listdir(c.out)  # neither the tree nor its temporary folder


case("write_folders_failure_leaves_nothing", Err(OSError, "node 'k'", "name too long"))(_no_half_tree)


@case("write_folders_twin_display_names", Err(TaxonomyError, "two children of 'r'", "'same'", "read back as one"))
def _(c: Ctx) -> Any:
    tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "k")], display_names={"a": "same", "b": "same"})
    try:
        write_taxonomy(tax, c.out / "tree", format="folders")
    finally:
        assert os.listdir(c.out) == []


@case("write_nested_too_deep_clear_error", Err(TaxonomyError, "10001 levels deep", "edge list"))
def _(c: Ctx) -> Any:
    chain = Taxonomy([(f"n{i}", f"n{i + 1}") for i in range(10_001)])
    try:
        write_taxonomy(chain, c.out / "n.json", format="nested")
    finally:
        assert os.listdir(c.out) == []


@case("write_nested_deep_roundtrip", Ok(lambda ok: ok))
def _(c: Ctx) -> Any:
    chain = Taxonomy([(f"n{i}", f"n{i + 1}") for i in range(3000)])
    write_taxonomy(chain, c.out / "n.json", format="nested")
    return read_taxonomy(c.out / "n.json") == chain


# ---------------------------------------------------------------------------------------------- probabilities
@case("decode_logits", Err(ProbabilityError, "row 0", "'r' (id 0)", "2.5", "[0, 1]"))
def _(c: Ctx) -> Any:
    return decode(c.array([[2.5, 1.0, -0.5, 0.3, -2.0]]), TREE)


@case("decode_value_above_one", Err(ProbabilityError, "row 1", "node 'x' (id 2)", "1.5"))
def _(c: Ctx) -> Any:
    return decode(c.array([[1.0, 0.6, 0.3, 0.3, 0.4], [1.0, 1.0, 1.5, 0.0, 0.0]]), TREE, "top_down")


@case("decode_root_not_one", Err(ProbabilityError, "row 0", "root 'r' (id 0)", "0.5", "expected 1"))
def _(c: Ctx) -> Any:
    return decode(c.array([[0.5, 0.3, 0.1, 0.1, 0.2]]), TREE, "threshold")


@case("decode_child_above_parent_tree", Err(ProbabilityError, "node 'y' (id 3)", "0.7 > 0.6", "parent node 'a'"))
def _(c: Ctx) -> Any:
    return decode(c.array([[1.0, 0.6, 0.0, 0.7, 0.4]]), TREE, "max_info")


@case("decode_child_above_second_parent_dag", Err(ProbabilityError, "node 'x' (id 3)", "parent node 'b' (id 2)"))
def _(c: Ctx) -> Any:
    return decode(c.array([[1.0, 0.9, 0.2, 0.5]]), DAG, "threshold")


@case("decode_leaf_rows_sum_three", Err(ProbabilityError, "row 0", "sum to 3", "expected 1"))
def _(c: Ctx) -> Any:
    return optimal_hfbeta(c.array([[1.0, 1.0, 1.0]]), TREE, leaf_probs=True)


@case("hfbeta_children_sum_above_parent", Err(ProbabilityError, "children of node 'r' (id 0)", "sum to 2 > 1"))
def _(c: Ctx) -> Any:
    return optimal_hfbeta(c.array([[1.0, 1.0, 0.5, 0.5, 1.0]]), TREE)  # leaves x+y+b sum to 2


@case("crm_children_sum_above_parent", Err(ProbabilityError, "children of node 'a' (id 1)", "sum to 1.2 > 0.6"))
def _(c: Ctx) -> Any:
    return decode(c.array([[1.0, 0.6, 0.6, 0.6, 0.4]]), TREE, "crm")


@case("decode_nan", Err(ProbabilityError, "row 0", "node 'a' (id 1)", "nan"))
def _(c: Ctx) -> Any:
    return decode(c.array([[1.0, np.nan, 0.3, 0.3, 0.4]]), TREE)


@case("decode_inf_torch", Err(ProbabilityError, "node 'b' (id 4)", "inf"))
def _(c: Ctx) -> Any:
    return decode(torch.tensor([[1.0, 0.6, 0.3, 0.3, float("inf")]]), TREE)


@case("decode_bad_row_in_later_block_named", Err(ProbabilityError, "row 4321", "node 'x' (id 2)"))
def _(c: Ctx) -> Any:
    p = np.tile(GOOD[:1], (5000, 1))
    p[4321, 2] = 0.9
    return decode(c.array(p), TREE, "optimal_hfbeta")


@case("decode_check_false_multilabel_scores", Ok(lambda ids: ids.tolist() == [3]))
def _(c: Ctx) -> Any:
    # Multi-label scores (children above the sum rule, a child above its parent): refused by default, decoded with
    # check=False as the rule defines (argmax_leaf: the largest leaf, y at 0.9).
    return decode(c.array([[1.0, 0.5, 0.8, 0.9, 0.7]]), TREE, check=False)


@case("softmax_float32_not_refused", Ok(lambda r: r[0].tolist() == r[1].tolist()))
def _(c: Ctx) -> Any:
    rng = np.random.default_rng(0)
    tax = Taxonomy([("r", f"g{i}") for i in range(40)] + [(f"g{i}", f"l{i}_{j}") for i in range(40) for j in range(25)])
    leaf = torch.softmax(torch.tensor(rng.normal(size=(64, tax.num_leaves)) * 4, dtype=torch.float32), dim=1)
    node = tax.marginals(leaf)  # float32, as a head gives it
    want = np.asarray(tax.leaves)[np.argmax(leaf.numpy(), axis=1)]
    return decode(node, tax).numpy(), want


@case("check_probabilities_leaf_above_one", Err(ProbabilityError, "scores.npy", "leaf 'y' (id 3)", "1.7"))
def _(c: Ctx) -> Any:
    return check_probabilities(c.array([[0.1, 1.7, 0.2]]), TREE, kind="leaf", name="scores.npy")


@case("evaluate_probabilities_names_file", Err(ProbabilityError, "p.npy", "row 1", "root 'r' (id 0)"))
def _(c: Ctx) -> Any:
    p = c.npy("p.npy", np.array([GOOD[0], GOOD[1] * 0.5]))
    return evaluate_probabilities(p, np.array([2, 3]), TREE)


@case("evaluator_update_refuses_logits", Err(ProbabilityError, "row 0", "expected a value in [0, 1]"))
def _(c: Ctx) -> Any:
    return Evaluator(TREE, ["argmax_leaf"], k=()).update(c.array([[3.0, 2.0, 1.0, 0.5, 0.1]]), np.array([2]))


@case("evaluate_probabilities_correct", Ok(lambda r: r["argmax_leaf/accuracy"] == 0.5 and r["samples"] == 2))
def _(c: Ctx) -> Any:
    # row 0: leaves x .3, y .3, b .4 -> b (label x: wrong); row 1: x .8 -> x (right)
    return evaluate_probabilities(c.array(GOOD), np.array([2, 2]), TREE, ["argmax_leaf"], k=())


# ---------------------------------------------------------------------------------------------- label / prob files
@case("labels_empty_file", Err(ValueError, "y.txt", "no labels"))
def _(c: Ctx) -> Any:
    return load_labels(c.write("y.txt", ""), TREE)


@case("labels_only_comments", Err(ValueError, "y.txt", "no labels"))
def _(c: Ctx) -> Any:
    return load_labels(c.write("y.txt", "# header\n\n# nothing\n"), TREE)


@case("labels_empty_npy", Err(ValueError, "y.npy", "no labels"))
def _(c: Ctx) -> Any:
    return load_labels(c.npy("y.npy", np.zeros(0, dtype=np.int64)), TREE)


@case("labels_all_ignored", Err(ValueError, "y.txt", "every one of the 3 labels is -1"))
def _(c: Ctx) -> Any:
    return evaluate_probabilities(c.array(np.tile(GOOD[:1], (3, 1))), c.write("y.txt", "-1\n-1\n-1\n"), TREE)


@case("labels_latin1", Err(TextFileError, "y.txt:2", "not UTF-8", "offset 2"))
def _(c: Ctx) -> Any:
    return load_labels(c.write("y.txt", "x\n\xe9\n".encode("latin-1")), TREE)


@case("labels_unknown_name_line", Err(TaxonomyError, "y.txt:2", "'dog'"))
def _(c: Ctx) -> Any:
    return load_labels(c.write("y.txt", "x\ndog\n"), TREE)


@case("labels_csv_missing_column", Err(ValueError, "y.csv", "no column 'truth'"))
def _(c: Ctx) -> Any:
    return load_labels(c.write("y.csv", "id,label\n1,x\n"), TREE, column="truth")


@case("labels_path_names_correct", Ok(lambda y: y.tolist() == [2, 3, 4, -1]))
def _(c: Ctx) -> Any:
    return load_labels(c.write("y.txt", "x\na/y\n# comment\nb\n-1\n"), TREE)


@case("probs_empty_npy", Err(ValueError, "p.npy", "holds no probabilities"))
def _(c: Ctx) -> Any:
    return load_probabilities(c.npy("p.npy", np.zeros((0, 5))))


@case("probs_npz_ambiguous", Err(ValueError, "p.npz", "several arrays", "key="))
def _(c: Ctx) -> Any:
    np.savez(c.inp / "p.npz", a=GOOD, b=GOOD)
    return load_probabilities(c.inp / "p.npz")


# ---------------------------------------------------------------------------------------------- CLI
def _tax_file(c: Ctx) -> Path:
    return c.write("tax.edges", "r a\na x\na y\nr b\n")


@case("cli_decode_logits", CliErr("p.npy", "row 0", "[0, 1]", "--no-check"))
def _(c: Ctx) -> Any:
    return c.cli("decode", "--probs", c.npy("p.npy", [[4.0, 2.0, 1.0, 1.0, 0.5]]), "--taxonomy", _tax_file(c))


@case("cli_decode_no_check", Ok(lambda r: r[0] == 0 and "1 predictions" in r[1]))
def _(c: Ctx) -> Any:
    p = c.npy("p.npy", [[1.0, 0.5, 0.8, 0.1, 0.5]])
    return c.cli("decode", "--probs", p, "--taxonomy", _tax_file(c), "--no-check")


@case("cli_decode_leaf_sum", CliErr("p.npy", "sum to 3"))
def _(c: Ctx) -> Any:
    p = c.npy("p.npy", [[1.0, 1.0, 1.0]])
    return c.cli("decode", "--probs", p, "--taxonomy", _tax_file(c), "--leaf-probs", "--rule", "optimal_hfbeta")


@case("cli_decode_children_above_parent", CliErr("p.npy: row 0", "children of node 'r' (id 0)"))
def _(c: Ctx) -> Any:
    p = c.npy("p.npy", [[1.0, 0.9, 0.5, 0.4, 0.9]])  # every child below its parent, but a + b = 1.8 > 1
    return c.cli("decode", "--probs", p, "--taxonomy", _tax_file(c), "--rule", "crm")


@case("cli_evaluate_root_not_one", CliErr("p.npy", "root 'r' (id 0)"))
def _(c: Ctx) -> Any:
    p, y = c.npy("p.npy", [[0.9, 0.5, 0.2, 0.2, 0.4]]), c.npy("y.npy", [2])
    return c.cli("evaluate", "--probs", p, "--labels", y, "--taxonomy", _tax_file(c))


@case("cli_evaluate_all_ignored", CliErr("y.txt", "every one of the 2 labels is -1"))
def _(c: Ctx) -> Any:
    p, y = c.npy("p.npy", GOOD), c.write("y.txt", "-1\n-1\n")
    return c.cli("evaluate", "--probs", p, "--labels", y, "--taxonomy", _tax_file(c))


@case("cli_decode_labels_all_ignored", CliErr("y.npy", "every one of the 2 labels is -1"))
def _(c: Ctx) -> Any:
    p, y = c.npy("p.npy", GOOD), c.npy("y.npy", [-1, -1])
    return c.cli("decode", "--probs", p, "--labels", y, "--taxonomy", _tax_file(c))


@case("cli_decode_out_is_folder", CliErr("res", "is a folder"))
def _(c: Ctx) -> Any:
    (c.out / "res").mkdir()
    return c.cli("decode", "--probs", c.npy("p.npy", GOOD), "--taxonomy", _tax_file(c), "--out", c.out / "res")


@case("cli_evaluate_out_under_file", CliErr("notes.txt is a file"))
def _(c: Ctx) -> Any:
    notes = c.write("notes.txt", "mine")
    p, y = c.npy("p.npy", GOOD), c.npy("y.npy", [2, 2])
    return c.cli("evaluate", "--probs", p, "--labels", y, "--taxonomy", _tax_file(c), "--out", notes / "m.json")


@case("cli_decode_out_read_only", CliErr("m.json", "is not writable"))
def _(c: Ctx) -> Any:
    from unittest import mock

    with mock.patch("hiercls._textio.os.access", return_value=False):  # a read-only folder, also when run as root
        return c.cli("decode", "--probs", c.npy("p.npy", GOOD), "--taxonomy", _tax_file(c), "--out", c.out / "m.json")


@case("cli_labels_latin1", CliErr("y.txt:1", "not UTF-8"))
def _(c: Ctx) -> Any:
    p, y = c.npy("p.npy", GOOD[:1]), c.write("y.txt", "\xe9\n".encode("latin-1"))
    return c.cli("decode", "--probs", p, "--labels", y, "--taxonomy", _tax_file(c))


@case("cli_taxonomy_show_yaml", CliErr("t.yaml", "not a taxonomy format"))
def _(c: Ctx) -> Any:
    return c.cli("taxonomy", "show", c.write("t.yaml", "r: [a, b]\n"))


@case("cli_taxonomy_show_latin1", CliErr("t.tsv:1", "offset"))
def _(c: Ctx) -> Any:
    return c.cli("taxonomy", "show", c.write("t.tsv", "r\t\xe9\n".encode("latin-1")))


@case("cli_taxonomy_convert_onto_folder", CliErr("x.json", "is a folder"))
def _(c: Ctx) -> Any:
    (c.out / "x.json").mkdir()
    return c.cli("taxonomy", "convert", _tax_file(c), c.out / "x.json")


@case("cli_taxonomy_show_duplicate_key", CliErr("t.json:2", "duplicate key 'a'"))
def _(c: Ctx) -> Any:
    return c.cli("taxonomy", "show", c.write("t.json", '{"r": {"a": {},\n"a": {"x": {}}}}'))


@case("cli_missing_file", CliErr("nope.npy"))
def _(c: Ctx) -> Any:
    return c.cli("decode", "--probs", c.inp / "nope.npy", "--taxonomy", _tax_file(c))


# ---------------------------------------------------------------------------------------------- recipes
@case("config_duplicate_key", Err(ConfigError, "r.yaml:3", "duplicate key 'lr'", "first at line 2"))
def _(c: Ctx) -> Any:
    return load_config(c.write("r.yaml", "optim:\n  lr: 0.1\n  lr: 0.2\n"))


@case("config_duplicate_section", Err(ConfigError, "r.yaml:4", "duplicate key 'optim'"))
def _(c: Ctx) -> Any:
    return load_config(c.write("r.yaml", "optim:\n  lr: 0.1\nrun: {}\noptim:\n  eps: 1.0e-6\n"))


@case("config_merge_key_override_allowed", Ok(lambda cfg: cfg.optim.lr == 0.2))
def _(c: Ctx) -> Any:
    text = "optim:\n  <<: {lr: 0.1, eps: 1.0e-6}\n  lr: 0.2\n"  # YAML's merge key: overriding it is intended
    return load_config(c.write("r.yaml", text))


@case("config_override_eps_nan", Err(ConfigError, "optim.eps", "finite", "nan"))
def _(c: Ctx) -> Any:
    return load_config(c.write("r.yaml", "optim:\n  lr: 0.1\n"), ["optim.eps=nan"])


@case("config_override_lr_inf", Err(ConfigError, "optim.lr", "finite", "inf"))
def _(c: Ctx) -> Any:
    return load_config(c.write("r.yaml", "optim:\n  lr: 0.1\n"), ["optim.lr=inf"])


@case("config_file_lr_nan", Err(ConfigError, "r.yaml:2", "optim.lr", "finite"))
def _(c: Ctx) -> Any:
    return load_config(c.write("r.yaml", "optim:\n  lr: .nan\n"))


@case("config_betas_inf", Err(ConfigError, "optim.betas[1]", "finite"))
def _(c: Ctx) -> Any:
    return load_config(c.write("r.yaml", "optim:\n  betas: [0.9, .inf]\n"))


@case("config_latin1", Err(ConfigError, "r.yaml:1", "recipe is not UTF-8", "offset"))
def _(c: Ctx) -> Any:
    return load_config(c.write("r.yaml", "# caf\xe9\noptim: {lr: 0.1}\n".encode("latin-1")))


@case("cli_train_duplicate_key", CliErr("r.yaml:3", "duplicate key 'head'"))
def _(c: Ctx) -> Any:
    return c.cli("train", c.write("r.yaml", "model:\n  head: flat\n  head: hxe\n"))


# ---------------------------------------------------------------------------------------------- image folders
def _image_folder(c: Ctx) -> Path:
    from PIL import Image

    for sub in ("a/x", "a/y", "b"):
        (c.inp / "img" / sub).mkdir(parents=True)
        Image.new("RGB", (6, 6), "red").save(c.inp / "img" / sub / "ok.png")
    c.write("img/a/x/broken.png", b"\x89PNG\r\n\x1a\n not really")
    return c.inp / "img"


@case("image_folder_corrupt_fail", Err(OSError, "broken.png"))
def _(c: Ctx) -> Any:
    from hiercls.data.images import HierImageFolder

    ds = HierImageFolder(_image_folder(c))
    return [ds[i] for i in range(len(ds))]


@case("image_folder_corrupt_skip", Ok(lambda names: names == ["a/x", "a/y", "b"]))
def _(c: Ctx) -> Any:
    from hiercls.data.images import HierImageFolder

    ds = HierImageFolder(_image_folder(c), on_error="skip")
    return [ds.taxonomy.names[ds[i][1]] for i in range(len(ds))]


@case("image_folder_bad_on_error", Err(ValueError, "on_error", "'fail', 'skip'"))
def _(c: Ctx) -> Any:
    from hiercls.data.images import HierImageFolder

    return HierImageFolder(_image_folder(c), on_error="ignore")


# ---------------------------------------------------------------------------------------------- issue 28
CSV_5 = "id,text\n1,a cat\n2\n3,\n4,a dog\n5,a car\n"  # rows 2 (short) and 3 (empty text) cannot be used


@case("predict_csv_short_row_named", Err(ValueError, "in.csv:3", "1 field but the header has 2", "--on-error skip"))
def _(c: Ctx) -> Any:
    return read_input_rows([str(c.write("in.csv", CSV_5))])


@case(
    "predict_csv_skip_keeps_order_and_ids",
    Ok(lambda r: (r.inputs, r.total, len(r.skipped)) == (["a cat", "a dog", "a car"], 5, 2)),
)
def _(c: Ctx) -> Any:
    rows = read_input_rows([str(c.write("in.csv", CSV_5))], on_error="skip")
    assert [s[0].rsplit(":", 1)[1] for s in rows.skipped] == ["3", "4"]  # file lines of rows 2 and 3
    assert [r.rsplit(":", 1)[1] for r in rows.rows] == ["2", "5", "6"]
    return rows


@case("predict_jsonl_empty_text_named", Err(ValueError, "in.jsonl:2", "empty text under key 'text'"))
def _(c: Ctx) -> Any:
    return read_input_rows([str(c.write("in.jsonl", '{"text": "a cat"}\n{"text": " "}\n'))])


@case("predict_missing_file_is_not_a_text", Err(FileNotFoundError, "'notes.txt'", "no such file"))
def _(c: Ctx) -> Any:
    return read_input_rows(["a cat", "notes.txt"])


@case("predict_args_ids_in_order", Ok(lambda r: r.rows == ["arg:1", "arg:2"] and r.inputs == ["b text", "a text"]))
def _(c: Ctx) -> Any:
    return read_input_rows(["b text", "a text"])


@case("csv_200k_character_field_reads", Ok(lambda t: [len(x) for x in t] == [200_000, 1]))
def _(c: Ctx) -> Any:
    return read_text_rows(c.write("big.csv", "text\n" + "x" * 200_000 + "\ny\n"))


@case("taxonomy_fifo_refused", Err(TaxonomyError, "pipe.tsv", "FIFO", "regular file"))
def _(c: Ctx) -> Any:
    os.mkfifo(c.inp / "pipe.tsv")  # no writer: opening it would block forever
    try:
        return read_taxonomy(c.inp / "pipe.tsv")
    finally:
        os.unlink(c.inp / "pipe.tsv")  # the table test reads back every file it finds


@case("taxonomy_dev_zero_refused", Err(TaxonomyError, "/dev/zero", "device"))
def _(c: Ctx) -> Any:
    return read_taxonomy("/dev/zero", format="tsv")


@case("taxonomy_gzip_bomb_bounded", Err(TaxonomyError, "bomb.tsv.gz", "expands to more than 100000 bytes"))
def _(c: Ctx) -> Any:
    c.write("bomb.tsv.gz", gzip.compress(b"r\ta\n" + b"#" * 10_000_000))  # 10 MB of comment from ~10 KB
    with read_limit(100_000):
        return read_taxonomy(c.inp / "bomb.tsv.gz")


@case("labels_over_read_limit", Err(TextFileError, "y.txt", "holds 400 bytes, over the read limit of 100"))
def _(c: Ctx) -> Any:
    with read_limit(100):
        return load_labels(c.write("y.txt", "x\n" * 200), TREE)


@case("folder_taxonomy_empty_refused", Err(TaxonomyError, "empty", "no sub-folders"))
def _(c: Ctx) -> Any:
    (c.inp / "empty").mkdir()
    return read_taxonomy(c.inp / "empty", format="folders")


@case("paths_writer_refuses_carriage_return", Err(TaxonomyError, "'a\\rb'", "label-path component"))
def _(c: Ctx) -> Any:
    return write_taxonomy(Taxonomy([("r", "a\rb")]), c.out / "t.paths")


@case("tsv_writer_refuses_line_separator", Err(TaxonomyError, "'a\\u2028b'", "cannot be written as TSV"))
def _(c: Ctx) -> Any:
    return write_taxonomy(Taxonomy([("r", "a\u2028b"), ("r", "c")]), c.out / "t.tsv")


@case("paths_writer_refuses_twin_display_names", Err(TaxonomyError, "two children of 'r'", "'x'"))
def _(c: Ctx) -> Any:
    return write_taxonomy(Taxonomy([("r", "a"), ("r", "b")], display_names={"a": "x", "b": "x"}), c.out / "t.paths")


@case("hfbeta_decoder_beta_zero", Err(ValueError, "beta must be a finite number > 0; got 0"))
def _(c: Ctx) -> Any:
    return decode(c.array(GOOD), TREE, "optimal_hfbeta", beta=0)


@case("hfbeta_metric_beta_zero", Err(ValueError, "beta must be a finite number > 0; got 0"))
def _(c: Ctx) -> Any:
    return hierarchical_fbeta_score(["x"], ["y"], taxonomy=TREE, beta=0.0)


@case("top_k_nan_scores", Err(ValueError, "y_score must be finite", "row 0", "nan"))
def _(c: Ctx) -> Any:
    return top_k_accuracy_score([2, 3], np.full((2, 3), np.nan), taxonomy=TREE, k=1)


@case("bayes_negative_cost", Err(ValueError, "cost matrix must be >= 0", "cost[0, 0] = -1"))
def _(c: Ctx) -> Any:
    return decode(c.array(GOOD), TREE, "bayes_node", cost=-np.ones((5, 3)))


@case("hie_level_out_of_range", Err(ValueError, "level must be a depth in [0, 2]", "got 99"))
def _(c: Ctx) -> Any:
    return decode(c.array(GOOD), TREE, "hie", level=99)


@case("decode_meta_tensor", Err(TypeError, "probs is a meta tensor"))
def _(c: Ctx) -> Any:
    return decode(torch.empty(2, 5, device="meta"), TREE, "argmax_leaf")


@case("decode_sparse_tensor", Err(TypeError, "probs is a sparse tensor", "to_dense()"))
def _(c: Ctx) -> Any:
    return decode(torch.tensor(GOOD).to_sparse(), TREE, "argmax_leaf")


@case("metric_sparse_labels", Err(TypeError, "y_true is a sparse tensor"))
def _(c: Ctx) -> Any:
    return hierarchical_fbeta_score(torch.eye(5)[[2, 3]].to_sparse(), [2, 3], taxonomy=TREE)


@case("metric_meta_scores", Err(TypeError, "y_score is a meta tensor"))
def _(c: Ctx) -> Any:
    return top_k_accuracy_score([2], torch.empty(1, 3, device="meta"), taxonomy=TREE, k=1)


@case("cli_evaluate_max_samples_negative", Ok(lambda err: "--max-samples: must be a whole number >= 1" in err))
def _(c: Ctx) -> Any:
    with pytest.raises(SystemExit) as info:  # argparse's exit, before any work
        c.cli("evaluate", "--model", c.inp / "nope", "--max-samples", "-1")
    assert info.value.code == 2
    return c.capsys.readouterr().err.splitlines()[-1]


@case("cli_evaluate_out_checked_first", CliErr("notes.txt is a file"))
def _(c: Ctx) -> Any:
    c.write("notes.txt", "mine")  # --out under a file fails before the (missing) model is even looked at
    return c.cli("evaluate", "--model", c.inp / "nope", "--out", c.inp / "notes.txt" / "m.json")


# ---------------------------------------------------------------------------------------------- the table test
def _snapshot(folder: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), folder) + "/"] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, folder)] = Path(p).read_bytes()
    return out


def test_enough_cases() -> None:
    assert len(CASES) >= 50, len(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fn, expect = CASES[name]
    ctx = Ctx(tmp_path, capsys)
    # Each case writes its inputs (Ctx.write / Ctx.npy) just before calling hiercls: record their bytes then, and
    # compare after the call.
    before: dict[str, bytes | None] = {}
    original_write, original_npy = ctx.write, ctx.npy

    def write(name: str, content: str | bytes) -> Path:
        p = original_write(name, content)
        before[os.path.relpath(p, ctx.inp)] = p.read_bytes()
        return p

    def npy(name: str, arr: Any) -> Path:
        p = original_npy(name, arr)
        before[os.path.relpath(p, ctx.inp)] = p.read_bytes()
        return p

    ctx.write, ctx.npy = write, npy  # type: ignore[method-assign]
    if isinstance(expect, Err):
        with pytest.raises(expect.exc) as info:
            fn(ctx)
        msg = str(info.value)
        for culprit in expect.culprits:
            assert culprit in msg, f"{culprit!r} not in {msg!r}"
    elif isinstance(expect, CliErr):
        rc, _, err = fn(ctx)
        lines = err.strip().splitlines()
        assert rc == 2, (rc, err)
        assert len(lines) == 1 and lines[0].startswith("hiercls ") and ": error: " in lines[0], err
        assert "Traceback" not in err
        for culprit in expect.culprits:
            assert culprit in lines[0], f"{culprit!r} not in {lines[0]!r}"
    else:
        result = fn(ctx)
        assert expect.check(result), result
    after = _snapshot(ctx.inp)
    for rel, content in before.items():
        assert after.get(rel) == content, f"the user's file {rel} was changed"
    leftovers = [p for p in _snapshot(tmp_path) if ".tmp" in p]
    assert not leftovers, leftovers
    for arr, copy in ctx.arrays:
        np.testing.assert_array_equal(arr, copy)


# ---------------------------------------------------------------------------------------------- faults
def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path, monkeypatch: Any) -> None:
    import hiercls.taxonomy.io.nested as tio

    target = tmp_path / "tree.json"
    write_taxonomy(TREE, target, format="nested")
    old = target.read_bytes()

    def half_then_fail(obj: Any, f: Any, **kwargs: Any) -> None:
        f.write('{"r": {"a"')  # part of the output reached the file
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tio, "dump_json", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        write_taxonomy(Taxonomy([("r", "z")]), target, format="nested")
    assert target.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["tree.json"]


def test_broken_pipe_exits_quietly(monkeypatch: Any, capsys: pytest.CaptureFixture[str]) -> None:
    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            raise ValueError("no descriptor")

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    rc = main(["taxonomy", "list"])
    monkeypatch.undo()
    assert rc == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------- pickles
class _Payload:
    """Unpickling it creates the marker file (a stand-in for any code an attacker would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (open, (self.marker, "w"))


def _pickle_files(d: Path, marker: Path) -> dict[str, Path]:
    payload = _Payload(marker)
    files = {}
    obj_array = np.empty(2, dtype=object)
    obj_array[:] = [payload, payload]
    np.save(d / "objects.npy", obj_array, allow_pickle=True)
    files["npy_object_array"] = d / "objects.npy"
    (d / "raw_pickle.npy").write_bytes(pickle.dumps(payload))
    files["raw_pickle_as_npy"] = d / "raw_pickle.npy"
    np.savez(d / "objects.npz", probs=obj_array)
    files["npz_object_array"] = d / "objects.npz"
    torch.save({"probs": payload}, d / "payload.pt")
    files["pt_payload"] = d / "payload.pt"
    torch.save(payload, d / "payload.pth")
    files["pth_payload"] = d / "payload.pth"
    (d / "raw_pickle.pt").write_bytes(pickle.dumps(payload))
    files["raw_pickle_as_pt"] = d / "raw_pickle.pt"
    return files


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch, on the raw pickle it then refuses
def test_crafted_pickles_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    files = _pickle_files(tmp_path, marker)
    readers: list[tuple[str, Callable[[Path], Any]]] = [
        ("load_probabilities", load_probabilities),
        ("load_labels", lambda p: load_labels(p, TREE)),
        ("evaluate_probabilities", lambda p: evaluate_probabilities(p, np.array([2, 2]), TREE)),
    ]
    for kind, path in files.items():
        for reader_name, reader in readers:
            with pytest.raises(ValueError) as info:
                reader(path)
            assert path.name in str(info.value), (kind, reader_name, str(info.value))
            assert not marker.exists(), f"{reader_name} ran the pickle in {kind}"
    # the CLI on the same files: one line, exit 2, nothing run
    taxonomy = tmp_path / "tax.edges"
    taxonomy.write_text("r a\na x\na y\nr b\n")
    for path in files.values():
        assert main(["decode", "--probs", str(path), "--taxonomy", str(taxonomy)]) == 2
        assert main(["evaluate", "--probs", str(path), "--labels", str(path), "--taxonomy", str(taxonomy)]) == 2
    # taxonomy files and recipes are text: a pickle is refused as such, a YAML object tag is not built
    pkl_tax = tmp_path / "tax.json"
    pkl_tax.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises((TaxonomyError, ValueError)):
        read_taxonomy(pkl_tax)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"optim: !!python/object/apply:builtins.open ['{marker}', 'w']\n")
    with pytest.raises(ConfigError):
        load_config(recipe)
    assert not marker.exists()

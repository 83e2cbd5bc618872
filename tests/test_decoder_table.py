"""The decoder x metric table (Plaud et al., ICML 2025): values against brute force, optimal decoders, CLI.

The reference values are written from the metric definitions over explicit ancestor sets built by walking the
parent array (no hiercls metric, distance or decoder code), enumerating every leaf label.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _generators import random_tree

from hiercls.cli import main
from hiercls.evaluation import TABLE_METRICS, decoder_metric_table
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import write_json

TAX = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")], name="toy")  # ids r 0, a 1, x 2, y 3, b 4


class Brute:
    """Per-(node, leaf) metric tables of one tree, from ancestor sets (leaf columns in ``tax.leaves`` order)."""

    def __init__(self, tax: Taxonomy) -> None:
        parent = np.asarray(tax.parent)
        n = len(parent)
        anc = np.zeros((n, n), dtype=bool)  # anc[i, j]: j is i or above i
        for i in range(n):
            j = i
            while j >= 0:
                anc[i, j] = True
                j = int(parent[j])
        has_child = np.zeros(n, dtype=bool)
        has_child[parent[parent >= 0]] = True
        leaves = np.asarray(tax.leaves)
        assert set(leaves.tolist()) == set(np.flatnonzero(~has_child).tolist())
        self.n, self.leaves, self.anc = n, leaves, anc
        self.sets = anc[:, 1:]  # root-free closed set of each node
        depth = self.sets.sum(1)
        d_leaf = depth[leaves]
        common = anc[:, None, :] & anc[None, leaves, :]  # [N, L, N]
        lca = np.where(common, depth[None, None, :], -1).argmax(-1)  # the deepest common ancestor
        d_lca = depth[lca]
        same = np.arange(n)[:, None] == leaves[None, :]
        height = depth.max()
        under = anc[leaves].sum(0)  # leaves below each node
        ic = np.log2(len(leaves) / under)
        self.tables = {
            "shortest_path": depth[:, None] + d_leaf[None, :] - 2 * d_lca,
            "lca_height": np.where(same, 0, height - d_lca),
            "wu_palmer": np.where(same, 0.0, 1.0 - 2.0 * d_lca / (depth[:, None] + d_leaf[None, :])),
        }
        den = ic[:, None] + ic[leaves][None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            zhao = np.where(den > 0, 1.0 - 2.0 * ic[lca] / den, 0.0)
        self.tables["zhao"] = np.where(same, 0.0, zhao)
        self.same = same

    def closed(self, pred: np.ndarray, is_set: bool) -> np.ndarray:
        """Root-free closed sets [B, N-1] of node ids or of node sets."""
        if not is_set:
            return self.sets[pred]
        return (pred.astype(int) @ self.anc.astype(int))[:, 1:] > 0

    def set_values(self, s: np.ndarray, metric: str) -> np.ndarray:
        """[B, L] value of each label for predicted root-free sets ``s``."""
        y = self.sets[self.leaves]
        inter = s.astype(float) @ y.T.astype(float)
        ns, ny = s.sum(1)[:, None], y.sum(1)[None, :]
        if metric == "accuracy":
            return ((inter == ns) & (inter == ny)).astype(float)
        if metric == "hamming":
            return (ns + ny - 2 * inter) / (self.n - 1)
        beta2 = float(metric[2:]) ** 2
        return (1 + beta2) * inter / (beta2 * ny + ns)

    def values(self, pred: np.ndarray, is_set: bool, metric: str) -> np.ndarray | None:
        """[B, L] values, or None where the metric is a node-to-node distance and the predictions are sets."""
        if metric in ("accuracy", "hamming") or metric.startswith("hF"):
            return self.set_values(self.closed(pred, is_set), metric)
        if is_set:
            return None
        kind = {"mistake_severity_path": "shortest_path", "mistake_severity_lca": "lca_height", "cost": "lca_height"}
        return self.tables[kind.get(metric, metric)][pred].astype(float)

    def expected(self, pred: np.ndarray, is_set: bool, metric: str, leaf: np.ndarray) -> float | None:
        v = self.values(pred, is_set, metric)
        if v is None:
            return None
        if metric == "mistake_severity_lca":
            wrong = (leaf * ~self.same[pred]).sum()
            return float((leaf * v).sum() / wrong) if wrong > 1e-12 else math.nan
        return float((leaf * v).sum(1).mean())

    def realised(self, pred: np.ndarray, is_set: bool, metric: str, y_col: np.ndarray) -> float | None:
        v = self.values(pred, is_set, metric)
        if v is None:
            return None
        at = v[np.arange(len(y_col)), y_col]
        if metric == "mistake_severity_lca":
            wrong = ~self.same[pred, y_col]
            return float(at[wrong].mean()) if wrong.any() else math.nan
        return float(at.mean())


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def _posteriors(rng: np.random.Generator, num_leaves: int, rows: int) -> np.ndarray:
    leaf = rng.dirichlet(np.full(num_leaves, rng.choice([0.2, 1.0, 5.0])), size=rows)
    if rng.random() < 0.3:  # exact ties and zeros, where the tie rules decide
        leaf[0] = rng.integers(0, 3, size=num_leaves)
        leaf[0, 0] += leaf[0].sum() == 0
        leaf[0] /= leaf[0].sum()
    return leaf


def test_optimal_decoder_has_the_best_expected_value_on_1000_random_trees() -> None:
    rng = np.random.default_rng(2025)
    marked = 0
    for _ in range(1000):
        tax = random_tree(int(rng.integers(2, 10)), rng)
        leaf = _posteriors(rng, tax.num_leaves, 3)
        table = decoder_metric_table(leaf, None, tax, leaf_probs=True)
        ref = Brute(tax)
        brute = {
            d: {m: ref.expected(table.predictions[d], table.predictions[d].ndim == 2, m, leaf) for m in table.metrics}
            for d in table.decoders
        }
        for d in table.decoders:
            for m in table.metrics:
                assert _close(table.expected[d][m], brute[d][m]), (tax.parent.tolist(), leaf, d, m)
                assert table.realised[d][m] is None
        for m, opt in table.optimal.items():
            if opt is None:
                continue
            marked += 1
            col = [v for v in (brute[d][m] for d in table.decoders) if v is not None]
            best = max(col) if table.higher_is_better[m] else min(col)
            assert abs(brute[opt][m] - best) <= 1e-9, (tax.parent.tolist(), leaf.tolist(), m, opt, brute)
    assert marked == 1000 * 9  # every column but Bertinetto's ratio has its decoder


def test_realised_values_against_brute_force() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        tax = random_tree(int(rng.integers(3, 12)), rng)
        leaf = _posteriors(rng, tax.num_leaves, 6)
        y_col = np.array([rng.choice(tax.num_leaves, p=row) for row in leaf])
        labels = np.asarray(tax.leaves)[y_col]
        table = decoder_metric_table(leaf, labels, tax, leaf_probs=True)
        ref = Brute(tax)
        for d in table.decoders:
            pred = table.predictions[d]
            for m in table.metrics:
                assert _close(table.realised[d][m], ref.realised(pred, pred.ndim == 2, m, y_col)), (d, m)


def test_hand_computed_case() -> None:
    # leaves x, y, b with posterior (0.3, 0.3, 0.4), label x; H = 2, L = 3, 4 non-root nodes
    leaf = np.array([[0.3, 0.3, 0.4]])
    t = decoder_metric_table(leaf, ["x"], TAX, ["argmax_leaf", "bayes_node"], leaf_probs=True)
    assert t.predictions["argmax_leaf"].tolist() == [4]  # b
    # expected shortest path: r 0.6*2 + 0.4*1 = 1.6; a 0.6*1 + 0.4*2 = 1.4; x, y 0.3*2 + 0.4*3 = 1.8; b 1.8
    assert t.predictions["bayes_node"].tolist() == [1]
    assert t.optimal["mistake_severity_path"] == "bayes_node"  # the same decoder as bayes_node:cost=shortest_path
    e, r = t.expected, t.realised
    assert e["argmax_leaf"]["accuracy"] == pytest.approx(0.4) and r["argmax_leaf"]["accuracy"] == 0.0
    assert e["bayes_node"]["mistake_severity_path"] == pytest.approx(1.4)
    assert r["bayes_node"]["mistake_severity_path"] == pytest.approx(1.0)  # a to x: one edge
    # hF1 of {b}: 1 when the label is b; of {a}: 2*1/(2+1) when the label is x or y
    assert e["argmax_leaf"]["hF1"] == pytest.approx(0.4)
    assert e["bayes_node"]["hF1"] == pytest.approx(0.6 * 2 / 3)
    assert r["bayes_node"]["hF2"] == pytest.approx(5 * 1 / (4 * 2 + 1))
    # Bertinetto: b is wrong for x and y, both with the LCA at the root, height 2
    assert e["argmax_leaf"]["mistake_severity_lca"] == pytest.approx(2.0)
    assert r["argmax_leaf"]["mistake_severity_lca"] == pytest.approx(2.0)
    # Wu-Palmer, root depth 0: a vs x or y = 1 - 2*1/(1+2); a vs b = 1 - 0
    assert e["bayes_node"]["wu_palmer"] == pytest.approx(0.6 / 3 + 0.4)
    # Zhao: IC(a) = log2(3/2), IC(x) = IC(b) = log2(3); a vs b has the LCA at the root (IC 0)
    zhao_ax = 1 - 2 * math.log2(1.5) / (math.log2(1.5) + math.log2(3))
    assert e["bayes_node"]["zhao"] == pytest.approx(0.6 * zhao_ax + 0.4)
    # Hamming over a, b, x, y: {a} vs {a, x}: 1 node; vs {b}: 2 nodes
    assert e["bayes_node"]["hamming"] == pytest.approx((0.6 * 1 + 0.4 * 2) / 4)
    # the cost column (default lca_height over all samples): b costs 2 unless right
    assert e["argmax_leaf"]["cost"] == pytest.approx(0.6 * 2)
    text = t.format()
    assert "bayes_node" in text and "1.400*" in text and "0.400*" in text
    assert t.to_dict()["expected"] == t.expected and json.dumps(t.to_dict())


def test_cost_matrix_column_and_its_optimal_decoder() -> None:
    rng = np.random.default_rng(3)
    tax = random_tree(8, rng)
    leaf = rng.dirichlet(np.ones(tax.num_leaves), size=5)
    for shape in ((tax.num_nodes, tax.num_leaves), (tax.num_nodes, tax.num_nodes)):
        cost = rng.random(shape)
        t = decoder_metric_table(leaf, None, tax, metrics=["cost"], cost=cost, leaf_probs=True)
        opt = t.optimal["cost"]
        assert opt == f"bayes_node:cost=<matrix {list(shape)}>" and t.cost == f"matrix {list(shape)}"
        cols = np.asarray(tax.leaves) if shape[1] == tax.num_nodes else np.arange(tax.num_leaves)
        singles = [d for d in t.decoders if t.predictions[d].ndim == 1]
        for d in singles:
            want = (leaf * cost[t.predictions[d]][:, cols]).sum(1).mean()
            assert t.expected[d]["cost"] == pytest.approx(want)
        assert t.expected[opt]["cost"] == pytest.approx(min(t.expected[d]["cost"] for d in singles))


def test_internal_label_mass_takes_the_accuracy_mark_away() -> None:
    node = np.array([[1.0, 0.9, 0.2, 0.1, 0.1]])  # 0.6 of the label mass stops at a
    t = decoder_metric_table(node, None, TAX, ["argmax_leaf"], ["accuracy", "hF1"])
    assert t.optimal == {"accuracy": None, "hF1": "optimal_hf1"}
    assert any("argmax_leaf is not Bayes-optimal" in n for n in t.notes)
    assert t.expected["argmax_leaf"]["accuracy"] == pytest.approx(0.2)


def test_columns_decoders_and_refusals() -> None:
    leaf = np.array([[0.5, 0.2, 0.3]])
    t = decoder_metric_table(leaf, None, TAX, ["argmax_leaf"], ["hF3"], leaf_probs=True)
    assert t.decoders == ["argmax_leaf", "optimal_hfbeta:beta=3"] and t.metrics == ["hF3"]
    assert "no labels given" in t.format()
    assert decoder_metric_table(leaf, None, TAX, leaf_probs=True).metrics == list(TABLE_METRICS)
    with pytest.raises(ValueError, match=r"unknown table metric 'hamm'.*did you mean 'hamming'"):
        decoder_metric_table(leaf, None, TAX, metrics=["hamm"], leaf_probs=True)
    with pytest.raises(ValueError, match="hF0 is hierarchical precision"):
        decoder_metric_table(leaf, None, TAX, metrics=["hF0"], leaf_probs=True)
    with pytest.raises(ValueError, match="'crm' is given twice"):
        decoder_metric_table(leaf, None, TAX, ["crm", "crm"], leaf_probs=True)
    with pytest.raises(ValueError, match="unknown decoder 'argmx_leaf'"):
        decoder_metric_table(leaf, None, TAX, ["argmx_leaf"], leaf_probs=True)
    with pytest.raises(ValueError, match="cost must be one of"):
        decoder_metric_table(leaf, None, TAX, cost="wu_palmr", leaf_probs=True)
    with pytest.raises(ValueError, match="labels has 2 entries but probs has 1 rows"):
        decoder_metric_table(leaf, [2, 3], TAX, leaf_probs=True)
    with pytest.raises(ValueError, match="no samples to score"):
        decoder_metric_table(leaf, [-1], TAX, leaf_probs=True)
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "c"), ("b", "c")])
    with pytest.raises(TaxonomyError, match="needs a tree"):
        decoder_metric_table(np.array([[1.0]]), None, dag, leaf_probs=True)
    # ignored rows are left out of both values
    two = decoder_metric_table(np.array([[0.5, 0.2, 0.3], [0.1, 0.1, 0.8]]), [2, -1], TAX, leaf_probs=True)
    one = decoder_metric_table(leaf, [2], TAX, leaf_probs=True)
    assert two.samples == 1 and json.dumps(two.to_dict()) == json.dumps(one.to_dict())


def test_cli_table(tmp_path, capsys) -> None:
    node = np.asarray(TAX.marginals(np.array([[0.3, 0.3, 0.4], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])))
    np.save(tmp_path / "p.npy", node)
    (tmp_path / "y.txt").write_text("x\nx\nb\n")
    write_json(TAX, tmp_path / "tax.json")
    out = tmp_path / "t.json"
    args = ["evaluate", "--probs", str(tmp_path / "p.npy"), "--labels", str(tmp_path / "y.txt")]
    rc = main([*args, "--taxonomy", str(tmp_path / "tax.json"), "--table", "--cost", "wu_palmer", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "realised (against the labels)" in printed and "expected (under the model's posterior)" in printed
    want = decoder_metric_table(node, np.array([2, 2, 4]), TAX, cost="wu_palmer")
    assert json.loads(out.read_text()) == json.loads(json.dumps(want.to_dict()))
    assert want.format() in printed
    # --model --table computes the model's probabilities (tests/test_cli_train.py); a folder that holds no model
    # is refused by name before any work.
    rc = main(["evaluate", "--model", str(tmp_path), "--table"])
    assert rc == 2 and "is neither a saved model" in capsys.readouterr().err


def test_row_blocks_do_not_change_the_values(monkeypatch) -> None:
    import hiercls.evaluation.table as table_module

    rng = np.random.default_rng(11)
    tax = random_tree(14, rng)
    leaf = _posteriors(rng, tax.num_leaves, 9)
    labels = np.asarray(tax.leaves)[rng.integers(0, tax.num_leaves, 9)]
    whole = decoder_metric_table(leaf, labels, tax, leaf_probs=True).to_dict()
    monkeypatch.setattr(table_module, "_BLOCK_ELEMENTS", 1)  # one row per block
    blocks = decoder_metric_table(leaf, labels, tax, leaf_probs=True).to_dict()
    for d in whole["decoders"]:
        for m in whole["metrics"]:
            assert _close(blocks["expected"][d][m], whole["expected"][d][m]), (d, m)

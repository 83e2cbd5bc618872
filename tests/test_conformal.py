"""Conformal hierarchical prediction (hiercls.conformal): coverage over many random splits, flat reductions against
APS written from its published formula, risk control against a brute-force search, DAGs, tensors, DDP.

Monte-Carlo design. A pool of samples is drawn once (fixed seed) from a known generating posterior; each of
``SPLITS`` random splits draws ``N_CAL`` calibration and ``N_TEST`` test rows from it without replacement. Given the
pool, calibration and test rows are exchangeable, so split conformal guarantees for the *expected* test coverage
``1 - alpha <= E[coverage] <= 1 - alpha + 1 / (N_CAL + 1)`` (the upper bound: no tied scores at the threshold).
The test allows ``Z = 4`` standard errors of the mean over the splits on either side (a correct implementation
fails a check with probability below 1e-4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from _generators import node_probs as dirichlet_node_probs
from _generators import random_dag, random_tree, star
from PIL import Image

from hiercls.cli import main
from hiercls.cli.names import CONFORMAL_LOSSES
from hiercls.conformal import (
    RISK_LOSSES,
    NodeConformal,
    RiskConformal,
    SetConformal,
    conformal_quantile,
    conformal_rank,
    coverage_summary,
    create_conformal,
    greedy_chain,
    load_conformal,
)
from hiercls.decode import threshold as threshold_decoder
from hiercls.taxonomy import Taxonomy, TaxonomyError, load_taxonomy, write_taxonomy

SPLITS, N_CAL, N_TEST, POOL, Z = 500, 250, 500, 4000, 4.0
ALPHAS = (0.05, 0.1, 0.2)


def _tree() -> Taxonomy:
    """Three levels, branching 3: 27 leaves."""
    edges = [("r", f"{i}") for i in range(3)]
    edges += [(f"{i}", f"{i}{j}") for i in range(3) for j in range(3)]
    edges += [(f"{i}{j}", f"{i}{j}{k}") for i in range(3) for j in range(3) for k in range(3)]
    return Taxonomy(edges)


def _pool(tax: Taxonomy, *, sharpen: float, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True leaf posteriors (a Dirichlet per internal node, top-down), labels drawn from them, and the model's node
    probabilities: the truth (``sharpen=1``) or the leaf posterior raised to ``sharpen`` and renormalised
    (``sharpen > 1``: an overconfident, miscalibrated model)."""
    rng = np.random.default_rng(seed)
    leaf = np.ones((POOL, tax.num_leaves))
    for v in np.flatnonzero(~tax.is_leaf):
        kids = np.asarray(tax.children(int(v)))
        cond = rng.dirichlet(np.full(len(kids), 0.7), size=POOL)
        under = tax.ancestors_sparse[tax.leaves][:, kids].toarray()  # [leaves, kids]
        leaf *= np.where(under.any(1), (cond @ under.T), 1.0)
    leaf /= leaf.sum(1, keepdims=True)
    labels = tax.leaves[(leaf.cumsum(1) < rng.random((POOL, 1))).sum(1).clip(max=tax.num_leaves - 1)]
    model = leaf**sharpen
    model /= model.sum(1, keepdims=True)
    return tax.marginals(leaf), np.asarray(tax.marginals(model)), labels


@pytest.fixture(scope="module")
def pools():
    tax = _tree()
    return tax, {"calibrated": _pool(tax, sharpen=1.0), "overconfident": _pool(tax, sharpen=3.0)}


def _splits(seed: int = 2024) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(np.random.default_rng(seed).random((SPLITS, POOL)), axis=1)
    return order[:, :N_CAL], order[:, N_CAL : N_CAL + N_TEST]


def _split_coverage(scores: np.ndarray, alpha: float) -> np.ndarray:
    """Test coverage of every split: the threshold is the ceil((n+1)(1-alpha))-th smallest calibration score."""
    cal, test = _splits()
    k = conformal_rank(N_CAL, alpha)
    q = np.sort(scores[cal], axis=1)[:, k - 1]
    return (scores[test] <= q[:, None]).mean(1)


def _check_band(cov: np.ndarray, alpha: float, what: str) -> None:
    se = cov.std(ddof=1) / np.sqrt(len(cov))
    lo, hi = 1 - alpha - Z * se, 1 - alpha + 1 / (N_CAL + 1) + Z * se
    assert lo <= cov.mean() <= hi, f"{what}: mean coverage {cov.mean():.4f} outside [{lo:.4f}, {hi:.4f}]"


@pytest.mark.parametrize("model", ["calibrated", "overconfident"])
@pytest.mark.parametrize("method", ["node", "set"])
def test_coverage_over_random_splits(pools, model, method):
    tax, data = pools
    _, probs, labels = data[model]
    cal = NodeConformal(tax) if method == "node" else SetConformal(tax, r=2)
    scores = cal.scores(probs, labels)
    # ties at the threshold would void the upper bound: only the score 0 (label = the chain's leaf) repeats
    assert (scores == 0).mean() < 0.7
    for alpha in ALPHAS:
        _check_band(_split_coverage(scores, alpha), alpha, f"{method}/{model}/alpha={alpha}")


def test_posterior_threshold_misses_on_the_overconfident_model(pools):
    """The non-conformal rule "deepest node with P > 1 - alpha" covers as promised only when the model is
    calibrated; conformal calibration of the same model keeps its promise (previous test)."""
    tax, data = pools
    for model, ok in (("calibrated", True), ("overconfident", False)):
        _, probs, labels = data[model]
        for alpha in ALPHAS:
            pred = threshold_decoder(probs, tax, threshold=1 - alpha)
            cov = coverage_summary(pred, labels, tax)["coverage"]
            se = np.sqrt(cov * (1 - cov) / POOL)
            if ok:
                assert cov >= 1 - alpha - Z * se, (model, alpha, cov)
            else:
                assert cov < 1 - alpha - 0.05, (model, alpha, cov)  # visibly below the target


def test_fit_predict_agree_with_scores(pools):
    tax, data = pools
    _, probs, labels = data["overconfident"]
    cal_rows, test_rows = _splits()[0][0], _splits()[1][0]
    for cal in (NodeConformal(tax, 0.1), SetConformal(tax, 0.1, r=3)):
        cal.fit(probs[cal_rows], labels[cal_rows])
        assert cal.threshold_ == conformal_quantile(cal.scores(probs[cal_rows], labels[cal_rows]), 0.1)
        covered = cal.scores(probs[test_rows], labels[test_rows]) <= cal.threshold_
        pred = cal.predict(probs[test_rows])
        anc = tax.ancestors_sparse.toarray().astype(bool)[labels[test_rows]]  # [B, N]
        hit = anc[np.arange(len(test_rows)), pred] if pred.ndim == 1 else (anc & pred).any(1)
        np.testing.assert_array_equal(hit, covered)
        if pred.ndim == 2:
            assert pred.sum(1).max() <= 3


def test_node_method_is_the_threshold_decoder_above_one_half(pools):
    tax, data = pools
    _, probs, labels = data["calibrated"]
    for alpha in ALPHAS:  # q >= 1/2 on this data
        cal = NodeConformal(tax, alpha).fit(probs[:300], labels[:300])
        assert cal.threshold_ >= 0.5
        np.testing.assert_array_equal(
            cal.predict(probs[300:]), threshold_decoder(probs[300:], tax, threshold=cal.threshold_)
        )


def test_risk_control_over_random_splits(pools):
    """E[overshoot / H] <= alpha: the loss of the test rows at each split's lambda (chain positions from one
    greedy chain of the pool; losses from LCA depths)."""
    tax, data = pools
    _, probs, labels = data["overconfident"]
    path, mass = greedy_chain(probs, tax)
    depth = tax.depth
    valid = path >= 0
    safe = np.where(valid, path, 0)
    lca = np.asarray(tax.lca(safe.ravel(), np.repeat(labels, path.shape[1]))).reshape(path.shape)
    loss = np.where(valid, depth[safe] - depth[lca], 0) / tax.height  # [POOL, H + 1]
    cal, test = _splits()
    for alpha in (0.1, 0.2):
        risks = np.empty(SPLITS)
        for s in range(SPLITS):
            lam = RiskConformal(tax, alpha, loss="overshoot").fit(probs[cal[s]], labels[cal[s]]).threshold_
            k = (mass[test[s], 1:] > lam).sum(1)
            risks[s] = loss[test[s], k].mean()
        se = risks.std(ddof=1) / np.sqrt(SPLITS)
        assert risks.mean() <= alpha + Z * se, (alpha, risks.mean())
        assert risks.mean() >= alpha - 0.05  # and not trivially conservative


# ---------------------------------------------------------------------------------------------- flat reductions
def _flat(k: int, n: int, seed: int) -> tuple[Taxonomy, np.ndarray, np.ndarray, np.ndarray]:
    """A star with ``k`` classes: leaf probabilities, node probabilities and class indices drawn from them."""
    rng = np.random.default_rng(seed)
    tax = star(k)
    leaf = rng.dirichlet(np.full(k, 0.5), size=n)
    labels = (leaf.cumsum(1) < rng.random((n, 1))).sum(1).clip(max=k - 1)
    return tax, leaf, tax.marginals(leaf), labels


def _aps_u0(leaf: np.ndarray, labels: np.ndarray, test: np.ndarray, alpha: float) -> np.ndarray:
    """APS (Romano, Sesia, Candes 2020) with u = 0, from the formula: score = the mass of the classes strictly more
    probable than the label; the set holds the classes whose score is <= the conformal quantile."""

    def score(p: np.ndarray) -> np.ndarray:  # [B, K]: the score every class would get
        return (p[:, None, :] * (p[:, None, :] > p[:, :, None])).sum(2)

    s = score(leaf)[np.arange(len(labels)), labels]
    k = int(np.ceil((len(s) + 1) * (1 - alpha)))
    q = np.inf if k > len(s) else np.sort(s)[k - 1]
    return score(test) <= q


def _leaf_sets(pred: np.ndarray, tax: Taxonomy) -> np.ndarray:
    """Node sets [B, N] -> the leaves they cover [B, L]."""
    anc = tax.ancestors_sparse.toarray().astype(bool)[tax.leaves]  # [L, N]
    return (pred[:, None, :] & anc[None, :, :]).any(2)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_flat_set_method_is_aps(alpha):
    k = 6
    tax, leaf, probs, labels = _flat(k, 700, seed=int(alpha * 100))
    for r in (k - 1, k, 10):
        cal = SetConformal(tax, alpha, r=r).fit(probs[:300], tax.leaves[labels[:300]])
        ours = _leaf_sets(cal.predict(probs[300:]), tax)
        np.testing.assert_array_equal(ours, _aps_u0(leaf[:300], labels[:300], leaf[300:], alpha))


@pytest.mark.parametrize("alpha", ALPHAS)
def test_flat_node_method_is_top1_or_everything(alpha):
    """One node on a flat taxonomy: APS restricted to {top class} and {all classes}; oracle from that formula."""
    tax, leaf, probs, labels = _flat(5, 600, seed=3)
    cal = NodeConformal(tax, alpha).fit(probs[:300], tax.leaves[labels[:300]])
    top = leaf.argmax(1)
    s = np.where(labels[:300] == top[:300], 0.0, leaf[:300].max(1))
    q = np.sort(s)[int(np.ceil(301 * (1 - alpha))) - 1]
    want = np.where(leaf[300:].max(1) > q, tax.leaves[top[300:]], 0)
    np.testing.assert_array_equal(cal.predict(probs[300:]), want)
    # and it is the set method with r = 1
    one = SetConformal(tax, alpha, r=1).fit(probs[:300], tax.leaves[labels[:300]]).predict(probs[300:])
    np.testing.assert_array_equal(np.flatnonzero(one.ravel()) % tax.num_nodes, want)


def test_node_method_is_set_method_with_r1_on_trees():
    tax = random_tree(30, 5)
    rng = np.random.default_rng(5)
    probs = dirichlet_node_probs(tax, rng, 400)  # labels may be internal nodes
    labels = _draw(probs, tax, rng)
    a, b = NodeConformal(tax, 0.1), SetConformal(tax, 0.1, r=1)
    np.testing.assert_allclose(a.scores(probs, labels), b.scores(probs, labels), atol=1e-12)
    a.fit(probs[:200], labels[:200])
    b.fit(probs[:200], labels[:200])
    sets = b.predict(probs[200:])
    assert (sets.sum(1) == 1).all()
    np.testing.assert_array_equal(sets.argmax(1), a.predict(probs[200:]))


def _draw(probs: np.ndarray, tax: Taxonomy, rng: np.random.Generator) -> np.ndarray:
    """Labels (any node) drawn from node probabilities: the label distribution solves P = p A."""
    p = np.clip(probs @ np.linalg.inv(tax.ancestors_sparse.toarray().astype(np.float64)), 0, None)
    return np.array([rng.choice(tax.num_nodes, p=row / row.sum()) for row in p])


# ---------------------------------------------------------------------------------------------- risk control
def _oracle_chain(p: np.ndarray, tax: Taxonomy) -> tuple[list[int], list[float]]:
    path, mass = [0], [p[0]]
    while tax.children(path[-1]):
        kids = list(tax.children(path[-1]))
        path.append(kids[int(np.argmax(p[kids]))])
        mass.append(min(mass[-1], p[path[-1]]))
    return path, mass


def _oracle_lambda(probs, labels, tax, alpha, loss) -> float:
    """CRC from its definition: the smallest lambda among all chain masses (and 0) with
    n/(n+1) R(lambda) + 1/(n+1) <= alpha, R averaged from predictions and tax.distance / tax.lca directly."""
    chains = [_oracle_chain(p, tax) for p in probs]
    n = len(labels)
    for lam in sorted({0.0, *[m for _, ms in chains for m in ms]}):
        pred = np.array([path[max(i for i, m in enumerate(ms) if i == 0 or m > lam)] for path, ms in chains])
        lca = np.asarray(tax.lca(pred, labels))
        miss = lca != pred
        if loss == "miscoverage":
            r = miss.mean()
        elif loss == "overshoot":
            r = ((tax.depth[pred] - tax.depth[lca]) / tax.height).mean()
        else:
            r = (np.where(miss, tax.distance(pred, labels), 0) / (2 * tax.height)).mean()
        if n / (n + 1) * r + 1 / (n + 1) <= alpha + 1e-12:
            return lam
    return np.inf


@pytest.mark.parametrize("loss", ["overshoot", "distance", "miscoverage"])
def test_risk_threshold_matches_brute_force(loss):
    tax = random_tree(25, 11)
    rng = np.random.default_rng(11)
    for n, alpha in ((40, 0.3), (80, 0.15), (120, 0.1), (8, 0.1)):
        probs = dirichlet_node_probs(tax, rng, n)
        labels = _draw(probs, tax, rng)
        got = RiskConformal(tax, alpha, loss=loss).fit(probs, labels).threshold_
        assert got == _oracle_lambda(probs, labels, tax, alpha, loss), (n, alpha)


def test_miscoverage_risk_control_is_split_conformal():
    tax = random_tree(20, 3)
    rng = np.random.default_rng(3)
    for n in (50, 99, 100, 333):
        probs = dirichlet_node_probs(tax, rng, n)
        labels = rng.choice(tax.leaves, n)
        for alpha in ALPHAS:
            a = RiskConformal(tax, alpha, loss="miscoverage").fit(probs, labels).threshold_
            assert a == NodeConformal(tax, alpha).fit(probs, labels).threshold_, (n, alpha)


# ---------------------------------------------------------------------------------------------- API
def test_dags_node_and_risk_work_set_and_distance_refuse():
    tax = random_dag(30, 4)
    assert not tax.is_tree
    rng = np.random.default_rng(4)
    probs = dirichlet_node_probs(tax, rng, 300)
    labels = rng.choice(tax.num_nodes, 300)
    cal = NodeConformal(tax, 0.2).fit(probs[:150], labels[:150])
    anc = tax.ancestors_sparse.toarray().astype(bool)
    covered = anc[labels[150:], cal.predict(probs[150:])]
    np.testing.assert_array_equal(covered, cal.scores(probs[150:], labels[150:]) <= cal.threshold_)
    RiskConformal(tax, 0.2, loss="overshoot").fit(probs, labels)
    with pytest.raises(TaxonomyError, match="SetConformal needs a tree"):
        SetConformal(tax, 0.1)
    with pytest.raises(TaxonomyError, match="loss='distance'"):
        RiskConformal(tax, 0.1, loss="distance")


def test_batches_tensors_names_and_errors():
    tax = random_tree(20, 8)
    rng = np.random.default_rng(8)
    probs = dirichlet_node_probs(tax, rng, 90)
    labels = rng.choice(tax.leaves, 90)
    labels[5] = -1  # left out
    for method, opts in (("node", {}), ("set", {"r": 2}), ("risk", {"loss": "distance"})):
        whole = create_conformal(method, tax, 0.2, **opts).fit(probs, labels)
        parts = create_conformal(method, tax, 0.2, **opts)
        for lo in range(0, 90, 40):
            parts.update(probs[lo : lo + 40], labels[lo : lo + 40])
        assert parts.calibrate().threshold_ == whole.threshold_ and parts.n_calibration_ == 89
        t = torch.as_tensor(probs, dtype=torch.float32)
        out = whole.predict(t)
        assert isinstance(out, torch.Tensor) and out.device == t.device
        np.testing.assert_array_equal(out.numpy(), whole.predict(probs.astype(np.float32)))
    names = [tax.name_of(int(i)) for i in labels[6:]]
    assert (
        NodeConformal(tax, 0.2).fit(probs[6:], names).threshold_
        == NodeConformal(tax, 0.2).fit(probs[6:], torch.as_tensor(labels[6:])).threshold_
    )
    with pytest.raises(ValueError, match="alpha"):
        NodeConformal(tax, 1.5)
    with pytest.raises(ValueError, match="r must be"):
        SetConformal(tax, 0.1, r=0)
    with pytest.raises(RuntimeError, match="not calibrated"):
        NodeConformal(tax).predict(probs)
    with pytest.raises(ValueError, match="no calibration samples"):
        NodeConformal(tax).fit(probs[:2], [-1, -1])
    with pytest.raises(TaxonomyError, match=r"labels\[0\]"):
        NodeConformal(tax).fit(probs[:1], [99])
    # too few calibration samples for alpha: infinite threshold, the root
    few = NodeConformal(tax, 0.05).fit(probs[:10], labels[:10])
    assert few.threshold_ == np.inf and (few.predict(probs) == 0).all()


# ---------------------------------------------------------------------------------------------- DDP
WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from hiercls.conformal import create_conformal
    from hiercls.taxonomy import Taxonomy
    rank, init_file, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    data = np.load(sys.argv[4])
    spec = json.loads(sys.argv[5])
    tax = Taxonomy([tuple(e) for e in spec["edges"]], nodes=spec["nodes"])
    rows = [np.arange(0, 70), np.arange(70, 100)][rank]  # uneven on purpose
    result = {}
    for method, opts in (("node", {}), ("set", {"r": 2}), ("risk", {"loss": "overshoot"})):
        cal = create_conformal(method, tax, 0.1, **opts)
        for part in np.array_split(rows, 2 if rank == 0 else 1):  # several batches on one rank
            cal.update(data["probs"][part], data["labels"][part])
        result[method] = [cal.calibrate().threshold_, cal.n_calibration_]
    json.dump(result, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.slow  # two worker processes import torch and hiercls (~10 s of CPU each)
@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="gloo needed"
)
def test_two_gloo_ranks_match_single_process(tmp_path):
    tax = random_tree(25, 9)
    rng = np.random.default_rng(9)
    probs = dirichlet_node_probs(tax, rng, 100)
    labels = _draw(probs, tax, rng)
    np.savez(tmp_path / "data.npz", probs=probs, labels=labels)
    (tmp_path / "worker.py").write_text(WORKER)
    edges = json.dumps({"edges": [list(e) for e in tax.edge_list(names=True)], "nodes": list(tax.names)})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(tmp_path / "worker.py"),
                str(r),
                str(tmp_path / "init"),
                str(tmp_path / f"out{r}.json"),
                str(tmp_path / "data.npz"),
                edges,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        log = p.communicate(timeout=240)[0]
        assert p.returncode == 0, log
    single = {
        "node": NodeConformal(tax, 0.1).fit(probs, labels).threshold_,
        "set": SetConformal(tax, 0.1, r=2).fit(probs, labels).threshold_,
        "risk": RiskConformal(tax, 0.1, loss="overshoot").fit(probs, labels).threshold_,
    }
    for r in range(2):
        out = json.loads((tmp_path / f"out{r}.json").read_text())
        assert {k: v[0] for k, v in out.items()} == single
        assert all(v[1] == 100 for v in out.values())


# ---------------------------------------------------------------------------------------------- CLI and table
def test_cli_evaluate_conformal_rows(tmp_path, capsys):
    tax = _tree()
    _, probs, labels = _pool(tax, sharpen=3.0)
    probs, labels = probs[:600], labels[:600].copy()
    labels[3] = -1  # ignored, then split
    write_taxonomy(tax, tmp_path / "tax.json")
    np.save(tmp_path / "p.npy", probs)
    np.save(tmp_path / "y.npy", labels)
    np.savetxt(tmp_path / "cal.txt", np.arange(0, 599, 2), fmt="%d")
    common = ["evaluate", "--probs", str(tmp_path / "p.npy"), "--labels", str(tmp_path / "y.npy"), "--conformal", "0.1"]
    assert (
        main(
            [
                *common,
                "--taxonomy",
                str(tmp_path / "tax.json"),
                "--calibration-split",
                str(tmp_path / "cal.txt"),
                "--table",
                "--decoder",
                "argmax_leaf",
                "--out",
                str(tmp_path / "t.json"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "conformal rows: alpha = 0.1" in text and "set:r=2" in text
    out = json.loads((tmp_path / "t.json").read_text())
    assert out["samples"] == 299 and out["conformal"]["n_calibration"] == 300 and out["conformal"]["n_test"] == 299
    # the same numbers from the API: calibrate on the listed rows of the labelled rows, score the others
    kept = labels >= 0
    p, y = probs[kept], labels[kept]
    cal, test = np.arange(0, 599, 2), np.arange(1, 599, 2)
    pred = NodeConformal(tax, 0.1).fit(p[cal], y[cal]).predict(p[test])
    assert out["conformal"]["rows"]["node"]["coverage"] == coverage_summary(pred, y[test], tax)["coverage"]
    pred = threshold_decoder(p[test], tax, threshold=0.9)
    assert out["conformal"]["rows"]["threshold"]["coverage"] == coverage_summary(pred, y[test], tax)["coverage"]
    capsys.readouterr()
    assert main([*common, "--taxonomy", str(tmp_path / "tax.json"), "--calibration-split", "1.5"]) != 0
    assert "a fraction must be in (0, 1); got '1.5'" in capsys.readouterr().err


def test_as_decoder_gives_ids_or_closed_sets():
    tax = random_tree(20, 6)
    rng = np.random.default_rng(6)
    probs = dirichlet_node_probs(tax, rng, 60)
    labels = _draw(probs, tax, rng)
    node = NodeConformal(tax, 0.2).fit(probs, labels)
    np.testing.assert_array_equal(node.as_decoder()(probs, tax), node.predict(probs))
    sets = SetConformal(tax, 0.2, r=3).fit(probs, labels)
    chosen = sets.predict(probs)
    closed = sets.as_decoder()(torch.as_tensor(probs), tax)
    assert isinstance(closed, torch.Tensor)
    anc = tax.ancestors_sparse.toarray().astype(bool)
    np.testing.assert_array_equal(closed.numpy(), (chosen[:, :, None] & anc[None, :, :]).any(1))
    with pytest.raises(TaxonomyError, match="fitted on taxonomy"):
        node.as_decoder()(probs, random_tree(20, 7))


def test_cli_offers_the_risk_losses():
    assert CONFORMAL_LOSSES == RISK_LOSSES  # the parser's copy (hiercls.cli.names) of the owner's list


@pytest.mark.slow  # trains a tiny model (~15 s of CPU)
def test_cli_evaluate_model_conformal_stores_the_calibration(tmp_path, capsys):
    """``evaluate --model RUN --conformal``: calibrate on val, check on test, store ``RUN/conformal.json``; the
    stored calibrators reload and predict, and refuse another taxonomy."""
    (tmp_path / "tax.txt").write_text("root animal\nroot vehicle\nanimal cat\nanimal dog\nvehicle car\nvehicle bike\n")
    recipe = {
        "name": "tiny",
        "taxonomy": str(tmp_path / "tax.txt"),
        "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
        "data": {
            "dataset": "synthetic",
            "batch_size": 8,
            "image_size": 16,
            "options": {"kind": "image", "image_size": 16, "train_samples": 16, "val_samples": 40, "test_samples": 30},
        },
        "schedule": {"epochs": 1},
        "run": {"out_dir": str(tmp_path / "run"), "progress": False},
    }
    (tmp_path / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML
    assert main(["train", str(tmp_path / "recipe.yaml"), "--no-compare"]) == 0
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--conformal", "0.2", "--out", str(tmp_path / "c.json")]) == 0
    text = capsys.readouterr().out
    assert "calibrated on split 'val', checked on split 'test'" in text and "set:r=2" in text
    out = json.loads((tmp_path / "c.json").read_text())["conformal"]
    assert out["n_calibration"] == 40 and out["n_test"] == 30
    tax = load_taxonomy(str(tmp_path / "tax.txt"))
    stored = load_conformal(run / "conformal.json", tax)
    assert [c.method for c in stored] == ["node", "set", "risk"]
    for cal, name in zip(stored, ["node", "set:r=2", "risk:overshoot"], strict=True):
        assert cal.threshold_ == out["rows"][name]["threshold"] and cal.n_calibration_ == 40
        cal.predict(np.tile(tax.marginals(np.full(tax.num_leaves, 1 / tax.num_leaves)), (2, 1)))
    with pytest.raises(TaxonomyError, match="was calibrated on taxonomy"):
        load_conformal(run / "conformal.json", star(3))
    assert main(["evaluate", "--model", str(run), "--conformal", "0.2", "--data", "val"]) != 0
    assert "both 'val'" in capsys.readouterr().err
    # predict with the stored calibration
    rng = np.random.default_rng(0)
    images = []
    for i in range(3):
        images.append(tmp_path / f"x{i}.png")
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(images[-1])
    for method in ("node", "set"):
        out_json = tmp_path / f"pred_{method}.json"
        argv = ["predict", "--model", str(run), *map(str, images), "--conformal", method, "--out", str(out_json)]
        assert main(argv) == 0
        written = json.loads(out_json.read_text())
        assert written["decoder"].startswith(f"conformal:{method} alpha=0.2") and len(written["predictions"]) == 3
    assert main(["predict", "--model", str(tmp_path), str(images[0]), "--conformal"]) != 0

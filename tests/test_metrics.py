"""Tests of hiercls.metrics against hand-computed cases, an independent set-based reference, scikit-learn.

The reference functions (``ref_*``, below) walk ``Taxonomy.parents`` and use plain Python sets; they never
touch the sparse ancestor matrix, ``Taxonomy.lca`` or ``Taxonomy.depth`` that the library relies on.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn.metrics as skm
import torch
from _generators import random_dag, random_tree
from hypothesis import given, settings
from hypothesis import strategies as st

import hiercls.metrics as M
from hiercls.taxonomy import Taxonomy, TaxonomyError


# ----------------------------------------------------------------------------- independent reference
def ref_ancestors(tax: Taxonomy, node: int) -> set[int]:
    """Node and all its ancestors through every parent (by walking parents)."""
    out, todo = {node}, [node]
    while todo:
        for p in tax.parents(todo.pop()):
            if p not in out:
                out.add(p)
                todo.append(p)
    return out


def ref_closed(tax: Taxonomy, nodes) -> set[int]:
    out: set[int] = set()
    for n in nodes:
        out |= ref_ancestors(tax, int(n))
    return out


def ref_depth_of(tax: Taxonomy, node: int) -> int:
    d, n = 0, node
    while n != 0:
        n = tax.parents(n)[0]
        d += 1
    return d


def ref_tree_path(tax: Taxonomy, node: int) -> list[int]:
    out = [node]
    while out[-1] != 0:
        out.append(tax.parents(out[-1])[0])
    return out[::-1]


def ref_deepest_common(tax: Taxonomy, a: int, b: int) -> int:
    common = ref_ancestors(tax, a) & ref_ancestors(tax, b)
    return max(common, key=lambda n: (ref_depth_of(tax, n), -n))


def div(a: float, b: float, zd: float) -> float:
    return a / b if b else zd


def ref_hier_prf(tax, true_sets, pred_sets, *, average, include_root, beta=1.0, weights=None, zd=0.0):
    """Set-based hP, hR, hF; ``true_sets`` / ``pred_sets`` are closed sets of node ids."""
    w = [1.0] * len(true_sets) if weights is None else list(weights)
    b2 = beta * beta

    def strip(s):
        return (s | {0}) if include_root else (s - {0})

    ts = [strip(s) for s in true_sets]
    ps = [strip(s) for s in pred_sets]
    if average == "micro":
        i = sum(wi * len(t & p) for wi, t, p in zip(w, ts, ps, strict=True))
        nt = sum(wi * len(t) for wi, t in zip(w, ts, strict=True))
        npd = sum(wi * len(p) for wi, p in zip(w, ps, strict=True))
        return div(i, npd, zd), div(i, nt, zd), div((1 + b2) * i, b2 * nt + npd, zd)
    if average == "samples":
        tot = sum(w)
        pr = sum(wi * div(len(t & p), len(p), zd) for wi, t, p in zip(w, ts, ps, strict=True)) / tot
        rc = sum(wi * div(len(t & p), len(t), zd) for wi, t, p in zip(w, ts, ps, strict=True)) / tot
        f = (
            sum(wi * div((1 + b2) * len(t & p), b2 * len(t) + len(p), zd) for wi, t, p in zip(w, ts, ps, strict=True))
            / tot
        )
        return pr, rc, f
    nodes = range(tax.num_nodes) if include_root else range(1, tax.num_nodes)
    prs, rcs, fs = [], [], []
    for j in nodes:
        tp = sum(wi for wi, t, p in zip(w, ts, ps, strict=True) if j in t and j in p)
        fp = sum(wi for wi, t, p in zip(w, ts, ps, strict=True) if j not in t and j in p)
        fn = sum(wi for wi, t, p in zip(w, ts, ps, strict=True) if j in t and j not in p)
        prs.append(div(tp, tp + fp, zd))
        rcs.append(div(tp, tp + fn, zd))
        fs.append(div((1 + b2) * tp, (1 + b2) * tp + b2 * fn + fp, zd))
    return sum(prs) / len(prs), sum(rcs) / len(rcs), sum(fs) / len(fs)


def ref_mistake_severity(tax, t, p):
    h = max(ref_depth_of(tax, n) for n in range(tax.num_nodes))
    d = [h - ref_depth_of(tax, ref_deepest_common(tax, a, b)) for a, b in zip(t, p, strict=True) if a != b]
    return sum(d) / len(d) if d else math.nan


def ref_per_level(tax, t, p):
    h = max(ref_depth_of(tax, n) for n in range(tax.num_nodes))
    out = []
    for d in range(1, h + 1):
        ok = n = 0
        for a, b in zip(t, p, strict=True):
            pa, pb = ref_tree_path(tax, a), ref_tree_path(tax, b)
            if len(pa) > d and len(pb) > d:
                n += 1
                ok += pa[d] == pb[d]
        out.append(ok / n if n else math.nan)
    return out


def ref_consistent(tax, raw: set[int]) -> set[int]:
    return {j for j in raw if all(a in raw for a in ref_ancestors(tax, j) if a != 0)}


def f1_from_lists(tps, fps, fns, average, zd=0.0):
    if average == "micro":
        tp, fp, fn = sum(tps), sum(fps), sum(fns)
        return div(2 * tp, 2 * tp + fp + fn, zd)
    return float(np.mean([div(2 * a, 2 * a + b + c, zd) for a, b, c in zip(tps, fps, fns, strict=True)]))


def ref_path_f1(tax, true_sets, raw_preds, average, zd=0.0):
    tps, fps, fns = [], [], []
    for j in range(1, tax.num_nodes):
        tp = fp = fn = 0
        for t, raw in zip(true_sets, raw_preds, strict=True):
            ok = j in raw and j in t and all(a in raw for a in ref_ancestors(tax, j) if a != 0)
            tp += ok
            fp += (j in raw) and not ok
            fn += (j in t) and not ok
        tps.append(tp)
        fps.append(fp)
        fns.append(fn)
    return f1_from_lists(tps, fps, fns, average, zd)


def ref_constrained_f1(tax, true_sets, raw_preds, average, zd=0.0):
    kept = [ref_consistent(tax, r) for r in raw_preds]
    tps = [sum(j in t and j in k for t, k in zip(true_sets, kept, strict=True)) for j in range(1, tax.num_nodes)]
    fps = [sum(j not in t and j in k for t, k in zip(true_sets, kept, strict=True)) for j in range(1, tax.num_nodes)]
    fns = [sum(j in t and j not in k for t, k in zip(true_sets, kept, strict=True)) for j in range(1, tax.num_nodes)]
    return f1_from_lists(tps, fps, fns, average, zd)


# ----------------------------------------------------------------------------- fixtures
def animal_tree() -> Taxonomy:
    """root ─┬─ animal ─┬─ cat
    │          └─ dog ── puppy
    └─ vehicle ── car          (ids 0..6 in this order; height 3)"""
    return Taxonomy(
        [
            ("root", "animal"),
            ("animal", "cat"),
            ("animal", "dog"),
            ("dog", "puppy"),
            ("root", "vehicle"),
            ("vehicle", "car"),
        ],
        name="animals",
    )


def diamond_dag() -> Taxonomy:
    """root → a → x, root → b → x (x has two parents), b → y."""
    return Taxonomy([("root", "a"), ("root", "b"), ("a", "x"), ("b", "x"), ("b", "y")], name="diamond")


# The four samples of the hand-computed cases, (truth, prediction):
#   cat   vs dog:  T={animal, cat}          P={animal, dog}   |T∩P| = 1, |P| = 2, |T| = 2
#   puppy vs dog:  T={animal, dog, puppy}   P={animal, dog}   |T∩P| = 2, |P| = 2, |T| = 3
#   car   vs cat:  T={vehicle, car}         P={animal, cat}   |T∩P| = 0, |P| = 2, |T| = 2
#   animal vs cat: T={animal}               P={animal, cat}   |T∩P| = 1, |P| = 2, |T| = 1
HAND_TRUE = ["cat", "puppy", "car", "animal"]
HAND_PRED = ["dog", "dog", "cat", "cat"]


def sets_matrix(tax: Taxonomy, sets: list[set[int]]) -> np.ndarray:
    m = np.zeros((len(sets), tax.num_nodes), dtype=bool)
    for i, s in enumerate(sets):
        m[i, list(s)] = True
    return m


# ----------------------------------------------------------------------------- hand-computed cases
def test_hierarchical_prf_hand_computed_micro_samples_macro():
    tax = animal_tree()
    kw = {"taxonomy": tax}
    # micro without root: 4 / 8 and 4 / 8; with root every count grows by 1 per sample: 8 / 12.
    assert M.hierarchical_precision_recall_fscore(HAND_TRUE, HAND_PRED, **kw) == (0.5, 0.5, 0.5)
    p, r, f = M.hierarchical_precision_recall_fscore(HAND_TRUE, HAND_PRED, include_root=True, **kw)
    assert (p, r, f) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    # per sample: hP_b = 1/2, 1, 0, 1/2; hR_b = 1/2, 2/3, 0, 1; hF_b = 2/4, 4/5, 0, 2/3.
    p, r, f = M.hierarchical_precision_recall_fscore(HAND_TRUE, HAND_PRED, average="samples", **kw)
    assert p == pytest.approx(0.5)
    assert r == pytest.approx((0.5 + 2 / 3 + 0 + 1) / 4)
    assert f == pytest.approx((0.5 + 0.8 + 0 + 2 / 3) / 4)
    # macro over the 6 non-root nodes (tp, fp, fn): animal (3, 1, 0), cat (0, 2, 1), dog (1, 1, 0),
    # puppy (0, 0, 1), vehicle (0, 0, 1), car (0, 0, 1).
    p, r, f = M.hierarchical_precision_recall_fscore(HAND_TRUE, HAND_PRED, average="macro", zero_division=0.0, **kw)
    assert p == pytest.approx((0.75 + 0.5) / 6)
    assert r == pytest.approx(2 / 6)
    assert f == pytest.approx((6 / 7 + 2 / 3) / 6)
    p1 = M.hierarchical_precision_score(HAND_TRUE, HAND_PRED, average="macro", zero_division=1.0, **kw)
    assert p1 == pytest.approx((0.75 + 0.5 + 3) / 6)
    pn = M.hierarchical_precision_score(HAND_TRUE, HAND_PRED, average="macro", zero_division=math.nan, **kw)
    assert pn == pytest.approx((0.75 + 0 + 0.5) / 3)  # puppy, vehicle, car were never predicted: left out
    # beta = 2: (1 + 4) * 4 / (4 * 8 + 8)
    assert M.hierarchical_fbeta_score(HAND_TRUE, HAND_PRED, beta=2.0, **kw) == pytest.approx(20 / 40)
    assert M.hierarchical_fbeta_score(["puppy"], ["dog"], beta=2.0, **kw) == pytest.approx(5 * 2 / (4 * 3 + 2))
    # beta -> 0 tends to hierarchical precision; beta = 0 itself is refused (issue 28: beta > 0 everywhere)
    for average in ("micro", "macro", "samples"):
        assert M.hierarchical_fbeta_score(
            HAND_TRUE, HAND_PRED, beta=1e-6, average=average, zero_division=0.0, **kw
        ) == pytest.approx(
            M.hierarchical_precision_score(HAND_TRUE, HAND_PRED, average=average, zero_division=0.0, **kw)
        )
        with pytest.raises(ValueError, match="beta must be a finite number > 0; got 0"):
            M.hierarchical_fbeta_score(HAND_TRUE, HAND_PRED, beta=0.0, average=average, **kw)


def test_hand_computed_distances_levels_nodes():
    tax = animal_tree()
    kw = {"taxonomy": tax}
    # LCAs: animal (depth 1), dog (2), root (0), animal (1); H = 3 -> heights 2, 1, 3, 2.
    assert M.mistake_severity(HAND_TRUE, HAND_PRED, **kw) == pytest.approx(2.0)
    assert M.mistake_severity(HAND_TRUE, HAND_PRED, distance="shortest_path", **kw) == pytest.approx(8 / 4)
    # car vs vehicle: H - depth(vehicle) = 2, but vehicle's own height is 1 (the tree is unbalanced).
    assert M.mistake_severity(["car"], ["vehicle"], **kw) == 2.0
    assert M.mistake_severity(["car"], ["vehicle"], distance="lca_node_height", **kw) == 1.0
    # only mistakes count: adding correct predictions does not change it
    assert M.mistake_severity([*HAND_TRUE, "car", "dog"], [*HAND_PRED, "car", "dog"], **kw) == pytest.approx(2.0)
    # depth 1: 3 of 4 right; depth 2: cat/dog, dog/dog, car/cat (animal has no depth-2 node); depth 3: none
    acc = M.per_level_accuracy_score(HAND_TRUE, HAND_PRED, **kw)
    assert acc[:2].tolist() == pytest.approx([0.75, 1 / 3]) and math.isnan(acc[2])
    # semantic: 2 + 3 + 2 + 1 = 8 valid (sample, level) pairs, right: 1 + 2 + 0 + 1
    assert M.semantic_accuracy_score(HAND_TRUE, HAND_PRED, **kw) == 0.5
    # symmetric differences 2 + 1 + 4 + 1 over 4 samples x 6 nodes
    assert M.hamming_loss(HAND_TRUE, HAND_PRED, **kw) == pytest.approx(8 / 24)
    assert M.exact_match_score(HAND_TRUE, HAND_PRED, **kw) == 0.0
    assert M.node_f1_score(HAND_TRUE, HAND_PRED, **kw) == 0.5
    # Wu-Palmer of Plaud et al. (root depth 0): cat/dog: 1 - 2*1/(2+2); puppy/dog: 1 - 2*2/(3+2);
    # car/cat: 1 - 0; animal/cat: 1 - 2*1/(1+2)
    expected = np.mean([1 - 2 / 4, 1 - 4 / 5, 1.0, 1 - 2 / 3])
    assert M.wu_palmer_loss(HAND_TRUE, HAND_PRED, **kw) == pytest.approx(expected)
    # WordNet's root depth 1: cat/dog: 1 - 2*2/(3+3); puppy/dog: 1 - 2*3/(4+3); car/cat: 1 - 2*1/(3+3);
    # animal/cat: 1 - 2*2/(2+3)
    expected = np.mean([1 - 4 / 6, 1 - 6 / 7, 1 - 2 / 6, 1 - 4 / 5])
    got = M.hierarchical_distance_loss(HAND_TRUE, HAND_PRED, distance="wu_palmer_root1", **kw)
    assert got == pytest.approx(expected)
    # Zhao (IC = log2(3 leaves / leaves under)): cat/dog: 1 - 2 log2(3/2) / (log2 3 + log2 3)
    assert M.zhao_loss(["cat"], ["dog"], **kw) == pytest.approx(1 - 2 * math.log2(1.5) / (2 * math.log2(3)))
    # the unnormalised information-content distance: log 3 + log 3 - 2 log(3/2)
    got = M.hierarchical_distance_loss(["cat"], ["dog"], distance="ic_distance", **kw)
    assert got == pytest.approx(2 * math.log(3) - 2 * math.log(1.5))


def test_dag_ancestors_by_identity_through_all_parents():
    tax = diamond_dag()
    x, y = tax.index("x"), tax.index("y")
    # anc(x) = {a, b, x}, anc(y) = {b, y}: they share b (only through x's second parent)
    assert M.hierarchical_precision_recall_fscore([x], [y], taxonomy=tax)[:2] == (0.5, pytest.approx(1 / 3))
    assert M.hierarchical_precision_score(["x"], ["y"], taxonomy=tax.to_tree("first")) == 0.0
    # a node set holding only x is closed to {a, b, x}
    only_x = np.zeros((1, tax.num_nodes), dtype=bool)
    only_x[0, x] = True
    assert M.hierarchical_counts(only_x, [y], taxonomy=tax)[2].tolist() == [3.0]
    assert M.per_level_accuracy_score([x], [y], taxonomy=tax).tolist()[0] == 0.0  # {a, b} vs {b} at depth 1


def test_path_and_constrained_f1_hand_computed():
    tax = animal_tree()
    ids = {n: tax.index(n) for n in tax.names}
    truth = [["puppy"], ["cat"]]  # closed: {animal, dog, puppy}, {animal, cat}
    raw = [["dog", "puppy"], ["animal", "cat", "car"]]  # dog, puppy lack animal; car lacks vehicle
    # P-F1: tp = animal, cat (sample 2); fp = dog, puppy, car; fn = animal, dog, puppy (sample 1)
    assert M.path_constrained_f1_score(truth, raw, taxonomy=tax) == pytest.approx(4 / 10)
    # C-F1: kept {} and {animal, cat}: tp = 2, fp = 0, fn = 3
    assert M.constrained_f1_score(truth, raw, taxonomy=tax) == pytest.approx(4 / 7)
    # consistent_subsets on the raw sets
    kept = M.consistent_subsets(
        sp.csr_matrix(sets_matrix(tax, [{ids["dog"], ids["puppy"]}, {ids["animal"], ids["cat"], ids["car"]}])), tax
    )
    assert [set(np.flatnonzero(r)) for r in kept.toarray()] == [set(), {ids["animal"], ids["cat"]}]
    # closed predictions make P-F1, C-F1 and the node F1 agree
    closed = [["dog", "puppy", "animal"], ["animal", "cat"]]
    f = M.node_f1_score(truth, closed, taxonomy=tax)
    assert M.path_constrained_f1_score(truth, closed, taxonomy=tax) == pytest.approx(f)
    assert M.constrained_f1_score(truth, closed, taxonomy=tax) == pytest.approx(f)


def test_hiclass_mode_compares_names_not_nodes():
    # "other" exists under both animal and vehicle: hiclass counts a name match, node identity does not.
    yt = [["animal", "other"], ["vehicle", "other"]]
    yp = [["vehicle", "other"], ["vehicle", "car"]]
    assert M.hiclass_precision_recall_fscore(yt, yp) == (0.5, 0.5, 0.5)
    tax = Taxonomy(
        [
            ("root", "animal"),
            ("animal", "animal/other"),
            ("root", "vehicle"),
            ("vehicle", "vehicle/other"),
            ("vehicle", "car"),
        ]
    )
    nodes_t = ["animal/other", "vehicle/other"]
    nodes_p = ["vehicle/other", "car"]
    assert M.hierarchical_precision_score(nodes_t, nodes_p, taxonomy=tax) == 0.25
    # hiclass "macro" = per-sample mean = our "samples" (when names are unique)
    yt2, yp2 = [["animal", "cat"], ["vehicle", ""]], [["animal", "dog"], ["vehicle", "car"]]
    hc = M.hiclass_precision_recall_fscore(yt2, yp2, average="macro")
    tax2 = Taxonomy([("root", "animal"), ("animal", "cat"), ("animal", "dog"), ("root", "vehicle"), ("vehicle", "car")])
    ours = M.hierarchical_precision_recall_fscore(["cat", "vehicle"], ["dog", "car"], taxonomy=tax2, average="samples")
    assert hc == pytest.approx((*ours[:2], np.mean([0.5, 2 * 1 * 0.5 / 1.5])))


# ----------------------------------------------------------------------------- against the reference
def _random_case(rng, tax, b, multilabel=False):
    if multilabel:
        t = [set(rng.choice(tax.num_nodes, size=int(rng.integers(0, 4)), replace=False).tolist()) for _ in range(b)]
        p = [set(rng.choice(tax.num_nodes, size=int(rng.integers(0, 4)), replace=False).tolist()) for _ in range(b)]
        return t, p
    return rng.integers(0, tax.num_nodes, b), rng.integers(0, tax.num_nodes, b)


@pytest.mark.parametrize("kind", ["tree", "dag"])
@pytest.mark.parametrize("multilabel", [False, True])
def test_prf_matches_set_reference(kind, multilabel):
    rng = np.random.default_rng(0 if kind == "tree" else 1)
    for trial in range(6):
        n = int(rng.integers(2, 25))
        tax = random_tree(n, rng) if kind == "tree" else random_dag(n, rng, n // 2)
        t, p = _random_case(rng, tax, int(rng.integers(1, 15)), multilabel)
        tsets = [ref_closed(tax, s) for s in t] if multilabel else [ref_ancestors(tax, int(a)) for a in t]
        psets = [ref_closed(tax, s) for s in p] if multilabel else [ref_ancestors(tax, int(a)) for a in p]
        y_t = [sorted(s) for s in t] if multilabel else t
        y_p = [sorted(s) for s in p] if multilabel else p
        w = rng.uniform(0.1, 2.0, len(tsets)) if trial % 2 else None
        for average in ("micro", "samples", "macro"):
            for include_root in (False, True):
                beta = 0.5 if trial % 3 == 0 else 1.0
                got = M.hierarchical_precision_recall_fscore(
                    y_t,
                    y_p,
                    taxonomy=tax,
                    average=average,
                    include_root=include_root,
                    beta=beta,
                    sample_weight=w,
                    zero_division=0.0,
                )
                want = ref_hier_prf(tax, tsets, psets, average=average, include_root=include_root, beta=beta, weights=w)
                assert got == pytest.approx(want, abs=1e-12), (trial, average, include_root)


def test_all_input_forms_agree():
    rng = np.random.default_rng(3)
    tax = random_tree(30, rng)
    t, p = rng.integers(0, 30, 40), rng.integers(0, 30, 40)
    want = M.hierarchical_precision_recall_fscore(t, p, taxonomy=tax, average="samples", zero_division=0.0)
    closed_t = tax.ancestor_matrix(t)
    unclosed_p = np.zeros((40, 30), dtype=np.int64)
    unclosed_p[np.arange(40), p] = 1
    forms = [
        (torch.from_numpy(t), torch.from_numpy(p)),
        ([tax.names[i] for i in t], np.array([tax.names[i] for i in p])),
        (closed_t, unclosed_p),  # bool closed, int64 not closed (closed silently)
        (torch.from_numpy(closed_t).float(), sp.csr_matrix(unclosed_p)),
        ([[int(i)] for i in t], [[tax.names[i]] for i in p]),
    ]
    for yt, yp in forms:
        got = M.hierarchical_precision_recall_fscore(yt, yp, taxonomy=tax, average="samples", zero_division=0.0)
        assert got == pytest.approx(want, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 20), st.integers(0, 2**31 - 1), st.booleans())
def test_hypothesis_micro_equals_node_micro_and_reference(n, seed, dag):
    rng = np.random.default_rng(seed)
    tax = random_dag(n, rng, n // 3) if dag else random_tree(n, rng)
    t, p = rng.integers(0, n, 12), rng.integers(0, n, 12)
    hp, hr, hf = M.hierarchical_precision_recall_fscore(t, p, taxonomy=tax, zero_division=0.0)
    np_, nr, nf, _ = M.node_precision_recall_fscore_support(t, p, taxonomy=tax, average="micro", zero_division=0.0)
    assert (hp, hr, hf) == pytest.approx((np_, nr, nf))
    want = ref_hier_prf(
        tax,
        [ref_ancestors(tax, int(a)) for a in t],
        [ref_ancestors(tax, int(a)) for a in p],
        average="micro",
        include_root=False,
    )
    assert (hp, hr, hf) == pytest.approx(want)


def test_node_metrics_match_sklearn_on_binarised_sets():
    rng = np.random.default_rng(4)
    for dag in (False, True):
        tax = random_dag(25, rng, 8) if dag else random_tree(25, rng)
        t, p = rng.integers(0, 25, 60), rng.integers(0, 25, 60)
        bt, bp = tax.ancestor_matrix(t)[:, 1:], tax.ancestor_matrix(p)[:, 1:]
        w = rng.uniform(0, 3, 60)
        for zd in (0.0, 1.0):
            for average in ("micro", "macro"):
                want = skm.f1_score(bt, bp, average=average, zero_division=zd, sample_weight=w)
                got = M.node_f1_score(t, p, taxonomy=tax, average=average, zero_division=zd, sample_weight=w)
                assert got == pytest.approx(want)
        p_, r_, f_, s_ = M.node_precision_recall_fscore_support(t, p, taxonomy=tax, zero_division=0.0)
        wp, wr, wf, ws = skm.precision_recall_fscore_support(bt, bp, zero_division=0.0)
        assert np.allclose(p_, wp) and np.allclose(r_, wr) and np.allclose(f_, wf) and np.allclose(s_, ws)
        assert M.hamming_loss(t, p, taxonomy=tax) == pytest.approx(skm.hamming_loss(bt, bp))
        assert M.exact_match_score(t, p, taxonomy=tax) == pytest.approx(skm.accuracy_score(bt, bp))
        assert M.exact_match_score(tax.ancestor_matrix(t), tax.ancestor_matrix(p), taxonomy=tax) == pytest.approx(
            skm.accuracy_score(bt, bp)
        )
        # labels= restricts the macro average to a subset
        sub = [3, 5, 7]
        want = skm.f1_score(bt, bp, labels=[s - 1 for s in sub], average="macro", zero_division=0.0)
        got = M.node_f1_score(t, p, taxonomy=tax, average="macro", labels=sub, zero_division=0.0)
        assert got == pytest.approx(want)


def test_present_labels_equal_sklearn_multiclass_macro_on_a_flat_taxonomy():
    # root + 12 leaves: node sets are one-hot, so node metrics are multiclass metrics; classes 10, 11 never occur
    flat = Taxonomy([("root", f"c{i}") for i in range(12)])
    rng = np.random.default_rng(12)
    t, p = rng.integers(1, 11, 50), rng.integers(1, 11, 50)
    p[:3] = 11  # a class only predicted
    want = skm.f1_score(t, p, average="macro")  # averages over the labels present in t or p
    assert M.node_f1_score(t, p, taxonomy=flat, average="macro", labels="present", zero_division=0.0) == pytest.approx(
        want
    )
    assert M.hierarchical_f1_score(
        t, p, taxonomy=flat, average="macro", labels="present", zero_division=0.0
    ) == pytest.approx(want)
    everything = skm.f1_score(t, p, average="macro", labels=np.arange(1, 13), zero_division=0.0)
    assert M.node_f1_score(t, p, taxonomy=flat, average="macro", zero_division=0.0) == pytest.approx(everything)
    assert M.hierarchical_report(t, p, taxonomy=flat, k=(), output_dict=True)["node_macro_f1"] == pytest.approx(want)
    assert M.exact_match_score(t, p, taxonomy=flat) == pytest.approx(skm.accuracy_score(t, p))


def test_path_constrained_and_constrained_f1_match_reference():
    rng = np.random.default_rng(5)
    for dag in (False, True):
        tax = random_dag(18, rng, 6) if dag else random_tree(18, rng)
        t = rng.integers(0, 18, 20)
        raw = [
            set(rng.choice(np.arange(1, 18), size=int(rng.integers(0, 5)), replace=False).tolist()) for _ in range(20)
        ]
        tsets = [ref_ancestors(tax, int(a)) for a in t]
        for average in ("micro", "macro"):
            got = M.path_constrained_f1_score(
                t, [sorted(r) for r in raw], taxonomy=tax, average=average, zero_division=0.0
            )
            assert got == pytest.approx(ref_path_f1(tax, tsets, raw, average))
            got = M.constrained_f1_score(t, sets_matrix(tax, raw), taxonomy=tax, average=average, zero_division=0.0)
            assert got == pytest.approx(ref_constrained_f1(tax, tsets, raw, average))


def test_distances_levels_topk_match_reference():
    rng = np.random.default_rng(6)
    for _ in range(4):
        tax = random_tree(int(rng.integers(3, 30)), rng)
        t, p = rng.integers(0, tax.num_nodes, 25), rng.integers(0, tax.num_nodes, 25)
        want = ref_mistake_severity(tax, t.tolist(), p.tolist())
        if not math.isnan(want):
            assert M.mistake_severity(t, p, taxonomy=tax) == pytest.approx(want)
        got = M.per_level_accuracy_score(t, p, taxonomy=tax)
        assert np.allclose(got, ref_per_level(tax, t.tolist(), p.tolist()), equal_nan=True)
        # the general (node set) path of per-level accuracy agrees with the tree fast path
        assert np.allclose(M.per_level_accuracy_score(tax.ancestor_matrix(t), p, taxonomy=tax), got, equal_nan=True)
        # Wu-Palmer from the reference depths (root depth 0, and WordNet's root depth 1)
        wup = [
            0.0
            if a == b
            else 1
            - 2 * ref_depth_of(tax, ref_deepest_common(tax, a, b)) / (ref_depth_of(tax, a) + ref_depth_of(tax, b))
            for a, b in zip(t.tolist(), p.tolist(), strict=True)
        ]
        assert M.wu_palmer_loss(t, p, taxonomy=tax) == pytest.approx(np.mean(wup))
        wup = [
            0.0
            if a == b
            else 1
            - 2
            * (ref_depth_of(tax, ref_deepest_common(tax, a, b)) + 1)
            / (ref_depth_of(tax, a) + ref_depth_of(tax, b) + 2)
            for a, b in zip(t.tolist(), p.tolist(), strict=True)
        ]
        got = M.hierarchical_distance_loss(t, p, taxonomy=tax, distance="wu_palmer_root1")
        assert got == pytest.approx(np.mean(wup))
        # top-k and hdist@k over leaf scores
        leaves = tax.leaves
        y = rng.choice(leaves, 25)
        scores = rng.random((25, len(leaves)))
        k = min(3, len(leaves))
        want_acc = skm.top_k_accuracy_score(tax.leaf_index[y], scores, k=k, labels=np.arange(len(leaves)))
        assert M.top_k_accuracy_score(y, scores, taxonomy=tax, k=k) == pytest.approx(want_acc)
        node_scores = np.zeros((25, tax.num_nodes))
        node_scores[:, leaves] = scores
        assert M.top_k_accuracy_score(y, node_scores, taxonomy=tax, k=k) == pytest.approx(want_acc)
        h = max(ref_depth_of(tax, n) for n in range(tax.num_nodes))
        order = np.argsort(-scores, axis=1)[:, :k]
        ref = np.mean(
            [
                np.mean(
                    [0 if leaves[j] == a else h - ref_depth_of(tax, ref_deepest_common(tax, a, leaves[j])) for j in row]
                )
                for a, row in zip(y.tolist(), order, strict=True)
            ]
        )
        assert M.average_hierarchical_distance_at_k(y, scores, taxonomy=tax, k=k) == pytest.approx(ref)


def test_semantic_levels_with_class_subset():
    # classes skip "dog": puppy's semantic level is 1 (animal is its only class ancestor)
    tax = Taxonomy(
        [("root", "animal"), ("animal", "cat"), ("animal", "dog"), ("dog", "puppy")], classes=["animal", "cat", "puppy"]
    )
    assert tax.semantic_level[tax.ids(["animal", "cat", "puppy"])].tolist() == [0, 1, 1]
    acc = M.per_level_accuracy_score(
        ["puppy", "puppy", "cat"], ["cat", "puppy", "dog"], taxonomy=tax, levels="semantic"
    )
    # level 0: animal everywhere (3/3); level 1: puppy/cat no, puppy/puppy yes, cat/(dog: none) not valid
    assert acc.tolist() == [1.0, 0.5]
    # semantic accuracy counts the cat/dog pair at level 1 as wrong: (3 + 1) / (3 + 3)
    assert M.semantic_accuracy_score(["puppy", "puppy", "cat"], ["cat", "puppy", "dog"], taxonomy=tax) == 4 / 6


# ----------------------------------------------------------------------------- segmentation
def test_dice_masks_match_direct_formula_and_sklearn():
    rng = np.random.default_rng(8)
    t = rng.random((3, 4, 5, 6)) > 0.5
    p = rng.random((3, 4, 5, 6)) > 0.6
    got = M.nested_dice_score(t, p)
    for r in range(4):
        tr, pr = t[:, r].ravel(), p[:, r].ravel()
        assert got[r] == pytest.approx(2 * (tr & pr).sum() / (tr.sum() + pr.sum()))
        assert got[r] == pytest.approx(skm.f1_score(tr, pr))
    per = M.nested_dice_score(t, p, per_sample=True)
    want = [
        np.mean([2 * (t[b, r] & p[b, r]).sum() / (t[b, r].sum() + p[b, r].sum()) for b in range(3)]) for r in range(4)
    ]
    assert np.allclose(per, want)
    soft = rng.random((2, 1, 6))
    assert M.nested_dice_score(t[:2, :1, 0], soft)[0] == pytest.approx(
        2 * (t[:2, :1, 0] * soft).sum() / (t[:2, :1, 0].sum() + soft.sum())
    )
    # the empty-empty rule and smoothing
    z = np.zeros((1, 2, 4), dtype=bool)
    assert M.nested_dice_score(z, z).tolist() == [1.0, 1.0]
    assert M.nested_dice_score(z, z, empty_score=0.0).tolist() == [0.0, 0.0]
    assert np.isnan(M.nested_dice_score(z, z, empty_score=math.nan)).all()
    one = np.array([[[1, 0, 0, 0]]], dtype=bool)
    assert M.nested_dice_score(one, np.zeros_like(one), smooth=1.0)[0] == pytest.approx(1 / 2)


@pytest.mark.parametrize("dag", [False, True])
def test_dice_label_maps_equal_nested_masks(dag):
    rng = np.random.default_rng(9)
    tax = random_dag(12, rng, 5) if dag else random_tree(12, rng)
    t = rng.integers(-1, 12, (3, 7, 5))
    p = rng.integers(0, 12, (3, 7, 5))
    regions = [1, 2, 5, 7]
    mt = M.region_masks(t, taxonomy=tax, regions=regions)
    mp = M.region_masks(np.where(t < 0, 0, p), taxonomy=tax, regions=regions) & (t >= 0)[:, None]
    # region r holds the pixels whose label has r among its (reference) ancestors
    for r_i, r in enumerate(regions):
        ref = np.vectorize(lambda n, r=r: n >= 0 and r in ref_ancestors(tax, int(n)))(t)
        assert (mt[:, r_i] == ref).all()
    for per_sample in (False, True):
        got = M.nested_dice_score(t, p, taxonomy=tax, regions=regions, per_sample=per_sample)
        want = M.nested_dice_score(mt, mp, per_sample=per_sample)
        assert np.allclose(got, want)


def test_dice_nested_hand_case():
    tax = Taxonomy([("r", "tumour"), ("tumour", "core"), ("core", "enhancing")])
    t = np.array([[0, 1, 2, 3, 3]])
    p = np.array([[1, 1, 2, 2, 3]])
    # tumour: 4 true, 5 predicted, 4 shared; core 3, 3, 3; enhancing 2, 1, 1
    assert M.nested_dice_score(t, p, taxonomy=tax).tolist() == pytest.approx([8 / 9, 1.0, 2 / 3])
    assert M.nested_dice_score(t, p, taxonomy=tax, regions=["core"]).tolist() == [1.0]


# ----------------------------------------------------------------------------- stateful classes
def test_stateful_batches_equal_functional():
    rng = np.random.default_rng(10)
    tax = random_tree(35, rng)
    t, p = rng.integers(0, 35, 37), rng.integers(0, 35, 37)
    w = rng.uniform(0.5, 2, 37)
    leaves = tax.leaves
    y = rng.choice(leaves, 37)
    scores = rng.random((37, len(leaves)))
    metrics = {
        "micro": M.HierarchicalFBeta(tax, zero_division=0.0),
        "samples": M.HierarchicalFBeta(tax, average="samples", zero_division=0.0),
        "macro": M.HierarchicalFBeta(tax, average="macro", include_root=True, zero_division=0.0),
        "node": M.NodeF1(tax, zero_division=0.0),
        "sev": M.MistakeSeverity(tax),
        "level": M.LevelAccuracy(tax),
    }
    topk = M.TopKMetrics(tax, k=(1, 3))
    for chunk in np.array_split(np.arange(37), [5, 6, 20]):
        for m in metrics.values():
            m.update(p[chunk], t[chunk], sample_weight=w[chunk])
        topk.update(scores[chunk], y[chunk], sample_weight=w[chunk])
    kw = {"taxonomy": tax, "sample_weight": w}
    for avg in ("micro", "samples"):
        assert tuple(metrics[avg].results().values()) == pytest.approx(
            M.hierarchical_precision_recall_fscore(t, p, average=avg, zero_division=0.0, **kw)
        )
    assert tuple(metrics["macro"].results().values()) == pytest.approx(
        M.hierarchical_precision_recall_fscore(t, p, average="macro", include_root=True, zero_division=0.0, **kw)
    )
    node = metrics["node"].results()
    assert node["macro_f1"] == pytest.approx(M.node_f1_score(t, p, average="macro", zero_division=0.0, **kw))
    assert node["hamming_loss"] == pytest.approx(M.hamming_loss(t, p, **kw))
    assert metrics["sev"].results()["mistake_severity"] == pytest.approx(M.mistake_severity(t, p, **kw))
    lv = metrics["level"].results()
    assert np.allclose(lv["per_level_accuracy"], M.per_level_accuracy_score(t, p, **kw), equal_nan=True)
    assert lv["semantic_accuracy"] == pytest.approx(M.semantic_accuracy_score(t, p, levels="depth", **kw))
    tk = topk.results()
    assert tk["top3_accuracy"] == pytest.approx(M.top_k_accuracy_score(y, scores, k=3, **kw))
    assert tk["hdist@3"] == pytest.approx(M.average_hierarchical_distance_at_k(y, scores, k=3, **kw))
    # reset, state_dict round trip, merge
    m = metrics["micro"]
    saved = m.state_dict()
    m.reset()
    with pytest.raises(RuntimeError, match=r"HierarchicalFBeta.compute\(\) was called before any update\(\)"):
        m.compute()
    m.load_state_dict(saved)
    assert m.results()["fbeta"] == pytest.approx(M.hierarchical_fbeta_score(t, p, zero_division=0.0, **kw))
    a, b = M.NodeF1(tax, zero_division=0.0), M.NodeF1(tax, zero_division=0.0)
    a.update(p[:10], t[:10])
    b.update(p[10:], t[10:])
    a.merge(b)
    full = M.NodeF1(tax, zero_division=0.0)
    full.update(p, t)
    assert a.results() == pytest.approx(full.results())
    assert m.to("cpu") is m
    with pytest.raises(ValueError, match="missing"):
        m.load_state_dict({})


def test_empty_batches_and_taxonomy_mismatch_in_stateful_metrics():
    tax = animal_tree()
    m = M.HierarchicalMetrics(tax, k=(1,))
    m.update([], [], y_score=np.zeros((0, tax.num_leaves)))  # a rank or batch without samples
    m.update(["dog"], ["cat"], y_score=np.array([[0.1, 0.8, 0.1]]))
    m.update(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert m.results()["mistake_severity"] == 2.0 and m.results()["accuracy"] == 0.0
    other = M.HierarchicalMetrics(diamond_dag(), k=(1,))
    with pytest.raises((ValueError, TypeError)):
        m.merge(other)
    with pytest.raises(ValueError, match="different taxonomies"):
        M.NodeF1(tax).merge(M.NodeF1(Taxonomy([("root", "a")])))
    with pytest.raises(ValueError, match="multilabel=True"):
        M.HierarchicalMetrics(tax).update([["cat"]], [["cat", "car"]])


def test_report_and_collection_agree_with_functions():
    rng = np.random.default_rng(11)
    tax = random_tree(30, rng)
    leaves = tax.leaves
    t = rng.choice(leaves, 40)
    scores = rng.random((40, len(leaves)))
    p = leaves[scores.argmax(1)]
    r = M.hierarchical_report(t, p, taxonomy=tax, y_score=scores, k=(1, 2), output_dict=True)
    kw = {"taxonomy": tax}
    assert r["accuracy"] == pytest.approx(np.mean(t == p))
    assert r["top1_accuracy"] == pytest.approx(r["accuracy"])
    assert r["hF1_micro"] == pytest.approx(M.hierarchical_f1_score(t, p, **kw))
    assert r["hF1_samples"] == pytest.approx(M.hierarchical_f1_score(t, p, average="samples", **kw))
    assert r["hF1_macro"] == pytest.approx(
        M.hierarchical_f1_score(t, p, average="macro", zero_division=0.0, labels="present", **kw)
    )
    assert r["mistake_severity"] == pytest.approx(M.mistake_severity(t, p, **kw))
    assert r["wu_palmer_loss"] == pytest.approx(M.wu_palmer_loss(t, p, **kw))
    assert r["zhao_loss"] == pytest.approx(M.zhao_loss(t, p, **kw))
    assert r["hdist@2"] == pytest.approx(M.average_hierarchical_distance_at_k(t, scores, k=2, **kw))
    assert r["semantic_accuracy"] == pytest.approx(M.semantic_accuracy_score(t, p, **kw))
    assert np.allclose(r["per_level_accuracy"], M.per_level_accuracy_score(t, p, **kw), equal_nan=True)
    coll = M.HierarchicalMetrics(tax, k=(1, 2))
    coll.update(p[:13], t[:13], y_score=scores[:13])
    coll.update(p[13:], t[13:], y_score=scores[13:])
    got = coll.results()
    assert got.keys() == r.keys()
    assert r["mistake_severity_distance"] == "lca_height"
    for key, val in r.items():
        assert got[key] == (val if isinstance(val, str) else pytest.approx(val, nan_ok=True)), key
    saved = coll.state_dict()
    coll.reset()
    coll.load_state_dict(saved)
    assert coll.results()["hF1_micro"] == pytest.approx(r["hF1_micro"])
    # multi-label: node sets, distance metrics left out
    ml = M.hierarchical_report([[1, 5], [2]], [[1], [2, 6]], taxonomy=tax, output_dict=True)
    assert "mistake_severity" not in ml and ml["hF1_micro"] == pytest.approx(
        M.hierarchical_f1_score([[1, 5], [2]], [[1], [2, 6]], taxonomy=tax)
    )


# ----------------------------------------------------------------------------- errors
def test_errors_name_the_parameter_and_the_expectation():
    tax = animal_tree()
    kw = {"taxonomy": tax}
    with pytest.raises(ValueError, match="y_true has 2 samples but y_pred has 1"):
        M.hierarchical_f1_score([1, 2], [1], **kw)
    with pytest.raises(TaxonomyError, match=r"y_pred\[1\].*unknown label 'kitten'"):
        M.hierarchical_f1_score(["cat", "dog"], ["cat", "kitten"], **kw)
    with pytest.raises(ValueError, match=r"shape \(2, 5\); expected \[B\] node ids or \[B, 7\] node sets.*animals"):
        M.hierarchical_f1_score(np.zeros((2, 5), dtype=bool), [1, 2], **kw)
    bad = np.zeros((1, 7), dtype=int)
    bad[0, 1] = 2
    with pytest.raises(ValueError, match=r"y_true\[0, 1\] = 2; node sets must hold only 0/1"):
        M.hierarchical_f1_score(bad, [1], **kw)
    with pytest.raises(ValueError, match=r"y_pred\[0, 2\] = nan; node sets must hold only 0/1"):
        M.hierarchical_f1_score([1], np.array([[0, 1, np.nan, 0, 0, 0, 0]]), **kw)
    with pytest.raises(ValueError, match=r"y_pred\[0\] = -1 is not a node id"):
        M.hierarchical_f1_score([1], [-1], **kw)
    with pytest.raises(ValueError, match=r"y_true\[1\] = 7 is not a node id.*\[-1, 7\)"):
        M.hierarchical_f1_score([1, 7], [1, 1], **kw)
    with pytest.raises(TypeError, match="must be integers"):
        M.hierarchical_f1_score(np.array([1.0, 2.0]), [1, 1], **kw)
    with pytest.raises(ValueError, match="average must be one of 'micro', 'macro', 'weighted', 'samples'; got 'bin'"):
        M.hierarchical_f1_score([1], [1], average="bin", **kw)
    with pytest.raises(ValueError, match="beta must be a finite number > 0; got -1"):
        M.hierarchical_fbeta_score([1], [1], beta=-1, **kw)
    with pytest.raises(ValueError, match="beta must be a finite number > 0; got inf"):
        M.hierarchical_fbeta_score([1], [1], beta=float("inf"), **kw)
    with pytest.raises(ValueError, match="zero_division must be"):
        M.hierarchical_f1_score([1], [1], zero_division=0.5, **kw)
    with pytest.raises(ValueError, match=r"sample_weight has shape \(1,\); expected \(2,\)"):
        M.hierarchical_f1_score([1, 2], [1, 2], sample_weight=[1.0], **kw)
    with pytest.raises(ValueError, match="non-negative"):
        M.hierarchical_f1_score([1], [1], sample_weight=[-1.0], **kw)
    with pytest.raises(TypeError, match=r"taxonomy must be a hiercls\.taxonomy\.Taxonomy"):
        M.hierarchical_f1_score([1], [1], taxonomy="animals")
    with pytest.raises(ValueError, match="single node ids"):
        M.mistake_severity(np.eye(7, dtype=bool)[[1]], [1], **kw)
    with pytest.raises(ValueError, match="distance must be one of"):
        M.mistake_severity([1], [2], distance="euclid", **kw)
    with pytest.raises(ValueError, match=r"scores has 4 columns; expected 3 .* or 7"):
        M.top_k_accuracy_score([2], np.zeros((1, 4)), **kw)
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 3\]"):
        M.top_k_accuracy_score([2], np.zeros((1, 3)), k=4, **kw)
    with pytest.raises(ValueError, match="no samples to score"):
        M.hierarchical_f1_score([-1], [1], **kw)
    with pytest.raises(ValueError, match=r"y_pred\[0, 2\] = 9 is not a node id"):
        M.nested_dice_score(np.zeros((1, 3), dtype=int), np.array([[0, 1, 9]]), **kw)
    with pytest.raises(ValueError, match="masks must lie in"):
        M.nested_dice_score(np.full((1, 1, 2), 2.0), np.zeros((1, 1, 2)))
    with pytest.raises(ValueError, match="empty_score must be"):
        M.nested_dice_score(np.zeros((1, 1, 2)), np.zeros((1, 1, 2)), empty_score=0.5)
    with pytest.raises(ValueError, match=r"needs taxonomy= .* or num_regions="):
        M.NestedDice()


def test_zero_division_warn():
    tax = animal_tree()
    with pytest.warns(M.UndefinedMetricWarning, match="ill-defined"):
        assert M.hierarchical_precision_score([0], [0], taxonomy=tax) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert M.hierarchical_precision_score([0], [0], taxonomy=tax, zero_division=1.0) == 1.0
        assert M.hierarchical_precision_score([0], [0], taxonomy=tax, include_root=True) == 1.0


def _published_semantic_accuracy(tax: Taxonomy, logits: np.ndarray, y: np.ndarray) -> float:
    """Ridnik et al.'s ``AccuracySemanticSoftmaxMet`` (Alibaba-MIIL/ImageNet21K) restated: the levels are the class
    depths 0 .. max_depth - 1 (the deepest depth is left out) holding more than one class; each level predicts
    the argmax of its classes' logits; micro accuracy over the (sample, level) pairs where the truth has a class."""
    classes = np.arange(1, tax.num_nodes)  # every non-root node is a class
    depth = tax.depth - 1  # class depth: 0 for the root's children
    correct = valid = 0
    for d in range(int(depth[classes].max())):
        members = classes[depth[classes] == d]
        if len(members) <= 1:
            continue
        pred = members[logits[:, members].argmax(1)]
        for b, node in enumerate(y):
            while node > 0 and depth[node] > d:
                node = tax.parent[node]
            if node > 0 and depth[node] == d:
                valid += 1
                correct += int(pred[b] == node)
    return correct / valid


def test_level_argmax_accuracy_drop_deepest_level_is_the_published_metric():
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b"), ("b", "z")])
    a, x, y, b, z = (tax.index(n) for n in "axybz")
    lp = np.array([[a, y], [b, x], [b, z], [b, z]])
    truth = ["x", "x", "b", "z"]
    # by hand, levels (a|b, x|y|z): x -> (a ok, y wrong), x -> (b wrong, x ok), b -> (b ok, no level 2), z -> (ok, ok)
    assert M.level_argmax_accuracy_score(truth, lp, taxonomy=tax) == pytest.approx(5 / 7)
    assert M.level_argmax_accuracy_score(truth, lp, taxonomy=tax, drop_deepest_level=True) == pytest.approx(3 / 4)
    assert M.level_argmax_accuracy_score(truth, lp[:, :1], taxonomy=tax, drop_deepest_level=True) == 0.75
    with pytest.raises(ValueError, match="two semantic levels"):
        M.level_argmax_accuracy_score(["a"], np.array([[1]]), taxonomy=Taxonomy([("r", "a")]), drop_deepest_level=True)
    rng = np.random.default_rng(29)
    for _ in range(5):
        tax = random_tree(40, rng)
        logits = rng.random((30, tax.num_nodes))
        ids = rng.integers(1, tax.num_nodes, 30)
        levels = tax.semantic_level
        lp = np.stack(
            [np.flatnonzero(levels == k)[logits[:, levels == k].argmax(1)] for k in range(int(levels.max()) + 1)], 1
        )
        want = _published_semantic_accuracy(tax, logits, ids)
        got = M.level_argmax_accuracy_score(ids, lp, taxonomy=tax, drop_deepest_level=True)
        assert got == pytest.approx(want, rel=1e-12)

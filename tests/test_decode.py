"""Single-node decoders against straightforward per-sample references and brute-force Bayes risks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from _generators import ancestor_indicator, nx_tree_distance, random_label_distribution, random_taxonomy, sample_case

from hiercls.decode import (
    RULES,
    SET_RULES,
    ProbabilityError,
    argmax_leaf,
    bayes,
    bayes_node,
    calibrate_info_gain,
    check_probabilities,
    crm,
    decode,
    expected_cost,
    hie,
    info_gain,
    inputs,
    majority,
    max_info,
    plurality,
    threshold,
    top_down,
)
from hiercls.decode.inputs import key_value, order_key
from hiercls.taxonomy import Taxonomy, TaxonomyError


# ------------------------------------------------------------------------------------------ references
def ref_argmax_leaf(tax, row):
    best = None
    for n in range(tax.num_nodes):
        if not tax.children(n) and (best is None or row[n] > row[best]):
            best = n
    return best


def ref_top_down(tax, row, t=0.0):
    cur = 0
    while tax.children(cur):
        kids = sorted(tax.children(cur))
        c = max(kids, key=lambda k: (row[k], -k))
        cond = row[c] / row[cur] if row[cur] > 0 else 0.0
        if cond < t or row[c] <= 0:
            break
        cur = c
    return cur


def ref_plurality(tax, row, stop):
    # Plaud et al.'s recursion: running max of the second-best child probability along the greedy path.
    cur, m = 0, 0.0
    while tax.children(cur):
        kids = sorted(tax.children(cur))
        c = max(kids, key=lambda k: (row[k], -k))
        if len(kids) > 1:
            m = max(m, max(row[k] for k in kids if k != c))
            if row[c] < m - 1e-9:
                break
        if row[c] <= 0:
            break
        cur = c
    return cur


def ref_deepest_above(tax, row, t, key):
    best = 0
    found = False
    for n in range(tax.num_nodes):
        if row[n] > t and (not found or (key[n], row[n]) > (key[best], row[best])):
            best, found = n, True
    return best


def ref_info_gain(tax, row, lam):
    leaves_under = [sum(1 for d in [n, *tax.descendants(n)] if not tax.children(d)) for n in range(tax.num_nodes)]
    nl = tax.num_leaves
    scores = [(math.log(nl) - math.log(leaves_under[n]) + lam) * row[n] for n in range(tax.num_nodes)]
    return int(np.argmax(scores))


# ------------------------------------------------------------------------------------------ rules
def test_simple_rules_match_per_sample_references() -> None:
    rng = np.random.default_rng(0)
    for _ in range(400):
        dag = bool(rng.random() < 0.3)
        tax, _a, p, node = sample_case(rng, dag=dag)
        depth = tax.depth.astype(float)
        ic = tax.information_content
        t = float(rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]))
        lam = float(rng.choice([0.0, 0.5, 3.0]))
        got = {
            "argmax_leaf": argmax_leaf(node, tax),
            "top_down": top_down(node, tax),
            "top_down_t": top_down(node, tax, threshold=t),
            "threshold": threshold(node, tax, threshold=t),
            "majority": majority(node, tax),
            "max_info": max_info(node, tax, threshold=t),
            "info_gain": info_gain(node, tax, lam=lam),
            "plurality": plurality(node, tax),
        }
        for b, row in enumerate(node):
            want = {
                "argmax_leaf": ref_argmax_leaf(tax, row),
                "top_down": ref_top_down(tax, row),
                "top_down_t": ref_top_down(tax, row, t),
                "threshold": ref_deepest_above(tax, row, t, depth),
                "majority": ref_deepest_above(tax, row, 0.5, depth),
                "max_info": ref_deepest_above(tax, row, t, ic),
                "info_gain": ref_info_gain(tax, row, lam),
                "plurality": ref_plurality(tax, row, p[b]),
            }
            for k in want:
                assert int(got[k][b]) == want[k], (k, row.tolist(), tax.edge_list(names=True))


def test_hie_matches_reference() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        tax, _, _, node = sample_case(rng)
        if tax.num_nodes == 1:
            continue
        level = rng.choice([None, *range(min(2, tax.height) + 1)])
        got = hie(node, tax, level=None if level is None else int(level))
        with pytest.raises(ValueError, match=rf"level must be a depth in \[0, {tax.height}\]"):
            hie(node, tax, level=tax.height + 1)  # issue 28: a level past the deepest node is a mistake
        for b, row in enumerate(node):
            best, score = None, -1.0
            for leaf in tax.leaves:
                path = tax.path(int(leaf))
                coarse = path[-2] if level is None else path[min(int(level), len(path) - 1)]
                s = row[leaf] * row[coarse]
                if s > score:
                    best, score = int(leaf), s
            assert int(got[b]) == best


def test_threshold_root_only_and_empty_batch() -> None:
    tax = Taxonomy([("r", "a"), ("r", "b")])
    root_only = np.array([[1.0, 0.0, 0.0]])
    for rule in RULES:
        out = decode(root_only, tax, rule)
        if rule in SET_RULES:
            assert out.tolist() == [[True, False, False]], rule
        elif rule not in ("argmax_leaf", "hie", "crm"):
            assert out.tolist() == [0], rule
        empty = decode(np.zeros((0, 3)), tax, rule)
        assert empty.shape[0] == 0
    assert threshold(np.array([[1.0, 0.6, 0.4]]), tax, threshold=1.0).tolist() == [0]
    single = Taxonomy([], nodes=["only"])
    assert threshold(np.ones((2, 1)), single).tolist() == [0, 0]
    assert argmax_leaf(np.ones((2, 1)), single).tolist() == [0, 0]


def test_input_validation_messages(small_tree: Taxonomy) -> None:
    tax = small_tree
    with pytest.raises(ValueError, match=r"unknown decoder 'nope'; valid: argmax_leaf"):
        decode(np.ones((1, 5)), tax, "nope")
    with pytest.raises(ValueError, match=r"\[B, 5\]"):
        argmax_leaf(np.ones((2, 4)), tax)
    with pytest.raises(ValueError, match=r"leaf probabilities \[B, num_leaves\]"):
        argmax_leaf(np.ones((2, 5)), tax, leaf_probs=True)
    with pytest.raises(ValueError, match="NaN"):
        decode(np.full((1, 5), np.nan), tax, check=False)
    with pytest.raises(ValueError, match=r"row 0: node 'r' \(id 0\) is nan"):
        argmax_leaf(np.full((1, 5), np.nan), tax)
    with pytest.raises(ValueError, match="negative"):
        decode(-np.ones((1, 5)), tax, check=False)
    with pytest.raises(ValueError, match=r"expected a value in \[0, 1\]"):
        argmax_leaf(-np.ones((1, 5)), tax)
    ok = np.array([[1.0, 0.6, 0.3, 0.3, 0.4]])  # valid probabilities: these cases test the options
    with pytest.raises(TypeError, match="taxonomy"):
        argmax_leaf(ok, "tree")
    with pytest.raises(ValueError, match="threshold"):
        threshold(ok, tax, threshold=1.5)
    with pytest.raises(ValueError, match="lam"):
        info_gain(ok, tax, lam=-1)
    with pytest.raises(ValueError, match="cost must be one of"):
        bayes_node(ok, tax, "euclid")
    with pytest.raises(ValueError, match=r"cost matrix must be \[N, L\]"):
        bayes_node(ok, tax, np.ones((5, 2)))
    with pytest.raises(ValueError, match="internal nodes"):
        bayes_node(np.array([[1.0, 1.0, 0.0, 0.0, 0.0]]), tax, np.ones((5, 3)))
    with pytest.raises(ValueError, match="candidates"):
        bayes_node(ok, tax, candidates="some")
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x")])
    with pytest.raises(TaxonomyError, match="tree"):
        hie(np.ones((1, 4)), dag)


# ------------------------------------------------------------------------------------------ Bayes
@pytest.mark.parametrize("kind", ["shortest_path", "lca_height", "wu_palmer", "wu_palmer_root1", "zhao", "ic_distance"])
def test_bayes_node_matches_brute_force(kind: str) -> None:
    rng = np.random.default_rng(hash(kind) % 1000)
    for _ in range(300):
        tax, _, p, node = sample_case(rng)
        dist = nx_tree_distance(tax, kind)
        risk = p @ dist.T  # [B, N]: expected cost of predicting each node
        ids, cost = bayes_node(node, tax, kind, return_cost=True)
        np.testing.assert_allclose(cost, risk.min(1), atol=1e-9)
        np.testing.assert_allclose(risk[np.arange(len(ids)), ids], risk.min(1), atol=1e-9)
        np.testing.assert_allclose(expected_cost(node, tax, kind), risk, atol=1e-9)
        leaves = tax.leaves
        lid, lcost = crm(node, tax, kind, return_cost=True)
        assert np.isin(lid, leaves).all()
        np.testing.assert_allclose(lcost, risk[:, leaves].min(1), atol=1e-9)


@pytest.mark.parametrize("kind", ["wu_palmer", "wu_palmer_root1", "zhao"])
def test_ratio_costs_match_the_distance_matrix_with_a_chain_under_the_root(kind: str) -> None:
    """The closed form of the ratio kinds groups labels by f(y); a chain below the root has IC 0 throughout,
    where zhao's 0/0 is defined as 0: label mass on internal nodes, several groups, and that case at once."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(4, 25))
        par = [-1, 0, 1] + [int(rng.integers(1, i)) for i in range(3, n)]  # root -> 1 -> 2 -> ...: a chain on top
        tax = Taxonomy([(str(par[i]), str(i)) for i in range(1, n)])
        lab = rng.dirichlet(np.full(n, 0.3), size=4)
        lab[:, rng.random(n) < 0.3] = 0.0
        lab[:, n - 1] += 1e-3
        lab /= lab.sum(1, keepdims=True)
        node = lab @ tax.ancestors_sparse.toarray()  # P(label under-or-at n)
        want = lab @ tax.distance_matrix(kind, targets=np.arange(n)).T
        np.testing.assert_allclose(expected_cost(node, tax, kind), want, atol=1e-9)


def test_bayes_node_on_dags_and_custom_matrices() -> None:
    rng = np.random.default_rng(8)
    for _ in range(150):
        tax, _, p, node = sample_case(rng, dag=True)
        kind = str(rng.choice(["shortest_path", "lca_height", "wu_palmer", "wu_palmer_root1", "zhao", "ic_distance"]))
        dist = np.array([[float(tax.distance(a, b, kind)) for b in range(tax.num_nodes)] for a in range(tax.num_nodes)])
        _, cost = bayes_node(node, tax, kind, return_cost=True)
        np.testing.assert_allclose(cost, (p @ dist.T).min(1), atol=1e-9)
        # an arbitrary node-to-label matrix
        mat = rng.random((tax.num_nodes, tax.num_nodes))
        ids, cost = bayes_node(node, tax, mat, return_cost=True, candidates="all")
        np.testing.assert_allclose(cost, (p @ mat.T).min(1), atol=1e-9)
    # node-to-leaf matrices with leaf-only labels
    tax = random_taxonomy(rng, 8)
    leaf = rng.dirichlet(np.ones(tax.num_leaves), size=4)
    mat = rng.random((tax.num_nodes, tax.num_leaves))
    ids, cost = bayes_node(leaf, tax, mat, leaf_probs=True, return_cost=True)
    np.testing.assert_allclose(cost, (leaf @ mat.T).min(1), atol=1e-9)
    sub = [int(tax.leaves[0]), 0]
    ids = bayes_node(leaf, tax, mat, leaf_probs=True, candidates=sub)
    assert set(ids.tolist()) <= set(sub)


def test_calibrate_info_gain_reaches_target() -> None:
    rng = np.random.default_rng(6)
    tax = random_taxonomy(rng, 9)
    while tax.num_leaves < 3:
        tax = random_taxonomy(rng, 9)
    logits = rng.normal(size=(300, tax.num_leaves)) * 2
    leaf = np.exp(logits)
    leaf /= leaf.sum(1, keepdims=True)
    labels = np.array([tax.leaves[rng.choice(tax.num_leaves, p=row)] for row in leaf])
    node = np.asarray(tax.marginals(leaf))
    anc = tax.ancestors_sparse

    def acc(lam):
        pred = info_gain(node, tax, lam=lam)
        return np.asarray(anc[labels, pred]).ravel().astype(bool).mean()

    accs = [acc(lam) for lam in (0.0, 0.3, 1.0, 3.0, 10.0, 100.0)]
    assert all(x <= y + 1e-12 for x, y in itertools.pairwise(accs))  # monotone in lambda (Deng et al.)
    for target in (0.6, 0.8, 0.95):
        lam = calibrate_info_gain(node, labels, tax, target_accuracy=target)
        assert acc(lam) >= target
        if lam > 0:  # the smallest such lambda, up to the bisection tolerance (1e-4 relative)
            assert acc(lam - 1e-3 * max(1.0, lam)) < target


def test_row_blocks_do_not_change_results(monkeypatch) -> None:

    rng = np.random.default_rng(12)
    tax = random_taxonomy(rng, 9)
    node = random_label_distribution(rng, 9, tax.leaves, 50) @ ancestor_indicator(tax)
    ref = {rule: decode(node, tax, rule) for rule in RULES}
    monkeypatch.setattr(inputs, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(bayes, "CHUNK_ELEMENTS", 1)
    for rule in RULES:
        np.testing.assert_array_equal(decode(node, tax, rule), ref[rule], err_msg=rule)
        np.testing.assert_array_equal(decode(torch.from_numpy(node), tax, rule).numpy(), ref[rule], err_msg=rule)
    for cost in ("zhao", "wu_palmer"):  # the NumPy formulations, in blocks of one row
        ids, value = bayes_node(node, tax, cost, return_cost=True)
        monkeypatch.undo()
        want = bayes_node(node, tax, cost, return_cost=True)
        assert np.array_equal(ids, want[0]) and np.allclose(value, want[1])
        monkeypatch.setattr(inputs, "CHUNK_ELEMENTS", 1)
        monkeypatch.setattr(bayes, "CHUNK_ELEMENTS", 1)
    bad = node.copy()
    bad[37, 0] = 0.5
    with pytest.raises(ValueError, match="row 37"):
        bayes_node(bad, tax, "zhao")


def test_inputs_are_never_modified() -> None:
    rng = np.random.default_rng(13)
    tax = random_taxonomy(rng, 9)
    a = ancestor_indicator(tax)
    for rows in (1, 5):
        node = random_label_distribution(rng, 9, tax.leaves, rows) @ a
        leaf = rng.dirichlet(np.ones(tax.num_leaves), size=rows)
        for rule in RULES:
            for arr, lp in ((node, False), (leaf, True)):
                before = arr.copy()
                decode(arr, tax, rule, leaf_probs=lp)
                np.testing.assert_array_equal(arr, before, err_msg=rule)


def test_float32_edge_check_decides_as_float64_at_the_tolerance() -> None:
    """The row check takes a float32 child's excess over its parent in float32: near the tolerance that
    difference is exact or within 1e-11, so rows a hair inside the tolerance pass and rows a hair outside are
    refused, as the float64 difference of the same values decides (parents from 1e-6 to 1, both sides)."""
    tax = Taxonomy([("r", "a"), ("a", "x"), ("r", "b")])
    tol = 1e-4 + 2.0**-23  # atol plus float32's epsilon, one term
    rng = np.random.default_rng(5)
    for parent in np.concatenate([10.0 ** -rng.uniform(0, 6, size=300), [1.0 - tol, 0.5]]):
        for side in (-1.0, 1.0):
            p32 = np.float32(parent)
            c32 = np.float32(float(p32) + tol + side * 1e-9)
            excess = float(c32) - float(p32)
            if abs(excess - tol) < 1e-10 or c32 > 1.0:
                continue
            row = np.array([[1.0, p32, c32, 1.0 - p32]], dtype=np.float32)
            if excess > tol:
                with pytest.raises(ProbabilityError, match="never more likely than its parent"):
                    check_probabilities(row, tax)
            else:
                check_probabilities(row, tax)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_range_check_decides_at_the_bounds_as_float64(dtype) -> None:
    """The row check screens the range in float32 against bounds loosened by a millionth and decides flagged rows
    in float64: the values next to each bound (either side, in the row's dtype) pass or fail as ``lo <= v <= hi``
    does in float64: :func:`check_probabilities` (``[-(atol + eps), 1 + atol + eps]``), a decoder (``lo = -1e-6``)
    and a decoder with the checks off (``lo = -1e-6``, no upper bound)."""
    tax = Taxonomy([("r", "a"), ("r", "b")])
    eps = max(float(np.finfo(dtype).eps), 2.0**-23)
    hi = 1.0 + 1e-4 + eps
    cases = (
        (lambda row: check_probabilities(row, tax), -(1e-4 + eps), hi),
        (lambda row: decode(row, tax, "argmax_leaf"), -1e-6, hi),
        (lambda row: decode(row, tax, "argmax_leaf", check=False), -1e-6, np.inf),
    )
    for run, lo, top in cases:
        for bound in (lo, top):
            if not np.isfinite(bound):
                continue
            near = dtype(bound)
            for v in (near, np.nextafter(near, dtype(np.inf)), np.nextafter(near, dtype(-np.inf))):
                row = np.array([[1.0, 0.0, 0.0]], dtype=dtype)
                row[0, 2 if bound < 0.5 else 1] = v  # a column whose parent (the root) is 1
                if lo <= float(v) <= top:
                    run(row)
                else:
                    with pytest.raises(ValueError, match=r"negative|expected a value in"):
                        run(row)


def test_order_key_orders_as_the_floats() -> None:
    """The kernels' maxima are taken over :func:`order_key`: sorting by it sorts the floats (signs, zeros, inf)."""
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.normal(size=200) * 10.0 ** rng.integers(-300, 300, size=200), [0.0, np.inf, -np.inf]])
    keys = np.array([order_key(v) for v in values])
    np.testing.assert_array_equal(values[np.argsort(keys, kind="stable")], np.sort(values))
    assert all(key_value(k) == v for k, v in zip(keys, values, strict=True))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_threshold_compares_as_float64_at_the_threshold(dtype) -> None:
    """``threshold`` compares each value with the threshold in the rows' dtype (against the largest value of it
    not above the threshold): a value just above, at or just below a threshold that the dtype cannot hold (0.3)
    or can (0.5) qualifies exactly when ``float(v) > threshold``."""
    tax = Taxonomy([("r", "a"), ("a", "x"), ("r", "b")])
    for t in (0.3, 0.5):
        near = np.asarray(t, dtype=dtype)
        for v in (near, np.nextafter(near, dtype(1)), np.nextafter(near, dtype(0))):
            row = np.array([[1.0, 0.9, v, 0.1]], dtype=dtype)
            assert int(threshold(row, tax, threshold=t)[0]) == (2 if float(v) > t else 1), (t, float(v))

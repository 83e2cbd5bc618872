"""Decoders read node-major (Fortran-order) arrays, what :meth:`Taxonomy.marginals` returns, through the same
kernels by strides: the answers and the refusals (row and node named) are the row-major ones, also where the
NumPy formulations work in row blocks and the check's tolerance follows the input dtype."""

from __future__ import annotations

import numpy as np
import pytest
from _generators import random_tree, sample_case

from hiercls.decode import RULES, ProbabilityError, check_probabilities, decode
from hiercls.taxonomy import Taxonomy

OPTIONS = [
    ("bayes_node", {"cost": "lca_height"}),
    ("bayes_node", {"candidates": "leaves"}),
    ("top_down", {"threshold": 0.6}),
    ("threshold", {"threshold": 0.3}),
    ("max_info", {"threshold": 0.7}),
    ("info_gain", {"lam": 2.0}),
    ("hie", {"level": 1}),
]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_fortran_order_input_decodes_as_row_major(rule: str) -> None:
    rng = np.random.default_rng(21)
    for _ in range(40):
        tax, _a, _p, node = sample_case(rng, batch=int(rng.integers(2, 7)))  # quantised: many exact ties
        for arr in (node, node.astype(np.float32)):
            want = decode(np.ascontiguousarray(arr), tax, rule)
            got = decode(np.asfortranarray(arr), tax, rule)
            np.testing.assert_array_equal(got, want)
    # big enough for several blocks of the chunked decoders and of the check
    tax = random_tree(300, rng)
    node = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.2), size=2500)), dtype=np.float32)
    assert node.flags.f_contiguous
    np.testing.assert_array_equal(decode(node, tax, rule), decode(np.ascontiguousarray(node), tax, rule))


@pytest.mark.parametrize(("rule", "options"), OPTIONS)
def test_fortran_order_with_options(rule: str, options: dict) -> None:
    rng = np.random.default_rng(22)
    tax = random_tree(120, rng)
    node = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.3), size=300)))
    np.testing.assert_array_equal(
        decode(node, tax, rule, **options), decode(np.ascontiguousarray(node), tax, rule, **options)
    )


def _broken(kind: str, node: np.ndarray, row: int) -> np.ndarray:
    bad = node.copy()
    if kind == "nan":
        bad[row, 3] = np.nan
    elif kind == "range":
        bad[row, 5] = 1.5
    elif kind == "root":
        bad[row, 0] = 0.9
    elif kind == "edge":
        child = int(np.flatnonzero(bad[row, 1:] < 0.3)[0]) + 1
        bad[row, child] = min(1.0, bad[row, child] + 0.5)
    return bad


@pytest.mark.parametrize("kind", ["nan", "range", "root", "edge"])
def test_refusals_name_the_same_culprit_in_every_layout(kind: str) -> None:
    rng = np.random.default_rng(23)
    tax = random_tree(200, rng)
    node = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.3), size=3000)), dtype=np.float32)
    for row in (0, 1700, 2999):
        bad = _broken(kind, np.ascontiguousarray(node), row)
        messages = set()
        for arr in (bad, np.asfortranarray(bad)):
            with pytest.raises(ProbabilityError) as err:
                check_probabilities(arr, tax)
            messages.add(str(err.value))
            for rule in ("argmax_leaf", "bayes_node", "threshold", "optimal_hfbeta"):
                with pytest.raises(ProbabilityError) as err:
                    decode(arr, tax, rule)
                messages.add(str(err.value))
        assert len(messages) == 1, messages
        assert f"row {row}:" in messages.pop()


def test_checks_off_still_refuse_nan_and_negatives_in_every_layout() -> None:
    rng = np.random.default_rng(24)
    tax = random_tree(50, rng)
    node = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.3), size=40)))
    for arr in (node, np.ascontiguousarray(node)):
        bad = arr.copy()
        bad[7, 3] = np.inf
        with pytest.raises(ValueError, match="NaN or infinite"):
            decode(bad, tax, "argmax_leaf", check=False)
        bad[7, 3] = -0.01
        with pytest.raises(ValueError, match="negative"):
            decode(bad, tax, "argmax_leaf", check=False)
        bad[7, 3] = arr[7, 3]
        bad[7, tax.leaves[0]] = -5e-5  # within the check's tolerance, below the decoders' -1e-6
        with pytest.raises(ValueError, match="negative"):
            decode(bad, tax, "argmax_leaf")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_check_tolerance_follows_the_dtype(dtype: type) -> None:
    """A child above its parent by a few units of the dtype's round-off passes; by 10x the tolerance it does not."""
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    eps = max(float(np.finfo(dtype).eps), 2.0**-23)
    node = np.array([[1.0, 0.5, 0.25, 0.25, 0.5]])
    node[0, 2] += 0.5 * (1e-4 + eps)  # x above a by half the edge tolerance: labels a, x, y still sum to a's mass
    check_probabilities(node.astype(dtype), tax)
    bad = node.copy()
    bad[0, 2] = 0.5 + 10 * (1e-4 + eps)
    with pytest.raises(ProbabilityError, match=r"node 'x' \(id 2\)"):
        check_probabilities(bad.astype(dtype), tax)

"""Decoders on node-major (Fortran-order) arrays and on torch tensors give the NumPy row-major answers.

The NumPy decoders and the probability check take a node-major path when the input is laid out node by node
(:meth:`Taxonomy.marginals` returns such arrays); the torch paths of the tree rules, the label-set rules and
the Bayes closed forms stay on the tensor's device (CPU tensors take them only with ``TORCH_KERNELS_ON_CPU``, set here;
by default they are read as NumPy arrays). Both are checked against the plain row-major NumPy path, and
the refusals against the same messages.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hiercls.decode import RULES, SET_RULES, ProbabilityError, check_probabilities, decode
from hiercls.taxonomy import Taxonomy
from tests.test_decode import sample_case

TORCH_NATIVE = sorted(RULES)


def _tree(n: int, rng: np.random.Generator) -> Taxonomy:
    return Taxonomy([(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, n)])


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
    tax = _tree(300, rng)
    node = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.2), size=2500)), dtype=np.float32)
    assert node.flags.f_contiguous
    np.testing.assert_array_equal(decode(node, tax, rule), decode(np.ascontiguousarray(node), tax, rule))


@pytest.mark.parametrize(("rule", "options"), OPTIONS)
def test_fortran_order_with_options(rule: str, options: dict) -> None:
    rng = np.random.default_rng(22)
    tax = _tree(120, rng)
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
    tax = _tree(200, rng)
    node = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.3), size=3000)), dtype=np.float32)
    for row in (0, 1700, 2999):
        bad = _broken(kind, np.ascontiguousarray(node), row)
        messages = set()
        for arr in (bad, np.asfortranarray(bad)):
            with pytest.raises(ProbabilityError) as err:
                check_probabilities(arr, tax)
            messages.add(str(err.value))
            for rule in ("argmax_leaf", "bayes_node", "threshold"):
                with pytest.raises(ProbabilityError) as err:
                    decode(arr, tax, rule)
                messages.add(str(err.value))
        assert len(messages) == 1, messages
        assert f"row {row}:" in messages.pop()


def test_checks_off_still_refuse_nan_and_negatives_in_every_layout() -> None:
    rng = np.random.default_rng(24)
    tax = _tree(50, rng)
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


def _refuse(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("host round trip (.cpu() / .numpy()) in a decoder's torch path")


@pytest.mark.parametrize("rule", sorted(RULES))
def test_cpu_tensors_decode_through_numpy_by_default(rule: str) -> None:
    rng = np.random.default_rng(27)
    tax = _tree(50, rng)
    node = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.3), size=9)))
    for arr in (node, node.astype(np.float32)):
        got = decode(torch.as_tensor(arr), tax, rule)
        assert isinstance(got, torch.Tensor) and got.device.type == "cpu"
        assert got.dtype == (torch.bool if rule in SET_RULES else torch.int64)
        np.testing.assert_array_equal(got.numpy(), decode(arr, tax, rule))


@pytest.mark.usefixtures("torch_kernels_on_cpu")
@pytest.mark.parametrize("rule", TORCH_NATIVE)
def test_torch_rules_stay_on_the_device_and_equal_numpy(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(25)
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y"), ("b", "z"), ("y", "w")])
    cases = []
    for _ in range(15):
        tax, _a, p, node = sample_case(rng, batch=5)
        cases.append((tax, node, p))
    tax = _tree(60, rng)
    leaf = rng.dirichlet(np.full(tax.num_leaves, 0.3), size=20)
    cases.append((tax, np.asarray(tax.marginals(leaf)), None))
    if rule in (
        "top_down",
        "plurality",
        "threshold_set",
        "chmcnn",
        "threshold",
        "majority",
        "max_info",
        "optimal_hfbeta",
    ):
        leaf = rng.dirichlet(np.ones(dag.num_leaves), size=6)
        cases.append((dag, np.asarray(dag.marginals(leaf)), None))
    opts = [{}] + [o for r, o in OPTIONS if r == rule]
    for tax, node, _p in cases:
        for o in opts:
            for arr in (node, node.astype(np.float32), node[:0]):
                want = decode(arr, tax, rule, **o)
                with monkeypatch.context() as m:
                    m.setattr(torch.Tensor, "cpu", _refuse)
                    m.setattr(torch.Tensor, "numpy", _refuse)
                    got = decode(torch.as_tensor(arr), tax, rule, **o)
                assert isinstance(got, torch.Tensor)
                assert got.dtype == (torch.bool if rule in SET_RULES else torch.int64)
                np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{rule} {o} {arr.dtype}")
    # leaf probabilities in
    tax = _tree(40, rng)
    leaf = rng.dirichlet(np.full(tax.num_leaves, 0.3), size=12)
    want = decode(leaf, tax, rule, leaf_probs=True)
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "cpu", _refuse)
        m.setattr(torch.Tensor, "numpy", _refuse)
        got = decode(torch.as_tensor(leaf), tax, rule, leaf_probs=True)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.usefixtures("torch_kernels_on_cpu")
@pytest.mark.parametrize("rule", ["bayes_node", "crm", "top_down", "plurality", "threshold_set", "chmcnn"])
def test_torch_refusals_match_numpy(rule: str) -> None:
    rng = np.random.default_rng(26)
    tax = _tree(30, rng)
    node = np.asarray(tax.marginals(rng.dirichlet(np.full(tax.num_leaves, 0.3), size=8)))
    with pytest.raises(ValueError, match=r"expected a value in \[0, 1\]"):
        decode(torch.as_tensor(node) + 1.5, tax, rule)
    with pytest.raises(ValueError, match="nan, expected a finite probability"):
        decode(torch.full((2, tax.num_nodes), float("nan")), tax, rule)
    with pytest.raises(ValueError, match="negative"):
        decode(torch.as_tensor(node) - 0.5, tax, rule, check=False)
    if rule in ("bayes_node", "crm"):  # children summing to more than their parent: refused as on NumPy
        bad = np.ascontiguousarray(node)
        kids = np.flatnonzero(tax.parent == 0)
        bad[:, kids] = np.minimum(1.0, bad[:, kids] * 1.5 + 0.1)
        with pytest.raises(ProbabilityError) as want:
            decode(bad, tax, rule)
        with pytest.raises(ProbabilityError) as got:
            decode(torch.as_tensor(bad), tax, rule)
        assert str(got.value) == str(want.value)

"""The compiled per-row kernels (``hiercls/decode/_kernels.py``) give the NumPy path's answers and refusals.

Row-major tree inputs (a head's ``[B, N]`` output) are decoded by the kernels; the reference is the same call with
``ROW_KERNELS`` off, which takes the vectorised NumPy path. Inputs: random trees of several shapes, random and
quantised posteriors (exact ties), float32 and float64, checks on and off, every rule and its options; the
kernels must also leave every invalid row to the NumPy path so that the refusal names the same row and node.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hiercls.decode._rows as rows_mod
from hiercls.decode import RULES, ProbabilityError, decode
from hiercls.decode import rules as rules_mod
from hiercls.taxonomy import Taxonomy, load_taxonomy

KERNEL_RULES = sorted(set(RULES) - {"optimal_hfbeta"})

OPTIONS = [
    ("bayes_node", {"cost": "lca_height"}),
    ("bayes_node", {"candidates": "leaves"}),
    ("bayes_node", {"candidates": "classes"}),
    ("bayes_node", {"cost": "lca_height", "candidates": "leaves"}),
    ("top_down", {"threshold": 0.6}),
    ("threshold", {"threshold": 0.3}),
    ("threshold", {"threshold": 1.0}),
    ("max_info", {"threshold": 0.7}),
    ("info_gain", {"lam": 2.0}),
    ("hie", {"level": 1}),
    ("hie", {"level": 3}),
    ("threshold_set", {"threshold": 0.2}),
    ("chmcnn", {"threshold": 0.05}),
]


def _shapes(rng: np.random.Generator) -> list[Taxonomy]:
    """Bushy, deep, chain-like and star-like trees."""
    bushy = [(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, 150)]
    deep = [(f"n{int(rng.integers(max(0, i - 3), i))}", f"n{i}") for i in range(1, 120)]
    chain = [(f"n{i - 1}", f"n{i}") for i in range(1, 30)] + [("n29", "x"), ("n10", "y")]
    star = [("r", f"s{i}") for i in range(200)] + [("s0", "t0"), ("s0", "t1")]
    return [Taxonomy(e) for e in (bushy, deep, chain, star)]


def _posteriors(tax: Taxonomy, rng: np.random.Generator, batch: int, quantised: bool) -> np.ndarray:
    """Row-major node probabilities; ``quantised``: leaf masses on a grid of 1/8, with many exact ties."""
    if quantised:
        counts = rng.multinomial(8, rng.dirichlet(np.full(tax.num_leaves, 0.3)), size=batch)
        leaf = counts / 8.0
    else:
        leaf = rng.dirichlet(np.full(tax.num_leaves, 0.2), size=batch)
    return np.ascontiguousarray(tax.marginals(leaf))


def _both(monkeypatch: pytest.MonkeyPatch, fn: object) -> tuple[object, object]:
    got = fn()
    monkeypatch.setattr(rows_mod, "ROW_KERNELS", False)
    want = fn()
    monkeypatch.setattr(rows_mod, "ROW_KERNELS", True)
    return got, want


@pytest.mark.parametrize("rule", KERNEL_RULES)
def test_kernels_equal_the_numpy_path(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    for tax in _shapes(rng):
        for quantised in (False, True):
            node = _posteriors(tax, rng, 64, quantised)
            for arr in (node, node.astype(np.float32)):
                for check in (True, False):
                    got, want = _both(monkeypatch, lambda a=arr, c=check, t=tax: decode(a, t, rule, check=c))
                    np.testing.assert_array_equal(got, want, err_msg=f"{rule} on {tax.num_nodes} nodes")


@pytest.mark.parametrize(("rule", "options"), OPTIONS)
def test_kernels_with_options(rule: str, options: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    for tax in _shapes(rng):
        node = _posteriors(tax, rng, 80, quantised=bool(rng.integers(2))).astype(np.float32)
        got, want = _both(monkeypatch, lambda t=tax, a=node: decode(a, t, rule, **options))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("tree", ["imagenet1k_tree", "imagenet21k_winter21"])
def test_kernels_on_the_shipped_trees(tree: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tax = load_taxonomy(tree)
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(96, tax.num_leaves)) * rng.choice([1.0, 4.0, 12.0], size=(96, 1))
    leaf = np.exp(logits - logits.max(1, keepdims=True))
    node = np.ascontiguousarray(tax.marginals(leaf / leaf.sum(1, keepdims=True)), dtype=np.float32)
    for rule in KERNEL_RULES:
        got, want = _both(monkeypatch, lambda r=rule: decode(node, tax, r))
        np.testing.assert_array_equal(got, want, err_msg=rule)


def test_row_major_input_takes_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the NumPy path's input conversion made to fail, row-major trees still decode: the kernels ran."""
    rng = np.random.default_rng(8)
    tax = _shapes(rng)[0]
    node = _posteriors(tax, rng, 20, quantised=False).astype(np.float32)
    want = {rule: decode(node, tax, rule) for rule in KERNEL_RULES}

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the NumPy path ran")

    for module in ("hiercls.decode.rules", "hiercls.decode.bayes", "hiercls.decode.sets"):
        monkeypatch.setattr(f"{module}.prepare", refuse)
    for rule in KERNEL_RULES:
        np.testing.assert_array_equal(decode(node, tax, rule), want[rule])
        np.testing.assert_array_equal(decode(node[3], tax, rule), want[rule][3:4])  # one row [N]
    tensor = torch.from_numpy(node)
    out = decode(tensor, tax, "argmax_leaf")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64
    np.testing.assert_array_equal(out.numpy(), want["argmax_leaf"])
    with pytest.raises(AssertionError, match="NumPy path ran"):  # node-major: the NumPy path, as designed
        decode(np.asfortranarray(node), tax, "argmax_leaf")


@pytest.mark.parametrize("rule", KERNEL_RULES)
def test_invalid_rows_are_refused_as_by_the_numpy_path(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    tax = _shapes(rng)[0]
    node = _posteriors(tax, rng, 40, quantised=False).astype(np.float32)
    child = int(np.flatnonzero(tax.parent > 0)[0])
    bad_cases = {
        "child above parent": (17, child, node[17, tax.parent[child]] + 0.01),
        "NaN": (3, 5, np.nan),
        "above one": (30, 4, 1.5),
        "negative": (39, child, -0.01),
    }
    for what, (row, col, value) in bad_cases.items():
        arr = node.copy()
        arr[row, col] = value
        if rule in ("chmcnn", "threshold_set") and what == "child above parent":  # scores: allowed
            got, want = _both(monkeypatch, lambda a=arr: decode(a, tax, rule))
            np.testing.assert_array_equal(got, want)
            continue
        messages = []
        for kernels in (True, False):
            monkeypatch.setattr(rows_mod, "ROW_KERNELS", kernels)
            with pytest.raises(ValueError) as err:
                decode(arr, tax, rule)
            messages.append(str(err.value))
        assert messages[0] == messages[1], what
        assert f"row {row}:" in messages[0], (what, messages[0])
    monkeypatch.setattr(rows_mod, "ROW_KERNELS", True)
    arr = node.copy()
    arr[11, 2] = np.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        decode(arr, tax, rule, check=False)
    arr[11, 2] = -0.5
    with pytest.raises(ValueError, match="negative"):
        decode(arr, tax, rule, check=False)


def test_child_above_parent_names_row_and_node() -> None:
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    node = np.tile(np.array([1.0, 0.6, 0.3, 0.3, 0.4], dtype=np.float32), (5, 1))
    node[3, 2] = 0.7
    with pytest.raises(ProbabilityError, match=r"row 3: node 'x' \(id 2\) has P = 0.7 > 0.6"):
        decode(node, tax, "top_down")
    assert decode(node, tax, "top_down", check=False).tolist() == [2, 2, 2, 2, 2]


def test_bayes_label_mass_refusal_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Children summing above their parent (not single-label probabilities) are refused by both paths alike."""
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    node = np.tile(np.array([1.0, 0.6, 0.3, 0.3, 0.4]), (4, 1))
    node[2] = [1.0, 0.6, 0.5, 0.5, 0.4]  # x + y = 1.0 > 0.6 = a
    messages = []
    for kernels in (True, False):
        monkeypatch.setattr(rows_mod, "ROW_KERNELS", kernels)
        with pytest.raises(ProbabilityError) as err:
            decode(node, tax, "bayes_node")
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "row 2" in messages[0]
    monkeypatch.setattr(rows_mod, "ROW_KERNELS", True)
    got, want = _both(monkeypatch, lambda: decode(node, tax, "crm", check=False))
    np.testing.assert_array_equal(got, want)


def test_descents_follow_their_definition() -> None:
    """Independent of both paths: top-down and plurality by hand on a small tree, with a tie between children."""
    tax = Taxonomy([("R", "X"), ("X", "Y"), ("Y", "a1"), ("Y", "a2"), ("X", "b"), ("R", "c"), ("R", "d")])
    leaf = np.array([[0.23, 0.29, 0.15, 0.31, 0.02], [0.25, 0.25, 0.2, 0.15, 0.15]], dtype=np.float32)
    node = np.ascontiguousarray(tax.marginals(leaf), dtype=np.float32)
    names = [[tax.name_of(int(n)) for n in decode(node, tax, r)] for r in ("top_down", "plurality")]
    # row 0: X (.67) > c, Y (.52) > b, a2 > a1; plurality stops at Y since a2 (.29) < c (.31)
    # row 1: X (.70), Y (.50) > b (.20), a1 = a2 (.25): the smaller id a1; plurality: .25 >= max(.15, .2, .25)
    assert names == [["a2", "a1"], ["Y", "a1"]]
    # P(a2 | Y) = .29 / .52 and P(a1 | Y) = .25 / .50 are below .6, the steps above it are not: both stop at Y
    assert rules_mod.top_down(node, tax, threshold=0.6).tolist() == [2, 2]


def test_read_only_and_foreign_byte_order_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only array (a memory-mapped file) takes the kernels; a big-endian one, which numba cannot read, the
    NumPy path; both give the answers of a plain array."""
    rng = np.random.default_rng(10)
    tax = _shapes(rng)[1]
    node = _posteriors(tax, rng, 30, quantised=False)
    want = {rule: decode(node, tax, rule) for rule in KERNEL_RULES}
    frozen = node.copy()
    frozen.setflags(write=False)
    swapped = node.astype(">f8")
    for rule in KERNEL_RULES:
        np.testing.assert_array_equal(decode(swapped, tax, rule), want[rule])
    monkeypatch.setattr("hiercls.decode.rules.prepare", lambda *a, **k: pytest.fail("the NumPy path ran"))
    for rule in ("argmax_leaf", "top_down", "threshold", "info_gain", "hie"):
        np.testing.assert_array_equal(decode(frozen, tax, rule), want[rule])


@pytest.mark.parametrize(
    "options", [{}, {"cost": "lca_height"}, {"candidates": "leaves"}, {"cost": "lca_height", "candidates": "classes"}]
)
def test_both_bayes_kernels_equal_the_numpy_path(options: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eight-row Bayes kernel (trees that ``_tree_block`` decodes) and the four-row one (the others, forced
    here) give the NumPy path's answers, ties included."""
    rng = np.random.default_rng(11)
    for tax in _shapes(rng):
        node = _posteriors(tax, rng, 45, quantised=bool(rng.integers(2)))
        for arr in (node, node.astype(np.float32)):
            got, want = _both(monkeypatch, lambda a=arr, t=tax: decode(a, t, "bayes_node", **options))
            np.testing.assert_array_equal(got, want)
            monkeypatch.setattr("hiercls.decode.bayes.lane_tables", lambda taxonomy: None)
            got, want = _both(monkeypatch, lambda a=arr, t=tax: decode(a, t, "bayes_node", **options))
            monkeypatch.undo()
            np.testing.assert_array_equal(got, want)

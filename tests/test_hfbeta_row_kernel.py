"""The compiled row kernel of ``optimal_hfbeta`` (``hiercls/decode/_kernels_hfbeta.py``) gives the NumPy path's sets.

Row-major tree inputs (a head's ``[B, N]`` output) are decoded by the kernel, which repeats the NumPy block path's
candidate rounds and certificate row by row and hands the rows it cannot certify back to it. The reference is the
same call with ``ROW_KERNELS`` off. Inputs: random trees of several shapes (bushy, deep, chains, stars, and trees
the kernel leaves to the NumPy path), random posteriors with exact ties, zero-probability branches and internal
labels, several betas, the root counted or not, float32 and float64, checks on and off, and rows of the shipped
ImageNet trees; plus an independent brute force over every ancestor-closed set of tiny trees, and the refusals.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import hiercls.decode._rows as rows_mod
from hiercls.decode import ProbabilityError, decode, optimal_hfbeta
from hiercls.decode import hfbeta as hfbeta_mod
from hiercls.taxonomy import Taxonomy, load_taxonomy
from tests.test_decode_row_kernels import _both

BETAS = (0.5, 1.0, 2.0, 4.0)
TIE_BETAS = (0.0, *BETAS)  # beta 0 (precision): sizes tie often, decided by the last bits of the values


# ------------------------------------------------------------------------------------------ inputs
def _tree(edges: list[tuple[int, int]]) -> Taxonomy:
    return Taxonomy([(f"n{p}", f"n{c}") for p, c in edges])


def _shapes(rng: np.random.Generator) -> dict[str, Taxonomy]:
    """Trees the kernel decodes (bushy, deep, chain, star, caterpillar) and two it leaves to the NumPy path."""
    return {
        "bushy": _tree([(int(rng.integers(0, i)), i) for i in range(1, 160)]),
        "deep": _tree([(int(rng.integers(max(0, i - 2), i)), i) for i in range(1, 70)]),  # height about 45
        "chain": _tree([(i - 1, i) for i in range(1, 40)] + [(39, 40), (20, 41), (5, 42)]),
        "star": _tree([(0, i) for i in range(1, 300)] + [(1, 300), (1, 301), (2, 302)]),
        "caterpillar": _tree([(max(0, i - 2) if i % 2 == 0 else max(0, i - 1), i) for i in range(1, 80)]),
        "too deep": _tree([(i - 1, i) for i in range(1, 60)] + [(30, 60)]),  # height 59: the size search
        "too wide": _tree([(0, i) for i in range(1, 2100)] + [(1, 2100)]),  # > 2048 children: _tree_rows
    }


def _label_rows(tax: Taxonomy, rng: np.random.Generator, batch: int) -> np.ndarray:
    """Label distributions ``[batch, N]`` of every kind: continuous, quantised with exact ties, one-hot, internal
    labels, whole branches at zero, flat."""
    n = tax.num_nodes
    leaves = tax.leaves
    out = np.zeros((batch, n))
    for b in range(batch):
        kind = b % 7
        support = leaves if rng.random() < 0.6 else np.arange(n)
        p = np.zeros(n)
        if kind == 0:
            p[support] = rng.dirichlet(np.full(len(support), float(rng.choice([0.05, 0.3, 2.0]))))
        elif kind == 1:  # quantised on a grid of 1/8: many exact ties between nodes and between sizes
            p[support] = rng.multinomial(8, rng.dirichlet(np.full(len(support), 0.3))) / 8.0
        elif kind == 2:  # a few equal masses
            k = int(rng.integers(1, min(6, len(support)) + 1))
            p[rng.choice(support, size=k, replace=False)] = 1.0
        elif kind == 3:
            p[rng.choice(support)] = 1.0
        elif kind == 4:  # a peaked posterior on the leaves (softmax of logits), as a model gives
            z = rng.normal(size=len(leaves)) * rng.choice([1.0, 3.0, 8.0])
            p[leaves] = np.exp(z - z.max())
        elif kind == 5:  # a root child's whole subtree at zero
            p[support] = rng.random(len(support))
            kids = np.flatnonzero(tax.parent == 0)
            gone = int(rng.choice(kids))
            p[(tax.ancestors_sparse[:, [gone]].toarray()[:, 0] > 0)] = 0.0
        else:  # flat
            p[support] = 1.0
        if p.sum() == 0:
            p[rng.choice(leaves)] = 1.0
        out[b] = p / p.sum()
    return out


def _node_rows(tax: Taxonomy, labels: np.ndarray) -> np.ndarray:
    """Row-major node probabilities: each node's label mass summed over its subtree."""
    return np.ascontiguousarray(labels @ tax.ancestors_sparse.toarray())


KERNEL = hfbeta_mod._hfbeta_kernels() is not None
"""Whether the kernel runs here (numba installed, and it rounds NumPy's sums as NumPy does on this machine)."""


def _assert_same(got: tuple, want: tuple, what: str) -> None:
    np.testing.assert_array_equal(got[0], want[0], err_msg=what)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-15, err_msg=what)


# ------------------------------------------------------------------------------------------ against NumPy
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernel_equals_the_numpy_path_on_random_trees(dtype: type, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    for name, tax in _shapes(rng).items():
        node = _node_rows(tax, _label_rows(tax, rng, 56 if name != "too wide" else 8)).astype(dtype)
        handled = hfbeta_mod._optimal_hfbeta_rows(node, tax, 1.0, False, False, False, 64) is not None
        assert handled == (KERNEL and name not in ("too deep", "too wide")), name
        for beta, include_root in itertools.product(TIE_BETAS, (False, True)):
            got, want = _both(
                monkeypatch,
                lambda t=tax, a=node, b=beta, r=include_root: optimal_hfbeta(
                    a, t, b, include_root=r, return_value=True
                ),
            )
            _assert_same(got, want, f"{name} beta={beta} include_root={include_root} {np.dtype(dtype).name}")


def test_kernel_hands_uncertified_rows_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Few initial candidates make most rows fail the kernel's rounds: the NumPy path finishes them alike."""
    rng = np.random.default_rng(12)
    tax = _shapes(rng)["bushy"]
    node = _node_rows(tax, _label_rows(tax, rng, 70)).astype(np.float32)
    for c0, beta in itertools.product((1, 2, 5, 64, 10**6), (1.0, 4.0)):
        got, want = _both(
            monkeypatch,
            lambda c=c0, b=beta: optimal_hfbeta(node, tax, b, return_value=True, initial_candidates=c),
        )
        _assert_same(got, want, f"initial_candidates={c0} beta={beta}")


def test_kernel_with_checks_off_and_other_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(13)
    tax = _shapes(rng)["bushy"]
    node = _node_rows(tax, _label_rows(tax, rng, 40))
    bent = node.copy()
    bent[5, 1:4] *= 1.3  # children above their parent: refused with the checks on, clipped with them off
    bent[6] = 0.0  # no mass at all
    for arr in (node, bent):
        got, want = _both(monkeypatch, lambda a=arr: decode(a, tax, "optimal_hfbeta", check=False))
        np.testing.assert_array_equal(got, want)
    # one row [N], a CPU tensor (sets and values come back as tensors) and a read-only array
    got, want = _both(monkeypatch, lambda: optimal_hfbeta(node[3], tax, 2.0, return_value=True))
    _assert_same(got, want, "one row")
    tensor = torch.from_numpy(node.astype(np.float32))
    got, want = _both(monkeypatch, lambda: optimal_hfbeta(tensor, tax, 1.0, return_value=True))
    assert isinstance(got[0], torch.Tensor) and got[0].dtype == torch.bool and got[1].dtype == torch.float32
    _assert_same((got[0].numpy(), got[1].numpy()), (want[0].numpy(), want[1].numpy()), "tensor")
    frozen = node.copy()
    frozen.setflags(write=False)
    got, want = _both(monkeypatch, lambda: optimal_hfbeta(frozen, tax, 1.0, return_value=True))
    _assert_same(got, want, "read-only")


@pytest.mark.parametrize("tree", ["imagenet1k_tree", "imagenet21k_winter21"])
def test_kernel_on_the_shipped_trees(tree: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tax = load_taxonomy(tree)
    rng = np.random.default_rng(14)
    rows = 240 if tree == "imagenet1k_tree" else 120
    logits = rng.normal(size=(rows, tax.num_leaves)) * rng.choice([1.0, 4.0, 12.0], size=(rows, 1))
    logits[np.arange(rows), rng.integers(0, tax.num_leaves, size=rows)] += rng.uniform(2, 12, size=rows)
    leaf = np.exp(logits - logits.max(1, keepdims=True))
    node = np.ascontiguousarray(tax.marginals(leaf / leaf.sum(1, keepdims=True)), dtype=np.float32)
    combos = [(1.0, False), (2.0, True)] if tree == "imagenet1k_tree" else [(1.0, False)]
    for beta, include_root in combos:
        got, want = _both(
            monkeypatch,
            lambda b=beta, r=include_root: optimal_hfbeta(node, tax, b, include_root=r, return_value=True),
        )
        _assert_same(got, want, f"{tree} beta={beta} include_root={include_root}")


@pytest.mark.skipif(not KERNEL, reason="no numba, or the kernel rounds otherwise than NumPy/BLAS here")
def test_row_major_trees_take_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the NumPy path made to fail, a row-major tree still decodes (the kernel certified every row);
    node-major input takes the NumPy path, as designed."""
    tax = load_taxonomy("imagenet1k_tree")
    rng = np.random.default_rng(15)
    leaf = rng.dirichlet(np.full(tax.num_leaves, 0.02), size=32)
    node = np.ascontiguousarray(tax.marginals(leaf), dtype=np.float32)
    want = optimal_hfbeta(node, tax)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the NumPy path ran")

    monkeypatch.setattr(hfbeta_mod, "prepare", refuse)
    monkeypatch.setattr(hfbeta_mod, "_tree_block", refuse)
    np.testing.assert_array_equal(optimal_hfbeta(node, tax), want)
    with pytest.raises(AssertionError, match="NumPy path ran"):
        optimal_hfbeta(np.asfortranarray(node), tax)


# ------------------------------------------------------------------------------------------ brute force
def _closed_sets(tax: Taxonomy) -> np.ndarray:
    """Every ancestor-closed node set (the root always in), as a boolean matrix."""
    n = tax.num_nodes
    parent = np.asarray(tax.parent)
    sets = []
    for bits in itertools.product([False, True], repeat=n - 1):
        s = np.array([True, *bits])
        if all(s[parent[i]] for i in range(1, n) if s[i]):
            sets.append(s)
    return np.array(sets)


def _expected_hf(sets: np.ndarray, labels: np.ndarray, tax: Taxonomy, beta: float, include_root: bool) -> np.ndarray:
    """E[hF_beta] of each set ``[S]`` under each label distribution ``[B]``, from the definition: ``[S, B]``."""
    n = tax.num_nodes
    anc = np.zeros((n, n))
    for y in range(n):  # ancestors-or-self of y, walked up the parent pointers
        v = y
        while True:
            anc[y, v] = 1.0
            if v == 0:
                break
            v = int(tax.parent[v])
    s = sets.astype(float)
    if not include_root:
        s[:, 0] = 0.0
        anc[:, 0] = 0.0
    inter = s @ anc.T  # |S cap Y_y|
    size_s = s.sum(1)[:, None]
    size_y = anc.sum(1)[None, :]
    b2 = beta * beta
    denom = b2 * size_y + size_s
    hf = np.where(denom > 0, (1 + b2) * inter / np.where(denom > 0, denom, 1.0), 0.0)
    hf = np.where((size_s == 0) & (size_y == 0), 1.0, hf)  # the root label predicted by the root alone
    return hf @ labels.T


def test_kernel_against_brute_force_on_tiny_trees() -> None:
    """The optimal value, and a set that achieves it, against every ancestor-closed set. (Which of several sets
    tied in exact arithmetic is returned depends on the round-off of their values, as on the NumPy path; the
    tests above compare the two paths on inputs full of such ties.)"""
    rng = np.random.default_rng(16)
    for trial in range(300):
        n = int(rng.integers(2, 9))
        tax = _tree([(int(rng.integers(0, i)), i) for i in range(1, n)])
        labels = _label_rows(tax, rng, 7)
        node = _node_rows(tax, labels)
        beta = float(rng.choice(BETAS))
        include_root = bool(rng.random() < 0.5)
        if KERNEL:
            assert hfbeta_mod._optimal_hfbeta_rows(node, tax, beta**2, include_root, False, False, 64) is not None
        sets, value = optimal_hfbeta(node, tax, beta, include_root=include_root, return_value=True)
        candidates = _closed_sets(tax)
        table = _expected_hf(candidates, labels, tax, beta, include_root)  # [S, B]
        best = table.max(0)
        achieved = _expected_hf(sets, labels, tax, beta, include_root).diagonal()
        ctx = f"trial {trial}: n={n} beta={beta} include_root={include_root}"
        np.testing.assert_allclose(value, best, rtol=0, atol=1e-12, err_msg=ctx)
        np.testing.assert_allclose(achieved, best, rtol=0, atol=1e-12, err_msg=ctx)
        parent = np.asarray(tax.parent)
        for s in sets:  # ancestor-closed, root included
            assert s[0] and all(s[parent[i]] for i in np.flatnonzero(s[1:]) + 1), ctx


# ------------------------------------------------------------------------------------------ refusals
def test_invalid_rows_are_refused_as_by_the_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(17)
    tax = _shapes(rng)["bushy"]
    node = _node_rows(tax, _label_rows(tax, rng, 30)).astype(np.float32)
    child = int(np.flatnonzero(tax.parent > 0)[0])
    kids = np.flatnonzero(tax.parent == tax.parent[child])
    cases = {
        "child above parent": (ProbabilityError, lambda a: a.__setitem__((17, child), a[17, tax.parent[child]] + 0.01)),
        # every child within its parent, but together above it: the label-mass refusal
        "children above parent": (ProbabilityError, lambda a: a.__setitem__((21, kids), a[21, tax.parent[child]])),
        "NaN": (ValueError, lambda a: a.__setitem__((3, 5), np.nan)),
        "root not one": (ProbabilityError, lambda a: a.__setitem__((9, 0), 0.7)),
        "negative": (ValueError, lambda a: a.__setitem__((29, child), -0.01)),
    }
    assert len(kids) > 1
    for what, (error, spoil) in cases.items():
        arr = node.copy()
        spoil(arr)
        messages = []
        for kernels in (True, False):
            monkeypatch.setattr(rows_mod, "ROW_KERNELS", kernels)
            with pytest.raises(error) as err:
                optimal_hfbeta(arr, tax)
            messages.append(str(err.value))
        monkeypatch.setattr(rows_mod, "ROW_KERNELS", True)
        assert messages[0] == messages[1], what

"""Metrics given node names (lists, tuples, NumPy arrays) score exactly as given node ids, and name unknown labels.

Lists of at least ``_FIXED_WIDTH_MIN`` names of one UTF-8 length take the vectorised ``_lookup_fixed_width``;
shorter lists, lists of several lengths and every failure take the dict, which names the unknown label. Both
paths are pinned here, and the vectorised one against the dict on labels built to break its row layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hiercls.metrics as M
from hiercls.metrics import _validation as V
from hiercls.taxonomy import Taxonomy, TaxonomyError, load_taxonomy

BIG = max(2000, 2 * V._FIXED_WIDTH_MIN)  # a batch the vectorised list lookup takes


@pytest.fixture(scope="module")
def tax() -> Taxonomy:
    return load_taxonomy("imagenet1k_tree")


def _metrics(t: Any, p: Any, tax: Taxonomy) -> list[Any]:
    kw: dict[str, Any] = {"taxonomy": tax}
    return [
        M.hierarchical_f1_score(t, p, **kw),
        M.hierarchical_precision_recall_fscore(t, p, average="samples", zero_division=0.0, **kw),
        M.mistake_severity(t, p, zero_division=0.0, **kw),
        M.per_level_accuracy_score(t, p, **kw),
        M.node_f1_score(t, p, average="macro", zero_division=0.0, **kw),
        M.exact_match_score(t, p, **kw),
    ]


def _assert_same(got: list[Any], want: list[Any]) -> None:
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g, dtype=float), np.asarray(w, dtype=float))


@pytest.mark.parametrize("n", [1, 7, BIG])
def test_names_score_as_ids_in_every_container(tax: Taxonomy, n: int) -> None:
    rng = np.random.default_rng(n)
    names = np.array(tax.names)
    # targets are leaves, predictions any node but the root (internal nodes too): names of one length here
    yt, yp = rng.choice(tax.leaves, n), rng.integers(1, tax.num_nodes, n)
    want = _metrics(yt, yp, tax)
    forms = {
        "list": lambda ids: names[ids].tolist(),
        "tuple": lambda ids: tuple(names[ids].tolist()),
        "numpy": lambda ids: names[ids],
        "object": lambda ids: names[ids].astype(object),
        "str_": lambda ids: list(names[ids]),  # np.str_ items
    }
    for make_t in forms.values():
        for make_p in forms.values():
            _assert_same(_metrics(make_t(yt), make_p(yp), tax), want)
    _assert_same(_metrics(names[yt].tolist(), yp, tax), want)  # names on one side, ids on the other


def _mixed_taxonomy() -> Taxonomy:
    """Names of 1-24 UTF-8 bytes (multiples of 8 among them), non-ASCII ones, prefixes of one another."""
    rng = np.random.default_rng(3)
    alphabet = np.array(list("ab/_ éß猫\U0001f431"))
    names = {"".join(rng.choice(alphabet, int(rng.integers(1, 13)))) for _ in range(3000)}
    names |= {"x" * k for k in range(1, 25)}
    names = sorted(names)
    return Taxonomy([(names[0], x) for x in names[1:]])


@pytest.mark.parametrize("which", ["imagenet1k_tree", "mixed"])
def test_fixed_width_lookup_finds_every_length(which: str) -> None:
    tax = load_taxonomy(which) if which != "mixed" else _mixed_taxonomy()
    rng = np.random.default_rng(4)
    lengths = np.array([len(x.encode()) for x in tax.names])
    for w in np.unique(lengths):
        pool = np.flatnonzero(lengths == w)
        ids = rng.choice(pool, BIG)
        values = [tax.names[i] for i in ids]
        np.testing.assert_array_equal(V._lookup_fixed_width(values, tax), ids)
        np.testing.assert_array_equal(V._lookup_names(values, tax), ids)
        np.testing.assert_array_equal(V._lookup_names(tuple(values), tax), ids)
    # several lengths: the dict gives the same ids
    ids = rng.integers(0, tax.num_nodes, BIG)
    np.testing.assert_array_equal(V._lookup_names([tax.names[i] for i in ids], tax), ids)


def _broken(values: list[str], w: int, shorter: list[str], rng: np.random.Generator) -> list[list[Any]]:
    """Lists that keep the first and last label (one of ``w`` bytes) but are no list of names of ``w`` bytes.

    ``shorter``: names of fewer bytes; each padded with NULs to ``w`` bytes makes a label whose row is that name's.
    """
    s = 8 * (w // 8 + 1) - w  # the NULs the lookup puts after each label
    out: list[list[Any]] = []
    k = int(rng.integers(1, len(values) - 2))
    padded = [x + "\0" * (w - len(x.encode())) for x in shorter[:3]]
    for bad in (values[k][:-1] + "#", "", values[k] * 3, 7, None, b"n0", "\ud800", values[k] + "\0", *padded):
        v = list(values)
        v[k] = bad
        out.append(v)
    # two labels joined (directly, or by the lookup's own separator), then an empty label: the joined bytes have
    # the layout's length
    v = list(values)
    v[k : k + 2] = [values[k] + values[k + 1], ""]
    out.append(v)
    v = list(values)
    v[k : k + 2] = [values[k] + "\0" * s + values[k + 1], ""]
    out.append(v)
    # a label with the separator inside, its tail moved to the next label: every row's bytes still line up
    v = list(values)
    v[k : k + 2] = [values[k][:2] + "\0" * s, values[k][2 : w - s] + values[k + 1]]
    out.append(v)
    return out


@pytest.mark.parametrize("which", ["imagenet1k_tree", "mixed"])
def test_fixed_width_lookup_refuses_what_is_not_a_list_of_names(which: str) -> None:
    tax = load_taxonomy(which) if which != "mixed" else _mixed_taxonomy()
    rng = np.random.default_rng(5)
    lengths = np.array([len(x.encode()) for x in tax.names])
    known = set(tax.names)
    for w in (int(lengths[1]), int(lengths.max())):
        pool = np.flatnonzero(lengths == w)
        values = [tax.names[i] for i in rng.choice(pool, BIG)]
        shorter = [tax.names[i] for i in np.flatnonzero(lengths < w)]
        for v in _broken(values, w, shorter, rng):
            assert V._lookup_fixed_width(v, tax) is None
            if not all(isinstance(x, str) and x in known for x in v):
                assert V._lookup_names(v, tax) is None


@pytest.mark.parametrize("n", [7, BIG])
@pytest.mark.parametrize("container", ["list", "tuple", "numpy", "object"])
@pytest.mark.parametrize("side", ["y_true", "y_pred"])
def test_unknown_names_are_named_with_close_matches(tax: Taxonomy, n: int, container: str, side: str) -> None:
    rng = np.random.default_rng(6)
    names = np.array(tax.names)
    yt, yp = rng.choice(tax.leaves, n), rng.choice(tax.leaves, n)
    k = n - 3
    near = names[yt[k]][:-1] + "x"  # one character off a name: the message suggests it
    labels = {"y_true": names[yt].tolist(), "y_pred": names[yp].tolist()}
    labels[side][k] = near
    make = {"list": list, "tuple": tuple, "numpy": np.array, "object": lambda v: np.array(v, dtype=object)}[container]
    with pytest.raises(TaxonomyError, match=rf"{side}\[{k}\]: unknown label '{near}'.*did you mean '{names[yt[k]]}'"):
        M.hierarchical_f1_score(make(labels["y_true"]), make(labels["y_pred"]), taxonomy=tax)
    with pytest.raises(TaxonomyError, match=rf"{side}\[{k}\]: unknown label '{near}'") as info:
        M.mistake_severity(make(labels["y_true"]), make(labels["y_pred"]), taxonomy=tax)
    assert info.value.label == near


@pytest.mark.parametrize("n", [7, BIG])
def test_labels_that_are_no_names_keep_their_errors(tax: Taxonomy, n: int) -> None:
    rng = np.random.default_rng(7)
    names = np.array(tax.names)
    yt = names[rng.choice(tax.leaves, n)].tolist()
    for bad, shown in ((3, "'3'"), (None, "'None'"), ("", "''"), ("n" * 40, "'n{40}'")):
        yp = list(yt)
        yp[2] = bad
        with pytest.raises(TaxonomyError, match=rf"y_pred\[2\]: unknown label {shown} for taxonomy"):
            M.hierarchical_f1_score(yt, yp, taxonomy=tax)
    # a list whose first item is no name is read as ids or sets, as before
    with pytest.raises(TaxonomyError, match=r"y_pred\[0\]: unknown label '1'"):
        M.hierarchical_f1_score(yt, [1, *yt[1:]], taxonomy=tax)

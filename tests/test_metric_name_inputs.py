"""Metrics given node names (lists, tuples, NumPy arrays of any width) score exactly as given node ids, and an
unknown label is named with its position and close matches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hiercls.metrics as M
from hiercls.taxonomy import Taxonomy, TaxonomyError, load_taxonomy

BIG = 2000


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
    """Names of 1-24 code points, non-ASCII ones, prefixes of one another."""
    rng = np.random.default_rng(3)
    alphabet = np.array(list("ab/_ éß猫\U0001f431"))
    names = {"".join(rng.choice(alphabet, int(rng.integers(1, 13)))) for _ in range(3000)}
    names |= {"x" * k for k in range(1, 25)}
    names = sorted(names)
    return Taxonomy([(names[0], x) for x in names[1:]])


def test_names_of_every_length_and_script_score_as_ids() -> None:
    tax = _mixed_taxonomy()
    rng = np.random.default_rng(4)
    names = np.array(tax.names)
    yt, yp = rng.integers(0, tax.num_nodes, BIG), rng.integers(0, tax.num_nodes, BIG)
    want = _metrics(yt, yp, tax)
    _assert_same(_metrics(names[yt].tolist(), names[yp], tax), want)
    # arrays wider than every name, and as narrow as the labels they hold, are read exactly
    _assert_same(_metrics(names[yt].astype("U40"), names[yp].astype(f"U{max(map(len, names[yp]))}"), tax), want)
    short = np.flatnonzero([len(x) <= 2 for x in tax.names])
    np.testing.assert_array_equal(M.exact_match_score(names[short].astype("U2"), short, taxonomy=tax), 1.0)
    for label in ("x" * 25, names[yt[0]] + "a", names[yt[0]][:-1] + "#"):  # longer, suffixed, changed
        bad = names[yt].astype("U40")
        bad[11] = label
        if label not in set(tax.names):
            with pytest.raises(TaxonomyError, match=r"y_true\[11\]: unknown label"):
                M.hierarchical_f1_score(bad, names[yp], taxonomy=tax)


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

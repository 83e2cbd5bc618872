"""Fast paths of the metrics against their general paths: name labels and hiclass-compatible name sets."""

from __future__ import annotations

import numpy as np
import pytest

import hiercls.metrics.hierarchical as H
from hiercls.metrics import hierarchical_f1_score, mistake_severity
from hiercls.taxonomy import Taxonomy, TaxonomyError

WORDS = np.array(["", "a", "b", "c", "d", "animal", "cat", "other"])


@pytest.mark.parametrize("shape", [(50,), (40, 3), (30, 2, 3), (1, 4)])
def test_hiclass_counts_equal_the_per_sample_sets(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape))
    for _ in range(40):
        t, p = rng.choice(WORDS, size=shape), rng.choice(WORDS, size=shape)
        got = H._path_name_counts(t, p)
        ts, ps = H._path_name_sets(t, "y_true"), H._path_name_sets(p, "y_pred")
        want = (
            [len(a & b) for a, b in zip(ts, ps, strict=True)],
            [len(a) for a in ts],
            [len(b) for b in ps],
        )
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_name_labels_score_as_ids_and_unknown_names_are_named() -> None:
    rng = np.random.default_rng(0)
    tax = Taxonomy([(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, 60)])
    names = np.array(tax.names)
    yt, yp = rng.integers(0, tax.num_nodes, 200), rng.integers(0, tax.num_nodes, 200)
    for fn in (hierarchical_f1_score, mistake_severity):
        ref = fn(yt, yp, taxonomy=tax)
        assert fn(names[yt], names[yp], taxonomy=tax) == ref
        assert fn(names[yt].tolist(), names[yp].tolist(), taxonomy=tax) == ref
    # labels wider and narrower than the taxonomy's names, and a name with a suffix, are looked up exactly
    wide = np.array([*names[yt[:5]].tolist(), "x" * 40])
    with pytest.raises(TaxonomyError, match=r"x{40}"):
        hierarchical_f1_score(wide, names[yp[:6]], taxonomy=tax)
    np.testing.assert_array_equal(
        hierarchical_f1_score(names[yt].astype("U40"), names[yp].astype("U3"), taxonomy=tax),
        hierarchical_f1_score(yt, yp, taxonomy=tax),
    )
    with pytest.raises(TaxonomyError, match="n1x"):
        hierarchical_f1_score(np.array(["n1x", "n1"]), np.array(["n1", "n1"]), taxonomy=tax)
    bad = names[yt].tolist()
    bad[7] = "nope"
    with pytest.raises(TaxonomyError, match=r"y_true\[7\].*nope"):
        hierarchical_f1_score(bad, names[yp].tolist(), taxonomy=tax)


def test_name_table_finds_every_name_and_refuses_every_other_label() -> None:
    from hiercls.metrics._validation import _lookup_name_array, _lookup_names

    rng = np.random.default_rng(1)
    alphabet = np.array(list("ab/_ éß猫\U0001f431"))
    # names of 1-12 code points, prefixes of one another, non-ASCII: the key uses every code point
    names = sorted({"".join(rng.choice(alphabet, int(rng.integers(1, 13)))) for _ in range(3000)})
    tax = Taxonomy([(names[0], x) for x in names[1:]])
    ids = rng.integers(0, tax.num_nodes, 500)
    arr = np.array(tax.names)[ids]
    for values in (arr, arr.astype("U40")):
        np.testing.assert_array_equal(_lookup_name_array(values, tax), ids)
    for width in (1, 2, 3, 4):  # arrays narrower than the longest name, odd and even widths
        short = np.flatnonzero([len(x) <= width for x in tax.names])
        values = np.array([tax.names[i] for i in short])
        np.testing.assert_array_equal(_lookup_name_array(values.astype(f"U{width}"), tax), short)
    np.testing.assert_array_equal(_lookup_names(arr.tolist(), tax), ids)
    np.testing.assert_array_equal(_lookup_names(arr[:1].tolist(), tax), ids[:1])
    known = set(tax.names)
    others = [x + "a" for x in tax.names if x + "a" not in known][:50] + [
        x[:-1] for x in tax.names if x[:-1] not in known
    ][:50]
    for label in others:  # one unknown label among known ones, anywhere in the batch
        values = arr.astype("U41" if len(label) % 2 else "U40")  # odd and even widths
        values[int(rng.integers(0, len(values)))] = label
        assert _lookup_name_array(values, tax) is None
        assert _lookup_names(values.tolist(), tax) is None

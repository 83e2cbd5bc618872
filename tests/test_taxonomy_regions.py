"""Nested regions (BraTS WT ⊃ TC ⊃ ET): masks from labels and back, on random volumes, numpy and torch."""

from __future__ import annotations

import numpy as np
import pytest

from hiercls.taxonomy import NestedRegions, TaxonomyError, brats_regions, nested_regions

torch = pytest.importorskip("torch")


def brute_masks(vol: np.ndarray, sets: list[set[int]]) -> np.ndarray:
    """[R, *vol.shape] by a plain loop over voxels."""
    out = np.zeros((len(sets), *vol.shape), dtype=bool)
    for idx in np.ndindex(vol.shape):
        for r, s in enumerate(sets):
            out[(r, *idx)] = int(vol[idx]) in s
    return out


def test_brats_definitions() -> None:
    spec = brats_regions()
    assert spec.names == ("WT", "TC", "ET")
    assert [sorted(s) for s in spec.label_sets] == [[1, 2, 4], [1, 4], [4]]
    assert [sorted(r) for r in spec.ring_labels] == [[2], [1], [4]]
    assert spec.output_labels == (2, 1, 4)
    new = brats_regions("2023")
    assert [sorted(s) for s in new.label_sets] == [[1, 2, 3], [1, 3], [3]] and new.output_labels == (2, 1, 3)
    tax = spec.taxonomy
    assert tax.names == ("root", "WT", "TC", "ET") and tax.is_tree and tax.height == 3
    assert tax.parent.tolist() == [-1, 0, 1, 2]
    assert tax.classes.tolist() == [0, 1, 2, 3]  # background voxels are labelled with the root
    assert tax.display_names == ("background", "whole tumour", "tumour core", "enhancing tumour")
    with pytest.raises(ValueError, match="version"):
        brats_regions("2022")


def test_shipped_brats_is_the_regions_chain() -> None:
    from hiercls.taxonomy import list_taxonomies, load_taxonomy

    if "brats" not in [e["name"] for e in list_taxonomies()]:
        pytest.skip("no shipped brats taxonomy")
    shipped, spec = load_taxonomy("brats"), brats_regions().taxonomy
    assert shipped == spec and shipped.display_names == spec.display_names


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("version", ["2021", "2023"])
def test_labels_to_regions_matches_brute_force_and_round_trips(seed: int, version: str) -> None:
    spec = brats_regions(version)
    rng = np.random.default_rng(seed)
    labels = [0, *sorted(spec.label_sets[0])]
    vol = rng.choice(labels, size=(2, 3, 4, 5)).astype(rng.choice([np.int64, np.uint8, np.int16]))
    masks = spec.labels_to_regions(vol)
    assert masks.shape == (2, 3, 3, 4, 5) and masks.dtype == bool
    for b in range(2):
        np.testing.assert_array_equal(masks[b], brute_masks(vol[b], [set(s) for s in spec.label_sets]))
    # nested by construction: ET ⊂ TC ⊂ WT
    assert (masks[:, 2] <= masks[:, 1]).all() and (masks[:, 1] <= masks[:, 0]).all()
    np.testing.assert_array_equal(spec.regions_to_labels(masks), vol)
    np.testing.assert_array_equal(spec.regions_to_labels(masks.astype(np.float32)), vol)
    np.testing.assert_array_equal(spec.labels_to_nodes(vol), masks.sum(1))
    np.testing.assert_array_equal(spec.regions_to_nodes(masks), masks.sum(1))
    last = spec.labels_to_regions(vol, channel_last=True, dtype=np.float32)
    assert last.shape == (2, 3, 4, 5, 3) and last.dtype == np.float32
    np.testing.assert_array_equal(np.moveaxis(last, -1, 1), masks)
    np.testing.assert_array_equal(spec.regions_to_labels(last, channel_last=True), vol)
    # torch gives the same, on the input's device
    t = torch.from_numpy(vol.astype(np.int64))
    tm = spec.labels_to_regions(t, dtype=torch.float32)
    assert tm.dtype == torch.float32 and tuple(tm.shape) == masks.shape
    np.testing.assert_array_equal(tm.numpy().astype(bool), masks)
    np.testing.assert_array_equal(spec.regions_to_labels(tm).numpy(), vol)
    np.testing.assert_array_equal(spec.labels_to_nodes(t).numpy(), masks.sum(1))


def test_two_d_slices_and_single_volume() -> None:
    spec = brats_regions()
    sl = np.array([[0, 1, 2], [4, 4, 0]])
    m = spec.labels_to_regions(sl, spatial_dims=2)
    assert m.shape == (3, 2, 3)
    assert m[:, 0, 1].tolist() == [True, True, False] and m[:, 0, 2].tolist() == [True, False, False]
    np.testing.assert_array_equal(spec.regions_to_labels(m, spatial_dims=2), sl)
    with pytest.raises(ValueError, match="spatial_dims"):
        spec.labels_to_regions(np.zeros(4, dtype=int), spatial_dims=3)


def test_probabilities_threshold_and_nesting_is_enforced() -> None:
    spec = brats_regions()
    # voxel 0: ET high but WT low -> background (an inner region needs the outer ones)
    # voxel 1: WT, TC high, ET just below -> TC only -> label 1; voxel 2: all high -> 4; voxel 3: WT only -> 2
    probs = np.array([[0.2, 0.9, 0.9, 0.8], [0.9, 0.7, 0.6, 0.1], [0.95, 0.49, 0.99, 0.99]], dtype=np.float32)
    assert spec.regions_to_labels(probs, spatial_dims=1).tolist() == [0, 1, 4, 2]
    assert spec.regions_to_labels(probs, spatial_dims=1, threshold=0.85).tolist() == [0, 2, 2, 0]
    tp = torch.from_numpy(probs)
    assert spec.regions_to_labels(tp, spatial_dims=1).tolist() == [0, 1, 4, 2]
    assert spec.regions_to_nodes(tp, spatial_dims=1).tolist() == [0, 2, 3, 1]
    with pytest.raises(ValueError, match="expected 3 regions"):
        spec.regions_to_labels(probs[:2], spatial_dims=1)


def test_label_mapping_reads_new_labels_with_old_sets() -> None:
    spec = brats_regions(label_mapping={3: 4})
    vol = np.array([0, 1, 2, 3, 4])
    m = spec.labels_to_regions(vol, spatial_dims=1)
    assert m[:, 3].tolist() == [True, True, True] == m[:, 4].tolist()
    assert spec.output_labels == (2, 1, 3)  # written back in the file's convention
    assert spec.regions_to_labels(m, spatial_dims=1).tolist() == [0, 1, 2, 3, 3]


def test_unknown_labels_are_listed() -> None:
    spec = brats_regions()
    for vol in (np.array([[0, 3, 7], [1, 3, 2]]), torch.tensor([[0, 3, 7], [1, 3, 2]])):
        with pytest.raises(TaxonomyError, match=r"unknown labels \[3, 7\].*known: \[0, 1, 2, 4\]"):
            spec.labels_to_regions(vol, spatial_dims=2)
    with pytest.raises(TaxonomyError, match=r"unknown labels \[-1\]"):
        spec.labels_to_regions(np.array([0, -1]), spatial_dims=1)
    with pytest.raises(TaxonomyError, match=r"unknown labels \[1000000\]"):
        spec.labels_to_regions(np.array([0, 1_000_000]), spatial_dims=1)
    with pytest.raises(TypeError, match="integer"):
        spec.labels_to_regions(np.zeros(3, dtype=np.float32), spatial_dims=1)
    with pytest.raises(TypeError, match="integer"):
        spec.labels_to_regions(torch.zeros(3), spatial_dims=1)


def test_custom_regions_and_validation() -> None:
    spec = nested_regions(["organ", "lesion"], [{1, 2, 3}, {3}], name="liver")
    vol = np.array([0, 1, 2, 3])
    m = spec.labels_to_regions(vol, spatial_dims=1)
    assert m.tolist() == [[False, True, True, True], [False, False, False, True]]
    # ring {1, 2} has two labels: the inverse writes the smallest
    assert spec.regions_to_labels(m, spatial_dims=1).tolist() == [0, 1, 1, 3]
    assert spec.taxonomy.names == ("root", "organ", "lesion") and spec.taxonomy.name == "liver"
    with pytest.raises(ValueError, match="strict subset"):
        NestedRegions(names=("a", "b"), label_sets=(frozenset({1}), frozenset({1})))
    with pytest.raises(ValueError, match="strict subset"):
        NestedRegions(names=("a", "b"), label_sets=(frozenset({1}), frozenset({2})))
    with pytest.raises(ValueError, match="same"):
        NestedRegions(names=("a",), label_sets=(frozenset({1}), frozenset()))
    with pytest.raises(ValueError, match="background"):
        NestedRegions(names=("a",), label_sets=(frozenset({0, 1}),))
    with pytest.raises(ValueError, match="unique"):
        NestedRegions(names=("a", "a"), label_sets=(frozenset({1, 2}), frozenset({1})))


def test_empty_volume() -> None:
    spec = brats_regions()
    m = spec.labels_to_regions(np.zeros((0, 4, 4), dtype=np.int64))
    assert m.shape == (3, 0, 4, 4)
    assert spec.regions_to_labels(m).shape == (0, 4, 4)

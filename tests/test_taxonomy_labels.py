"""node_id_array: the one conversion of user-given nodes (ids or names) to node ids, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hiercls.decode import calibrate_info_gain, prediction_expected_cost
from hiercls.taxonomy import Taxonomy, TaxonomyError, node_id_array

TAX = Taxonomy([("r", "animal"), ("animal", "cat"), ("animal", "dog"), ("r", "car")], name="toy")


@pytest.mark.parametrize(
    "values",
    [["cat", "car"], np.array(["cat", "car"]), [2, 4], np.array([2, 4], dtype=np.int32), torch.tensor([2, 4])],
)
def test_ids_and_names_in_any_container(values) -> None:
    assert node_id_array(values, TAX, name="labels").tolist() == [2, 4]


def test_ignored_samples_only_where_allowed() -> None:
    assert node_id_array([3, -1], TAX, name="y_true", allow_ignore=True, rows=2).tolist() == [3, -1]
    with pytest.raises(TaxonomyError, match=r"y_pred\[1\] = -1 is not a node id of taxonomy 'toy'; expected ids in "):
        node_id_array([3, -1], TAX, name="y_pred")
    with pytest.raises(TaxonomyError, match=r"y_true\[0\] = 5 is not a node id.*\[-1, 5\)"):
        node_id_array([5], TAX, name="y_true", allow_ignore=True)


def test_unknown_name_is_placed_with_close_matches() -> None:
    with pytest.raises(TaxonomyError, match=r"labels\[1\]: unknown label 'dgo' for taxonomy 'toy'; did you mean 'dog'"):
        node_id_array(["cat", "dgo"], TAX, name="labels")


def test_taxonomy_ids_is_the_one_name_lookup() -> None:
    """Taxonomy.ids (what node_id_array looks names up with) takes any iterable and names the first unknown name."""
    assert TAX.ids(n for n in ("car", "r", "dog")).tolist() == [4, 0, 3]
    assert TAX.ids(("cat",)).tolist() == [2] and TAX.ids([]).dtype == np.int64 and TAX.ids([]).size == 0
    with pytest.raises(TaxonomyError, match=r"unknown label 'dgo' for taxonomy 'toy'; did you mean 'dog'") as err:
        TAX.ids(["cat", "dgo", "xx"])
    assert err.value.label == "dgo"
    # Object arrays may hold names as other objects; each is looked up as its str.
    assert node_id_array(np.array([np.str_("dog"), "cat"], dtype=object), TAX, name="labels").tolist() == [3, 2]


def test_shape_and_dtype_refusals() -> None:
    with pytest.raises(ValueError, match=r"labels must hold one node id or name per sample, shape \[3\]; got \[2\]"):
        node_id_array([1, 2], TAX, name="labels", rows=3)
    with pytest.raises(ValueError, match=r"labels must hold one node id or name per sample, shape \[2\]; got \[2, 1\]"):
        node_id_array([[1], [2]], TAX, name="labels", rows=2)
    with pytest.raises(ValueError, match="labels must be integer node ids or node names; got dtype float64"):
        node_id_array([1.0, 2.5], TAX, name="labels")
    assert node_id_array([[1], [2]], TAX, name="candidates").tolist() == [1, 2]  # a list of nodes: any shape
    assert node_id_array([], TAX, name="candidates").dtype == np.int64


def test_a_single_samples_prediction_may_be_a_scalar() -> None:
    probs = np.array([1.0, 0.7, 0.5, 0.2, 0.3])
    one = prediction_expected_cost(probs, 2, TAX, "lca_height")
    assert one.tolist() == prediction_expected_cost(probs[None], ["cat"], TAX, "lca_height").tolist()


def test_info_gain_calibration_labels_go_through_the_same_conversion() -> None:
    probs = np.array([[1.0, 0.9, 0.6, 0.3, 0.1]] * 2)
    by_id = calibrate_info_gain(probs, np.array([2, 3]), TAX, target_accuracy=1.0)
    assert calibrate_info_gain(probs, ["cat", "dog"], TAX, target_accuracy=1.0) == by_id
    with pytest.raises(TaxonomyError, match=r"labels\[1\] = 7 is not a node id of taxonomy 'toy'"):
        calibrate_info_gain(probs, [2, 7], TAX, target_accuracy=1.0)
    with pytest.raises(ValueError, match="labels must be integer node ids or node names; got dtype float64"):
        calibrate_info_gain(probs, [2.0, 2.7], TAX, target_accuracy=1.0)  # was truncated to node 2 before

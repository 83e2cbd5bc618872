"""Issue 29, finding 10: the smaller fidelity gaps between what the docs say and what the code does. Values in the
input's float dtype (NumPy as torch), the rules that need single-label probabilities (``check_label_mass``'s
docstring) and the cost kinds that docs/decoding.md lists. (The ``drop_deepest_level`` option of
``level_argmax_accuracy_score`` is tested in test_metrics.py against a restatement of the reference metric.)"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _generators import node_probs, random_tree

from hiercls.decode import COST_KINDS, ProbabilityError, bayes_node, decode, optimal_hfbeta
from hiercls.decode.checks import check_label_mass

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_values_come_back_in_the_input_float_dtype(dtype) -> None:
    rng = np.random.default_rng(29)
    tax = random_tree(25, rng)
    probs = node_probs(tax, rng, 6).astype(dtype)
    for fn, kw in ((optimal_hfbeta, {"return_value": True}), (bayes_node, {"return_cost": True})):
        _, values = fn(probs, tax, **kw)
        assert isinstance(values, np.ndarray) and values.dtype == dtype, fn.__name__
        _, from_torch = fn(torch.from_numpy(probs), tax, **kw)
        assert from_torch.dtype == getattr(torch, np.dtype(dtype).name)  # the same rule for tensors
        np.testing.assert_allclose(values.astype(np.float64), from_torch.double().numpy(), rtol=1e-6)
        _, wide = fn(probs.astype(np.float64), tax, **kw)
        np.testing.assert_allclose(values.astype(np.float64), wide, rtol=1e-3 if dtype == np.float16 else 1e-5)


def test_only_the_rules_check_label_mass_names_refuse_multilabel_probabilities() -> None:
    doc = check_label_mass.__doc__
    needs = re.findall(r"``(\w+)``", doc.split("need single-label probabilities", 1)[1].split("(and", 1)[0])
    free = re.findall(r"``(\w+)``", doc.split("compare node\n    probabilities only", 1)[1])
    assert needs == ["bayes_node", "crm", "optimal_hfbeta"] and "plurality" in free
    tax = random_tree(12, np.random.default_rng(0))
    multilabel = np.ones((1, tax.num_nodes)) * 0.9  # independent sigmoids: children outweigh their parent
    multilabel[0, 0] = 1.0
    for rule in needs:
        with pytest.raises(ProbabilityError, match="single-label"):
            decode(multilabel, tax, rule=rule)
    for rule in free:
        decode(multilabel, tax, rule=rule)


def test_docs_decoding_lists_every_cost_kind() -> None:
    text = (ROOT / "docs" / "decoding.md").read_text()
    listed = re.search(r"\(`COST_KINDS`: ([^)]*)\)", text).group(1)
    assert re.findall(r"`(\w+)`", listed) == list(COST_KINDS)
    assert len(COST_KINDS) == 7

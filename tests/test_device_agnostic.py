"""Every head's node_probs and loss stay in torch on the input's device: no .cpu() / .numpy() round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _generators import random_tree

from hiercls.heads import create_head, get_head_class, list_heads
from hiercls.taxonomy import Taxonomy

TREE = random_tree(25, 7)
DAG = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y"), ("b", "z")])


def _refuse(*_args, **_kwargs):
    raise AssertionError("host round trip (.cpu() / .numpy()) inside node_probs or loss")


def _variants(name):
    if name == "conditional_softmax":
        return [(TREE, {}), (TREE, {"stop": True}), (TREE, {"huffman_counts": np.arange(1, TREE.num_leaves + 1)})]
    if name == "flat":
        return [(TREE, {}), (DAG, {})]
    return [(TREE, {})]


@pytest.mark.parametrize("name", [h for h in list_heads() if not get_head_class(h).supports_dense])
def test_node_probs_and_loss_without_host_round_trips(name, monkeypatch):
    for tax, options in _variants(name):
        head = create_head(name, tax, 8, **options)
        x = torch.randn(4, 8)
        if name == "multilabel":
            y = torch.zeros(4, tax.num_nodes)
            y[:, 0] = 1
        else:  # leaves, an internal node, an ignored sample
            y = torch.as_tensor([int(tax.leaves[0]), 1, -1, int(tax.leaves[-1])])
        out = head(x)
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "cpu", _refuse)
            m.setattr(torch.Tensor, "numpy", _refuse)
            p = head.node_probs(out)
            loss = head.loss(out, y)
        assert p.device == x.device and loss.device == x.device and torch.isfinite(loss)

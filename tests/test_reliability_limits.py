"""Reliability at the limits (issue 28): every head's output decodes in float32, float16 and bfloat16 with every
rule; deep and wide taxonomies cost memory linear in their size (nested JSON, taxonomy statistics)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _generators import chain, star, tree_with_classes

from hiercls.cli.taxonomy_cmd import render_tree
from hiercls.decode import RULES, decode
from hiercls.heads.registry import HEADS, create_head
from hiercls.taxonomy import Taxonomy, read_taxonomy

# A tree with a wide node (w: 6 children), a chain below it and a deep leaf: sums of many children in float16.
TAX = Taxonomy(
    [
        ("r", "a"),
        ("a", "x"),
        ("a", "y"),
        ("r", "b"),
        ("b", "z"),
        *(("b", f"w{i}") for i in range(6)),
        ("w0", "d"),
        ("d", "e"),
        ("e", "f"),
    ]
)
OPTIONS: dict[str, dict[str, Any]] = {"bayes_node": {"cost": "lca_height"}}
# Heads whose node probabilities are multi-label: the rules that need a parent >= the sum of its children refuse
# them in any dtype (docs/decoding.md); every other pair must decode.
MULTILABEL_HEADS = ("multilabel", "nested_sigmoid")
SINGLE_LABEL_RULES = ("bayes_node", "crm", "optimal_hfbeta")


def _head_outputs(name: str) -> dict[str, torch.Tensor]:
    """Node probabilities of a random head: float32, cast down to float16/bfloat16, and computed under autocast."""
    torch.manual_seed(28)
    head = create_head(name, TAX, 8)
    feats = torch.randn(64, 8) * 3  # confident and unsure rows alike
    with torch.no_grad():
        p32 = head.node_probs(head(feats))
        out = {"float32": p32, "float16": p32.half(), "bfloat16": p32.bfloat16()}
        for dtype in (torch.float16, torch.bfloat16):
            with torch.autocast("cpu", dtype=dtype):
                out[f"autocast_{dtype}"] = head.node_probs(head(feats))
    return out


@pytest.mark.parametrize("head", sorted(HEADS))
def test_every_head_output_decodes_with_every_rule_in_every_dtype(head: str) -> None:
    """Issue 28 item 2: node probabilities of every head in float32, float16 and bfloat16 (a head under AMP, or
    float32 marginals cast down) are not refused by any rule's probability check; B = 0 too."""
    outputs = _head_outputs(head)
    for rule in sorted(RULES):
        refused = head in MULTILABEL_HEADS and rule in SINGLE_LABEL_RULES
        for kind, probs in outputs.items():
            if refused:
                with pytest.raises(ValueError, match="single-label node probabilities"):
                    decode(probs, TAX, rule, **OPTIONS.get(rule, {}))
                continue
            out = decode(probs, TAX, rule, **OPTIONS.get(rule, {}))
            assert out.shape[0] == probs.shape[0], (head, rule, kind)
            assert len(decode(probs[:0], TAX, rule, **OPTIONS.get(rule, {}))) == 0, (head, rule, kind)


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the peak bytes it allocated (tracemalloc: Python objects and NumPy buffers)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def _nested_chain_with_leaves(depth: int, width: int) -> str:
    """A chain ``c0 -> c1 -> ...`` ``depth`` deep, each chain node with ``width`` leaves besides the next."""
    pieces = [f'"c{i}": {{' + "".join(f'"l{i}_{j}": {{}}, ' for j in range(width)) for i in range(depth)]
    return "{" + "".join(pieces) + '"end": {}' + "}" * (depth + 1)


def test_nested_json_memory_does_not_grow_with_depth(tmp_path: Path) -> None:
    """Issue 28 item 6: the nested-JSON reader kept, for every edge, the whole path above it as its location
    (memory ~ nodes x depth: 3 GB for a 3.9 MB file at 900 levels). Now a node costs the same at any depth: the
    same number of nodes, 60 or 1,200 levels deep, within 1.5x of each other's peak."""
    peaks = {}
    for depth, width in ((60, 400), (1200, 19)):
        p = tmp_path / f"n{depth}.json"
        p.write_text(_nested_chain_with_leaves(depth, width), encoding="utf-8")
        tax, peaks[depth] = _peak(lambda p=p: read_taxonomy(p, format="nested"))
        assert tax.height == depth and tax.num_nodes == depth * (width + 1) + 1
    assert peaks[1200] < 1.5 * peaks[60] * (1200 * 20 + 1) / (60 * 401 + 1), peaks


def test_semantic_levels_and_stats_linear_on_a_deep_chain() -> None:
    """``taxonomy stats`` on a 50,000-deep chain tried to allocate 18.6 GiB (semantic levels through the
    ``N x depth`` ancestor matrix). Semantic levels are now counted top-down: equal to the brute force (classes
    among each class's ancestors) on random trees with non-class nodes, and a 5,000-deep chain's statistics
    allocate under 2 KiB per node (the ancestor matrix alone was 12.5 million entries)."""
    for seed in range(10):
        tax = tree_with_classes(40, seed)
        cls = set(tax.classes.tolist())
        want = [sum(a in cls for a in tax.path(n)[:-1]) if n in cls else -1 for n in range(tax.num_nodes)]
        assert tax.semantic_level.tolist() == want
    deep = chain(5000)
    stats, peak = _peak(deep.stats)
    assert stats["height"] == 4999 and stats["semantic_levels"] == 4999
    assert peak < 2048 * deep.num_nodes, peak
    wide = star(20_000)
    assert json.loads(json.dumps(wide.stats()))["nodes_per_depth"] == [1, 20_000]


def test_hie_level_needs_no_path_table() -> None:
    """``hie(level=k)`` took each leaf's ancestor at depth k from the ``[N, height]`` path table (N x depth memory
    on a chain); the parent walk gives the same ancestors (checked against ``Taxonomy.path``)."""
    rng = np.random.default_rng(3)
    tax = tree_with_classes(60, 4)
    leaf = rng.dirichlet(np.ones(tax.num_leaves), size=20)
    node = np.asarray(tax.marginals(leaf))
    for level in range(tax.height + 1):
        got = decode(node, tax, "hie", level=level)
        for b in range(node.shape[0]):
            scores = []
            for lf in tax.leaves:
                path = tax.path(int(lf))
                scores.append(node[b, lf] * node[b, path[min(level, len(path) - 1)]])
            assert int(got[b]) == int(tax.leaves[int(np.argmax(scores))])


def test_show_a_deep_chain_to_any_depth() -> None:
    """``taxonomy show --depth K`` recursed once per level (a RecursionError past ~1,000 levels); the walk now
    keeps its own stack: every node of a 5,000-deep chain is one line, indented once per level."""
    lines = render_tree(chain(5000), depth=6000)
    assert len(lines) == 5000
    assert lines[-1] == " " * 4 * 4998 + "└── n4999"

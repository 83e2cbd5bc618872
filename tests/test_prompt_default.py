"""The bounded default of TransHP's prompting blocks (few coarse levels, capped prompt tokens)."""

from __future__ import annotations

import pytest

from hiercls.models.prompt_pool import DEFAULT_MAX_PROMPT_TOKENS, default_prompt_positions
from hiercls.taxonomy import Taxonomy


def balanced(branching: list[int]) -> Taxonomy:
    edges, frontier = [], ["r"]
    for k in branching:
        nxt = []
        for p in frontier:
            for i in range(k):
                edges.append((p, f"{p}.{i}"))
                nxt.append(f"{p}.{i}")
        frontier = nxt
    return Taxonomy(edges)


def test_at_most_two_levels_coarsest_first():
    tax = balanced([2, 2, 2, 2, 2])  # coarse levels 1..4 of 2, 4, 8, 16 classes
    assert default_prompt_positions(tax, 12) == {9: 1, 10: 2}
    assert default_prompt_positions(tax, 12, max_levels=3) == {8: 1, 9: 2, 10: 3}


def test_token_budget_stops_before_a_wide_level():
    tax = balanced([3, 150, 2])  # level 1: 3 classes, level 2: 450 > budget
    assert default_prompt_positions(tax, 12) == {10: 1}
    total = len(tax.levels[1]) + len(tax.levels[2])
    assert total > DEFAULT_MAX_PROMPT_TOKENS
    assert default_prompt_positions(tax, 12, max_tokens=total) == {9: 1, 10: 2}


def test_a_coarsest_level_over_the_budget_is_refused_with_the_way_out():
    tax = balanced([DEFAULT_MAX_PROMPT_TOKENS + 1, 1, 1])
    with pytest.raises(ValueError, match=r"prompt_blocks=\{block: level\}"):
        default_prompt_positions(tax, 12)
    assert default_prompt_positions(tax, 12, max_tokens=10_000) == {9: 1, 10: 2}

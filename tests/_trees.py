"""Random taxonomies shared by the property tests."""

from __future__ import annotations

import numpy as np

from hiercls.taxonomy import Taxonomy


def random_tree(n: int, rng: np.random.Generator | int) -> Taxonomy:
    """A random tree on ``n0 .. n{n-1}``: node ``i`` hangs under a uniformly drawn earlier node."""
    rng = np.random.default_rng(rng) if isinstance(rng, (int, np.integer)) else rng
    edges = [(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, n)]
    return Taxonomy(edges, nodes=[f"n{i}" for i in range(n)], name="random-tree")

"""Random inputs shared by the property tests (one home for generators; tests import from here, not each other)."""

from __future__ import annotations

import numpy as np


def random_group_forest(rng: np.random.Generator, num_outputs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(group, parent, input_order)`` of a random chained softmax over ``num_outputs`` outputs.

    Groups of 1-5 outputs in random order; each group hangs below a random earlier output (or is a top group)
    that conditions no other group; the outputs read a random injective choice of ``num_outputs + 3`` logits.
    """
    group, parent, taken = [], [], set()
    while len(group) < num_outputs:
        size = min(int(rng.integers(1, 6)), num_outputs - len(group))
        free = [o for o in range(len(group)) if o not in taken]
        up = int(rng.choice(free)) if free and rng.random() < 0.8 else -1
        taken.add(up)
        group += [len(parent)] * size
        parent.append(up)
    perm = rng.permutation(len(parent))  # group ids in no particular order
    rank = np.argsort(perm)
    order = rng.permutation(num_outputs + 3)[:num_outputs]
    return rank[np.array(group)], np.array(parent)[perm], order

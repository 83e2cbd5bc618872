"""Compiled kernel (numba) of :meth:`hiercls.taxonomy.ops.ChainedSoftmax.probs` for CPU inference.

The caller takes the exponentials in torch, a block of rows at a time into a buffer that stays in the CPU cache
(torch's vectorised ``exp`` is several times faster than numba's, which calls libm once per element), and
:func:`chained_probs_rows` does the rest of the chained softmax for those rows while they are still cached:
the group sums, the scales ``c[g] = P(parent of g) / sum_g`` down the tree of groups, and the output
``P(i) = e[input of i] * c[group of i]`` written once, in order.

LLVM emits no vector gathers on the CPUs at hand (it rates them slow), so every indexed access is a scalar load
and the cost is the number of loads: four rows go through each loop together, so that every index is loaded once
for four rows, and the group sums run over groups sorted by size (a fixed inner trip count within each size, so
the loop branches are predicted, and no sum is carried through memory from one element to the next).

Indices are unsigned (numba then skips the negative-index wrap-around). The sums, reciprocals and products are
those of the torch path in the same precision, in another order: the results agree to float rounding.
"""

from __future__ import annotations

import numba
import numpy as np

_JIT = {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}

#: Rows that go through each loop together (the kernel's code is written out for this many).
ROWS = 4


@numba.njit(**_JIT)
def chained_probs_rows(e, out, r0, lead, tiny, huge, sizes, members, member_group, pin, gparent, ntop, src, group,
                       sums, scale, status):  # fmt: skip
    """Chained-softmax probabilities of rows ``r0 .. r0 + len(e) - 1`` from their exponentials.

    Args:
        e: ``[n, num_inputs]`` exponentials of the logits of those rows (C-contiguous).
        out: ``[B, lead + k]`` output; row ``r0 + i`` gets columns ``lead ..`` (the lead columns are not written).
        r0, lead: first output row; columns before the outputs.
        tiny, huge: a row whose group sums leave ``[tiny, huge]`` (in ``e``'s dtype) is flagged in ``status``.
        sizes: ``[C, 4]`` per size class ``(size s, number of groups n, offset in members, offset in
            member_group)``; the class's ``n * s`` members are listed group after group.
        members: input index of each member; member_group: the group of each of a class's groups.
        pin, gparent: per group, the input index of the output it is conditioned on and that output's group
            (groups ``>= ntop`` only; groups are numbered top-down, so ``gparent[g] < g``).
        ntop: groups ``0 .. ntop - 1`` hang below nothing.
        src, group: per output column (``k`` of them), its input index and its group.
        sums, scale: ``[G, 4]`` scratch in ``e``'s dtype.
        status: ``[B]`` zeros; ``status[r0 + i]`` becomes the number of row ``i``'s out-of-range group sums where
            it has any (the row is then not final).

    Returns:
        The number of flagged rows.
    """
    nr = e.shape[0]
    one = e.dtype.type(1.0)
    flat_sums = sums.reshape(-1)
    flat_scale = scale.reshape(-1)
    flagged = 0
    for b in range(0, nr, ROWS):
        # A last block of fewer rows repeats its last row (the same values written twice).
        i0, i1, i2, i3 = b, min(b + 1, nr - 1), min(b + 2, nr - 1), min(b + 3, nr - 1)
        e0, e1, e2, e3 = e[i0], e[i1], e[i2], e[i3]
        # Group sums, one size class at a time.
        for t in range(sizes.shape[0]):
            s, n, off, goff = sizes[t, 0], sizes[t, 1], sizes[t, 2], sizes[t, 3]
            mv = members[off : off + s * n]
            gv = member_group[goff : goff + n]
            if s == 1:
                for q in range(np.uint64(n)):
                    j, g = mv[q], gv[q]
                    sums[g, 0], sums[g, 1], sums[g, 2], sums[g, 3] = e0[j], e1[j], e2[j], e3[j]
            else:
                for q in range(np.uint64(n)):
                    first = np.uint64(s) * q
                    j = mv[first]
                    a0, a1, a2, a3 = e0[j], e1[j], e2[j], e3[j]
                    for m in range(first + np.uint64(1), first + np.uint64(s)):
                        j = mv[m]
                        a0 += e0[j]
                        a1 += e1[j]
                        a2 += e2[j]
                        a3 += e3[j]
                    g = gv[q]
                    sums[g, 0], sums[g, 1], sums[g, 2], sums[g, 3] = a0, a1, a2, a3
        # The range check and the reciprocals in one vectorised pass over the four rows (NaN passes the check, as
        # in the torch path); only when it fails, a second look tells which rows failed.
        bad = 0
        for i in range(np.uint64(flat_sums.shape[0])):
            x = flat_sums[i]
            bad += (x < tiny) | (x > huge)
            flat_scale[i] = one / x
        if bad:
            for r, row in enumerate((i0, i1, i2, i3)):
                row_bad = 0
                for g in range(np.uint64(sums.shape[0])):
                    row_bad += (sums[g, r] < tiny) | (sums[g, r] > huge)
                status[r0 + row] = row_bad  # a repeated last row writes its own flag last
            for row in range(b, min(b + ROWS, nr)):
                flagged += status[r0 + row] > 0
        # Down the tree of groups: scale[g] = e[parent output] * scale[parent group] / sum_g.
        for g in range(np.uint64(ntop), np.uint64(gparent.shape[0])):
            p, q = pin[g], gparent[g]
            scale[g, 0] = e0[p] * scale[q, 0] * scale[g, 0]
            scale[g, 1] = e1[p] * scale[q, 1] * scale[g, 1]
            scale[g, 2] = e2[p] * scale[q, 2] * scale[g, 2]
            scale[g, 3] = e3[p] * scale[q, 3] * scale[g, 3]
        o0, o1, o2, o3 = out[r0 + i0, lead:], out[r0 + i1, lead:], out[r0 + i2, lead:], out[r0 + i3, lead:]
        for i in range(np.uint64(src.shape[0])):
            j, g = src[i], group[i]
            o0[i] = e0[j] * scale[g, 0]
            o1[i] = e1[j] * scale[g, 1]
            o2[i] = e2[j] * scale[g, 2]
            o3[i] = e3[j] * scale[g, 3]
    return flagged

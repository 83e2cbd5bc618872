"""Compiled kernels (numba) of the semantic softmax loss on the CPU (:class:`hiercls.losses.semantic._LevelSmoothedCE`).

The loss's levels are contiguous slices of each row, so a row's per-level work is a handful of contiguous loops;
as torch ops it is two or three small calls per level (a dozen levels on ImageNet-21K), each a pass over a strided
view, which is what a batch of 64 rows spends most of its time on. Here the forward takes every level's sums
and cross-entropy in one call and the backward writes the gradient in one pass. The exponentials stay in torch
(vectorised; numba's ``exp`` is one libm call per element).

The level sums are taken with reassociation allowed (``fastmath={"reassoc"}``: several partial sums in vector
registers, as torch's own sum does), which changes them only by rounding; no other fast-math flag is set, so
NaN and infinities propagate as in torch.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_JIT = {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}


@numba.njit(**_JIT, fastmath={"reassoc"})
def _sum(v):
    acc = v.dtype.type(0.0)
    for j in range(v.shape[0]):
        acc += v[j]
    return acc


@numba.njit(**_JIT)
def level_cross_entropy(t, e, starts, tpos, eps, tiny, sums, per):
    """Per-level sums of ``e`` and label-smoothed cross-entropies ``[B, K]``, in the shared shift of ``e``.

    Args:
        t: ``[B, C]`` logits minus each row's maximum; e: ``[B, C]`` ``exp(t)`` (both C-contiguous, one dtype).
        starts: ``[K + 1]`` level ``l`` is columns ``starts[l] .. starts[l + 1] - 1``.
        tpos: ``[B, K]`` column of each row's target at each level (any column of the level where it has none).
        eps: label smoothing; tiny: the smallest level sum and target exponential the shared shift accepts.
        sums, per: ``[B, K]`` outputs: ``E_l = sum of e over level l`` and ``CE_l = log E_l - log e_t
            + eps (t_t - mean_l(t))`` (the shift cancels from the smoothing term).

    Returns:
        Whether every level sum and target exponential is at least ``tiny`` (NaN fails); at the first that is
        not, it stops (``sums`` and ``per`` incomplete) and the caller takes per-level shifts instead.
    """
    for b in range(t.shape[0]):
        tr, er = t[b], e[b]
        for level in range(starts.shape[0] - 1):
            lo, hi = np.uint64(starts[level]), np.uint64(starts[level + 1])
            s = _sum(er[lo:hi])
            j = np.uint64(tpos[b, level])
            e_t = er[j]
            if not ((s >= tiny) & (e_t >= tiny)):
                return False
            sums[b, level] = s
            value = math.log(s) - math.log(e_t)
            if eps:
                value += eps * (tr[j] - _sum(tr[lo:hi]) / (hi - lo))
            per[b, level] = value
    return True


@numba.njit(**_JIT)
def level_cross_entropy_grad(e, g, sums, starts, tpos, eps, out):
    """The gradient ``g_l * (e / E_l - eps / n_l) - g_l (1 - eps) onehot(t_l)`` of each level, into ``out``.

    Args:
        e: ``[B, C]`` the forward's exponentials; g: ``[B, K]`` upstream gradient times the level coefficients;
        sums: ``[B, K]`` the forward's level sums; starts, tpos, eps: as in :func:`level_cross_entropy`.
        out: ``[B, C]`` (C-contiguous), every column written.
    """
    for b in range(e.shape[0]):
        er, o = e[b], out[b]
        for level in range(starts.shape[0] - 1):
            lo, hi = np.uint64(starts[level]), np.uint64(starts[level + 1])
            gl = g[b, level]
            scale = gl / sums[b, level]
            floor = e.dtype.type(gl * eps / (hi - lo))  # in e's dtype: the loop below stays in it
            ev, ov = er[lo:hi], o[lo:hi]
            for j in range(ev.shape[0]):
                ov[j] = ev[j] * scale - floor
        for level in range(starts.shape[0] - 1):  # after the levels' writes, which cover every column
            o[np.uint64(tpos[b, level])] -= g[b, level] * (1.0 - eps)

"""The compiled row kernel of :func:`hiercls.decode.optimal_hfbeta` for row-major node probabilities on trees.

:func:`hfbeta_tree_rows` decodes each row as :func:`hiercls.decode.hfbeta._tree_block` does, in the same
floating-point operations, so that both paths return the same sets and values. Only the work differs: the block
path gathers and transposes blocks of rows and runs every round on ``[rows, candidates, sizes]`` arrays; the kernel
reads each row once and works in small float64 rows that stay in cache.

Per row, in the block path's depth-major node positions (eight rows at a time, :func:`_lane_passes`): the label
probabilities ``p(n) = P(n) - sum of its children's P`` (refused below ``-mtol`` with the checks on, clipped at 0),
``P~(n) = p(n) + sum of its children's P~``, and the blocked prefix sums of ``p``
(:func:`hiercls.decode._common.prefix_sums_t`), whose differences are the label mass by depth ``r`` and each
candidate's ``q_m(n)``. Then, per threshold round (``fractions`` of ``P~(root)``), the candidates grow top-down,
their ``q`` is gathered and :func:`_solve_row` repeats ``hfbeta._solve``: the search over the sizes ``k`` with its
two stopping bounds, then the certificate of every smaller size. The first certified round writes the row. Rows
that no round certifies, or that need more than ``c0`` candidates, are flagged: the caller hands them to
``_tree_block``, which takes them to its later levels.

Rounding. Exact ties between set sizes (quantised posteriors, ``beta = 0``) are decided by the last bits of the
values, so the kernel reproduces NumPy's sums bit for bit: ``q.sum(2)`` is NumPy's pairwise sum (:func:`_pairwise`),
the search weights are OpenBLAS's fused multiply-adds in its order (:func:`_weights`), ``U(k)`` is ``einsum``'s
two-lane loop (:func:`_einsum_dot`); everything else is elementwise or sequential, and numba, like NumPy, neither
fuses nor reorders those operations. Since the BLAS and NumPy's SIMD loops may round otherwise on another CPU or
build, ``hfbeta`` compares the three with NumPy once per process (:func:`mirror_sums`) and keeps the NumPy path
where they differ.

Vectors. numba runs LLVM without its straight-line (SLP) vectoriser, so work written out lane by lane stays scalar;
the O(N) passes and the weights use 256-bit vector intrinsics on a ``<4 x double>`` type (:class:`_Vec4`) instead.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from hiercls.decode._kernels import CHECK_OFF, _four, closed_form_pick

__all__ = ["hfbeta_tree_rows", "mirror_sums"]

_JIT = {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}

LANES = 8  # rows that go through the O(N) passes together (see _lane_passes)
K_BLOCK = 16  # hfbeta._K_BLOCK: the sizes _solve evaluates per step of its search
_SKIP_MARGIN = 1e-12  # relative margin, far above the round-off of a value (about (M + k) 2**-53), see _solve_row


_VT = ir.VectorType(ir.DoubleType(), 4)


class _Vec4(types.Type):
    """Four float64 lanes held as one LLVM ``<4 x double>`` value (a 256-bit register), for :func:`_lane_passes`.

    numba compiles with LLVM's straight-line (SLP) vectoriser off, so four lanes written out as four variables
    stay scalar; a tuple is kept lane by lane across loop iterations. This type is a vector in the IR itself.
    """

    def __init__(self) -> None:
        super().__init__(name="hiercls.Vec4")


_V4 = _Vec4()


@register_model(_Vec4)
class _Vec4Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VT)


def _lane_pointer(context, builder, sig, args):
    arr = context.make_array(sig.args[0])(context, builder, args[0])
    ptr = cgutils.get_item_pointer(context, builder, sig.args[0], arr, [args[1], args[2]], wraparound=False)
    return builder.bitcast(ptr, _VT.as_pointer())


@intrinsic
def _clear(typingctx, arr):
    """Zero a contiguous 1-D array (``llvm.memset``: numba's loop over a bool row stores a byte at a time)."""

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        size = builder.mul(ary.nitems, context.get_constant(types.intp, context.get_abi_sizeof(ary.data.type.pointee)))
        cgutils.memset(builder, ary.data, size, 0)
        return context.get_dummy_value()

    return types.void(arr), codegen


@intrinsic
def _v4_zero(typingctx):
    """Four zero lanes."""

    def codegen(context, builder, sig, args):
        return ir.Constant(_VT, [0.0] * 4)

    return _V4(), codegen


@intrinsic
def _v4_load(typingctx, arr, i, j):
    """``arr[i, j:j + 4]`` (one vector load; ``arr`` a C-contiguous float64 matrix)."""

    def codegen(context, builder, sig, args):
        return builder.load(_lane_pointer(context, builder, sig, args), align=8)

    return _V4(arr, i, j), codegen


@intrinsic
def _v4_store(typingctx, arr, i, j, v):
    """``arr[i, j:j + 4] = v`` (one vector store)."""

    def codegen(context, builder, sig, args):
        builder.store(args[3], _lane_pointer(context, builder, sig, args), align=8)
        return context.get_dummy_value()

    return types.void(arr, i, j, v), codegen


@intrinsic
def _v4_pack(typingctx, a, b, c, d):
    """The lanes ``(a, b, c, d)`` (float64)."""

    def codegen(context, builder, sig, args):
        vec = ir.Constant(_VT, ir.Undefined)
        for i, v in enumerate(args):
            vec = builder.insert_element(vec, v, ir.Constant(ir.IntType(32), i))
        return vec

    return _V4(types.float64, types.float64, types.float64, types.float64), codegen


@intrinsic
def _v4_add(typingctx, a, b):
    """Lane-wise ``a + b``."""

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return _V4(a, b), codegen


@intrinsic
def _v4_sub(typingctx, a, b):
    """Lane-wise ``a - b``."""

    def codegen(context, builder, sig, args):
        return builder.fsub(args[0], args[1])

    return _V4(a, b), codegen


@intrinsic
def _v4_splat(typingctx, a):
    """The float64 ``a`` in every lane."""

    def codegen(context, builder, sig, args):
        vec = builder.insert_element(ir.Constant(_VT, ir.Undefined), args[0], ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(ir.IntType(32), 4), [0] * 4))

    return _V4(a), codegen


@intrinsic
def _v4_fma(typingctx, a, b, c):
    """Lane-wise ``a * b + c`` with one rounding (``llvm.fma``), as OpenBLAS's dgemm kernels accumulate."""

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VT, [_VT] * 3), "llvm.fma.v4f64")
        return builder.call(fn, args)

    return _V4(a, b, c), codegen


@intrinsic
def _v4_clip(typingctx, a):
    """Lane-wise ``a if a >= 0 else 0.0`` (the label probabilities' clipping)."""

    def codegen(context, builder, sig, args):
        zero = ir.Constant(_VT, [0.0] * 4)
        return builder.select(builder.fcmp_ordered(">=", args[0], zero), args[0], zero)

    return _V4(a), codegen


@intrinsic
def _v4_any_below(typingctx, a, t):
    """Whether some lane of ``a`` is below the float64 ``t``."""

    def codegen(context, builder, sig, args):
        tv = builder.insert_element(ir.Constant(_VT, ir.Undefined), args[1], ir.Constant(ir.IntType(32), 0))
        tv = builder.shuffle_vector(tv, tv, ir.Constant(ir.VectorType(ir.IntType(32), 4), [0] * 4))
        bits = builder.bitcast(builder.fcmp_ordered("<", args[0], tv), ir.IntType(4))
        return builder.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(4), 0))

    return types.boolean(a, t), codegen


@numba.njit(**_JIT)
def _pairwise(a, j, m_count):
    """``a[0:m_count, j].sum()`` as NumPy's pairwise sum adds a contiguous row of up to 128 values."""
    if m_count < 8:
        res = 0.0
        for i in range(m_count):
            res += a[i, j]
        return res
    r0, r1, r2, r3 = a[0, j], a[1, j], a[2, j], a[3, j]
    r4, r5, r6, r7 = a[4, j], a[5, j], a[6, j], a[7, j]
    i = 8
    while i < m_count - (m_count % 8):
        r0 += a[i, j]
        r1 += a[i + 1, j]
        r2 += a[i + 2, j]
        r3 += a[i + 3, j]
        r4 += a[i + 4, j]
        r5 += a[i + 5, j]
        r6 += a[i + 6, j]
        r7 += a[i + 7, j]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < m_count:
        res += a[i, j]
        i += 1
    return res


@numba.njit(**_JIT)
def _einsum_dot(a, b, m_count):
    """``sum(a * b)`` as ``np.einsum("gm,km->gk")`` adds contiguous rows: two lanes, four steps unrolled, no fma."""
    acc0 = 0.0
    acc1 = 0.0
    i = 0
    while m_count - i >= 8:
        acc0 = a[i + 6] * b[i + 6] + acc0
        acc1 = a[i + 7] * b[i + 7] + acc1
        acc0 = a[i + 4] * b[i + 4] + acc0
        acc1 = a[i + 5] * b[i + 5] + acc1
        acc0 = a[i + 2] * b[i + 2] + acc0
        acc1 = a[i + 3] * b[i + 3] + acc1
        acc0 = a[i] * b[i] + acc0
        acc1 = a[i + 1] * b[i + 1] + acc1
        i += 8
    while i < m_count:
        acc0 = a[i] * b[i] + acc0
        if i + 1 < m_count:
            acc1 = a[i + 1] * b[i + 1] + acc1
        i += 2
    return acc0 + acc1


@numba.njit(**_JIT)
def _bound(k, r, frac, ps, sp, nv, c, tau, b2, m_count):
    """``min(U(k), mass bound(k))``: ``hfbeta._upper_bound`` and ``hfbeta._mass_bound`` of one size."""
    u = (1.0 + b2) * _einsum_dot(r, frac[k], m_count)
    kk = min(k, nv)
    top = sp[kk] + (k - kk) * tau
    nxt = ps[min(k, c - 1)] if k < nv else tau
    mb = (1.0 + b2) * max(top / (b2 + k), nxt)
    return min(u, mb)


@numba.njit(**_JIT)
def _weights(qt, nv, m_count, ck, scratch):
    """``scratch[0, :nv]``: the search weights ``sum_m ck[m] qt[m, j]`` of the candidates, rounded as the BLAS
    ``matmul`` of ``_search_weights`` rounds them (OpenBLAS on x86-64): fused multiply-adds over the depths in
    order, from 0, for fewer than 32 depths; from 32 on, eight accumulators (depth ``m`` into ``m % 8``) added
    pairwise at the end. Candidates go four to a vector, 32 at a time (eight independent chains hide the fma
    latency) or four at a time with the eight accumulators; ``qt``'s columns past ``nv`` (up to a multiple of 32)
    and its rows past ``m_count`` (up to a multiple of 8) are 0, as is ``ck`` past ``m_count``.
    """
    if m_count < 32:
        for jb in range(0, nv, 32):
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _v4_zero()
            for m in range(m_count):
                cm = _v4_splat(ck[m])
                a0 = _v4_fma(cm, _v4_load(qt, m, jb), a0)
                a1 = _v4_fma(cm, _v4_load(qt, m, jb + 4), a1)
                a2 = _v4_fma(cm, _v4_load(qt, m, jb + 8), a2)
                a3 = _v4_fma(cm, _v4_load(qt, m, jb + 12), a3)
                a4 = _v4_fma(cm, _v4_load(qt, m, jb + 16), a4)
                a5 = _v4_fma(cm, _v4_load(qt, m, jb + 20), a5)
                a6 = _v4_fma(cm, _v4_load(qt, m, jb + 24), a6)
                a7 = _v4_fma(cm, _v4_load(qt, m, jb + 28), a7)
            _v4_store(scratch, 0, jb, a0)
            _v4_store(scratch, 0, jb + 4, a1)
            _v4_store(scratch, 0, jb + 8, a2)
            _v4_store(scratch, 0, jb + 12, a3)
            _v4_store(scratch, 0, jb + 16, a4)
            _v4_store(scratch, 0, jb + 20, a5)
            _v4_store(scratch, 0, jb + 24, a6)
            _v4_store(scratch, 0, jb + 28, a7)
        return
    for jb in range(0, nv, 4):
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = _v4_zero()
        for m in range(0, m_count, 8):  # the padding adds fma(0, 0, s) = s: nothing
            s0 = _v4_fma(_v4_splat(ck[m]), _v4_load(qt, m, jb), s0)
            s1 = _v4_fma(_v4_splat(ck[m + 1]), _v4_load(qt, m + 1, jb), s1)
            s2 = _v4_fma(_v4_splat(ck[m + 2]), _v4_load(qt, m + 2, jb), s2)
            s3 = _v4_fma(_v4_splat(ck[m + 3]), _v4_load(qt, m + 3, jb), s3)
            s4 = _v4_fma(_v4_splat(ck[m + 4]), _v4_load(qt, m + 4, jb), s4)
            s5 = _v4_fma(_v4_splat(ck[m + 5]), _v4_load(qt, m + 5, jb), s5)
            s6 = _v4_fma(_v4_splat(ck[m + 6]), _v4_load(qt, m + 6, jb), s6)
            s7 = _v4_fma(_v4_splat(ck[m + 7]), _v4_load(qt, m + 7, jb), s7)
        total = _v4_add(_v4_add(_v4_add(s0, s1), _v4_add(s2, s3)), _v4_add(_v4_add(s4, s5), _v4_add(s6, s7)))
        _v4_store(scratch, 0, jb, total)


@numba.njit(**_JIT)
def _evaluate(k, qt, nv, c, m_count, tau, tau_depth, depth_reached, b2, coef, den, rden, best, scratch, perm):
    """One size ``k`` of ``_solve``'s search: ``(value, estimate, exact, out)``.

    The weights ``w_k`` of the candidates, sorted descending into ``scratch[1]`` (``perm`` their candidates,
    starting from the previous size's order: nearly sorted, a few swaps); ``out`` the bound on every outside
    node's weight; ``exact``: the top ``k`` are the global ones (``out <= kth``), else ``scratch[5, k]`` holds the
    relaxation. ``value`` is ``V_k`` summed in ``_solve``'s order where it may reach ``best`` (else ``-inf``, and
    for infeasible sizes), ``estimate`` an upper estimate of it within 1e-13 (``-inf`` when infeasible).
    """
    w = scratch[0]
    ws = scratch[1]
    _weights(qt, nv, m_count, coef[k], scratch)
    for i in range(nv):
        v = w[perm[i]]
        p = perm[i]
        t = i
        while t > 0 and ws[t - 1] < v:
            ws[t] = ws[t - 1]
            perm[t] = perm[t - 1]
            t -= 1
        ws[t] = v
        perm[t] = p
    # The outside bound max_m tau_depth[m] / den[k, m]: the quotients by reciprocals find the few depths within
    # 1e-14 of the largest (each is within 2 ulp of its quotient), which are then divided exactly.
    approx = 0.0
    for m in range(1, depth_reached + 1):
        approx = max(approx, tau_depth[m] * rden[k, m])
    near = approx * (1.0 - 1e-14)
    out = 0.0
    for m in range(1, depth_reached + 1):
        if tau_depth[m] * rden[k, m] >= near:
            out = max(out, tau_depth[m] / den[k, m])
    out = (1.0 + b2) * out
    value = -np.inf
    estimate = -np.inf
    if k <= nv:
        # Four partial sums are within 1e-13 (relative) of the sequential sum: only a size that may reach the
        # best needs the sum in _solve's order.
        p0 = p1 = p2 = p3 = 0.0
        for i in range(0, k - 3, 4):
            p0 += ws[i]
            p1 += ws[i + 1]
            p2 += ws[i + 2]
            p3 += ws[i + 3]
        for i in range(k - k % 4, k):
            p0 += ws[i]
        estimate = ((p0 + p1) + (p2 + p3)) * (1.0 + _SKIP_MARGIN)
        if estimate >= best:
            value = 0.0
            for i in range(k):
                value += ws[i]
        ex = out <= ws[k - 1]
    else:
        ex = tau == 0.0
    if not ex:
        rel = 0.0
        for i in range(min(k, c)):
            rel += max(ws[i] if i < nv else -1.0, out)
        scratch[5, k] = rel + max(k - c, 0) * out
    return value, estimate, ex, out


@numba.njit(**_JIT)
def _solve_row(
    qt, nv, c, kmax, tau, tau_depth, depth_reached, r, best0, b2, lv, coef, frac, den, rden, scratch, iscratch
):
    """``hfbeta._solve`` for one row: ``(certified, best value, best size)``; the weights of the best size are
    left in ``scratch[0, :nv]``.

    ``qt[m, j]`` is candidate ``j``'s label mass at depth ``m`` (0 past ``nv``, up to a multiple of 32);
    ``coef[k]``, ``frac[k]`` and ``den[k]`` the per-size tables of the search weights, of ``U(k)`` and of the
    outside bound (``b2 lv + k``), ``rden`` the reciprocals of ``den``.

    ``_solve`` evaluates every size of a block of 16, then stops after the block where the bound on larger sizes
    falls to the best value. This gives the same best value, size and certificate with fewer evaluations:

    * it stops inside a block at the first size whose bound is below the best by more than ``_SKIP_MARGIN``
      (relative, far above the round-off): no later size can reach the best, and the certificate never looks
      past that size;
    * past the best size it evaluates ``a`` and a larger ``b`` and settles every size ``k`` between without
      evaluating it when (i) at least ``k`` weights ``w_b`` are at least ``out_a``, or the sum of the ``k``
      largest ``max(w_a, out_a)`` is at most the best: the computed weights and ``out`` only shrink as ``k``
      grows (every rounding is monotone), so ``k`` is ``exact``, or its relaxation at most the best, exactly as
      ``_solve`` finds it; and (ii) the interval bound of ``_SizeSearch`` (``w_k`` is convex in ``k``, top-``k``
      sums concave) keeps ``V_k`` below the best by the margin. Otherwise it evaluates them one by one.
    """
    m_count = r.shape[0]
    ps = scratch[2]
    sp = scratch[3]
    exact = scratch[4]
    relaxed = scratch[5]
    ub = scratch[6]
    rel_a = scratch[7]
    ws = scratch[1]
    w = scratch[0]
    perm = iscratch[0]
    # p_sorted: the candidates' q.sum(2) (pairwise), sorted descending, zeros for the padding, capped below by tau.
    for j in range(nv):
        v = _pairwise(qt, j, m_count)
        i = j
        while i > 0 and ps[i - 1] < v:
            ps[i] = ps[i - 1]
            i -= 1
        ps[i] = v
    for j in range(nv, c):
        ps[j] = 0.0
    sp[0] = 0.0
    for j in range(c):
        if ps[j] < tau:
            ps[j] = tau
        sp[j + 1] = sp[j] + ps[j]
    best = best0
    best_k = 0
    for k in range(kmax + 2):
        ub[k] = np.nan  # not computed yet
        exact[k] = 0.0  # sizes never evaluated are not settled, as in _solve
        relaxed[k] = np.inf
    for j in range(nv):
        perm[j] = j
    k0 = 1
    active = nv > 0
    stride = 4  # the first jump past the best size; doubles after each success
    while active and k0 <= kmax:
        k1 = min(kmax, k0 + K_BLOCK - 1)
        k = k0
        while k <= k1:
            ub[k] = _bound(k, r, frac, ps, sp, nv, c, tau, b2, m_count)
            if ub[k] * (1.0 + _SKIP_MARGIN) < best:
                break  # V_k' <= ub[k] < best for every k' >= k: k_hat <= k
            value, est_a, ex, out_a = _evaluate(
                k, qt, nv, c, m_count, tau, tau_depth, depth_reached, b2, coef, den, rden, best, scratch, perm
            )
            exact[k] = 1.0 if ex else 0.0
            if value > best:
                best = value
                best_k = k
                k += 1
                continue
            # Jumps from the evaluated size a to b: the sizes between are settled if (i) and (ii) hold.
            a = k
            k = a + 1
            while True:
                b = min(k1, nv, a + stride)
                if b < a + 2:
                    break
                nxt_a = ws[a] if a < nv else 0.0
                # The relaxation of each size between, bounded by a's: sums of max(ws_a, out_a) in _solve's order.
                rel = 0.0
                for i in range(b - 1):
                    rel += max(ws[i], out_a)
                    rel_a[i + 1] = rel
                value_b, est_b, ex_b, out_b = _evaluate(
                    b, qt, nv, c, m_count, tau, tau_depth, depth_reached, b2, coef, den, rden, best, scratch, perm
                )
                count = 0
                for j in range(nv):
                    count += w[j] >= out_a
                kth_b = ws[b - 1]
                settled = True
                for kk in range(a + 1, b):
                    lam = (b - kk) / (b - a)
                    bound = lam * (est_a + (kk - a) * nxt_a) + (1.0 - lam) * (est_b - (b - kk) * kth_b)
                    settled = (kk <= count or rel_a[kk] <= best) and bound * (1.0 + _SKIP_MARGIN) < best
                    if not settled:
                        break
                if not settled:  # evaluate the sizes from a + 1 on, one by one
                    stride = 2
                    break
                for kk in range(a + 1, b):
                    if kk <= count:
                        exact[kk] = 1.0
                    else:
                        relaxed[kk] = rel_a[kk]
                exact[b] = 1.0 if ex_b else 0.0
                k = b + 1
                if value_b > best:
                    best = value_b
                    best_k = b
                    break
                stride *= 2
                a, est_a, out_a = b, est_b, out_b
        nxt = k1 + 1
        if ub[nxt] != ub[nxt]:
            ub[nxt] = _bound(nxt, r, frac, ps, sp, nv, c, tau, b2, m_count)
        if ub[nxt] <= best or (nxt > nv and tau == 0.0):
            active = False
        k0 = k1 + 1
    # The certificate: every size below the first one whose bound is at most the best must be settled.
    k_hat = kmax + 2
    for k in range(1, kmax + 2):
        if ub[k] != ub[k]:
            ub[k] = _bound(k, r, frac, ps, sp, nv, c, tau, b2, m_count)
        if ub[k] <= best:
            k_hat = k
            break
    need = k_hat - 1
    ok = need <= kmax or tau == 0.0
    for k in range(1, min(need, kmax) + 1):
        if not ok:
            break
        if exact[k] == 0.0 and not relaxed[k] <= best:
            ok = False
    if ok and best_k > 0:
        ck = coef[best_k]
        for j in range(nv):
            w[j] = 0.0
        for m in range(m_count):
            if lv[m] > 0:
                cm = ck[m]
                for j in range(nv):
                    w[j] += qt[m, j] * cm
    return ok, best, best_k


@numba.njit(**_JIT)
def _size_tables(m_count, kt, b2, include_root):
    """Label sizes ``lv`` and the per-size tables of :func:`_solve_row`, as ``_solve`` and ``_upper_bound`` compute
    them (float64 sizes and label sizes): ``coef[k]`` the search weights' coefficients (0 past ``m_count``, up to a
    multiple of 8, see :func:`_weights`), ``frac[k]`` those of ``U(k)``, ``den[k]`` the outside bound's
    denominators ``b2 lv + k`` and ``rden`` their reciprocals."""
    lv = np.empty(m_count)
    for m in range(m_count):
        lv[m] = np.float64(m + (1 if include_root else 0))
    coef = np.zeros((kt + 1, 8 * ((m_count + 7) // 8)))
    frac = np.zeros((kt + 1, m_count))
    den = np.empty((kt + 1, m_count))
    for k in range(1, kt + 1):
        kf = np.float64(k)
        for m in range(m_count):
            den[k, m] = b2 * lv[m] + kf
            if lv[m] > 0:
                coef[k, m] = (1.0 + b2) / (b2 * lv[m] + kf)
                frac[k, m] = lv[m] / (b2 * lv[m] + max(kf, lv[m]))
    return lv, coef, frac, den, 1.0 / den


@numba.njit(**_JIT)
def mirror_sums(q, ks, b2, include_root):
    """The kernel's own roundings of NumPy's sums, on a candidate table ``q [c, M]``:
    the search weights of the sizes ``ks`` (``_search_weights``), ``U(k)`` for the label mass ``q[0]``
    (``_upper_bound``) and ``q.sum(1)``. ``hfbeta`` compares them with NumPy's once per process and leaves the
    rows to NumPy where they differ (another BLAS, another NumPy), so that the two paths round alike."""
    c, m_count = q.shape
    kt = int(ks.max()) + 1
    _lv, coef, frac, _den, _rden = _size_tables(m_count, kt, b2, include_root)
    qt = np.zeros((8 * ((m_count + 7) // 8), 32 * ((c + 31) // 32)))
    qt[:m_count, :c] = q.T
    scratch = np.zeros((1, qt.shape[1]))
    w = np.empty((ks.shape[0], c))
    u = np.empty(ks.shape[0])
    r = q[0].copy()
    for i in range(ks.shape[0]):
        _weights(qt, c, m_count, coef[ks[i]], scratch)
        w[i] = scratch[0, :c]
        u[i] = (1.0 + b2) * _einsum_dot(r, frac[ks[i]], m_count)
    sums = np.empty(c)
    for j in range(c):
        sums[j] = _pairwise(qt, j, m_count)
    return w, u, sums


@numba.njit(**_JIT)
def _lane_passes(x, b0, check, order, fam_parent, fam_first, fam_size, mtol, bs, w, prefix=True):
    """The label probabilities, ``P~`` and the blocked prefix sums of the label probabilities of the rows ``b0 ..
    b0 + 7`` (rows past the end repeat the last one), in one work array ``w [positions, 24]``: columns 0-7 the
    node probabilities, then the prefix sums; 8-15 the label probabilities; 16-23 ``P~``, one column per row.

    Every step is the same for the eight rows, so each loop runs once for all of them on two four-lane vectors
    (``_v4_*``; numba leaves straight-line code unvectorised), which also amortises the branches of the loops
    over children eight times. The rows are first checked (``check``: the kernels' check arguments, see
    ``_kernels._four``). Returns the first row that fails the check or whose label mass is refused (``mtol``, with
    the checks on), or ``-1``. ``prefix=False`` skips the prefix sums (columns 0-7 then keep the node probabilities).
    """
    parent, mode, lo, hi, edge_tol, root_tol = check
    for b in range(b0, min(b0 + LANES, x.shape[0]), 4):  # the input check, four rows at a time
        bad = _four(x, b, parent, mode, lo, hi, edge_tol, root_tol)[0]
        if bad >= 0:
            return bad
    check_mass = mode != CHECK_OFF
    n = x.shape[1]
    last = x.shape[0] - 1
    r0 = x[b0]
    r1 = x[min(b0 + 1, last)]
    r2 = x[min(b0 + 2, last)]
    r3 = x[min(b0 + 3, last)]
    r4 = x[min(b0 + 4, last)]
    r5 = x[min(b0 + 5, last)]
    r6 = x[min(b0 + 6, last)]
    r7 = x[min(b0 + 7, last)]
    # Node probabilities in depth-major positions; leaves' label probability and P~: P clipped at 0.
    for j in range(n):
        o = order[j]
        lo4 = _v4_pack(np.float64(r0[o]), np.float64(r1[o]), np.float64(r2[o]), np.float64(r3[o]))
        hi4 = _v4_pack(np.float64(r4[o]), np.float64(r5[o]), np.float64(r6[o]), np.float64(r7[o]))
        _v4_store(w, j, 0, lo4)
        _v4_store(w, j, 4, hi4)
        lo4 = _v4_clip(lo4)
        hi4 = _v4_clip(hi4)
        _v4_store(w, j, 8, lo4)
        _v4_store(w, j, 12, hi4)
        _v4_store(w, j, 16, lo4)
        _v4_store(w, j, 20, hi4)
    # Internal nodes, deepest first (children before parents), grouped by their number of children so that the
    # loop over the children ends where the branch predictor expects. Children are summed in ascending order
    # from 0, as the csr products of the block path do.
    bad = False
    zero = _v4_zero()
    for f in range(fam_parent.shape[0]):
        c = fam_first[f]
        kx_lo = kx_hi = ks_lo = ks_hi = zero
        for i in range(c, c + fam_size[f]):
            kx_lo = _v4_add(kx_lo, _v4_load(w, i, 0))
            kx_hi = _v4_add(kx_hi, _v4_load(w, i, 4))
            ks_lo = _v4_add(ks_lo, _v4_load(w, i, 16))
            ks_hi = _v4_add(ks_hi, _v4_load(w, i, 20))
        u = fam_parent[f]
        v_lo = _v4_sub(_v4_load(w, u, 0), kx_lo)
        v_hi = _v4_sub(_v4_load(w, u, 4), kx_hi)
        bad |= _v4_any_below(v_lo, -mtol[u]) | _v4_any_below(v_hi, -mtol[u])
        v_lo = _v4_clip(v_lo)
        v_hi = _v4_clip(v_hi)
        _v4_store(w, u, 8, v_lo)
        _v4_store(w, u, 12, v_hi)
        _v4_store(w, u, 16, _v4_add(v_lo, ks_lo))
        _v4_store(w, u, 20, _v4_add(v_hi, ks_hi))
    if check_mass and bad:
        for lane in range(LANES):  # which row: the same test again, lane by lane
            for f in range(fam_parent.shape[0]):
                u = fam_parent[f]
                kx = 0.0
                for i in range(fam_first[f], fam_first[f] + fam_size[f]):
                    kx += w[i, lane]
                if w[u, lane] - kx < -mtol[u]:
                    return min(b0 + lane, last)
    if not prefix:  # the Bayes kernel needs the label probabilities and P~ only
        return -1
    # Blocked prefix sums (prefix_sums_t): the sum within the block of bs plus the sum of the earlier blocks.
    # They replace the node probabilities, not needed any more.
    nb = (n + bs - 1) // bs
    t_lo = t_hi = zero
    for blk in range(nb):
        a_lo = a_hi = zero
        for j in range(blk * bs, blk * bs + bs):
            _v4_store(w, j, 0, _v4_add(a_lo, t_lo))
            _v4_store(w, j, 4, _v4_add(a_hi, t_hi))
            a_lo = _v4_add(a_lo, _v4_load(w, j, 8))
            a_hi = _v4_add(a_hi, _v4_load(w, j, 12))
        t_lo = _v4_add(t_lo, a_lo)
        t_hi = _v4_add(t_hi, a_hi)
    _v4_store(w, nb * bs, 0, t_lo)
    _v4_store(w, nb * bs, 4, t_hi)
    return -1


@numba.njit(**_JIT)
def hfbeta_tree_rows(
    x,
    parent,
    mode,
    lo,
    hi,
    edge_tol,
    root_tol,
    order,
    fam_parent,
    fam_first,
    fam_size,
    cstart,
    cend,
    mtol,
    lo_tab,
    hi_tab,
    span,
    seg_lo,
    seg_hi,
    bs,
    fractions,
    c0,
    max_k,
    b2,
    include_root,
    sets,
    values,
    flags,
):
    """The optimal hF-beta sets of a tree's rows (``hfbeta._tree_block``, row by row in the same arithmetic).

    Writes ``sets[b]`` and ``values[b]`` for every certified row and ``flags[b] = True`` for the others (left for
    the NumPy path). Returns ``-1``, or a row that fails the input check or the label-mass check (``mtol`` per
    depth-major position, with the checks on), as the kernels of :mod:`._kernels` do.

    The tables (``hfbeta._row_kernel_tables``): ``order`` maps depth-major positions to node ids;
    ``fam_parent``/``fam_first``/``fam_size`` list the internal nodes' positions, their first child's position and
    their number of children, deepest first; ``cstart``/``cend`` every position's children's positions;
    ``lo_tab``/``hi_tab`` ``[N, h+1]`` each node's descendants by depth as ranges of positions (empty outside the
    depths ``span[n, 0] .. span[n, 1] - 1`` of its subtree); ``seg_lo``/``seg_hi`` the depths' ranges; ``bs`` the
    block of the prefix sums; ``fractions`` the threshold rounds. ``c0`` is the most candidates of a round,
    ``max_k`` the fewest sizes searched (``hfbeta._BLOCK_WIDTH``), ``b2`` is ``beta ** 2``.
    """
    n = x.shape[1]
    m_count = lo_tab.shape[1]
    nb = (n + bs - 1) // bs
    work = np.zeros((nb * bs + 1, 3 * LANES))  # see _lane_passes; the padding past n stays 0
    r = np.empty(m_count)
    tau_depth = np.zeros(m_count)
    width_max = 32 * ((c0 + 1 + 31) // 32)
    kt = max(width_max, max_k) + 2
    qt = np.zeros((8 * ((m_count + 7) // 8), width_max))  # rows past m_count stay 0, see _weights
    cand = np.empty(c0 + 2, dtype=np.intp)
    ids = np.empty(c0 + 2, dtype=np.intp)
    frontier = np.empty(c0 + 2, dtype=np.intp)
    nxt_frontier = np.empty(c0 + 2, dtype=np.intp)
    scratch = np.empty((8, max(kt, width_max) + 1))
    iscratch = np.empty((1, width_max), dtype=np.intp)
    lv, coef, frac, den, rden = _size_tables(m_count, kt, b2, include_root)
    check = (parent, mode, lo, hi, edge_tol, root_tol)
    for b0 in range(0, x.shape[0], LANES):
        failed = _lane_passes(x, b0, check, order, fam_parent, fam_first, fam_size, mtol, bs, work)
        if failed >= 0:
            return failed
        for b in range(b0, min(b0 + LANES, x.shape[0])):
            lane = b - b0
            for m in range(m_count):
                r[m] = work[seg_hi[m], lane] - work[seg_lo[m], lane]
            best0 = -np.inf if include_root else r[0]
            certified = False
            for fi in range(fractions.shape[0]):
                thr = fractions[fi] * work[0, 2 * LANES + lane]
                for m in range(m_count):
                    tau_depth[m] = 0.0
                nc = 0
                if include_root:
                    cand[0] = 0
                    nc = 1
                count = 0
                nf = 1
                frontier[0] = 0
                depth = 0
                too_many = False
                # Candidates grow top-down: the children of candidates with P~ above thr; tau_depth keeps the
                # largest P~ left out at each depth.
                while nf > 0:
                    depth += 1
                    nn = 0
                    td = 0.0
                    for f in range(nf):
                        u = frontier[f]
                        for i in range(cstart[u], cend[u]):
                            v = work[i, 2 * LANES + lane]
                            if v > thr:
                                if count + nn >= c0:
                                    too_many = True
                                    break
                                nxt_frontier[nn] = i
                                nn += 1
                            elif v > td:
                                td = v
                        if too_many:
                            break
                    if too_many:
                        break
                    if depth < m_count:
                        tau_depth[depth] = td
                    for f in range(nn):
                        frontier[f] = nxt_frontier[f]
                        cand[nc + f] = nxt_frontier[f]
                    nc += nn
                    count += nn
                    nf = nn
                if too_many:  # more than c0 candidates: every later round has more still
                    break
                reached = min(depth, m_count - 1)
                tau = 0.0
                for m in range(reached + 1):
                    tau = max(tau, tau_depth[m])
                # Candidates by node id (ancestors before descendants), their q from the prefix sums.
                for t in range(nc):
                    v = order[cand[t]]
                    i = t
                    while i > 0 and ids[i - 1] > v:
                        ids[i] = ids[i - 1]
                        i -= 1
                    ids[i] = v
                for t in range(nc):
                    u = ids[t]
                    # Above the node's depth and below its subtree's deepest level the range is empty: cs - cs = 0.
                    for m in range(m_count):
                        qt[m, t] = 0.0
                    for m in range(span[u, 0], span[u, 1]):
                        qt[m, t] = work[hi_tab[u, m], lane] - work[lo_tab[u, m], lane]
                for m in range(m_count):
                    for t in range(nc, nc + (-nc) % 32):
                        qt[m, t] = 0.0
                c = max(8 * ((nc + 7) // 8), 8)
                kmax = max(c, max_k)
                ok, best, best_k = _solve_row(
                    qt, nc, c, kmax, tau, tau_depth, reached, r, best0, b2, lv, coef, frac, den, rden, scratch, iscratch
                )
                if not ok:
                    continue
                out = sets[b]
                _clear(out)
                out[0] = True
                w = scratch[0]
                # The top best_k weights, ties to the smaller id (a stable descending sort of id-sorted candidates).
                if best_k > 0:
                    for j in range(nc):
                        rank = 0
                        for t in range(nc):
                            if w[t] > w[j] or (w[t] == w[j] and t < j):
                                rank += 1
                        if rank < best_k:
                            out[ids[j]] = True
                values[b] = best
                certified = True
                break
            flags[b] = not certified
    return -1


@numba.njit(**_JIT)
def bayes_lane_rows(
    x,
    parent,
    mode,
    lo,
    hi,
    edge_tol,
    root_tol,
    order,
    fam_parent,
    fam_first,
    fam_size,
    cstart,
    cend,
    mtol,
    bs,
    parent_pos,
    depth_pos,
    cand_pos,
    lca_height,
    every,
    height,
    tol,
    out,
):
    """``_kernels.bayes_tree_rows`` on eight rows at a time, from the label probabilities and ``P~`` of
    :func:`_lane_passes` (the same sums: children in ascending id order, added from 0), in depth-major positions.

    Shortest path over every node (``every``): descend from the root to the child with ``P~ > P~(root) / 2 + tol``
    while there is one (``cstart``/``cend``: each position's children). Otherwise the path sums ``A`` (root first,
    ``parent_pos``) and the first candidate (``cand_pos``: the candidates' positions in ascending id order) whose
    score is within ``tol`` of the best, as ``bayes_tree_rows``. ``out`` gets node ids (``order`` of positions).
    """
    n = x.shape[1]
    nb = (n + bs - 1) // bs
    work = np.zeros((nb * bs + 1, 3 * LANES))  # see _lane_passes; the padding past n stays 0
    a = np.empty((n, LANES))
    check = (parent, mode, lo, hi, edge_tol, root_tol)
    zero = _v4_zero()
    for b0 in range(0, x.shape[0], LANES):
        rows = min(LANES, x.shape[0] - b0)
        failed = _lane_passes(x, b0, check, order, fam_parent, fam_first, fam_size, mtol, bs, work, False)
        if failed >= 0:
            return failed
        if every and not lca_height:
            for lane in range(rows):
                half = 0.5 * work[0, 2 * LANES + lane] + tol
                cur = 0
                while True:
                    nxt = -1
                    for c in range(cstart[cur], cend[cur]):
                        if work[c, 2 * LANES + lane] > half:
                            nxt = c
                            break
                    if nxt < 0:
                        break
                    cur = nxt
                out[b0 + lane] = order[cur]
            continue
        _v4_store(a, 0, 0, zero)  # the root is the LCA of every pair: it adds the same to every score
        _v4_store(a, 0, 4, zero)
        for j in range(1, n):  # positions are depth-major: a parent's path sum is final before its children's
            k = parent_pos[j]
            _v4_store(a, j, 0, _v4_add(_v4_load(a, k, 0), _v4_load(work, j, 2 * LANES)))
            _v4_store(a, j, 4, _v4_add(_v4_load(a, k, 4), _v4_load(work, j, 2 * LANES + 4)))
        for lane in range(rows):
            mass = work[0, 2 * LANES + lane]
            best = closed_form_pick(a, lane, work, LANES + lane, mass, cand_pos, depth_pos, lca_height, height, tol)
            out[b0 + lane] = order[best]
    return -1

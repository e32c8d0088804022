"""Vectorised CPU kernels (``@njit(parallel=True)``) built on the scalar definitions.

Every kernel calls the ``register_jitable`` functions of emu/_scalar.py; the only
logic added here is iteration order and, in the PAM matmul, fast paths whose
preconditions guarantee that they produce the same bits as the scalar
definition (tests compare both against the reference, exhaustively where small).
Arrays are flat, C-contiguous ``uint32`` views of float32 data; shape handling and
argument checking live in emu/ops.py and emu/matmul.py.
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, register_jitable

from . import _scalar as S
from ._numba_cache import drop_stale


@njit(cache=True)
def _cache_probe():
    return 0


drop_stale(_cache_probe, __file__, S.__file__)


@intrinsic
def _as_f32(typingctx, x):
    """Reinterpret an int32 as float32 (a register move, no conversion)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


# --- elementwise ------------------------------------------------------------------

@njit(parallel=True, cache=True)
def quantize(x, out, fc, mode, subnormals, saturate, key):
    for i in prange(x.size):
        out[i] = S.quantize(x[i], fc, mode, subnormals, saturate, key, i)


@njit(parallel=True, cache=True)
def to_bits(x, out, fc):
    for i in prange(x.size):
        out[i] = S.f32_to_bits(S.quantize(x[i], fc, S.RNE, True, False, 0, 0), fc)


@njit(parallel=True, cache=True)
def from_bits(b, out, fc):
    for i in prange(b.size):
        out[i] = S.bits_to_f32(b[i], fc)


@register_jitable
def _operand(x, fc):
    """Operands of every op are first rounded to the format, RNE, subnormals kept.

    Rounding to float32 changes only NaN payloads, and every op maps any NaN
    operand to the canonical NaN itself: skip it (the loop is then unswitched and
    vectorised by LLVM).
    """
    if fc.exp_bits == 8 and fc.man_bits == 23:
        return np.int64(x)
    return S.quantize(x, fc, S.RNE, True, False, 0, 0)


def _unary(op):
    @njit(parallel=True, cache=True)
    def kernel(x, out, fc):
        for i in prange(x.size):
            out[i] = op(_operand(x[i], fc), fc)
    return kernel


def _binary(op):
    @njit(parallel=True, cache=True)
    def kernel(x, y, out, fc):
        for i in prange(x.size):
            out[i] = op(_operand(x[i], fc), _operand(y[i], fc), fc)
    return kernel


@register_jitable
def _fp_mul_keep(a, b, fc):
    return S.fp_mul(a, b, fc, True)


@register_jitable
def _fp_mul_daz(a, b, fc):
    return S.fp_mul(a, b, fc, False)


#: the scalar definition of every elementwise op, by name: the CPU kernels below and the
#: CUDA kernels (emu/_cuda.py) are both built from these tables
UNARY_OPS = {"pa_exp2": S.pa_exp2, "pa_log2": S.pa_log2, "pa_exp": S.pa_exp,
             "pa_log": S.pa_log, "pa_sqrt": S.pa_sqrt}
BINARY_OPS = {"pam_mul": S.pam_mul, "pa_div": S.pa_div, "fp_add": S.fp_add,
              "fp_mul": _fp_mul_keep, "fp_mul_daz": _fp_mul_daz}
UNARY = {name: _unary(op) for name, op in UNARY_OPS.items()}
BINARY = {name: _binary(op) for name, op in BINARY_OPS.items()}


# --- PAM matmul -----------------------------------------------------------------
#
# C[i, j] = fold over k = 0..K-1 (increasing) of acc <- acc + pam_mul(A[i,k], B[k,j]),
# acc starting at +0.0.  The kernel vectorises over j and never reorders k for a
# given output.  Per (k, column block) it precomputes the magnitude range of B so
# that, for an operand a = A[i, k], two comparisons tell whether every product of
# that block row is a plain integer add (no NaN/inf/flush/overflow).  Then the
# product is one 32-bit wrapping add, b + c(a) with c(a) = |a| - ONE32 + sign(a)·2^31:
# adding 2^31 modulo 2^32 flips the sign bit, so sign(a) XOR sign(b) comes for free.
# Eight such "fast" k run in one pass over j whose inner loop is two instructions per
# product, the integer add and the float32 accumulate.  Skipping and masking zero
# products is exact because the accumulator is never -0.0 (it starts at +0.0; under
# RNE x + (-x) = +0.0 and -0 + +0 = +0), so adding a ±0 product leaves it unchanged.

MB = 128     # rows of A per tile
NB = 1024    # columns of B per tile
KG = 8       # k per pass over j: a block row group of B (KG * NB * 4 bytes) stays in L1

_CLEAN, _MASKED, _GENERAL = 1, 2, 3


@njit(parallel=True, cache=True)
def matmul_block_stats(B, fc, nb):
    """Per (batch, k, column block): bounds on |a| for the fast paths, and zero flags.

    ``lo``/``hi``: a row is fast if lo <= |a| <= hi (int64 patterns); an empty
    range (lo > hi) marks a block holding NaN or inf.  ``hz``: the block holds
    zeros or subnormals (masked fast path).
    """
    nbat, K, N = B.shape
    lo = np.empty((nbat, K, nb), np.int64)
    hi = np.empty((nbat, K, nb), np.int64)
    hz = np.zeros((nbat, K, nb), np.bool_)
    for t in prange(nbat * K):
        bt = t // K
        k = t % K
        for jb in range(nb):
            j0 = jb * NB
            j1 = min(N, j0 + NB)
            mn = np.int64(S.INF32)
            mx = np.int64(0)
            zero = False
            for j in range(j0, j1):
                ub = np.int64(B[bt, k, j]) & S.ABS32
                if ub < fc.minnorm32:
                    zero = True
                else:
                    mn = min(mn, ub)
                mx = max(mx, ub)
            hz[bt, k, jb] = zero
            if mx >= S.INF32:
                lo[bt, k, jb] = np.int64(1)
                hi[bt, k, jb] = np.int64(0)
            else:
                # no flush: ua + mn - ONE >= minnorm; no overflow: ua + mx - ONE <= max
                lo[bt, k, jb] = fc.minnorm32 + S.ONE32 - mn if mn < S.INF32 else np.int64(0)
                hi[bt, k, jb] = fc.max32 + S.ONE32 - mx
    return lo, hi, hz


@njit(parallel=True, cache=True)
def matmul_group_stats(lo, hi, hz, A, fc):
    """Fold the per-k statistics over groups of KG consecutive k.

    B side (nB, ngroups, nb): the intersection of the |a| ranges and whether any
    row has zeros.  A side (nA, M, ngroups): min and max |a|.  A whole group is
    fast for row i when [amin, amax] lies inside the B range and inside the
    normal range: one test instead of KG classifications.
    """
    nbat, K, nb = lo.shape
    ng = (K + KG - 1) // KG
    glo = np.empty((nbat, ng, nb), np.int64)
    ghi = np.empty((nbat, ng, nb), np.int64)
    ghz = np.zeros((nbat, ng, nb), np.bool_)
    for t in prange(nbat * ng):
        bt = t // ng
        g = t % ng
        for jb in range(nb):
            lo_g = fc.minnorm32
            hi_g = fc.max32
            z = False
            for k in range(g * KG, min(K, g * KG + KG)):
                lo_g = max(lo_g, lo[bt, k, jb])
                hi_g = min(hi_g, hi[bt, k, jb])
                z = z or hz[bt, k, jb]
            glo[bt, g, jb] = lo_g
            ghi[bt, g, jb] = hi_g
            ghz[bt, g, jb] = z
    na, M, _ = A.shape
    amin = np.empty((na, M, ng), np.int64)
    amax = np.empty((na, M, ng), np.int64)
    for t in prange(na * M):
        ba = t // M
        i = t % M
        for g in range(ng):
            mn = np.int64(S.INF32)
            mx = np.int64(0)
            for k in range(g * KG, min(K, g * KG + KG)):
                ua = np.int64(A[ba, i, k]) & S.ABS32
                mn = min(mn, ua)
                mx = max(mx, ua)
            amin[ba, i, g] = mn
            amax[ba, i, g] = mx
    return glo, ghi, ghz, amin, amax


@register_jitable
def _offset(a):
    """c(a): what a fast path adds (mod 2^32) to b's pattern to get a ·̂ b."""
    a = np.int64(a)
    return np.int32(np.uint32(((a & S.ABS32) - S.ONE32 + (a & S.SIGN32)) & S.M32))


@register_jitable
def _masked(b, c, mn):
    """The fast product, or +0.0 where b is zero/subnormal (a no-op for the accumulator)."""
    if (b & np.int32(S.ABS32)) < mn:
        return np.float32(0.0)
    return _as_f32(np.int32(b + c))


@register_jitable
def _pass8x2(ar, aq, r0, r1, r2, r3, r4, r5, r6, r7, arow, qrow, k, masked, mn):
    """For eight consecutive k, in k order, vectorised over j and for two rows at once
    (each B load serves both): ar[j] += arow[k] ·̂ B[k, j], aq[j] += qrow[k] ·̂ B[k, j]."""
    c0, c1 = _offset(arow[k]), _offset(arow[k + 1])
    c2, c3 = _offset(arow[k + 2]), _offset(arow[k + 3])
    c4, c5 = _offset(arow[k + 4]), _offset(arow[k + 5])
    c6, c7 = _offset(arow[k + 6]), _offset(arow[k + 7])
    d0, d1 = _offset(qrow[k]), _offset(qrow[k + 1])
    d2, d3 = _offset(qrow[k + 2]), _offset(qrow[k + 3])
    d4, d5 = _offset(qrow[k + 4]), _offset(qrow[k + 5])
    d6, d7 = _offset(qrow[k + 6]), _offset(qrow[k + 7])
    if masked:
        for j in range(ar.size):
            s, u = ar[j], aq[j]
            b = r0[j]
            s += _masked(b, c0, mn)
            u += _masked(b, d0, mn)
            b = r1[j]
            s += _masked(b, c1, mn)
            u += _masked(b, d1, mn)
            b = r2[j]
            s += _masked(b, c2, mn)
            u += _masked(b, d2, mn)
            b = r3[j]
            s += _masked(b, c3, mn)
            u += _masked(b, d3, mn)
            b = r4[j]
            s += _masked(b, c4, mn)
            u += _masked(b, d4, mn)
            b = r5[j]
            s += _masked(b, c5, mn)
            u += _masked(b, d5, mn)
            b = r6[j]
            s += _masked(b, c6, mn)
            u += _masked(b, d6, mn)
            b = r7[j]
            s += _masked(b, c7, mn)
            u += _masked(b, d7, mn)
            ar[j], aq[j] = s, u
    else:
        for j in range(ar.size):
            s, u = ar[j], aq[j]
            b = r0[j]
            s += _as_f32(np.int32(b + c0))
            u += _as_f32(np.int32(b + d0))
            b = r1[j]
            s += _as_f32(np.int32(b + c1))
            u += _as_f32(np.int32(b + d1))
            b = r2[j]
            s += _as_f32(np.int32(b + c2))
            u += _as_f32(np.int32(b + d2))
            b = r3[j]
            s += _as_f32(np.int32(b + c3))
            u += _as_f32(np.int32(b + d3))
            b = r4[j]
            s += _as_f32(np.int32(b + c4))
            u += _as_f32(np.int32(b + d4))
            b = r5[j]
            s += _as_f32(np.int32(b + c5))
            u += _as_f32(np.int32(b + d5))
            b = r6[j]
            s += _as_f32(np.int32(b + c6))
            u += _as_f32(np.int32(b + d6))
            b = r7[j]
            s += _as_f32(np.int32(b + c7))
            u += _as_f32(np.int32(b + d7))
            ar[j], aq[j] = s, u


@njit(parallel=True, cache=True)
def matmul_f32acc(A, B, lo, hi, hz, glo, ghi, ghz, amin, amax, ia, ib, C, fc):
    """PAM matmul with float32 accumulation.

    A: (nA, M, K) and B: (nB, K, N) int32 patterns of format values; the statistics
    come from matmul_block_stats and matmul_group_stats; ia/ib map each output batch
    to its A and B batch.
    """
    nout = C.shape[0]
    M = A.shape[1]
    K = A.shape[2]
    N = B.shape[2]
    nbi = (M + MB - 1) // MB
    nbj = (N + NB - 1) // NB
    mn = np.int32(fc.minnorm32)
    for t in prange(nout * nbi * nbj):
        bo = t // (nbi * nbj)
        rem = t % (nbi * nbj)
        bi = rem // nbj
        bj = rem % nbj
        ba = ia[bo]
        bb = ib[bo]
        i0 = bi * MB
        i1 = min(M, i0 + MB)
        j0 = bj * NB
        j1 = min(N, j0 + NB)
        nj = j1 - j0
        acc = np.zeros((MB, nj), np.float32)
        scratch = np.zeros(nj, np.float32)
        fast_rows = np.empty(MB, np.int64)
        for k0 in range(0, K, KG):
            k1 = min(K, k0 + KG)
            g = k0 // KG
            full = k1 - k0 == KG
            if full:
                r0, r1 = B[bb, k0, j0:j1], B[bb, k0 + 1, j0:j1]
                r2, r3 = B[bb, k0 + 2, j0:j1], B[bb, k0 + 3, j0:j1]
                r4, r5 = B[bb, k0 + 4, j0:j1], B[bb, k0 + 5, j0:j1]
                r6, r7 = B[bb, k0 + 6, j0:j1], B[bb, k0 + 7, j0:j1]
            nfast = 0
            for i in range(i0, i1):
                ar = acc[i - i0]
                arow = A[ba, i]
                if (full and amin[ba, i, g] >= glo[bb, g, bj]
                        and amax[ba, i, g] <= ghi[bb, g, bj]):
                    fast_rows[nfast] = i
                    nfast += 1
                    continue
                for k in range(k0, k1):
                    a = arow[k]
                    ua = np.int64(a) & S.ABS32
                    r = B[bb, k, j0:j1]
                    if ua < fc.minnorm32:
                        if lo[bb, k, bj] <= hi[bb, k, bj]:
                            continue            # ±0 products, no inf/NaN in this block row
                        mode = _GENERAL
                    elif ua <= fc.max32 and lo[bb, k, bj] <= ua and ua <= hi[bb, k, bj]:
                        mode = _MASKED if hz[bb, k, bj] else _CLEAN
                    else:
                        mode = _GENERAL
                    if mode == _GENERAL:
                        for j in range(nj):
                            ar[j] += _as_f32(np.int32(np.uint32(S.pam_mul(a, r[j], fc))))
                        continue
                    c = _offset(a)
                    if mode == _CLEAN:
                        for j in range(nj):
                            ar[j] += _as_f32(np.int32(r[j] + c))
                    else:
                        for j in range(nj):
                            ar[j] += _masked(r[j], c, mn)
            # the fast rows, two at a time (rows are independent outputs); an odd one
            # out is paired with a scratch row
            for q in range(0, nfast, 2):
                i = fast_rows[q]
                if q + 1 < nfast:
                    i2 = fast_rows[q + 1]
                    aq = acc[i2 - i0]
                else:
                    i2 = i
                    aq = scratch
                _pass8x2(acc[i - i0], aq, r0, r1, r2, r3, r4, r5, r6, r7, A[ba, i], A[ba, i2],
                         k0, ghz[bb, g, bj], mn)
        for i in range(i0, i1):
            for j in range(nj):
                v = acc[i - i0, j]
                C[bo, i, j0 + j] = np.float32(np.nan) if v != v else v


@njit(parallel=True, cache=True)
def matmul_fmtacc(A, B, ia, ib, C, fc, fca):
    """PAM matmul accumulating in the format ``fca``: every step is one correctly
    rounded fp_add.  A, B, C: int32 patterns; C holds the canonical NaN."""
    nout = C.shape[0]
    M = A.shape[1]
    K = A.shape[2]
    N = B.shape[2]
    for t in prange(nout * M):
        bo = t // M
        i = t % M
        ba = ia[bo]
        bb = ib[bo]
        acc = np.zeros(N, np.int64)
        for k in range(K):
            a = np.int64(A[ba, i, k])
            if (a & S.ABS32) < fc.minnorm32:
                # ±0 products leave the accumulator unchanged; only inf/NaN in B matter
                anyspecial = False
                for j in range(N):
                    if (np.int64(B[bb, k, j]) & S.ABS32) >= S.INF32:
                        anyspecial = True
                        break
                if not anyspecial:
                    continue
            for j in range(N):
                acc[j] = S.fp_add(acc[j], S.pam_mul(a, B[bb, k, j], fc), fca)
        for j in range(N):
            C[bo, i, j] = np.int32(np.uint32(acc[j]))

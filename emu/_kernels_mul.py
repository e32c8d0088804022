"""CPU kernels of the multipliers: ``emu.mul`` (every multiplier's scalar definition,
emu/_scalar_mul.py, on each element, operands rounded into the format first; a parallel
and a serial twin) and the float32-accumulator matmul of those that are not one
constant (below)."""
import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from . import _scalar as S
from . import _scalar_mul as SM
from . import _kernels as K
from ._kernels import as_f32, twins
from ._numba_cache import drop_stale
from ._tiles import CLEAN, GENERAL, MASKED, SKIP

drop_stale(__file__)


def _mul(x, y, out, fc, mp):
    for i in prange(x.size):
        out[i] = SM.product(S.operand(x[i], fc), S.operand(y[i], fc), fc, mp)


MUL = twins("mul", _mul)


# --- the float32-accumulator matmul of corrected PAM ------------------------------------
#
# The definition is the fold of SM.mac (emu/_kernels.py matmul_fmtacc).  Corrected PAM's
# product is the pattern sum a + b - ONE32 + c32 + T[i(a), j(b)] (i, j the top k mantissa
# bits): with B packed once per row i of the table, Bq[i] = b - ONE32 + c32 + T[i, j(b)],
# it is one wrapping add a + Bq[i(a)], as PAM's a + (b - ONE32).  The mode of the whole
# product (emu/_tiles.py's rules, the constant between c32 + min T and c32 + max T) says
# where that is exact: CLEAN, MASKED (zero/subnormal operands: ±0 products, skipped: the
# float32 accumulator is never -0), SKIP, or GENERAL (S.pam_sum's rule without branches).

QR = 16         # rows of A per task: B is read once per QR rows
JW = 512        # columns per vectorised loop (a long loop: little per-row overhead)


def table_mode(a, b, fc, mp) -> int:
    """The mode of every product of the int32 patterns a, b (emu/_tiles.py)."""
    ua = np.asarray(a).reshape(-1) & S.ABS32
    ub = np.asarray(b).reshape(-1) & S.ABS32
    if ua.size == 0 or ub.size == 0 or ua.max() >= S.INF32 or ub.max() >= S.INF32:
        return GENERAL
    na, nb = ua[ua >= fc.minnorm32], ub[ub >= fc.minnorm32]
    if na.size == 0 or nb.size == 0:
        return SKIP
    lo = int(mp.c32) + int(mp.table.min())
    hi = int(mp.c32) + int(mp.table.max())
    if (int(na.min()) + int(nb.min()) - S.ONE32 + lo < fc.minnorm32
            or int(na.max()) + int(nb.max()) - S.ONE32 + hi > fc.max32):
        return GENERAL
    return MASKED if na.size < ua.size or nb.size < ub.size else CLEAN


@njit(parallel=True, cache=True)
def pack_table(B, mp):
    """Bq (nB, 2^k, K, N) int32: b - ONE32 + c32 + table[i, j(b)] (mod 2^32) for each i."""
    nb, Kd, N = B.shape
    rows = 1 << mp.k
    mask = np.int64(rows - 1)
    Bq = np.empty((nb, rows, Kd, N), np.int32)
    for t in prange(nb * Kd):
        bb, k = t // Kd, t % Kd
        for i in range(rows):
            for j in range(N):
                v = np.int64(B[bb, k, j])
                c = mp.c32 + mp.table[(i << mp.k) | ((v >> (23 - mp.k)) & mask)]
                Bq[bb, i, k, j] = np.int32(np.uint32((v - S.ONE32 + c) & S.M32))
    return Bq


@register_jitable
def _table_sum(a, b, fc, c32, table, k):
    """S.pam_sum(a, b, fc, c32 + table[i, j]) without branches (i, j the top k mantissa
    bits of a and b), int64 patterns of fmt values."""
    mask = (np.int64(1) << k) - 1
    c = c32 + table[(((a >> (23 - k)) & mask) << k) | ((b >> (23 - k)) & mask)]
    return K.pam_sum_nb(a, b, fc.minnorm32, fc.max32, fc.ovf32, c)


@njit(parallel=True, cache=True)
def matmul_table(A, B, Bq, ia, ib, C, fc, mp, mode):
    """C (nout, M, N) float32 = the fold of SM.mac with a float32 accumulator for the
    corrected-PAM ``mp`` in the ``mode`` of table_mode; A (nA, M, K), B (nB, K, N) int32
    patterns of fmt values, Bq from pack_table (unused in GENERAL and SKIP mode)."""
    nout, M, N = C.shape
    Kd = A.shape[2]
    nq = (M + QR - 1) // QR
    nj = (N + JW - 1) // JW
    mn = np.int32(fc.minnorm32)
    shift = 23 - mp.k
    mask = np.int32((1 << mp.k) - 1)
    for t in prange(nout * nq * nj):
        bo = t // (nq * nj)
        q = (t // nj) % nq
        j0 = (t % nj) * JW
        jw = min(JW, N - j0)
        ba, bb = ia[bo], ib[bo]
        i0 = q * QR
        nr = min(QR, M - i0)
        acc = np.zeros((QR, JW), np.float32)
        for k in range(Kd if mode != SKIP else 0):
            brow = B[bb, k, j0:j0 + jw]
            for r in range(nr):
                a = A[ba, i0 + r, k]
                ar = acc[r]
                if mode == GENERAL:
                    a64 = np.int64(a)
                    for j in range(jw):
                        ar[j] += as_f32(_table_sum(a64, np.int64(brow[j]), fc, mp.c32,
                                                   mp.table, mp.k))
                elif (a & np.int32(S.ABS32)) >= mn:     # else ±0 products only
                    bq = Bq[bb, (a >> shift) & mask, k, j0:j0 + jw]
                    if mode == CLEAN:
                        for j in range(jw):
                            ar[j] += as_f32(np.int32(a + bq[j]))
                    else:
                        for j in range(jw):
                            t32 = as_f32(np.int32(a + bq[j]))
                            ar[j] += np.float32(0.0) if (brow[j] & np.int32(S.ABS32)) < mn \
                                else t32
        for r in range(nr):
            for j in range(jw):
                v = acc[r, j]
                C[bo, i0 + r, j0 + j] = np.float32(np.nan) if v != v else v


def exact_ok(a, b, fmt) -> bool:
    """Whether every product of finite operands of the int32 patterns ``a``, ``b`` (values
    of fmt) is exact in float32, so that the float32 product and add are the ``exact``
    multiplier's fused step (K.matmul_blocked's FMUL): M <= 11 (2 (M + 1) significant
    bits), every product below 2^128 and every non-zero one at least 2^(2M + 2 - 149)
    (its last bit, above |a b| 2^(-2M-2), is then at least float32's 2^-149)."""
    if fmt.man_bits > 11:
        return False
    lo = 2.0 ** (2 * fmt.man_bits + 2 - 149)
    q = fmt.smallest_subnormal
    if fmt.max ** 2 < 2.0 ** 128 and q * q >= lo:
        return True                             # every pair of the format
    amn, amx = _abs_range(a.reshape(-1))
    bmn, bmx = _abs_range(b.reshape(-1))
    return amx * bmx < 2.0 ** 128 and (amn == np.inf or bmn == np.inf or amn * bmn >= lo)


@njit(cache=True)
def _abs_range(x):
    """(smallest non-zero, largest) finite magnitude of the patterns x (inf if none, 0)."""
    mn, mx = np.inf, 0.0
    for v in x:
        u = np.int32(v) & np.int32(S.ABS32)
        if 0 < u < np.int32(S.INF32):
            f = np.float64(as_f32(u))
            mn = min(mn, f)
            mx = max(mx, f)
    return mn, mx

"""The PAM matmul for small operands: one serial kernel, no packing.

For the few thousand products of a small matmul the register-blocked kernel of
emu/_kernels.py spends more on packing B, per-block statistics and starting parallel
regions than on the products.  This kernel computes §5's definition directly,

    C[b, i, j] = fold over k = 0..K-1 (increasing) of acc <- acc + pam_mul(A[.,i,k], B[.,k,j]),

from +0.0 with float32 additions, vectorised over j.  One (A batch, B batch) pair's
statistics pick the mode of all its products (emu/_tiles.py, whose argument holds for
any block, the whole matrix included): CLEAN/MASKED products are the wrapping add
``a + (b - ONE32 + c32)`` (zero/subnormal operands contribute +0.0, or nothing for a zero
``a``, exact as the accumulator is never -0.0), SKIP leaves the accumulator at +0.0,
GENERAL takes S.pam_sum per product.  ``c32`` is the multiplier's constant (PAM: 0;
emu/_scalar_mul.py): any pattern-sum multiplier with one constant runs here unchanged.  NaN results are canonical.  The same bits as the
blocked kernel (tests/test_matmul.py runs both).
"""
import numpy as np
from numba import njit

from . import _scalar as S
from ._kernels import as_f32
from ._numba_cache import drop_stale
from ._tiles import GENERAL, SKIP, tile_mode


drop_stale(__file__)


@njit(cache=True)
def _stats(X, fc):
    """Per batch of X (nb, R, C int32 patterns): min normal |x| (INF32 if none), max |x|,
    whether a zero or subnormal occurs."""
    nb = X.shape[0]
    st = np.empty((nb, 3), np.int64)
    for b in range(nb):
        mn, mx, z = np.int64(S.INF32), np.int64(0), np.int64(0)
        for v in X[b].reshape(-1):
            u = np.int64(v) & S.ABS32
            if u >= fc.minnorm32:
                mn = min(mn, u)
            else:
                z = 1
            mx = max(mx, u)
        st[b, 0], st[b, 1], st[b, 2] = mn, mx, z
    return st


@njit(cache=True)
def matmul_small(A, B, ia, ib, C, fc, c32):
    """C (nout, M, N) float32 = the matmul of A (nA, M, K) and B (nB, K, N), int32
    patterns of format values, C-contiguous, by the pattern-sum multiplier of constant
    ``c32`` (PAM: 0); ia/ib map output batches to operands'."""
    nout, M, N = C.shape
    Kd = A.shape[2]
    sa = _stats(A, fc)
    sb = _stats(B, fc)
    acc = np.empty(N, np.float32)
    bq = np.empty((Kd, N), np.int32)
    bz = np.empty((Kd, N), np.bool_)
    last = -1
    mn = np.int32(fc.minnorm32)
    for bo in range(nout):
        ba, bb = ia[bo], ib[bo]
        mode = tile_mode(sa[ba, 0], sa[ba, 1], sa[ba, 2], sb[bb, 0], sb[bb, 1], sb[bb, 2], fc,
                         c32)
        if mode != GENERAL and mode != SKIP and bb != last:
            for k in range(Kd):     # b - ONE32 + c32 (mod 2^32), and which b are normal
                for j in range(N):
                    v = B[bb, k, j]
                    bq[k, j] = np.int32(np.uint32((np.int64(v) - S.ONE32 + c32) & S.M32))
                    bz[k, j] = (v & np.int32(S.ABS32)) < mn
            last = bb
        for i in range(M):
            acc[:] = 0.0
            if mode == SKIP:
                pass
            elif mode == GENERAL:
                for k in range(Kd):
                    a = A[ba, i, k]
                    for j in range(N):
                        acc[j] += as_f32(np.int32(np.uint32(
                            S.pam_sum(a, B[bb, k, j], fc, c32))))
            else:
                for k in range(Kd):
                    a = A[ba, i, k]
                    if (a & np.int32(S.ABS32)) < mn:
                        continue                # ±0 products only
                    for j in range(N):
                        t = as_f32(np.int32(a + bq[k, j]))
                        acc[j] += np.float32(0.0) if bz[k, j] else t
            for j in range(N):
                v = acc[j]
                C[bo, i, j] = np.float32(np.nan) if v != v else v

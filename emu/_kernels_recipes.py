"""CPU kernel of emu.recipe_matmul's epilogue (docs/semantics.md §10b steps 2-3): each
K-block's partial product scaled and folded into the accumulator in one pass, with the
scalar definitions of emu/_scalar_mul.py (a parallel and a serial twin)."""
import numpy as np
from numba import prange

from . import _scalar as S
from . import _scalar_mul as SM
from ._kernels import as_f32, as_i32, twins
from ._numba_cache import drop_stale

drop_stale(__file__)


def _scale_fold(p, sa, sb, out, pow2, f32c, fca, mp, mpx):
    """``out[t, i, j]`` = the fold over blocks b, increasing, from +0, of
    ``RN_acc(c + T)`` with ``T = p[t, b, i, j]`` scaled by ``sa[t, b, i]`` and
    ``sb[t, b, j]``: exactly (``pow2``: powers of two, one rounding to float32) or by the
    multiplier ``mp`` in float32, ``mul(P, mul(s_a, s_b))``.  The fold's step is the
    matmul's exact step (``mpx``), SM.mac with the factor 1.  Uint32 patterns."""
    nt, nb, m, n = p.shape
    for task in prange(nt * m):
        t = task // m
        i = task % m
        c = np.zeros(n, np.int64)
        for b in range(nb):
            a = np.int64(sa[t, b, i])
            fa = np.float64(as_f32(np.int32(np.uint32(a))))
            for j in range(n):
                x = np.int64(p[t, b, i, j])
                if pow2:
                    v = np.float32(np.float64(as_f32(np.int32(np.uint32(x)))) * fa
                                   * np.float64(as_f32(np.int32(np.uint32(sb[t, b, j])))))
                    y = np.int64(S.QNAN32) if v != v else np.int64(as_i32(v)) & S.M32
                else:
                    s = SM.product(a, np.int64(sb[t, b, j]), f32c, mp)
                    y = SM.product(x, s, f32c, mp)
                c[j] = SM.mac(c[j], y, np.int64(S.ONE32), f32c, fca, mpx)
        for j in range(n):
            out[t, i, j] = np.uint32(c[j] & S.M32)


SCALE_FOLD = twins("recipe scale_fold", _scale_fold)

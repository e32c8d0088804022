"""CPU kernels of the multipliers: ``emu.mul`` and the exact ``emu.grad.mul`` (every
multiplier's scalar definitions, emu/_scalar_mul.py, on each element, operands rounded
into the format first; a parallel and a serial twin), and when the float32 product is the ``exact`` multiplier's step."""
import numpy as np
from numba import njit, prange

from . import _scalar as S
from . import _scalar_mul as SM
from ._kernels import as_f32, twins
from ._numba_cache import drop_stale

drop_stale(__file__)


def _mul(x, y, out, fc, mp):
    if mp.kind == SM.SUM and mp.k == 0 and S.is_float32(fc):
        c = mp.c32      # one constant, float32 operands as they are: the 32-bit twin
        for i in prange(x.size):
            out[i] = S.pam_sum32(x[i], y[i], fc, c)
        return
    for i in prange(x.size):
        out[i] = SM.product(S.operand(x[i], fc), S.operand(y[i], fc), fc, mp)


MUL = twins("mul", _mul)


def _mul_grad(x, y, d, outa, outb, fc, mp):
    for i in prange(x.size):
        a, b, g = S.operand(x[i], fc), S.operand(y[i], fc), S.operand(d[i], fc)
        outa[i] = SM.product_da(a, b, g, fc, mp)
        outb[i] = SM.product_db(a, b, g, fc, mp)


#: the exact derivatives of every multiplier (emu.grad.mul)
MUL_GRAD = twins("mul_grad", _mul_grad)


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


@njit(parallel=True, cache=True)
def _encode(x, fc):
    """The format encodings of the patterns ``x`` (values of the format)."""
    out = np.empty(x.shape, np.int32)
    flat, o = x.reshape(-1), out.reshape(-1)
    for i in prange(flat.size):
        o[i] = S.f32_to_bits(flat[i], fc)
    return out


@njit(parallel=True, cache=True)
def _table_f32acc(ea, eb, ia, ib, values, w, c):
    """c[t] = ea[ia[t]] x eb[ib[t]] by the table ``values`` (float32, row e_a of 2^w),
    each column's sum in float32 in increasing k from +0 (numpy ``+``: fp_add into
    float32), NaNs canonical."""
    nout, m, n = c.shape
    k = ea.shape[2]
    for t in prange(nout * m):
        bo, i = t // m, t % m
        arow = ea[ia[bo], i]
        bmat = eb[ib[bo]]
        acc = np.zeros(n, np.float32)
        for kk in range(k):
            row = values[arow[kk] << w:(arow[kk] + 1) << w]
            ebk = bmat[kk]
            for j in range(n):
                acc[j] += row[ebk[j]]
        for j in range(n):
            c[bo, i, j] = acc[j] if acc[j] == acc[j] else np.float32(np.nan)


def table_matmul_f32acc(a3, b3, ia, ib, c, fc, mp):
    """emu.matmul of a table multiplier with a float32 accumulator: operands encoded
    once, each product a lookup in the table's row of a's encoding (the fold of SM.mac,
    tests/test_table_multipliers.py)."""
    values = mp.table.astype(np.uint32).view(np.float32)
    _table_f32acc(_encode(a3, fc), _encode(b3, fc), ia, ib, values, int(mp.k), c)

"""CPU kernels (``@njit(parallel=True)``) of the E8M0 scale type and the MX block
formats: loops over the scalar definitions of emu/_scalar_mx.py, which the CUDA
kernels (emu/_cuda.py) call too.  Arrays are flat and C-contiguous (uint32 patterns
of float32 data; uint8 scale codes); emu/mx.py checks the arguments and emu/host.py
lays the operands out."""
import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from . import _scalar as S
from . import _scalar_mx as X
from ._kernels import as_f32, as_i32
from ._numba_cache import drop_stale


drop_stale(__file__)


@njit(parallel=True, cache=True)
def e8m0(x, out, to_bits):
    """out[i] = the E8M0 code of x[i] (``to_bits``) or its value's float32 pattern."""
    if to_bits:
        for i in prange(x.size):
            out[i] = X.e8m0_code(x[i])
    else:
        for i in prange(x.size):
            out[i] = X.e8m0_value(X.e8m0_code(x[i]))


@njit(parallel=True, cache=True)
def e8m0_from_bits(b, out):
    """out[i] = the float32 pattern of the E8M0 code b[i] (in [0, 256): checked first)."""
    for i in prange(b.size):
        out[i] = X.e8m0_value(b[i])


@njit(parallel=True, cache=True)
def mx_quantize(x, out, scales, ntask, nb, n, inner, block, efc, emax, int8, values, f32c):
    """The ``ntask`` = outer · nb · inner blocks of x viewed as (outer, n, inner), blocks
    along n (X.mx_block; float elements with a -0 and a mantissa bit: _block_fast)."""
    fast = not int8 and efc.man_bits > 0 and efc.negzero32 != 0
    for t in prange(ntask):
        if fast:
            _block_fast(x, out, scales, t, nb, n, inner, block, efc, emax, values, f32c)
        else:
            X.mx_block(x, out, scales, t, nb, n, inner, block, efc, emax, int8, values, f32c)


@register_jitable
def _block_fast(x, out, scales, t, nb, n, inner, block, efc, emax, values, f32c):
    """X.mx_block without branches in its element loop (so it vectorises), for float
    elements with M >= 1 and a -0: ``x / 2^s`` as a float32 product by 2^-s (exact, or
    below 2^-126 where it and the exact quotient round to ±0 in every element type),
    then RNE into the element format, saturating: in the normal range the pattern
    rounded in place (S.quantize's), clamped at max; below it ``(|v| + C) - C`` with
    ``C = 2^23`` quanta, float32's RNE onto the subnormal grid.  A block with a NaN or
    inf takes X.mx_block."""
    base, j0, j1 = X.block_span(t, nb, n, inner, block)
    amax = np.uint32(0)
    for j in range(j0, j1):
        amax = max(amax, x[base + j * inner] & np.uint32(S.ABS32))
    code = X.mx_scale_code(amax, emax)
    if code == X.E8M0_NAN:
        X.mx_block(x, out, scales, t, nb, n, inner, block, efc, emax, False, values, f32c)
        return
    down = as_f32(np.int32((254 - code) << 23))            # 2^(127 - code), normal
    up = as_f32(np.int32(X.e8m0_value(code)))              # 2^(code - 127)
    sh = np.int32(23 - efc.man_bits)
    half = np.int32((1 << (23 - efc.man_bits - 1)) - 1)
    keep = np.int32(~((1 << (23 - efc.man_bits)) - 1))
    mn = np.int32(efc.minnorm32)
    mx = np.int32(efc.max32)
    c = as_f32(np.int32(efc.minnorm32 - ((efc.man_bits - 23) << 23)))   # 2^23 quanta
    for j in range(j0, j1):
        idx = base + j * inner
        v = as_i32(as_f32(np.int32(x[idx])) * down)
        av = v & np.int32(S.ABS32)
        rn = min((av + half + ((av >> sh) & np.int32(1))) & keep, mx)
        rs = as_i32((as_f32(av) + c) - c)
        p = (v & np.int32(S.SIGN32)) | (rs if av < mn else rn)
        out[idx] = np.uint32(as_i32(as_f32(p) * up)) if values else np.uint32(p)
    if not values:
        scales[t] = code


@njit(parallel=True, cache=True)
def mx_dequantize(p, scales, out, nb, n, inner, block, f32c):
    for i in prange(p.size):
        out[i] = X.mx_dequantize_at(p, scales, i, nb, n, inner, block, f32c)

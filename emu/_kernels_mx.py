"""CPU kernels (``@njit(parallel=True)``) of the E8M0 scale type and the MX block
formats: loops over the scalar definitions of emu/_scalar_mx.py, which the CUDA
kernels (emu/_cuda.py) call too.  Arrays are flat and C-contiguous (uint32 patterns
of float32 data; uint8 scale codes); emu/mx.py checks the arguments and emu/host.py
lays the operands out."""
from numba import njit, prange

from . import _scalar_mx as X
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
    along n (X.mx_block)."""
    for t in prange(ntask):
        X.mx_block(x, out, scales, t, nb, n, inner, block, efc, emax, int8, values, f32c)


@njit(parallel=True, cache=True)
def mx_dequantize(p, scales, out, nb, n, inner, block, f32c):
    for i in prange(p.size):
        out[i] = X.mx_dequantize_at(p, scales, i, nb, n, inner, block, f32c)

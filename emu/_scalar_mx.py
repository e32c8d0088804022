"""The scalar definitions of the E8M0 scale type and of the OCP MX block rules
(docs/semantics.md §9 "The unsigned scale", §10), on float32 bit patterns.

Like emu/_scalar.py: ``register_jitable``, integer-only, widened with ``np.int64``
(the CUDA simulator's int32 scalars wrap), called by the CPU kernels of
emu/_kernels_mx.py and the CUDA kernels of emu/_cuda.py alike; emu/reference.py has
the independent oracle (MX) and ml_dtypes is the reference for E8M0.
"""
import numpy as np
from numba.extending import register_jitable

from . import _scalar as S

E8M0_NAN = 0xFF        # the E8M0 NaN code (and an MX block's NaN scale)


# --- E8M0: code c is 2^(c - 127), 0xFF NaN; no sign, no zero -----------------------

@register_jitable
def e8m0_code(x):
    """E8M0 code of the float32 pattern ``x``, as ml_dtypes rounds: NaN for +0, any
    negative number (-0 included), inf and NaN; a float32 normal ``2^e (1 + f)`` gives
    ``2^e`` for ``f < 1/2``, else ``2^(e+1)`` (ties up), NaN past 2^127; a float32
    subnormal gives 2^-126 above 2^-127, else 2^-127 (code 0)."""
    x = np.int64(x) & S.M32
    if x == 0 or x >= S.INF32:              # +0, inf, NaN and (sign bit set) negatives
        return np.int64(E8M0_NAN)
    if x < 0x800000:
        return (x + 0x3FFFFF) >> 23
    return (x + 0x400000) >> 23             # 0x7F7FFFFF + 0x400000 >> 23 = 0xFF: NaN


@register_jitable
def e8m0_value(c):
    """Float32 pattern of the E8M0 code ``0 <= c <= 0xFF``: 2^(c - 127), NaN for 0xFF."""
    c = np.int64(c)
    if c == E8M0_NAN:
        return np.int64(S.QNAN32)
    if c == 0:
        return np.int64(0x400000)           # 2^-127, a float32 subnormal
    return c << 23


# --- MX blocks ------------------------------------------------------------------------

@register_jitable
def ldexp32(x, k, f32c):
    """The float32 pattern ``x`` times 2^k, rounded RNE to float32 (subnormals kept,
    overflow to ±inf), ``|k| < 512``; ±0 and ±inf stay, NaN is the canonical NaN.
    ``f32c`` is float32's constants (emu.float32.consts)."""
    x = np.int64(x) & S.M32
    a = x & S.ABS32
    k = np.int64(k)
    if a > S.INF32:
        return np.int64(S.QNAN32)
    if a == S.INF32 or a == 0:
        return x
    e = (a >> 23) + k
    if a >= 0x800000 and e >= 1 and e <= 254:      # normal in, normal out: exact
        return x + (k << 23)
    sig, exp = S._unpack(a)
    return S.round_to_fmt(x >> 31, sig, exp + k, f32c, S.RNE, True, False, 0)


@register_jitable
def mx_scale_code(amax, emax):
    """The E8M0 scale code of a block whose largest |x| has the float32 pattern
    ``amax`` (the largest magnitude pattern: a NaN's is above inf's): 0xFF if the block
    holds a NaN or ±inf; else ``s + 127`` with ``s = max(floor(log2 amax) - emax, -127)``,
    which is ``max(exponent field - emax, 0)`` (0 for amax zero or a float32 subnormal:
    ``floor(log2 amax) <= -127`` and ``emax >= 0``)."""
    amax = np.int64(amax)
    if amax >= S.INF32:
        return np.int64(E8M0_NAN)
    return max((amax >> 23) - np.int64(emax), np.int64(0))


@register_jitable
def mx_element(x, code, efc, f32c, int8):
    """The MX element ``P`` (float32 pattern) of the float32 pattern ``x`` in a block
    with scale code ``code``: +0 in a NaN block; else ``x / 2^s`` (s = code - 127) rounded
    RNE, subnormals kept, saturating at ±max into the element format ``efc``.

    ``x / 2^s`` is exact in float32 unless it is below 2^-126, where it and the exact
    quotient both round to ±0 in every element type (docs/semantics.md §10).

    ``int8`` (mxint8): ``efc`` is the grid of e3m6 with bias 1, which below 2 is the
    fixed-point grid k · 2^-6 (quantum 2^-6 in its subnormals and in [1, 2)), so the
    RNE rounding there is ``round_half_even(64 x / 2^s) / 64``; ``|x / 2^s| < 2``
    (mxint8's emax is 0); the result is clamped to ±127/64 and a zero is +0.
    """
    if np.int64(code) == E8M0_NAN:
        return np.int64(0)
    v = ldexp32(x, np.int64(127) - np.int64(code), f32c)
    p = S.quantize(v, efc, S.RNE, True, True, 0, 0)
    if not int8:
        return p
    a = min(p & S.ABS32, np.int64(0x3FFE0000))   # 127/64 = 0x3FFE0000
    if a == 0:
        return np.int64(0)
    return (p & S.SIGN32) | a


@register_jitable
def mx_value(p, code, f32c):
    """The value ``P · 2^(code - 127)`` (float32 pattern, RNE: exact unless a user-made
    scale takes it out of float32's range); NaN if the scale is the NaN code."""
    if np.int64(code) == E8M0_NAN:
        return np.int64(S.QNAN32)
    return ldexp32(p, np.int64(code) - np.int64(127), f32c)


@register_jitable
def block_span(t, nb, n, inner, block):
    """Block ``t`` of an array viewed as (outer, n, inner), blocks of ``block`` along n
    (t indexes (outer, nb, inner) in C order): the flat index of its element j is
    ``base + j · inner`` for j in [j0, j1)."""
    i = np.int64(t) % inner
    bi = (np.int64(t) // inner) % nb
    o = np.int64(t) // (inner * nb)
    j0 = bi * block
    return o * n * inner + i, j0, min(n, j0 + block)


@register_jitable
def mx_block(x, out, scales, t, nb, n, inner, block, efc, emax, int8, values, f32c):
    """Block ``t`` of an array viewed as (outer, n, inner), blocks of ``block`` along n:
    t indexes (outer, nb, inner) in C order, which is also the scale's flat index.
    ``x``/``out`` are flat float32 patterns; writes the elements (``values``: the
    dequantized values P · 2^s instead, and no scale) and the scale code."""
    base, j0, j1 = block_span(t, nb, n, inner, block)
    amax = np.int64(0)
    for j in range(j0, j1):
        a = np.int64(x[base + j * inner]) & S.ABS32
        if a > amax:
            amax = a
    code = mx_scale_code(amax, emax)
    for j in range(j0, j1):
        idx = base + j * inner
        p = mx_element(x[idx], code, efc, f32c, int8)
        if values:
            out[idx] = mx_value(p, code, f32c)
        else:
            out[idx] = p
    if not values:
        scales[t] = code


@register_jitable
def mx_dequantize_at(p, scales, idx, nb, n, inner, block, f32c):
    """Element ``idx`` (flat, of (outer, n, inner)) of mx_dequantize: its value with
    the scale of its block."""
    idx = np.int64(idx)
    i = idx % inner
    j = (idx // inner) % n
    o = idx // (inner * n)
    return mx_value(p[idx], scales[(o * nb + j // block) * inner + i], f32c)

"""Scalar definitions of the multipliers (docs/semantics.md "Multipliers").

Like emu/_scalar.py: ``register_jitable``, integer-only, on float32 patterns of format
values held in int64.  A multiplier reaches a kernel as :class:`MulParams`
(``emu.Multiplier.params(fmt)``), which has one of three kinds:

* ``SUM``: a pattern sum, ``S.pam_sum`` with the constant ``c32`` plus, with ``k`` > 0,
  the correction ``table[i * 2^k + j]`` (``i``, ``j`` the top ``k`` mantissa bits of the
  operands), both in float32-pattern units: PAM, L-Mul, their offsets, corrected PAM;
* ``EXACT``: ``S.fp_mul`` with subnormals (``emu.mul``); in a matmul the step is the fused
  ``S.fp_fma`` into the accumulator;
* ``FLOAT``: ``S.fp_mul`` without subnormals, the RTL float MAC's product;
* ``TABLE``: ``table[e_a * 2^k + e_b]``, the float32 pattern of the product of the
  operands' ``k``-bit encodings (formats of at most 8 bits).

Exact derivatives (:func:`product_da`, :func:`product_db`): a pattern sum is piecewise
affine, so its slope is a signed power of two as PAM's (Table 1), with the constant in
the mantissa carry; ``EXACT`` and ``FLOAT`` take the derivative of the real product
(``∂(ab)/∂a = b``: the rounding's own derivative, zero almost everywhere, is passed
straight through), ``δ_A = RN(b δ_Y)``.
"""
import math
from typing import NamedTuple

import numpy as np
from numba.extending import register_jitable

from . import _scalar as S
from . import _scalar_grad as G

SUM = 0
EXACT = 1
FLOAT = 2
TABLE = 3


class MulParams(NamedTuple):
    """A multiplier in one format, as the kernels take it."""
    kind: int               # SUM, EXACT, FLOAT or TABLE
    c32: int                # SUM: the constant of the pattern sum, float32-pattern units
    table: np.ndarray       # SUM with k > 0: 4^k corrections (int64, float32-pattern units);
    #                         TABLE: the 4^k products' float32 patterns (int64)
    k: int                  # SUM: the mantissa bits per operand that index the table;
    #                         TABLE: the operands' encoding width


@register_jitable
def constant(a, b, c32, table, k):
    """The pattern sum's constant for the operands ``a``, ``b`` (kind SUM)."""
    if k == 0:
        return np.int64(c32)
    mask = (np.int64(1) << k) - 1
    i = (np.int64(a) >> (23 - k)) & mask
    j = (np.int64(b) >> (23 - k)) & mask
    return np.int64(c32) + table[(i << k) | j]


@register_jitable
def product_of(a, b, fc, kind, c32, table, k):
    """The product of the multiplier ``MulParams(kind, c32, table, k)`` in the format
    ``fc`` (the fields as arguments: CUDA kernels keep them in registers)."""
    if kind == SUM:
        return S.pam_sum(a, b, fc, constant(a, b, c32, table, k))
    if kind == TABLE:
        return table[(S.f32_to_bits(a, fc) << k) | S.f32_to_bits(b, fc)]
    return S.fp_mul(a, b, fc, kind == EXACT)


@register_jitable
def product(a, b, fc, mp):
    """The product of the multiplier ``mp`` in the format ``fc``."""
    return product_of(a, b, fc, mp.kind, mp.c32, mp.table, mp.k)


@register_jitable
def mac(s, a, b, fc, fca, mp):
    """One step of a matmul (docs/semantics.md §5 and "Multipliers"): the accumulator
    value ``s`` plus the product, rounded once into ``fca``; for EXACT the exact product
    (a fused multiply-add)."""
    if mp.kind == EXACT:
        return S.fp_fma(s, a, b, fca)
    return S.fp_add(s, product(a, b, fc, mp), fca)


@register_jitable
def _piece(u, fc):
    """An operand as the slope reads its mantissa: zero, subnormal (DAZ) and infinite
    operands sit at the piece of mantissa 0 (emu/_scalar_grad.py's convention)."""
    v = np.int64(u) & S.ABS32
    return np.int64(u) if fc.minnorm32 <= v < S.INF32 else np.int64(0)


@register_jitable
def _f64(p):
    """The value of a finite float32 pattern as a float64 (exact)."""
    u = np.int64(p) & S.ABS32
    if u >= 0x800000:
        v = math.ldexp(float((u & 0x7FFFFF) | 0x800000), int((u >> 23) - 150))
    else:
        v = math.ldexp(float(u), -149)
    return -v if (np.int64(p) >> 31) & 1 else v


@register_jitable
def _round64(v, fc):
    """The float64 ``v`` rounded (RNE, subnormals kept) into the format."""
    if v != v:
        return np.int64(fc.nan32)
    sign = np.int64(1) if math.copysign(1.0, v) < 0 else np.int64(0)
    if v == math.inf or v == -math.inf:
        return S.quantize((sign << 31) | S.INF32, fc, S.RNE, True, False, 0, 0)
    if v == 0:
        return (sign << 31) & fc.negzero32
    m, e = math.frexp(abs(v))
    return S.round_to_fmt(sign, np.int64(math.ldexp(m, 53)), np.int64(e - 53), fc, S.RNE,
                          True, False, 0)


@register_jitable
def _secant(own, other, d, fc, table, k, own_first):
    """TABLE: ∂product/∂own by the secant to own's neighbour (the next encoding up in
    magnitude, or down at the top of the range), times d: float64 arithmetic, rounded
    once into the format (docs/semantics.md "Multipliers")."""
    e0 = S.f32_to_bits(own, fc)
    eo = S.f32_to_bits(other, fc)
    p0 = S.bits_to_f32(e0, fc)
    if (p0 & S.ABS32) >= S.INF32 or (np.int64(other) & S.ABS32) > S.INF32:
        return np.int64(fc.nan32)
    e1 = e0 + 1
    p1 = S.bits_to_f32(e1, fc) if e1 < (np.int64(1) << k) else np.int64(S.QNAN32)
    if (p1 & S.ABS32) >= S.INF32 or (p1 ^ p0) & S.SIGN32:
        e1 = e0 - 1
        p1 = S.bits_to_f32(e1, fc)
    t0 = table[(e0 << k) | eo] if own_first else table[(eo << k) | e0]
    t1 = table[(e1 << k) | eo] if own_first else table[(eo << k) | e1]
    if (t0 & S.ABS32) >= S.INF32 or (t1 & S.ABS32) >= S.INF32:
        return np.int64(fc.nan32)
    if (np.int64(d) & S.ABS32) > S.INF32:
        return np.int64(fc.nan32)
    dv = math.inf if (np.int64(d) & S.ABS32) == S.INF32 else _f64(d)
    if (np.int64(d) >> 31) & 1:
        dv = -abs(dv)
    slope = (_f64(t1) - _f64(t0)) / (_f64(p1) - _f64(p0))
    return _round64(slope * dv, fc)


@register_jitable
def product_da_of(a, b, d, fc, mkind, c32, table, mk):
    """δ_A of ``Y = product(A, B)``: the exact derivative applied to ``d`` (a pattern of
    a value of the format); the multiplier's fields as arguments, as product_of."""
    if mkind == TABLE:
        return _secant(a, b, d, fc, table, mk, True)
    if mkind != SUM:
        return S.fp_mul(b, d, fc, True)
    c = constant(_piece(a, fc), b, c32, table, mk)
    kind, sgn, k = G.slope_sum(a, b, fc, c)
    return G.apply_slope(d, kind, sgn, k, fc)


@register_jitable
def product_db_of(a, b, d, fc, mkind, c32, table, mk):
    """δ_B of ``Y = product(A, B)`` (the table's index keeps A's bits first)."""
    if mkind == TABLE:
        return _secant(b, a, d, fc, table, mk, False)
    if mkind != SUM:
        return S.fp_mul(a, d, fc, True)
    c = constant(a, _piece(b, fc), c32, table, mk)
    kind, sgn, k = G.slope_sum(b, a, fc, c)
    return G.apply_slope(d, kind, sgn, k, fc)


@register_jitable
def product_da(a, b, d, fc, mp):
    """product_da_of with the multiplier ``mp``."""
    return product_da_of(a, b, d, fc, mp.kind, mp.c32, mp.table, mp.k)


@register_jitable
def product_db(a, b, d, fc, mp):
    """product_db_of with the multiplier ``mp``."""
    return product_db_of(a, b, d, fc, mp.kind, mp.c32, mp.table, mp.k)

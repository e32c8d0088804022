"""The one scalar definition of the *exact* derivatives of the PA operations (Table 1).

Kosson & Jaggi, section 2.5: the exact derivative of a piecewise affine function is
piecewise constant and, for every PA operation, a signed power of two, so
``δ_A = slope · δ_Y`` is a PAM by a power of two: an integer add to δ_Y's exponent,
no rounding.  This module computes that scaling on float32 bit patterns, with the
integer-only, ``register_jitable`` conventions of emu/_scalar.py (callable from
Python, ``@njit`` and ``@cuda.jit``; every intermediate fits in int64).

A *slope* is a tuple ``(kind, sign, k)``: ``POW2`` is ``(-1)^sign 2^k``, ``ZERO`` and
``INF`` are signed zero and infinity (limits at the edges of a piece, e.g. palog2 at
0), ``NAN`` is undefined.  :func:`apply_slope` multiplies a gradient by a slope with
the PAM rules of docs/semantics.md: the gradient operand is read DAZ, a result below
the smallest normal is flushed to ±0, above the largest finite one it is ±inf (IEEE)
or ±max (fn formats); ``0·inf`` and NaNs give the canonical NaN.

Conventions at the kinks (docs/torch_bridge.md, "Exact derivatives"): every piece is
closed on its lower end in the log domain, i.e. the slope is ``2^floor(.)`` of the
*result's* exponent (Table 1: ``1{M_A + M_B >= 1}`` for PAM, a borrow iff
``M_A < M_B`` for division, ``2^floor(A)`` for paexp2); an operand that is zero,
subnormal (DAZ) or infinite contributes a mantissa of 0 to the carry/borrow
(the slope of the piece at ``0+``, as the paper's bit-pattern formula gives), so
``∂(A ·̂ B)/∂A = ±2^E_B`` at ``A = 0`` just as ``∂(AB)/∂A = B``.
"""
import numpy as np
from numba.extending import register_jitable

from . import _scalar as S

POW2 = 0
ZERO = 1
INF = 2
NAN = 3

MAN32 = 0x7FFFFF
KMAX = 400           # |k| beyond this over/underflows every float32 value: clamp


@register_jitable
def _exp(u):
    """Unbiased exponent E of a normal float32 magnitude pattern."""
    return (u >> 23) - 127


@register_jitable
def _man(u, fc):
    """Mantissa field (float32 positions) of a normal operand; 0 for zero/DAZ/inf."""
    if u < fc.minnorm32 or u >= S.INF32:
        return np.int64(0)
    return u & MAN32


@register_jitable
def apply_slope(d, kind, sgn, k, fc):
    """Pattern of ``slope · d`` for the gradient pattern ``d`` (a value of the format),
    under the format's policy (docs/semantics.md §9 rule 7): an undefined product is
    fc.nan32 (NaN, or -0 without NaN codes), a -0 is +0 without -0 (fnuz)."""
    r = _slope_times(d, kind, sgn, k, fc)
    if r == S.QNAN32:
        return np.int64(fc.nan32)
    if r == S.SIGN32:
        return np.int64(fc.negzero32)
    return r


@register_jitable
def _slope_times(d, kind, sgn, k, fc):
    """apply_slope with IEEE's specials: the canonical NaN and -0 as such."""
    d = np.int64(d)
    ud = d & S.ABS32
    s = ((d >> 31) ^ sgn) & 1
    if kind == NAN or ud > S.INF32:
        return np.int64(S.QNAN32)
    if kind == ZERO:
        if ud == S.INF32:
            return np.int64(S.QNAN32)
        return s << 31
    if kind == INF:
        if ud < fc.minnorm32:
            return np.int64(S.QNAN32)
        return (s << 31) | fc.ovf32
    if ud == S.INF32:
        return (s << 31) | fc.ovf32
    if ud < fc.minnorm32:
        return s << 31
    r = ud + (max(-KMAX, min(KMAX, k)) << 23)
    if r < fc.minnorm32:
        return s << 31
    if r > fc.max32:
        return (s << 31) | fc.ovf32
    return (s << 31) | r


@register_jitable
def combine(k1, s1, e1, k2, s2, e2):
    """The slope of a composition: the product of two slopes."""
    s = s1 ^ s2
    if k1 == NAN or k2 == NAN:
        return NAN, np.int64(0), np.int64(0)
    if (k1 == ZERO and k2 == INF) or (k1 == INF and k2 == ZERO):
        return NAN, np.int64(0), np.int64(0)
    if k1 == ZERO or k2 == ZERO:
        return ZERO, s, np.int64(0)
    if k1 == INF or k2 == INF:
        return INF, s, np.int64(0)
    return POW2, s, e1 + e2


@register_jitable
def slope_mul(own, other, fc):
    """∂(own ·̂ other)/∂own = sign(other) 2^(E_other + 1{M_own + M_other >= 1}) (Table 1)."""
    return slope_sum(own, other, fc, 0)


@register_jitable
def slope_sum(own, other, fc, c):
    """The same for a pattern sum with the constant ``c`` (float32-pattern units,
    S.pam_sum): sign(other) 2^(E_other + floor(M_own + M_other + c 2^-23)), the carry
    (or borrow, for c < 0) of the sum's mantissa into the exponent."""
    own = np.int64(own)
    other = np.int64(other)
    uo = own & S.ABS32
    ut = other & S.ABS32
    st = (other >> 31) & 1
    if uo > S.INF32 or ut > S.INF32:
        return NAN, np.int64(0), np.int64(0)
    if ut < fc.minnorm32:
        return ZERO, st, np.int64(0)
    if ut == S.INF32:
        return INF, st, np.int64(0)
    carry = (_man(uo, fc) + (ut & MAN32) + c) >> 23        # floor, also for a borrow
    return POW2, st, _exp(ut) + carry


@register_jitable
def slope_div_num(a, b, fc):
    """∂(a ÷̂ b)/∂a = sign(b) 2^(-E_b - 1{M_a < M_b}) (Table 1, eqs. 14-17)."""
    a = np.int64(a)
    b = np.int64(b)
    ua = a & S.ABS32
    ub = b & S.ABS32
    sb = (b >> 31) & 1
    if ua > S.INF32 or ub > S.INF32:
        return NAN, np.int64(0), np.int64(0)
    if ub < fc.minnorm32:
        return INF, sb, np.int64(0)
    if ub == S.INF32:
        return ZERO, sb, np.int64(0)
    borrow = np.int64(1) if _man(ua, fc) < (ub & MAN32) else np.int64(0)
    return POW2, sb, -_exp(ub) - borrow


@register_jitable
def slope_div_den(a, b, fc):
    """∂(a ÷̂ b)/∂b = -sign(a) 2^(E_a - 2 E_b - 1{M_a < M_b}), the PA form of -a/b²."""
    a = np.int64(a)
    b = np.int64(b)
    ua = a & S.ABS32
    ub = b & S.ABS32
    s = ((a >> 31) & 1) ^ 1
    if ua > S.INF32 or ub > S.INF32:
        return NAN, np.int64(0), np.int64(0)
    a_zero = ua < fc.minnorm32
    b_zero = ub < fc.minnorm32
    if a_zero:
        if b_zero:
            return NAN, np.int64(0), np.int64(0)
        return ZERO, s, np.int64(0)
    if ua == S.INF32:
        if ub == S.INF32:
            return NAN, np.int64(0), np.int64(0)
        return INF, s, np.int64(0)
    if b_zero:
        return INF, s, np.int64(0)
    if ub == S.INF32:
        return ZERO, s, np.int64(0)
    borrow = np.int64(1) if (ua & MAN32) < (ub & MAN32) else np.int64(0)
    return POW2, s, _exp(ua) - 2 * _exp(ub) - borrow


@register_jitable
def slope_exp2(x, fc):
    """paexp2'(x) = 2^floor(x) (Table 1); -inf -> 0, +inf -> inf."""
    x = np.int64(x)
    ux = x & S.ABS32
    neg = (x >> 31) & 1
    if ux > S.INF32:
        return NAN, np.int64(0), np.int64(0)
    if ux == S.INF32:
        if neg:
            return ZERO, np.int64(0), np.int64(0)
        return INF, np.int64(0), np.int64(0)
    if ux < fc.minnorm32:                           # DAZ: the slope at 0
        return POW2, np.int64(0), np.int64(0)
    if ux >= 0x43800000:                            # |x| >= 256: out of every range
        return POW2, np.int64(0), np.int64(-KMAX) if neg else np.int64(KMAX)
    sig = (ux & MAN32) | 0x800000
    sh = 150 - (ux >> 23)                           # |x| = sig 2^-sh, sh >= 16
    if sh > 62:
        fl = np.int64(-1) if neg else np.int64(0)
    elif neg:
        fl = (-sig) >> sh
    else:
        fl = sig >> sh
    return POW2, np.int64(0), fl


@register_jitable
def slope_log2(x, fc):
    """palog2'(x) = 2^-E_x (Table 1); +inf at 0 (DAZ), 0 at +inf, NaN for x < 0."""
    x = np.int64(x)
    ux = x & S.ABS32
    if ux > S.INF32:
        return NAN, np.int64(0), np.int64(0)
    if ux < fc.minnorm32:
        return INF, np.int64(0), np.int64(0)
    if (x >> 31) & 1:
        return NAN, np.int64(0), np.int64(0)
    if ux == S.INF32:
        return ZERO, np.int64(0), np.int64(0)
    return POW2, np.int64(0), -_exp(ux)


@register_jitable
def slope_sqrt(x, fc):
    """pasqrt'(x) for pasqrt = paexp2(palog2(x)/2) (eq. 20), by the chain rule:
    2^floor((E+M)/2) · 2^-1 · 2^-E = 2^(floor(E/2) - E - 1)."""
    x = np.int64(x)
    ux = x & S.ABS32
    if ux > S.INF32:
        return NAN, np.int64(0), np.int64(0)
    if ux < fc.minnorm32:
        return INF, np.int64(0), np.int64(0)
    if (x >> 31) & 1:
        return NAN, np.int64(0), np.int64(0)
    if ux == S.INF32:
        return ZERO, np.int64(0), np.int64(0)
    e = _exp(ux)
    return POW2, np.int64(0), (e >> 1) - e - 1


@register_jitable
def slope_exp(x, fc):
    """paexp'(x) for paexp(x) = paexp2(x ·̂ log2e) (eq. 18): the chain of two slopes."""
    t = S.pam_mul(x, fc.log2e32, fc)
    k1, s1, e1 = slope_exp2(t, fc)
    k2, s2, e2 = slope_mul(x, fc.log2e32, fc)
    return combine(k1, s1, e1, k2, s2, e2)


@register_jitable
def slope_log(x, fc):
    """palog'(x) for palog(x) = palog2(x) ÷̂ log2e (eq. 19): the chain of two slopes."""
    lg = S.pa_log2(x, fc)
    k1, s1, e1 = slope_div_num(lg, fc.log2e32, fc)
    k2, s2, e2 = slope_log2(x, fc)
    return combine(k1, s1, e1, k2, s2, e2)


# --- gradients: the slope applied to δ_Y ---------------------------------------------

@register_jitable
def pam_mul_da(a, b, d, fc):
    """δ_A of Y = A ·̂ B (patterns of format values)."""
    kind, sgn, k = slope_mul(a, b, fc)
    return apply_slope(d, kind, sgn, k, fc)


@register_jitable
def pam_mul_db(a, b, d, fc):
    """δ_B of Y = A ·̂ B: PAM is symmetric, so δ_A with the operands exchanged."""
    return pam_mul_da(b, a, d, fc)


@register_jitable
def pa_div_da(a, b, d, fc):
    """δ_A of Y = A ÷̂ B."""
    kind, sgn, k = slope_div_num(a, b, fc)
    return apply_slope(d, kind, sgn, k, fc)


@register_jitable
def pa_div_db(a, b, d, fc):
    """δ_B of Y = A ÷̂ B."""
    kind, sgn, k = slope_div_den(a, b, fc)
    return apply_slope(d, kind, sgn, k, fc)


@register_jitable
def pa_exp2_dx(x, d, fc):
    kind, sgn, k = slope_exp2(x, fc)
    return apply_slope(d, kind, sgn, k, fc)


@register_jitable
def pa_log2_dx(x, d, fc):
    kind, sgn, k = slope_log2(x, fc)
    return apply_slope(d, kind, sgn, k, fc)


@register_jitable
def pa_exp_dx(x, d, fc):
    kind, sgn, k = slope_exp(x, fc)
    return apply_slope(d, kind, sgn, k, fc)


@register_jitable
def pa_log_dx(x, d, fc):
    kind, sgn, k = slope_log(x, fc)
    return apply_slope(d, kind, sgn, k, fc)


@register_jitable
def pa_sqrt_dx(x, d, fc):
    kind, sgn, k = slope_sqrt(x, fc)
    return apply_slope(d, kind, sgn, k, fc)

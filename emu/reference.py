"""The independent oracle: emu's operations from their *mathematical* definitions.

Nothing here looks at bit patterns or reuses emu's kernels.  Values are exact
rationals (:class:`fractions.Fraction`); a number is decomposed as
``2^E (1 + M)`` by comparing it with powers of two, PAM is literally
``paexp2(palog2|a| + palog2|b|)`` (eqs. 1, 9, 10), rounding is "pick the nearest
point of the format's grid".  It is slow (pure Python, one scalar at a time) and
meant for tests; :mod:`emu` must agree with it bit for bit (NaNs by class).

Scalars in and out are Python floats (every format value is a float32 value and
hence a Python float exactly); ``nan``, ``±inf`` and ``-0.0`` are themselves.
"""
from __future__ import annotations

import functools
import inspect
import math
import struct
from fractions import Fraction

from .formats import Format, format

__all__ = ["quantize", "pam_mul", "pam_sum", "pa_div", "pa_exp2", "pa_log2", "pa_exp", "pa_log",
           "pa_sqrt", "fp_add", "fp_mul", "pam_matmul", "rand32", "palog2_exact",
           "paexp2_exact", "pam_mul_vec", "pa_div_vec", "mx_quantize", "mx_dequantize",
           "mx_pam_matmul"]

NAN = float("nan")
INF = float("inf")
_LOG2E = Fraction("1.442695040888963407359924681001892137427")


# --- exact helpers ---------------------------------------------------------------

def _pow2(e: int) -> Fraction:
    """2^e exactly."""
    return Fraction(1 << e) if e >= 0 else Fraction(1, 1 << -e)


def _floor_log2(v: Fraction) -> int:
    """The integer E with 2^E <= v < 2^(E+1), for v > 0."""
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if _pow2(e) > v:
        e -= 1
    assert _pow2(e) <= v < _pow2(e + 1)
    return e


def palog2_exact(v: Fraction) -> Fraction:
    """palog2(v) = E + M for v = 2^E (1 + M) > 0 (eq. 10)."""
    e = _floor_log2(v)
    return e + (v / _pow2(e) - 1)


def paexp2_exact(y: Fraction) -> Fraction:
    """paexp2(y) = 2^floor(y) (1 + y - floor(y)) (eq. 9)."""
    fl = math.floor(y)
    return _pow2(fl) * (1 + y - fl)


def _signed(sign: int, magnitude: Fraction | float) -> float:
    v = float(magnitude)
    return -v if sign else v


def _sign(x: float) -> int:
    return 1 if math.copysign(1.0, x) < 0 else 0


def _round(v: Fraction, fmt: Format, mode: str = "nearest_even", subnormals: bool = True,
           saturate: bool = False, u: int | None = None) -> Fraction | float:
    """Round v >= 0 onto fmt's grid; returns a Fraction, ``INF`` or ``NAN``.

    The grid spacing at v is 2^(max(E_v, emin) - M).  Stochastic rounding rounds up
    iff u + floor(frac * 2^32) >= 2^32 for the discarded fraction frac of a spacing.
    """
    if v == 0:
        return Fraction(0)
    quantum = _pow2(max(_floor_log2(v), fmt.emin) - fmt.man_bits)
    n_exact = v / quantum
    n = math.floor(n_exact)
    frac = n_exact - n
    if mode == "nearest_even":
        # the even encoding: n's parity, or with M = 0 (n = 1 above zero) the exponent
        # field's, as gfloat's round_float
        odd = n % 2 == 1 if fmt.man_bits else (
            n != 0 and (_floor_log2(n * quantum) - fmt.emin + 1) % 2 == 1)
        if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and odd):
            n += 1
    elif mode == "stochastic":
        if u + math.floor(frac * 2 ** 32) >= 2 ** 32:
            n += 1
    elif mode != "toward_zero":
        raise ValueError(mode)
    r = n * quantum
    if r > Fraction(fmt.max):
        if saturate or mode == "toward_zero" or fmt.saturates:
            return Fraction(fmt.max)
        return INF if fmt.has_inf else NAN
    if not subnormals and 0 < r < _pow2(fmt.emin):
        return Fraction(0)
    return r


def _round_signed(sign: int, v: Fraction, fmt: Format, **kw) -> float:
    r = _round(v, fmt, **kw)
    if isinstance(r, float) and math.isnan(r):
        return NAN
    return _signed(sign, r)


def _policy(v: float, fmt: Format) -> float:
    """A result under the format's encoding policy: without NaN codes an invalid result
    is -0 (what quantize makes of the canonical NaN); without -0, -0 is +0."""
    if math.isnan(v):
        return -0.0 if fmt.nan == "none" else NAN
    if v == 0 and not fmt.has_neg_zero:
        return 0.0
    return v


def _policed(op):
    """Apply :func:`_policy` to the result of an operation with a ``fmt`` argument."""
    sig = inspect.signature(op)

    @functools.wraps(op)
    def wrapped(*args, **kw):
        bound = sig.bind(*args, **kw)
        bound.apply_defaults()
        return _policy(op(*args, **kw), format(bound.arguments["fmt"]))
    return wrapped


def _pa_round(sign: int, v: Fraction, fmt: Format) -> float:
    """Results of paexp2/palog2/pasqrt: RNE, no subnormals, overflow inf (IEEE) / max (fn)."""
    return _round_signed(sign, v, fmt, subnormals=False, saturate=not fmt.has_inf)


def _is_zero_class(x: float, fmt: Format) -> bool:
    """Zero or subnormal: what the PA operations read as zero (DAZ)."""
    return abs(x) < fmt.smallest_normal


def _pa_range(sign: int, v: Fraction, fmt: Format) -> float:
    """PAM/PA-division results: exact, flushed below the smallest normal, overflow
    to inf (IEEE) or max (fn)."""
    if v < _pow2(fmt.emin):
        return _signed(sign, 0)
    if v > Fraction(fmt.max):
        return _signed(sign, INF if fmt.has_inf else fmt.max)
    assert _round(v, fmt) == v, "PAM/PA-div results are exact format values"
    return _signed(sign, v)


# --- the operations ---------------------------------------------------------------

M32 = 0xFFFFFFFF


def _lowbias32(x: int) -> int:
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def rand32(seed: int, idx: int) -> int:
    """The stochastic-rounding draw for element ``idx`` under ``seed`` (docs/semantics.md)."""
    ka = _lowbias32((seed & M32) ^ 0x9E3779B9) & 0x7FFFFFFF
    kb = _lowbias32(ka ^ (seed >> 32) ^ 0x85EBCA6B)
    return _lowbias32(_lowbias32((idx + ka) & M32) ^ kb ^ ((idx >> 32) & M32))


def quantize(x: float, fmt, rounding: str = "nearest_even", subnormals: bool = True,
             overflow: str | None = None, u: int | None = None) -> float:
    """x rounded into fmt; ``u`` is the 32-bit draw for stochastic rounding."""
    # memoised on the exact bits of x (0.0 and -0.0 must not share an entry)
    return _quantize(struct.pack("<d", x), format(fmt), rounding, subnormals, overflow, u)


@functools.lru_cache(maxsize=1 << 17)
def _quantize(xbits: bytes, fmt: Format, rounding, subnormals, overflow, u) -> float:
    (x,) = struct.unpack("<d", xbits)
    saturate = overflow == "saturate"
    if math.isnan(x):
        # no NaN code: ml_dtypes gives the zero of the other sign
        return math.copysign(0.0, -math.copysign(1.0, x)) if fmt.saturates else NAN
    if math.isinf(x):
        if fmt.has_inf:
            return x
        return math.copysign(fmt.max, x) if saturate or fmt.saturates else NAN
    return _policy(_round_signed(_sign(x), abs(Fraction(x)), fmt, mode=rounding,
                                 subnormals=subnormals, saturate=saturate, u=u), fmt)


def pam_mul(a: float, b: float, fmt="float32") -> float:
    """a ·̂ b = ±paexp2(palog2|a| + palog2|b|) (eqs. 1, 5-8, 11-13)."""
    return pam_sum(a, b, fmt, lambda ma, mb: 0)


def _mantissa(x: float) -> Fraction:
    """M of |x| = 2^E (1 + M), 0 <= M < 1, for x != 0."""
    v = abs(Fraction(x))
    return v / _pow2(_floor_log2(v)) - 1


@_policed
def pam_sum(a: float, b: float, fmt, constant) -> float:
    """±paexp2(palog2|a| + palog2|b| + constant(M_a, M_b)): PAM with a constant in the
    logarithm's sum (the multipliers of emu/reference_mul.py), PAM's specials and range."""
    fmt = format(fmt)
    a, b = quantize(a, fmt), quantize(b, fmt)
    s = _sign(a) ^ _sign(b)
    if math.isnan(a) or math.isnan(b):
        return NAN
    za, zb = _is_zero_class(a, fmt), _is_zero_class(b, fmt)
    if math.isinf(a) or math.isinf(b):
        return NAN if (za or zb) else _signed(s, INF)
    if za or zb:
        return _signed(s, 0)
    v = paexp2_exact(palog2_exact(abs(Fraction(a))) + palog2_exact(abs(Fraction(b)))
                     + constant(_mantissa(a), _mantissa(b)))
    return _pa_range(s, v, fmt)


@_policed
def pa_div(a: float, b: float, fmt="float32") -> float:
    """a ÷̂ b = ±paexp2(palog2|a| - palog2|b|) (eqs. 14-17)."""
    fmt = format(fmt)
    a, b = quantize(a, fmt), quantize(b, fmt)
    s = _sign(a) ^ _sign(b)
    if math.isnan(a) or math.isnan(b):
        return NAN
    za, zb = _is_zero_class(a, fmt), _is_zero_class(b, fmt)
    if math.isinf(a):
        return NAN if math.isinf(b) else _signed(s, INF)
    if math.isinf(b):
        return _signed(s, 0)
    if zb:   # x/0 overflows: inf, or max where there is neither inf nor NaN; an
        # unsigned zero (fnuz, P3109) gives the result no sign: NaN
        if za or not fmt.has_neg_zero or not (fmt.has_inf or fmt.saturates):
            return NAN
        return _signed(s, INF if fmt.has_inf else fmt.max)
    if za:
        return _signed(s, 0)
    v = paexp2_exact(palog2_exact(abs(Fraction(a))) - palog2_exact(abs(Fraction(b))))
    return _pa_range(s, v, fmt)


@_policed
def pa_exp2(x: float, fmt="float32") -> float:
    """paexp2(x) (eq. 9), rounded once into fmt."""
    fmt = format(fmt)
    x = quantize(x, fmt)
    if math.isnan(x):
        return NAN
    if math.isinf(x):
        return 0.0 if x < 0 else (INF if fmt.has_inf else fmt.max)
    v = Fraction(0) if _is_zero_class(x, fmt) else Fraction(x)
    # keep 2^floor(x) small: past these bounds the result is 2^(>= emax+1), an
    # overflow, or below 2^(emin-1), a flush, whatever the rounding
    if v >= fmt.emax + 1:
        return INF if fmt.has_inf else fmt.max
    if v < fmt.emin - 1:
        return 0.0
    return _pa_round(0, paexp2_exact(v), fmt)


@_policed
def pa_log2(x: float, fmt="float32") -> float:
    """palog2(x) (eq. 10), rounded once into fmt; log of zero is -inf (fn: -max)."""
    fmt = format(fmt)
    x = quantize(x, fmt)
    if math.isnan(x):
        return NAN
    if _is_zero_class(x, fmt):
        return -INF if fmt.has_inf else -fmt.max
    if x < 0:
        return NAN
    if math.isinf(x):
        return INF
    v = palog2_exact(Fraction(x))
    return _pa_round(1 if v < 0 else 0, abs(v), fmt)


@_policed
def pa_sqrt(x: float, fmt="float32") -> float:
    """pasqrt(x) = paexp2(palog2(x) / 2) (eq. 20), rounded once into fmt."""
    fmt = format(fmt)
    x = quantize(x, fmt)
    if math.isnan(x):
        return NAN
    if _is_zero_class(x, fmt):
        return _signed(_sign(x), 0)
    if x < 0:
        return NAN
    if math.isinf(x):
        return INF
    return _pa_round(0, paexp2_exact(palog2_exact(Fraction(x)) / 2), fmt)


def _log2e(fmt: Format) -> float:
    return float(_round(_LOG2E, fmt))


def pa_exp(x: float, fmt="float32") -> float:
    """paexp(x) = paexp2(log2(e) ·̂ x) (eq. 18)."""
    fmt = format(fmt)
    return pa_exp2(pam_mul(x, _log2e(fmt), fmt), fmt)


def pa_log(x: float, fmt="float32") -> float:
    """palog(x) = palog2(x) ÷̂ log2(e) (eq. 19)."""
    fmt = format(fmt)
    return pa_div(pa_log2(x, fmt), _log2e(fmt), fmt)


def _add_exact(a: float, b: float, fmt: Format) -> float:
    """The exact sum of two floats, correctly rounded (RNE) into fmt, IEEE 754 zeros/specials."""
    if math.isnan(a) or math.isnan(b):
        return NAN
    if math.isinf(a) or math.isinf(b):
        if math.isinf(a) and math.isinf(b) and a != b:
            return NAN
        return quantize(a if math.isinf(a) else b, fmt)
    s = Fraction(a) + Fraction(b)
    if s == 0:
        # exact zero: -0 only when both addends are -0 (round-to-nearest rule)
        return -0.0 if (_sign(a) and _sign(b) and a == 0 and b == 0) else 0.0
    return _round_signed(1 if s < 0 else 0, abs(s), fmt)


@_policed
def fp_add(a: float, b: float, fmt="float32") -> float:
    """IEEE addition of a and b rounded into fmt (operands rounded to fmt first)."""
    fmt = format(fmt)
    return _add_exact(quantize(a, fmt), quantize(b, fmt), fmt)


@_policed
def fp_mul(a: float, b: float, fmt="float32", subnormals: bool = True) -> float:
    """IEEE multiplication rounded into fmt; without subnormals: DAZ operands, FTZ result."""
    fmt = format(fmt)
    a, b = quantize(a, fmt), quantize(b, fmt)
    if math.isnan(a) or math.isnan(b):
        return NAN
    s = _sign(a) ^ _sign(b)
    za = a == 0 or (not subnormals and _is_zero_class(a, fmt))
    zb = b == 0 or (not subnormals and _is_zero_class(b, fmt))
    if math.isinf(a) or math.isinf(b):
        return NAN if (za or zb) else quantize(_signed(s, INF), fmt)
    if za or zb:
        return _signed(s, 0)
    return _round_signed(s, abs(Fraction(a) * Fraction(b)), fmt, subnormals=subnormals)


def pam_matmul(A, B, fmt="float32", acc="float32"):
    """Nested lists in, nested lists out: C[i][j] = fold_k (acc ⊕ pam_mul(A[i][k], B[k][j]))
    in increasing k from +0.0, ⊕ the exact sum rounded into ``acc``."""
    fmt, acc = format(fmt), format(acc)
    n_k = len(B)
    out = []
    for row in A:
        assert len(row) == n_k
        out_row = []
        for j in range(len(B[0]) if n_k else 0):
            s = 0.0
            for k in range(n_k):
                s = _add_exact(s, pam_mul(row[k], B[k][j], fmt), acc)
            out_row.append(s)
        out.append(out_row)
    return out


# --- vectorised exact oracle for large sweeps ------------------------------------
#
# The bfloat16 sweeps (every value against thousands of partners) are too large for
# Fractions.  These numpy versions use the same definitions in float64, where they
# are exact: palog2 of a float32 value is an integer |E| <= 149 plus a fraction of
# at most 23 bits, so sums/differences of two need <= 33 significant bits, and
# paexp2 of such a number is a 24-bit significand times a power of two.  Inputs must
# already be values of ``fmt`` (checked).  Tests validate these against the
# Fraction oracle above on exhaustive fp8 and sampled wider inputs.

def _np_palog2(v):
    import numpy as np
    m, e = np.frexp(v)                     # v = m 2^e with 1/2 <= m < 1
    return (e - 1) + (2 * m - 1)


def _np_paexp2(y):
    import numpy as np
    fl = np.floor(y)
    return np.ldexp(1 + (y - fl), fl.astype(np.int64))


def _np_check_in_format(x, fmt: Format):
    import numpy as np
    fin = np.isfinite(x) & (x != 0)
    ax = np.abs(x[fin])
    _, e = np.frexp(ax)
    quantum = np.ldexp(1.0, np.maximum(e - 1, fmt.emin) - fmt.man_bits)
    if not (np.all(ax / quantum == np.floor(ax / quantum)) and np.all(ax <= fmt.max)):
        raise ValueError(f"vectorised oracle inputs must be values of {fmt.name}")
    if not fmt.has_inf and np.isinf(x).any():
        raise ValueError(f"{fmt.name} has no infinities")


def _np_pa_binary(a, b, fmt, sub: bool):
    import numpy as np
    fmt = format(fmt)
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    _np_check_in_format(a, fmt)
    _np_check_in_format(b, fmt)
    sign = np.signbit(a) ^ np.signbit(b)
    tiny = fmt.smallest_normal
    za, zb = np.abs(a) < tiny, np.abs(b) < tiny
    ia, ib = np.isinf(a), np.isinf(b)
    with np.errstate(all="ignore"):
        la = _np_palog2(np.where(za | ia | np.isnan(a), 1.0, np.abs(a)))
        lb = _np_palog2(np.where(zb | ib | np.isnan(b), 1.0, np.abs(b)))
        v = _np_paexp2(la - lb if sub else la + lb)
    over = v > fmt.max
    v = np.where(v < tiny, 0.0, v)
    v = np.where(over, np.inf if fmt.has_inf else fmt.max, v)
    if sub:   # division: specials in the order of the definition
        v = np.where(za, 0.0, v)
        x0 = np.inf if fmt.has_inf else (fmt.max if fmt.saturates else np.nan)
        v = np.where(zb, np.where(za, np.nan, x0), v)
        v = np.where(ib, np.where(ia, np.nan, 0.0), v)
        v = np.where(ia & ~ib, np.inf, v)
    else:
        v = np.where(za | zb, 0.0, v)
        v = np.where(ia | ib, np.where(za | zb, np.nan, np.inf), v)
    v = np.where(np.isnan(a) | np.isnan(b), np.nan, v)
    v = np.where(sign, -v, v)
    if fmt.saturates:          # invalid results are -0, quantize's image of the NaN
        v = np.where(np.isnan(v), -0.0, v)
    if not fmt.has_neg_zero:
        v = np.where(v == 0, 0.0, v)
    return v.astype(np.float32)


def pam_mul_vec(a, b, fmt="float32"):
    """Vectorised :func:`pam_mul` for arrays of values of ``fmt`` (float64 arithmetic, exact)."""
    return _np_pa_binary(a, b, fmt, sub=False)


def pa_div_vec(a, b, fmt="float32"):
    """Vectorised :func:`pa_div` for arrays of values of ``fmt`` (float64 arithmetic, exact)."""
    return _np_pa_binary(a, b, fmt, sub=True)


# --- MX block formats (docs/semantics.md, "MX block formats") ----------------------

_MX_ELEMENTS = {"mxfp8_e4m3": ("float8_e4m3fn", 8), "mxfp8_e5m2": ("float8_e5m2", 15),
                "mxfp6_e3m2": ("float6_e3m2fn", 4), "mxfp6_e2m3": ("float6_e2m3fn", 2),
                "mxfp4_e2m1": ("float4_e2m1fn", 2), "mxint8": ("int8", 0)}


def mx_quantize(values, mx: str, block: int = 32):
    """One row of floats in, ``(elements, scale codes)`` out, block by block from the
    definition: s = floor(log2 amax) - emax (>= -127), P = x / 2^s rounded RNE and
    saturated (int8: to k/64, |k| <= 127); NaN/inf blocks get code 0xFF and +0."""
    elem, emax = _MX_ELEMENTS[mx]
    elements, codes = [], []
    for start in range(0, len(values), block):
        xs = values[start:start + block]
        if any(math.isnan(v) or math.isinf(v) for v in xs):
            elements += [0.0] * len(xs)
            codes.append(0xFF)
            continue
        amax = max(abs(Fraction(v)) for v in xs)
        s = max(_floor_log2(amax) - emax, -127) if amax else -127
        for v in xs:
            q = v * 2.0 ** -s                  # exact in double precision, keeps -0
            if elem == "int8":
                k = max(-127, min(127, round(Fraction(q) * 64)))   # round(): half to even
                elements.append(k / 64)        # an integer code: no -0
            else:
                elements.append(quantize(q, elem, overflow="saturate"))
        codes.append(s + 127)
    return elements, codes


def mx_dequantize(elements, codes, block: int = 32):
    """P_i 2^(code - 127), rounded RNE to float32; NaN for code 0xFF."""
    out = []
    for i, p in enumerate(elements):
        c = codes[i // block]
        # p 2^(c-127) is exact in double precision (and keeps -0)
        out.append(NAN if c == 0xFF else quantize(p * 2.0 ** (c - 127), "float32"))
    return out


def mx_pam_matmul(A, B, mx: str, block: int = 32, acc="float32"):
    """Nested lists: rows of A and columns of B MX-quantized along K, then the PAM fold
    of :func:`pam_matmul` on the dequantized operands."""
    rows = [mx_dequantize(*mx_quantize(row, mx, block), block) for row in A]
    cols = [mx_dequantize(*mx_quantize(list(col), mx, block), block) for col in zip(*B)]
    return pam_matmul(rows, [list(r) for r in zip(*cols)], "float32", acc)

"""The independent oracle of emu.grad: derivatives of the PA operations from the math.

Nothing here looks at bit patterns or reuses emu's kernels.  Every PA operation is
``paexp2(z)`` of a log-domain argument ``z`` built from ``palog2`` (eqs. 1, 9-20), so
its exact derivative follows from the chain rule with ``paexp2'(z) = 2^floor(z)``
and ``palog2'(v) = 2^-E_v`` (Table 1), evaluated with exact rationals
(:class:`fractions.Fraction`).  An operand that is zero, subnormal (read as zero) or
infinite enters ``z`` as ``2^0`` (mantissa 0): the slope of the piece at ``0+``.  The
product ``slope · δ_Y`` is then placed in the format like a PAM result: flushed below
the smallest normal, ±inf (IEEE) or ±max (fn) above the largest finite value.  The
approximate derivatives are the compositions of Table 1, evaluated with
:mod:`emu.reference`.  Scalars in and out are Python floats; slow, for tests.
"""
from __future__ import annotations

import math
from fractions import Fraction

from . import reference as R
from .formats import format
from .reference import INF, NAN, _add_exact, _floor_log2, _is_zero_class, _pa_range, \
    _pow2, _sign, _signed, palog2_exact

__all__ = ["ln2", "pam_mul", "pa_div", "pa_exp2", "pa_log2", "pa_exp", "pa_log", "pa_sqrt",
           "pam_matmul", "exact_vec"]

_LN2 = Fraction("0.6931471805599453094172321214581765680755")


def ln2(fmt) -> float:
    """ln(2) rounded to nearest (ties to even) on fmt's grid."""
    return float(R._round(_LN2, format(fmt)))


def _log2e(fmt) -> float:
    return float(R._round(R._LOG2E, format(fmt)))


# A slope is ("pow2", sign, Fraction) | ("zero", sign) | ("inf", sign) | ("nan",).

def _times(s1, s2):
    if "nan" in (s1[0], s2[0]) or {s1[0], s2[0]} == {"zero", "inf"}:
        return ("nan",)
    sign = s1[1] ^ s2[1]
    if "zero" in (s1[0], s2[0]):
        return ("zero", sign)
    if "inf" in (s1[0], s2[0]):
        return ("inf", sign)
    return ("pow2", sign, s1[2] * s2[2])


def _log_arg(v: float, fmt) -> Fraction:
    """palog2 of |v| for the log-domain argument; zero/DAZ/inf enter as 2^0 (M = 0)."""
    if _is_zero_class(v, fmt) or math.isinf(v):
        return Fraction(0)
    return palog2_exact(abs(Fraction(v)))


def _E(v: float) -> int:
    return _floor_log2(abs(Fraction(v)))


def _apply(slope, d: float, fmt) -> float:
    """slope · δ placed in fmt like a PAM result (δ read DAZ), under fmt's policy
    (docs/semantics.md §9 rule 7)."""
    return R._policy(_apply_ieee(slope, d, fmt), fmt)


def _apply_ieee(slope, d: float, fmt) -> float:
    """_apply with IEEE's specials: NaN and -0 as such."""
    if slope[0] == "nan" or math.isnan(d):
        return NAN
    s = slope[1] ^ _sign(d)
    dz = _is_zero_class(d, fmt)
    if slope[0] == "zero":
        return NAN if math.isinf(d) else _signed(s, 0)
    if slope[0] == "inf" or math.isinf(d):
        if dz:
            return NAN
        return _signed(s, INF if fmt.has_inf else fmt.max)
    if dz:
        return _signed(s, 0)
    return _pa_range(s, slope[2] * abs(Fraction(d)), fmt)


def _slope_mul(own: float, other: float, fmt, constant=Fraction(0)):
    """∂(own ·̂ other)/∂own = sign(other) paexp2'(z) palog2'(|own|), z = l_own + l_other
    (+ ``constant``: a pattern-sum multiplier's, emu/reference_mul.py)."""
    if math.isnan(own) or math.isnan(other):
        return ("nan",)
    so = _sign(other)
    if _is_zero_class(other, fmt):
        return ("zero", so)
    if math.isinf(other):
        return ("inf", so)
    lo = _log_arg(own, fmt)
    z = lo + _log_arg(other, fmt) + constant
    return ("pow2", so, _pow2(math.floor(z) - math.floor(lo)))


def _slope_div_num(a: float, b: float, fmt):
    """∂(a ÷̂ b)/∂a = sign(b) 2^(floor(l_a - l_b) - E_a)."""
    if math.isnan(a) or math.isnan(b):
        return ("nan",)
    sb = _sign(b)
    if _is_zero_class(b, fmt):
        return ("inf", sb)
    if math.isinf(b):
        return ("zero", sb)
    la = _log_arg(a, fmt)
    return ("pow2", sb, _pow2(math.floor(la - _log_arg(b, fmt)) - math.floor(la)))


def _slope_div_den(a: float, b: float, fmt):
    """∂(a ÷̂ b)/∂b = -sign(a) 2^(floor(l_a - l_b) - E_b), the PA -a/b²."""
    if math.isnan(a) or math.isnan(b):
        return ("nan",)
    s = 1 - _sign(a)
    za, zb = _is_zero_class(a, fmt), _is_zero_class(b, fmt)
    if za:
        return ("nan",) if zb else ("zero", s)
    if math.isinf(a):
        return ("nan",) if math.isinf(b) else ("inf", s)
    if zb:
        return ("inf", s)
    if math.isinf(b):
        return ("zero", s)
    lb = _log_arg(b, fmt)
    return ("pow2", s, _pow2(math.floor(_log_arg(a, fmt) - lb) - math.floor(lb)))


def _slope_exp2(x: float, fmt):
    if math.isnan(x):
        return ("nan",)
    if math.isinf(x):
        return ("zero", 0) if x < 0 else ("inf", 0)
    v = Fraction(0) if _is_zero_class(x, fmt) else Fraction(x)
    # 2^±400 times any float32 value over/underflows, so capping floor(x) there
    # changes no result and keeps the Fractions small
    return ("pow2", 0, _pow2(max(-400, min(400, math.floor(v)))))


def _slope_log2(x: float, fmt):
    if math.isnan(x):
        return ("nan",)
    if _is_zero_class(x, fmt):
        return ("inf", 0)
    if x < 0:
        return ("nan",)
    if math.isinf(x):
        return ("zero", 0)
    return ("pow2", 0, _pow2(-_E(x)))


def _slope_sqrt(x: float, fmt):
    """pasqrt(x) = paexp2(palog2(x) / 2): 2^floor(l/2) · 1/2 · 2^-E_x."""
    sl = _slope_log2(x, fmt)
    if sl[0] != "pow2":
        return sl
    h = palog2_exact(Fraction(x)) / 2
    return _times(("pow2", 0, _pow2(math.floor(h)) / 2), sl)


def _q(fmt, *xs):
    return [R.quantize(float(x), fmt) for x in xs]


def pam_mul(a, b, dy, fmt="float32", kind="exact"):
    """(δ_A, δ_B) of a ·̂ b."""
    fmt = format(fmt)
    a, b, dy = _q(fmt, a, b, dy)
    if kind == "approx":
        return R.pam_mul(b, dy, fmt), R.pam_mul(a, dy, fmt)
    return (_apply(_slope_mul(a, b, fmt), dy, fmt), _apply(_slope_mul(b, a, fmt), dy, fmt))


def pa_div(a, b, dy, fmt="float32", kind="exact"):
    """(δ_A, δ_B) of a ÷̂ b."""
    fmt = format(fmt)
    a, b, dy = _q(fmt, a, b, dy)
    if kind == "approx":
        return (R.pa_div(dy, b, fmt),
                R.pa_div(R.pam_mul(-a, dy, fmt), R.pam_mul(b, b, fmt), fmt))
    return (_apply(_slope_div_num(a, b, fmt), dy, fmt),
            _apply(_slope_div_den(a, b, fmt), dy, fmt))


def _exp2_approx(y, dy, fmt):
    return R.pam_mul(R.pam_mul(y, ln2(fmt), fmt), dy, fmt)


def _log2_approx(x, dy, fmt):
    return R.pa_div(dy, R.pam_mul(x, ln2(fmt), fmt), fmt)


def pa_exp2(x, dy, fmt="float32", kind="exact"):
    fmt = format(fmt)
    x, dy = _q(fmt, x, dy)
    if kind == "approx":
        return _exp2_approx(R.pa_exp2(x, fmt), dy, fmt)
    return _apply(_slope_exp2(x, fmt), dy, fmt)


def pa_log2(x, dy, fmt="float32", kind="exact"):
    fmt = format(fmt)
    x, dy = _q(fmt, x, dy)
    if kind == "approx":
        return _log2_approx(x, dy, fmt)
    return _apply(_slope_log2(x, fmt), dy, fmt)


def pa_exp(x, dy, fmt="float32", kind="exact"):
    """paexp(x) = paexp2(x ·̂ log2e): chain rule through T = x ·̂ log2e."""
    fmt = format(fmt)
    x, dy = _q(fmt, x, dy)
    c = _log2e(fmt)
    t = R.pam_mul(x, c, fmt)
    if kind == "approx":
        return R.pam_mul(_exp2_approx(R.pa_exp2(t, fmt), dy, fmt), c, fmt)
    return _apply(_times(_slope_exp2(t, fmt), _slope_mul(x, c, fmt)), dy, fmt)


def pa_log(x, dy, fmt="float32", kind="exact"):
    """palog(x) = palog2(x) ÷̂ log2e: chain rule through L = palog2(x)."""
    fmt = format(fmt)
    x, dy = _q(fmt, x, dy)
    c = _log2e(fmt)
    if kind == "approx":
        return _log2_approx(x, R.pa_div(dy, c, fmt), fmt)
    lg = R.pa_log2(x, fmt)
    return _apply(_times(_slope_div_num(lg, c, fmt), _slope_log2(x, fmt)), dy, fmt)


def pa_sqrt(x, dy, fmt="float32", kind="exact"):
    fmt = format(fmt)
    x, dy = _q(fmt, x, dy)
    if kind == "approx":
        dh = _exp2_approx(R.pa_sqrt(x, fmt), dy, fmt)
        return _log2_approx(x, R.pa_div(dh, 2.0, fmt), fmt)
    return _apply(_slope_sqrt(x, fmt), dy, fmt)


def pam_matmul(A, B, dY, fmt="float32", acc="float32", kind="approx"):
    """Nested lists: (δA, δB) of C = pam_matmul(A, B); folds in increasing order from
    +0.0, each step the exact sum rounded into ``acc``."""
    fmt, acc = format(fmt), format(acc)
    M, K, N = len(A), len(B), len(B[0]) if B else 0
    da = [[0.0] * K for _ in range(M)]
    db = [[0.0] * N for _ in range(K)]
    for i in range(M):
        for k in range(K):
            s = 0.0
            for j in range(N):
                s = _add_exact(s, pam_mul(A[i][k], B[k][j], dY[i][j], fmt, kind)[0], acc)
            da[i][k] = s
    for k in range(K):
        for j in range(N):
            s = 0.0
            for i in range(M):
                s = _add_exact(s, pam_mul(A[i][k], B[k][j], dY[i][j], fmt, kind)[1], acc)
            db[k][j] = s
    return da, db


# --- vectorised exact oracle for exhaustive sweeps ------------------------------------
#
# The same definitions in float64 numpy, where they are exact: palog2 of a float32
# value needs <= 33 significant bits (see emu.reference), floors of sums of two are
# exact, and 2^k δ for |k| <= 400 and a float32 δ is a float64 without rounding.
# Validated against the Fraction oracle above on random and corner inputs (tests).

def _np_log_arg(v, fmt):
    import numpy as np
    plain = (np.abs(v) < fmt.smallest_normal) | ~np.isfinite(v)
    return R._np_palog2(np.where(plain, 1.0, np.abs(v)))


def _np_exponent(v):
    import numpy as np
    return np.frexp(np.where(np.isfinite(v) & (v != 0), np.abs(v), 1.0))[1] - 1


def _np_apply(kind, sign, k, d, fmt):
    """Vectorised :func:`_apply`; kind: 0 pow2, 1 zero, 2 inf, 3 nan."""
    import numpy as np
    s = sign.astype(bool) ^ np.signbit(d)
    dz = np.abs(d) < fmt.smallest_normal
    big = np.inf if fmt.has_inf else fmt.max
    with np.errstate(all="ignore"):
        v = np.ldexp(np.abs(d), np.clip(k, -400, 400).astype(np.int64))
    v = np.where(v < fmt.smallest_normal, 0.0, np.where(v > fmt.max, big, v))
    v = np.where(dz, 0.0, v)
    v = np.where((kind == 2) | np.isinf(d), np.where(dz, np.nan, big), v)
    v = np.where(kind == 1, np.where(np.isinf(d), np.nan, 0.0), v)
    v = np.where((kind == 3) | np.isnan(d), np.nan, v)
    v = np.where(s, -v, v)
    if fmt.nan == "none":                   # R._policy, vectorised
        v = np.where(np.isnan(v), -0.0, v)
    if not fmt.has_neg_zero:
        v = np.where(v == 0, 0.0, v)
    return v.astype(np.float32)


def _np_kind(pairs, default=0):
    """Build (kind, sign) arrays from (condition, kind, sign) rules, first match wins."""
    import numpy as np
    shape = np.broadcast_shapes(*(np.shape(c) for c, _, _ in pairs))
    kind = np.full(shape, default)
    sign = np.zeros(shape, np.int64)
    for cond, kd, sg in reversed(pairs):
        kind = np.where(cond, kd, kind)
        sign = np.where(cond, sg, sign)
    return kind, sign


def exact_vec(op, *args, fmt="float32"):
    """Exact derivatives of ``op`` for arrays of values of ``fmt``: ``(a, b, dy) ->
    (δA, δB)`` for pam_mul/pa_div, ``(x, dy) -> δX`` for pa_exp2/pa_log2/pa_sqrt."""
    import numpy as np
    fmt = format(fmt)
    arrs = [np.asarray(v, np.float64) for v in args]
    for v in arrs:
        R._np_check_in_format(v, fmt)
    tiny = fmt.smallest_normal
    sg = lambda v: np.signbit(v).astype(np.int64)            # noqa: E731
    if op in ("pam_mul", "pa_div"):
        a, b, d = np.broadcast_arrays(*arrs)
        nan = np.isnan(a) | np.isnan(b)
        za, zb = np.abs(a) < tiny, np.abs(b) < tiny
        ia, ib = np.isinf(a), np.isinf(b)
        la, lb = _np_log_arg(a, fmt), _np_log_arg(b, fmt)
        if op == "pam_mul":
            z = np.floor(la + lb)
            out = []
            for own_l, other, zo, io in ((la, b, zb, ib), (lb, a, za, ia)):
                kind, sign = _np_kind([(nan, 3, 0), (zo, 1, sg(other)), (io, 2, sg(other))],
                                      0)
                sign = np.where(kind == 0, sg(other), sign)
                out.append(_np_apply(kind, sign, (z - np.floor(own_l)).astype(np.int64), d,
                                     fmt))
            return tuple(out)
        z = np.floor(la - lb)
        kind, sign = _np_kind([(nan, 3, 0), (zb, 2, sg(b)), (ib, 1, sg(b))])
        sign = np.where(kind == 0, sg(b), sign)
        da = _np_apply(kind, sign, (z - np.floor(la)).astype(np.int64), d, fmt)
        s = 1 - sg(a)
        kind, sign = _np_kind([(nan, 3, 0), (za & zb, 3, 0), (za, 1, s), (ia & ib, 3, 0),
                               (ia, 2, s), (zb, 2, s), (ib, 1, s)])
        sign = np.where(kind == 0, s, sign)
        db = _np_apply(kind, sign, (z - np.floor(lb)).astype(np.int64), d, fmt)
        return da, db
    x, d = np.broadcast_arrays(*arrs)
    zx = np.abs(x) < tiny
    if op == "pa_exp2":
        kind, sign = _np_kind([(np.isnan(x), 3, 0), (x == -np.inf, 1, 0), (x == np.inf, 2, 0)])
        with np.errstate(invalid="ignore"):
            k = np.floor(np.clip(np.where(zx | ~np.isfinite(x), 0.0, x), -400, 400))
    elif op in ("pa_log2", "pa_sqrt"):
        kind, sign = _np_kind([(np.isnan(x), 3, 0), (zx, 2, 0), (x < 0, 3, 0),
                               (x == np.inf, 1, 0)])
        e = _np_exponent(x)
        k = -e if op == "pa_log2" else np.floor(_np_log_arg(x, fmt) / 2) - 1 - e
    else:
        raise ValueError(f"op={op!r}; exact_vec covers pam_mul, pa_div, pa_exp2, pa_log2, "
                         "pa_sqrt")
    return _np_apply(kind, sign, k.astype(np.int64), d, fmt)

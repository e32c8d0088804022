"""The independent oracle of the multipliers (docs/semantics.md "Multipliers").

Like emu/reference.py (whose ``pam_sum`` it uses): values are Fractions, no bit
patterns.  A pattern-sum multiplier is ``reference.pam_sum``:
``±paexp2(palog2|a| + palog2|b| + C)`` with its constant ``C`` (a Fraction), then PAM's
specials and range rules; ``exact`` and ``float`` are
``reference.fp_mul`` with and without subnormals.  :func:`grad` gives their exact
derivatives, with emu/reference_grad.py's slope rules.
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from . import multipliers as EM
from . import reference as R
from . import reference_grad as RG
from .formats import format
from .multipliers import Multiplier, cpam_table, multiplier

__all__ = ["mul", "grad", "lmul_constant", "fma", "matmul", "mx_matmul"]


def lmul_constant(man_bits: int) -> Fraction:
    """2^-l(M), l(M) = M for M <= 3, 3 for M = 4, 4 for M > 4 (Luo & Sun, 2024, as issue 23 states it)."""
    level = man_bits if man_bits <= 3 else (3 if man_bits == 4 else 4)
    return Fraction(1, 2 ** level)


def _constant(m: Multiplier, fmt):
    """A pattern-sum multiplier's constant C(M_a, M_b) in ``fmt`` (a Fraction)."""
    ulp = Fraction(1, 2 ** fmt.man_bits)
    if m.kind == "pam":
        return lambda ma, mb: m.offset * ulp
    if m.kind == "lmul":
        return lambda ma, mb: lmul_constant(fmt.man_bits) + m.offset * ulp
    table = m.table if isinstance(m.table, tuple) else cpam_table(fmt.man_bits, m.k, m.table)
    rows = 2 ** m.k
    return lambda ma, mb: table[math.floor(ma * rows) * rows + math.floor(mb * rows)] * ulp


@functools.lru_cache(maxsize=None)
def _decoded(name: str) -> tuple:
    """Every encoding of the format ``name`` (<= 8 bits, an ml_dtypes type) decoded by
    ml_dtypes, independently of emu's kernels."""
    import ml_dtypes
    return tuple(float(v) for v in np.arange(1 << format(name).width, dtype=np.uint8).view(
        getattr(ml_dtypes, name)))


@functools.lru_cache(maxsize=None)
def _code_map(name: str) -> dict:
    return {(math.copysign(1.0, v), v): e for e, v in enumerate(_decoded(name))
            if not math.isnan(v)}


def _codes(fmt) -> dict:
    """A table's index of each value of ``fmt``: encoding by (sign, value)."""
    return _code_map(fmt.name)


def _table_entry(m: Multiplier, fmt, a: float, b: float) -> float:
    codes = _codes(fmt)
    values = EM._table(m.table).values
    ea, eb = (codes[(math.copysign(1.0, x), x)] for x in (a, b))
    return float(values[ea, eb])


def mul(a: float, b: float, fmt="float32", mul="pam") -> float:
    """The product of the multiplier ``mul`` (a name or an emu.Multiplier)."""
    m: Multiplier = multiplier(mul)
    fmt = format(fmt)
    if m.kind == "table":       # formats with ml_dtypes twins, finite operands
        return _table_entry(m, fmt, R.quantize(a, fmt), R.quantize(b, fmt))
    if m.kind in ("exact", "float"):
        return R.fp_mul(a, b, fmt, subnormals=m.kind == "exact")
    return R.pam_sum(a, b, fmt, _constant(m, fmt))


def _secant(m: Multiplier, fmt, own: float, other: float, dy: float, own_first: bool):
    """A table's exact derivative: the secant from ``own`` to the next value up in
    magnitude (down at the top of the range), in float64 arithmetic, times δ_Y, rounded
    once into ``fmt`` (finite operands of formats with ml_dtypes twins)."""
    codes = _codes(fmt)
    vals = _decoded(fmt.name)
    e0 = codes[(math.copysign(1.0, own), own)]
    e1 = e0 + 1
    if e1 >= len(vals) or not math.isfinite(float(vals[e1])) \
            or math.copysign(1.0, float(vals[e1])) != math.copysign(1.0, own):
        e1 = e0 - 1
    t = EM._table(m.table).values
    eo = codes[(math.copysign(1.0, other), other)]
    t0, t1 = (float(t[e, eo] if own_first else t[eo, e]) for e in (e0, e1))
    if not (math.isfinite(t0) and math.isfinite(t1)):
        return math.nan
    slope = (t1 - t0) / (float(vals[e1]) - own)         # Python floats: IEEE float64
    return R.quantize(slope * dy, fmt)


def grad(a: float, b: float, dy: float, fmt="float32", mul="pam", kind="exact"):
    """(δ_A, δ_B) of ``mul(a, b)`` at δ_Y = ``dy`` (operands rounded into ``fmt``):
    ``exact``: a pattern sum's slope ``sign(B) 2^(floor(l_A + l_B + C) - E_A)`` (the
    constant C at the operands' mantissas, a zero, subnormal or infinite operand at
    mantissa 0) times δ_Y as emu/reference_grad.py places it; for ``exact`` and
    ``float`` the real product's, ``RN(B δ_Y)``.  ``approx``: ``mul(δ_Y, B)``,
    ``mul(δ_Y, A)``."""
    m: Multiplier = multiplier(mul)
    fmt = format(fmt)
    a, b, dy = (R.quantize(float(x), fmt) for x in (a, b, dy))
    if kind == "approx":
        e = multiplier("exact") if m.kind == "table" else m
        return _product(dy, b, fmt, e), _product(dy, a, fmt, e)
    if m.kind == "table":
        return _secant(m, fmt, a, b, dy, True), _secant(m, fmt, b, a, dy, False)
    if m.kind in ("exact", "float"):
        return R.fp_mul(b, dy, fmt, subnormals=True), R.fp_mul(a, dy, fmt, subnormals=True)

    def man(v):
        return Fraction(0) if R._is_zero_class(v, fmt) or math.isinf(v) or math.isnan(v) \
            else R._mantissa(v)
    c = _constant(m, fmt)(man(a), man(b))
    return (RG._apply(RG._slope_mul(a, b, fmt, c), dy, fmt),
            RG._apply(RG._slope_mul(b, a, fmt, c), dy, fmt))


_product = mul          # matmul's argument ``mul`` shadows the function


def fma(s: float, a: float, b: float, acc="float32") -> float:
    """``s + a·b`` exact, rounded (RNE) once into ``acc`` (IEEE 754 fusedMultiplyAdd; the
    zeros and specials of the exact sum of ``s`` and the exact product)."""
    acc = format(acc)
    if math.isnan(s) or math.isnan(a) or math.isnan(b):
        return R._policy(math.nan, acc)
    if math.isinf(a) or math.isinf(b):
        if a == 0 or b == 0:
            return R._policy(math.nan, acc)
        return R._add_exact(s, a * b, acc)          # ±inf: a float product is exact
    if a == 0 or b == 0 or math.isinf(s):
        return R._add_exact(s, math.copysign(0.0, a) * math.copysign(1.0, b), acc)
    v = Fraction(s) + Fraction(a) * Fraction(b)
    if v == 0:
        return R._policy(0.0, acc)                  # exact cancellation: +0 under RNE
    return R._policy(R._round_signed(1 if v < 0 else 0, abs(v), acc), acc)


def matmul(A, B, fmt="float32", acc="float32", mul="pam"):
    """Nested lists in, nested lists out: C[i][j] = the fold over increasing k from +0.0
    of ``s <- RN_acc(s + mul(A[i][k], B[k][j]))`` (``exact``: ``fma(s, a, b, acc)``),
    operands rounded (RNE) into ``fmt`` first."""
    m = multiplier(mul)
    fmt, acc = format(fmt), format(acc)
    out = []
    for row in A:
        out_row = []
        for j in range(len(B[0]) if B else 0):
            s = 0.0
            for k, a in enumerate(row):
                a, b = R.quantize(a, fmt), R.quantize(B[k][j], fmt)
                if m.kind == "exact":
                    s = fma(s, a, b, acc)
                else:
                    s = R._add_exact(s, _product(a, b, fmt, m), acc)
            out_row.append(s)
        out.append(out_row)
    return out


def mx_matmul(A, B, mx: str, block: int = 32, acc="float32", mul="pam"):
    """Nested lists: rows of A and columns of B MX-quantized along K and dequantized
    (emu/reference.py), then the fold of :func:`matmul` on those float32 values with
    the products of ``mul`` by the element format's rule (``exact``: fused)."""
    from .mx import MX_TYPES
    m, elem, acc = multiplier(mul), format(MX_TYPES[mx]), format(acc)
    rows = [R.mx_dequantize(*R.mx_quantize(row, mx, block), block) for row in A]
    cols = [R.mx_dequantize(*R.mx_quantize(list(col), mx, block), block) for col in zip(*B)]
    out = []
    for row in rows:
        out_row = []
        for col in cols:
            s = 0.0
            for a, b in zip(row, col):
                if m.kind == "exact":
                    s = fma(s, a, b, acc)
                else:
                    s = R._add_exact(s, R.pam_sum(a, b, "float32", _constant(m, elem)), acc)
            out_row.append(s)
        out.append(out_row)
    return out

"""The independent oracle of the multipliers (docs/semantics.md "Multipliers").

Like emu/reference.py (whose ``pam_sum`` it uses): values are Fractions, no bit
patterns.  A pattern-sum multiplier is ``reference.pam_sum``:
``±paexp2(palog2|a| + palog2|b| + C)`` with its constant ``C`` (a Fraction), then PAM's
specials and range rules; ``exact`` and ``float`` are
``reference.fp_mul`` with and without subnormals.
"""
from __future__ import annotations

import math
from fractions import Fraction

from . import reference as R
from .formats import format
from .multipliers import Multiplier, cpam_table, multiplier

__all__ = ["mul", "lmul_constant", "fma", "matmul"]


def lmul_constant(man_bits: int) -> Fraction:
    """2^-l(M), l(M) = M for M <= 3, 3 for M = 4, 4 for M > 4 (Luo & Sun, 2024, as issue 23 states it)."""
    level = man_bits if man_bits <= 3 else (3 if man_bits == 4 else 4)
    return Fraction(1, 2 ** level)


def mul(a: float, b: float, fmt="float32", mul="pam") -> float:
    """The product of the multiplier ``mul`` (a name or an emu.Multiplier)."""
    m: Multiplier = multiplier(mul)
    fmt = format(fmt)
    ulp = Fraction(1, 2 ** fmt.man_bits)
    if m.kind == "pam":
        return R.pam_sum(a, b, fmt, lambda ma, mb: m.offset * ulp)
    if m.kind == "lmul":
        return R.pam_sum(a, b, fmt,
                         lambda ma, mb: lmul_constant(fmt.man_bits) + m.offset * ulp)
    if m.kind == "cpam":
        table = m.table if isinstance(m.table, tuple) else cpam_table(fmt.man_bits, m.k, m.table)
        rows = 2 ** m.k
        return R.pam_sum(a, b, fmt, lambda ma, mb: table[math.floor(ma * rows) * rows
                                                         + math.floor(mb * rows)] * ulp)
    return R.fp_mul(a, b, fmt, subnormals=m.kind == "exact")


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

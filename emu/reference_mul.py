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

__all__ = ["mul", "lmul_constant"]


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

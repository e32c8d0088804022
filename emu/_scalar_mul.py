"""Scalar definitions of the multipliers (docs/semantics.md "Multipliers"), one per kind.

Like emu/_scalar.py: ``register_jitable``, integer-only, on float32 patterns of format
values held in int64.  The pattern-sum kinds (``pam``, ``lmul``, ``cpam``) are
``S.pam_sum`` with their constant; ``exact`` and ``float`` are ``S.fp_mul`` with and
without subnormals.  :func:`mul` picks one by the kind code of emu/multipliers.py.
"""
import numpy as np
from numba.extending import register_jitable

from . import _scalar as S

# kind codes (emu.multipliers.KINDS is in this order)
PAM = 0
LMUL = 1
CPAM = 2
EXACT = 3
FLOAT = 4


@register_jitable
def ulp32(fc):
    """One unit in the last place of the format's mantissa, in float32-pattern units."""
    return np.int64(1) << (23 - fc.man_bits)


@register_jitable
def lmul_level(man_bits):
    """L-Mul's l(M): M for M <= 3, 3 for M = 4, 4 for M > 4 (Luo & Sun, 2024)."""
    if man_bits <= 3:
        return man_bits
    if man_bits == 4:
        return 3
    return 4


@register_jitable
def pam_offset(a, b, fc, offset):
    """PAM plus ``offset`` ULPs of the format in the pattern sum."""
    return S.pam_sum(a, b, fc, np.int64(offset) * ulp32(fc))


@register_jitable
def lmul(a, b, fc, offset):
    """L-Mul: PAM plus 2^-l(M) in the mantissa field, plus ``offset`` ULPs."""
    lm = np.int64(1) << (23 - lmul_level(fc.man_bits))
    return S.pam_sum(a, b, fc, lm + np.int64(offset) * ulp32(fc))


@register_jitable
def cpam(a, b, fc, table, k):
    """Corrected PAM: ``table[i * 2^k + j]`` ULPs added to the pattern sum, ``i`` and ``j``
    the top ``k`` mantissa bits of ``a`` and ``b``."""
    mask = (np.int64(1) << k) - 1
    i = (np.int64(a) >> (23 - k)) & mask
    j = (np.int64(b) >> (23 - k)) & mask
    return S.pam_sum(a, b, fc, np.int64(table[(i << k) | j]) * ulp32(fc))


@register_jitable
def mul(a, b, fc, kind, offset, table, k):
    """The product of the multiplier ``(kind, offset, table, k)`` (emu.Multiplier.params)."""
    if kind == PAM:
        return pam_offset(a, b, fc, offset)
    if kind == LMUL:
        return lmul(a, b, fc, offset)
    if kind == CPAM:
        return cpam(a, b, fc, table, k)
    return S.fp_mul(a, b, fc, kind == EXACT)

"""How a block of the PAM matmul computes its products: shared by the CPU kernel
(emu/_kernels.py) and the CUDA kernels (emu/_cuda.py).

A block pairs a tile of A (rows × k) with a tile of B (k × columns).  From the
statistics of both tiles — the smallest normal magnitude, the largest magnitude and
whether a zero or subnormal occurs, all as |x| bit patterns — one of four modes is
chosen uniformly for the block:

CLEAN   every |a|, |b| is normal and every product is in the normal range: the product
        is one 32-bit wrapping add, a + b - ONE32 + c32 (mod 2^32): S.pam_sum's normal
        case, the sign bit being the XOR of the operands' sign bits for free.  c32 is
        the multiplier's constant (emu/_scalar_mul.py: 0 for PAM, 2^19 for float32's
        L-Mul); multipliers that are not one constant take none of these modes.
MASKED  as CLEAN, but zero/subnormal operands occur: their products are ±0 (DAZ), and
        adding +0.0 instead (or nothing) is exact because the accumulator is never -0.0
        (it starts at +0.0; under RNE x + (-x) = +0 and -0 + +0 = +0), NaN + 0 is NaN.
SKIP    one tile holds only zeros/subnormals and neither holds inf/NaN: every product
        is ±0, which leaves the accumulator unchanged (same argument): skip the block.
GENERAL anything else (inf, NaN, flush or overflow possible): S.pam_sum per product.
        The CPU's float32-accumulator kernel runs a GENERAL block of finite operands
        whose pattern sums cannot wrap as its vectorised FLUSH (or FLUSH_OVF) mode
        (emu/_kernels.py matmul_blocked).
"""
import numpy as np
from numba.extending import register_jitable

from . import _scalar as S

CLEAN, MASKED, GENERAL, SKIP = 0, 1, 2, 3


@register_jitable
def tile_mode(amn, amx, az, bmn, bmx, bz, fc, c32):
    """Mode of an (A tile, B tile) pair from their statistics: min normal |x| (INF32 if
    none), max |x|, and a zero/subnormal flag for each; ``c32``: the constant of the
    pattern sum (0 for PAM; emu/_scalar_mul.py), a + b - ONE32 + c32 being the product."""
    return tile_mode_range(amn, amx, az, bmn, bmx, bz, fc, c32, c32)


@register_jitable
def tile_mode_range(amn, amx, az, bmn, bmx, bz, fc, lo, hi):
    """:func:`tile_mode` for a product between the pattern sums with the constants ``lo``
    and ``hi`` (lo <= hi): a table of corrections, or a bound on a rounded product."""
    amn = np.int64(amn)
    amx = np.int64(amx)
    bmn = np.int64(bmn)
    bmx = np.int64(bmx)
    if amx >= S.INF32 or bmx >= S.INF32:
        return GENERAL
    if amn > fc.max32 or bmn > fc.max32:        # a tile without normal operands
        return SKIP
    if (amn + bmn - S.ONE32 + np.int64(lo) >= fc.minnorm32
            and amx + bmx - S.ONE32 + np.int64(hi) <= fc.max32):
        if az != 0 or bz != 0:
            return MASKED
        return CLEAN
    return GENERAL


@register_jitable
def task_index(t, nti, ntj):
    """The (batch, row block, column block) of task t of a matmul kernel's parallel
    loop over nbatch * nti * ntj tasks (row blocks outer to column blocks)."""
    return t // (nti * ntj), (t // ntj) % nti, t % ntj

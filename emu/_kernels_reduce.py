"""CPU kernels of emu.fold_sum: a float32 sum in a defined order (docs/semantics.md §6).

``out[o, i]`` is the left fold over ``j = 0, 1, ..., n-1`` of ``x[o, j, i]`` with IEEE
binary32 addition (RNE, subnormals kept), starting from ``x[o, 0, i]`` (so ``-0.0`` sums
to ``-0.0``); an empty sum is ``+0.0``; a NaN result is the canonical NaN.  The kernel
vectorises over ``i`` (and splits ``o`` over threads), never reordering the fold.
:func:`fold` is the same fold over a strided run of a flat array, for kernels that sum
inside a larger computation (torch_bridge's fused composites).
"""
import numpy as np
from numba import prange
from numba.extending import register_jitable

from . import _scalar as S
from ._kernels import as_f32, twins
from ._numba_cache import drop_stale


drop_stale(__file__)


@register_jitable
def canonical(v):
    """v, or the canonical NaN if it is a NaN (every NaN emu produces is canonical)."""
    return as_f32(np.int32(S.QNAN32)) if v != v else v


@register_jitable
def fold(x, start, n, stride):
    """The defined sum of the float32 values ``x[start + j * stride]``, j = 0..n-1."""
    if n == 0:
        return np.float32(0.0)
    acc = x[start]
    for j in range(1, n):
        acc += x[start + j * stride]
    return canonical(acc)


def _fold_sum(x, out):
    """x: (outer, n, inner) float32, C-contiguous; out: (outer, inner) float32."""
    outer, n, inner = x.shape
    for o in prange(outer):
        if n == 0:
            out[o, :] = 0.0
            continue
        acc = x[o, 0].copy()
        for j in range(1, n):
            row = x[o, j]
            for i in range(inner):
                acc[i] += row[i]
        for i in range(inner):
            out[o, i] = canonical(acc[i])


RB = 8      # rows folded side by side: independent chains, not one add's latency per element


def _fold_rows(x, out):
    """x: (outer, n) float32, C-contiguous (inner = 1); out: (outer,).  Blocks of RB rows
    are folded together, each row still from its first element in index order."""
    outer, n = x.shape
    for blk in prange((outer + RB - 1) // RB):
        r0 = blk * RB
        if r0 + RB > outer or n == 0:
            for o in range(r0, min(outer, r0 + RB)):
                out[o] = fold(x[o], 0, n, 1)
            continue
        acc = x[r0:r0 + RB, 0].copy()
        for j in range(1, n):
            for k in range(RB):
                acc[k] += x[r0 + k, j]
        for k in range(RB):
            out[r0 + k] = canonical(acc[k])


FOLD_SUM = twins("fold_sum", _fold_sum)
FOLD_ROWS = twins("fold_rows", _fold_rows)

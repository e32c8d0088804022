"""Numba CPU kernels of the memory-saving layers (flat, contiguous arrays).

Bit layout of a packed code stream (shared with the torch reference path in
packing.py): code i occupies stream bits [i*k, i*k + k), stream bit b is bit b % 8
of byte b // 8 (little endian).  Eight codes fill exactly k bytes, so the kernels
work on independent groups of 8 codes and parallelise over groups.

Every element's and every group's computation is a definition of _scalar.py, which
the CUDA kernels (_cuda.py) call too; what is here is the CPU's iteration: parallel
chunks, and in the hot loops SWAR tricks (_spread/_compress, flag bytes gathered by
one multiply) that move the same bits faster.
"""
import functools

import numpy as np
from numba import njit, prange

from emu.lowlevel import drop_stale

from . import _scalar as S


drop_stale(__file__)


def thresholds(bp64: np.ndarray, dtype) -> np.ndarray:
    """Breakpoints for comparing x of ``dtype`` (float32 or float64) in its own precision.

    For float32 each float64 breakpoint b becomes t = the largest float32 <= b; then for
    every float32 x, x > b  <=>  x > t (t <= b, and no float32 lies in (t, b]), so the
    index is unchanged while the kernel compares float32 values (faster than float64).
    """
    if np.dtype(dtype) == np.float64:
        return bp64
    t = bp64.astype(np.float32)
    return np.where(t.astype(np.float64) > bp64, np.nextafter(t, np.float32(-np.inf)), t)


def _lane_masks(k):
    """k-bit codes, 2k-bit pairs per 32-bit lane and 4k-bit quads (see _spread)."""
    return (np.uint64(((1 << k) - 1) * 0x0001000100010001),
            np.uint64(((1 << 2 * k) - 1) * 0x0000000100000001), np.uint64((1 << 4 * k) - 1))


_MASKS = np.array([_lane_masks(k) if k else (0, 0, 0) for k in range(9)], np.uint64)


@njit(cache=True, inline="always")
def _spread(acc, k):
    """Eight k-bit codes packed in acc (k <= 8) -> one code per byte: the quads to the
    32-bit halves, the pairs to 16-bit lanes, the codes to bytes (mask, shift, or)."""
    k = np.uint64(k)
    c, p, q = _MASKS[k, 0], _MASKS[k, 1], _MASKS[k, 2]
    acc = (acc & q) | (((acc >> (np.uint64(4) * k)) & q) << np.uint64(32))
    acc = (acc & p) | (((acc >> (np.uint64(2) * k)) & p) << np.uint64(16))
    return (acc & c) | (((acc >> k) & c) << np.uint64(8))


@njit(cache=True, inline="always")
def _compress(x, k):
    """The inverse of _spread: one code per byte of x -> eight packed k-bit codes."""
    k = np.uint64(k)
    c, p, q = _MASKS[k, 0], _MASKS[k, 1], _MASKS[k, 2]
    x = (x & c) | (((x >> np.uint64(8)) & c) << k)
    x = (x & p) | (((x >> np.uint64(16)) & p) << (np.uint64(2) * k))
    return (x & q) | (((x >> np.uint64(32)) & q) << (np.uint64(4) * k))


@njit(parallel=True, cache=True)
def pack(codes, k, out):
    for g in prange((codes.size + 7) // 8):
        S.pack_group(codes, g, k, out)


@njit(parallel=True, cache=True)
def unpack(packed, k, out):
    for g in prange((out.size + 7) // 8):
        S.unpack_group(packed, g, k, out)


#: groups of 8 codes per parallel chunk of index_packer / level_scaler: whole groups in
#: the hot loops (no bounds checks), one ragged group at the end done serially
GROUPS = 1024
CHUNK = 8 * GROUPS


@functools.lru_cache(maxsize=None)
def _index_packer(bp: bytes, dtype: str, k: int, even: bool):
    table = np.frombuffer(bp, dtype).copy()

    @njit(parallel=True, cache=True)
    def kernel(x, out):
        n = x.size
        full = n // 8
        for c in prange((full + GROUPS - 1) // GROUPS):
            i0 = c * CHUNK
            m = min(CHUNK, 8 * full - i0)
            codes = np.empty(CHUNK, np.uint8)
            xc = x[i0:i0 + m]
            for i in range(m):      # k <= 4: unrolled compares (table, k constants)
                codes[i] = np.uint8(S.code_of(xc[i], table, k, even))
            words = codes.view(np.uint64)
            for g in range(m // 8):
                # whole groups: S.store_group without its per-byte bound check (25 % of
                # this kernel's time at 16 M elements)
                acc = _compress(words[g], k)
                base = (i0 // 8 + g) * k
                for b in range(k):
                    out[base + b] = np.uint8((acc >> np.uint64(8 * b)) & np.uint64(0xFF))
        if 8 * full < n:
            S.index_group(x, full, table, k, even, out)
    return kernel


def index_packer(bp: np.ndarray, k: int, even: bool):
    """The few-bit forward kernel ``kernel(x, out)``: the interval index of every x (|x|
    if ``even``) among the sorted breakpoints ``bp``, packed; x of bp's dtype, which
    :func:`thresholds` makes exact for float32.  The breakpoints are closure constants
    (numba keys its on-disk cache by them), so the compares unroll and vectorise."""
    return _index_packer(np.ascontiguousarray(bp).tobytes(), bp.dtype.str, int(k), bool(even))


@functools.lru_cache(maxsize=None)
def _level_scaler(levels: bytes, dtype: str, k: int):
    table = np.frombuffer(levels, dtype).copy()

    @njit(parallel=True, cache=True)
    def kernel(grad, packed, out):
        n = grad.size
        full = n // 8
        for c in prange((full + GROUPS - 1) // GROUPS):
            g0 = c * GROUPS
            ng = min(full, g0 + GROUPS) - g0
            codes = np.empty(CHUNK, np.uint8)
            words = codes.view(np.uint64)
            for g in range(ng):
                words[g] = _spread(S.load_group(packed, g0 + g, k), k)
            # chunk views from 0: contiguous loads and stores, and a gather LLVM vectorises
            gc, oc = grad[8 * g0:8 * (g0 + ng)], out[8 * g0:8 * (g0 + ng)]
            for i in range(8 * ng):
                oc[i] = gc[i] * table[codes[i]]
        if 8 * full < n:
            S.scale_group(grad, packed, full, k, table, out)
    return kernel


def level_scaler(levels: np.ndarray, k: int):
    """The few-bit backward kernel ``kernel(grad, packed, out)``: out = grad * levels[code]
    (one rounding, like torch's mul), grad of levels' dtype.  The levels are a closure
    constant (numba keys its on-disk cache by them): LLVM then knows the lookups cannot
    alias ``out`` and vectorises the loop with gathers."""
    return _level_scaler(np.ascontiguousarray(levels).tobytes(), levels.dtype.str, int(k))


@njit(parallel=True, cache=True)
def affine_index_pack(x, bp, k, slope, intercept, y, out):
    """PA forward: y = x * slope[i] + intercept[i] (two roundings) and the packed i."""
    for g in prange((x.size + 7) // 8):
        S.affine_group(x, g, bp, k, slope, intercept, y, out)


#: (8 bytes of 0/1, little endian, as a uint64) * _GATHER_BITS >> 56 = the byte of the 8
#: bits (byte e to bit e; the partial products do not overlap, so nothing carries)
_GATHER_BITS = np.uint64(0x0102040810204080)
_BIT0, _BIT1 = np.uint64(0x0101010101010101), np.uint64(0x0202020202020202)
#: the inverse: (byte * _BIT0) & _SPREAD_BITS keeps bit e of the byte in byte e
_SPREAD_BITS = np.uint64(0x8040201008040201)


@njit(parallel=True, cache=True)
def inverted_forward(x, xbits, t, first, ytab, y, out):
    """Inverted-activation forward, after torch wrote the native y: the packed branch
    bits (x > t, t the threshold in x's dtype, see :func:`thresholds`) and, where x's
    bit pattern (``xbits``, int32/int64) is first + i with 0 <= i < len(ytab), y =
    ytab[i] (the float32 window around the minimum; ytab is empty for float64).

    One pass over x per chunk (vectorised): bit 0 of flag = branch, bit 1 = in the
    window; 8 flags to a packed byte by one multiply; then only the groups of 8 with a
    window element are patched."""
    n = x.size
    count = np.uint64(ytab.size)
    for c in prange((n + CHUNK - 1) // CHUNK):
        i0 = c * CHUNK
        m = min(CHUNK, n - i0)
        xc, bc, yc = x[i0:i0 + m], xbits[i0:i0 + m], y[i0:i0 + m]
        oc = out[i0 // 8:(i0 + m + 7) // 8]
        flag = np.empty(CHUNK, np.uint8)
        for i in range(m):
            flag[i] = (xc[i] > t) | ((S.window_offset(bc[i], first) < count) << 1)
        flag[m:] = 0                                # the ragged last group: padding bits 0
        words = flag.view(np.uint64)
        for g in range(oc.size):
            oc[g] = np.uint8(((words[g] & _BIT0) * _GATHER_BITS) >> np.uint64(56))
        for g in range(oc.size):
            if words[g] & _BIT1:            # the group again, patching y (same byte)
                S.branch_group(xc, bc, g, t, first, ytab, yc, oc)


def inverted_constants(dtype, cst, icst):
    """(fcst, icst) of :func:`_scalar.inverted_slope` for y of float ``dtype`` (float32
    or float64) from cst = (ymin_hi, ymin_lo, n / t_right, n / t_left), ymin = hi + lo,
    and icst = (n, e_tail, e_split, mantissa bits, lm, first, count, win0), e_* biased
    (the coef rows: n pieces in t on the right, its end constant, n pieces in t on the
    left, its end constant, the tail, the constant 0, then the float32 window's
    constants from row win0, one row per pattern and branch)."""
    ft = np.dtype(dtype).type
    it = np.int32 if ft == np.float32 else np.int64
    n, e_tail, e_split, mant, lm, first, count, win0 = (int(v) for v in icst)
    low = mant - lm
    first = first - (1 << 32) if first >= 1 << 31 else first
    fcst = tuple(ft(v) for v in (*cst[:4], n, 2.0 / (1 << low)))
    icst = tuple(it(v) for v in (
        np.iinfo(it).max, n + 1, 2 * n + 2 + ((e_split - e_tail) << lm),
        2 * n + 2 - (e_tail << lm), low, (1 << low) - 1, e_tail << mant, e_split << mant,
        first, count, win0, win0 + count))
    return fcst, icst


def inverted_scale(coef, cst, icst):
    """The inverted-activation backward kernel ``kernel(grad, y, ybits, packed, out)``
    for one activation's tables, y of float dtype coef.dtype (float32 or float64),
    ``ybits`` y's bit pattern as int32/int64: out = grad * f'(f⁻¹(y)) on the branch in
    ``packed`` (1 = right of the minimum), f'(f⁻¹(y)) by _scalar.inverted_slope from the
    coefficient rows ``coef`` and the constants of :func:`inverted_constants`.

    The table is a closure constant of the compiled kernel (numba keys the on-disk
    cache by the closure's contents): LLVM then knows its lookups cannot alias ``out``
    (an argument table would need runtime alias checks it cannot bound).  All
    arithmetic is in y's dtype (integers in its width) and Horner of constant length
    unrolls; no fast-math, no FMA contraction (the GPU twin rounds alike)."""
    ft = coef.dtype.type
    it = np.int32 if ft == np.float32 else np.int64
    if coef.shape[0] > 1 << 16:
        raise ValueError(f"coef has {coef.shape[0]} rows; the kernel indexes at most {1 << 16}")
    table, words = np.ascontiguousarray(coef), coef.shape[1]
    fcst, icst = inverted_constants(coef.dtype, cst, icst)

    @njit(parallel=True, cache=True)
    def kernel(grad, y, ybits, packed, out):
        size = grad.size
        for c in prange((size + CHUNK - 1) // CHUNK):
            i0 = c * CHUNK
            m = min(CHUNK, size - i0)
            # chunk views: loop indices from 0 are provably >= 0, so LLVM drops numba's
            # negative-index wraparound and loads/stores contiguously
            gc, yc, bc, oc = grad[i0:i0 + m], y[i0:i0 + m], ybits[i0:i0 + m], out[i0:i0 + m]
            pc = packed[i0 // 8:(i0 + m + 7) // 8]
            branch = np.empty(CHUNK, np.uint8)      # byte i != 0: element i is right
            spread = branch.view(np.uint64)
            for g in range(pc.size):
                spread[g] = (np.uint64(pc[g]) * _BIT0) & _SPREAD_BITS
            # S.inverted_slope in two loops: the piece selection vectorised, then the
            # table's Horner (LLVM will not gather from the table on every host: on
            # AMD Zen its cost model keeps a loop with gathers scalar)
            rows = np.empty(CHUNK, np.uint16)
            svar = np.empty(CHUNK, ft)
            for i in range(m):
                rows[i], svar[i] = S.inverted_piece(yc[i], bc[i], branch[i] != 0, fcst, icst,
                                                    it, ft)
            for i in range(m):
                v = yc[i]
                acc = S.horner(table, rows[i], svar[i], words)
                oc[i] = gc[i] * (acc if v == v else v)
    return kernel

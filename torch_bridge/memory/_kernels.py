"""Numba CPU kernels of the memory-saving layers (flat, contiguous arrays).

Bit layout of a packed code stream (shared with the torch reference path in
packing.py): code i occupies stream bits [i*k, i*k + k), stream bit b is bit b % 8
of byte b // 8 (little endian).  Eight codes fill exactly k bytes, so the kernels
work on independent groups of 8 codes and parallelise over groups.

Interval search: ``_bucket`` counts the breakpoints strictly below v — directly for
k <= 4, by a branch-free uniform binary search over the 2**k - 1 sorted float64
breakpoints for larger k; NaN compares false everywhere and lands in interval 0.
"""
import functools

import numpy as np
from numba import njit, prange


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


@njit(cache=True, inline="always")
def _bucket(v, bp, k):
    if k <= 4:                  # <= 15 breakpoints: count them, no data-dependent loads
        pos = 0
        for j in range((1 << k) - 1):
            pos += bp[j] < v
        return pos
    pos = 0
    for b in range(k - 1, -1, -1):
        step = 1 << b
        pos += step * (bp[pos + step - 1] < v)     # arithmetic, not a branch: no mispredicts
    return pos


@njit(cache=True, inline="always")
def _store_group(acc, out, g, k, nbytes):
    base = g * k
    for b in range(k):
        if base + b < nbytes:
            out[base + b] = np.uint8((acc >> np.uint64(8 * b)) & np.uint64(0xFF))


@njit(cache=True, inline="always")
def _load_group(packed, g, k, nbytes):
    acc = np.uint64(0)
    base = g * k
    for b in range(k):
        if base + b < nbytes:
            acc |= np.uint64(packed[base + b]) << np.uint64(8 * b)
    return acc


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
    n, nbytes = codes.size, out.size
    for g in prange((n + 7) // 8):
        acc = np.uint64(0)
        for e in range(min(8, n - 8 * g)):
            acc |= np.uint64(codes[8 * g + e]) << np.uint64(k * e)
        _store_group(acc, out, g, k, nbytes)


@njit(parallel=True, cache=True)
def unpack(packed, k, out):
    n, nbytes = out.size, packed.size
    mask = np.uint64((1 << k) - 1)
    for g in prange((n + 7) // 8):
        acc = _load_group(packed, g, k, nbytes)
        for e in range(min(8, n - 8 * g)):
            out[8 * g + e] = np.uint8((acc >> np.uint64(k * e)) & mask)


#: groups of 8 codes per parallel chunk of index_packer / level_scaler: whole groups in
#: the hot loops (no bounds checks), one ragged group at the end done serially
GROUPS = 1024
CHUNK = 8 * GROUPS


@njit(cache=True, inline="always")
def _tail_codes(x, i0, bp, k, even):
    """The codes of x[i0:] (fewer than 8 elements) as one packed group."""
    acc = np.uint64(0)
    for e in range(x.size - i0):
        v = x[i0 + e]
        if even:
            v = abs(v)
        acc |= np.uint64(_bucket(v, bp, k)) << np.uint64(k * e)
    return acc


@functools.lru_cache(maxsize=None)
def _index_packer(bp: bytes, dtype: str, k: int, even: bool):
    table = np.frombuffer(bp, dtype).copy()
    nb = table.size

    @njit(parallel=True, cache=True)
    def kernel(x, out):
        n = x.size
        full = n // 8
        for c in prange((full + GROUPS - 1) // GROUPS):
            i0 = c * CHUNK
            m = min(CHUNK, 8 * full - i0)
            codes = np.empty(CHUNK, np.uint8)
            xc = x[i0:i0 + m]
            for i in range(m):
                v = abs(xc[i]) if even else xc[i]
                if k <= 4:          # count the breakpoints below v: unrolled compares
                    pos = np.int32(0)
                    for j in range(nb):
                        pos += v > table[j]
                else:
                    pos = _bucket(v, table, k)
                codes[i] = np.uint8(pos)
            words = codes.view(np.uint64)
            for g in range(m // 8):
                # whole groups: _store_group without its per-byte bound check (25 % of
                # this kernel's time at 16 M elements)
                acc = _compress(words[g], k)
                base = (i0 // 8 + g) * k
                for b in range(k):
                    out[base + b] = np.uint8((acc >> np.uint64(8 * b)) & np.uint64(0xFF))
        if 8 * full < n:
            _store_group(_tail_codes(x, 8 * full, table, k, even), out, full, k, out.size)
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
    mask = np.uint64((1 << k) - 1)

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
                words[g] = _spread(_load_group(packed, g0 + g, k, packed.size), k)
            # chunk views from 0: contiguous loads and stores, and a gather LLVM vectorises
            gc, oc = grad[8 * g0:8 * (g0 + ng)], out[8 * g0:8 * (g0 + ng)]
            for i in range(8 * ng):
                oc[i] = gc[i] * table[codes[i]]
        if 8 * full < n:
            acc = _load_group(packed, full, k, packed.size)
            for e in range(n - 8 * full):
                out[8 * full + e] = grad[8 * full + e] * table[(acc >> np.uint64(k * e)) & mask]
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
    n, nbytes = x.size, out.size
    for g in prange((n + 7) // 8):
        acc = np.uint64(0)
        for e in range(min(8, n - 8 * g)):
            v = x[8 * g + e]
            i = _bucket(np.float64(v), bp, k)
            p = v * slope[i]
            y[8 * g + e] = p + intercept[i]
            acc |= np.uint64(i) << np.uint64(k * e)
        _store_group(acc, out, g, k, nbytes)


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
            flag[i] = (xc[i] > t) | ((np.uint64(bc[i] - first) < count) << 1)   # < 0: huge
        flag[m:] = 0                                # the ragged last group: padding bits 0
        words = flag.view(np.uint64)
        for g in range(oc.size):
            oc[g] = np.uint8(((words[g] & _BIT0) * _GATHER_BITS) >> np.uint64(56))
        for g in range(oc.size):
            if words[g] & _BIT1:
                for i in range(8 * g, min(8 * g + 8, m)):
                    off = np.uint64(bc[i] - first)
                    if off < count:
                        yc[i] = ytab[off]


@njit(cache=True, inline="always")
def _horner(table, j, s, words):
    """Horner on row j of a (rows, words) coefficient table, highest power first."""
    acc = table[j, 0]
    for k in range(1, words):
        acc = acc * s + table[j, k]
    return acc


def inverted_scale(coef, cst, icst):
    """The inverted-activation backward kernel ``kernel(grad, y, ybits, packed, out)``
    for one activation's tables, y of float dtype coef.dtype (float32 or float64),
    ``ybits`` y's bit pattern as int32/int64:

    out = grad * f'(f⁻¹(y)) on the branch in ``packed`` (1 = right of the minimum), with
    the piece selection of ``inverted.Inverter.__call__`` (coef rows, highest power
    first: n pieces in t on the right, its end constant, n pieces in t on the left, its
    end constant, the tail, the constant 0, then the float32 window's constants):

    * t = sqrt(y - ymin) on the piece int(min(t * n / t_end, n)) of the branch;
    * left tail, |y| < 2**e_split: the binade coordinate of |y| (its bits >> (mantissa
      bits - lm)) picks one piece per 1/2**lm binade, the constant 0 below 2**e_tail;
    * float32 y with bit pattern first + i, 0 <= i < count: row win0 + b * count + i.

    cst = (ymin_hi, ymin_lo, n / t_right, n / t_left), ymin = hi + lo;
    icst = (n, e_tail, e_split, mantissa bits, lm, first, count, win0), e_* biased.

    The table is a closure constant of the compiled kernel (numba keys the on-disk
    cache by the closure's contents): LLVM then knows its lookups cannot alias ``out``
    and vectorises the branch-free element loop with gathers (an argument table
    would need runtime alias checks it cannot bound, and the loop stays scalar).  All
    arithmetic is in y's dtype (integers in its width), Horner of constant length
    unrolls, and contractions to FMA are allowed (no other fast-math: NaN and inf keep
    their meaning)."""
    ft = coef.dtype.type
    it = np.int32 if ft == np.float32 else np.int64
    if coef.shape[0] > 1 << 16:
        raise ValueError(f"coef has {coef.shape[0]} rows; the kernel indexes at most {1 << 16}")
    table, words = np.ascontiguousarray(coef), coef.shape[1]
    n, e_tail, e_split, mant, lm, first, count, win0 = (int(v) for v in icst)
    ymin_hi, ymin_lo, r_right, r_near = (ft(v) for v in cst)
    near0, zero = it(n + 1), it(2 * n + 2 + ((e_split - e_tail) << lm))
    tail_off = it(2 * n + 2 - (e_tail << lm))
    low = it(mant - lm)
    low_mask = it((1 << (mant - lm)) - 1)
    below_tail, below_split = it(e_tail << mant), it(e_split << mant)
    abs_mask = it(np.iinfo(it).max)
    first, count = it(first - (1 << 32) if first >= 1 << 31 else first), np.uint32(count)
    win_left, win_right = it(win0), it(win0 + count)
    s_scale = ft(2.0 / (1 << (mant - lm)))
    one, two, nil, nf = ft(1.0), ft(2.0), ft(0.0), ft(n)

    @njit(parallel=True, cache=True, fastmath={"contract"})
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
            for i in range(m):
                v = yc[i]
                right = branch[i] != 0
                bits = bc[i]
                ab = it(bits & abs_mask)
                d = v - ymin_hi - ymin_lo
                t = np.sqrt(d if d > nil else nil)
                p = t * (r_right if right else r_near)
                p = p if p < nf else nf
                jp = it(p)
                j = jp if right else it(jp + near0)
                s = two * (p - ft(jp)) - one
                if not right and ab < below_split:
                    j = it(it(ab >> low) + tail_off) if ab >= below_tail else zero
                    s = ft(it(ab & low_mask)) * s_scale - one
                off = it(bits - first)
                if np.uint32(off) < count:
                    j = it(off + (win_right if right else win_left))
                acc = _horner(table, np.uint16(j), s, words)  # small unsigned index: no
                oc[i] = gc[i] * (acc if v == v else v)        # wraparound, 32-bit offsets
    return kernel

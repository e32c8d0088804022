"""Numba CPU kernels of the memory-saving layers (flat, contiguous arrays).

Bit layout of a packed code stream (shared with the torch reference path in
packing.py): code i occupies stream bits [i*k, i*k + k), stream bit b is bit b % 8
of byte b // 8 (little endian).  Eight codes fill exactly k bytes, so the kernels
work on independent groups of 8 codes and parallelise over groups.

Interval search: ``_bucket`` counts the breakpoints strictly below v — directly for
k <= 4, by a branch-free uniform binary search over the 2**k - 1 sorted float64
breakpoints for larger k; NaN compares false everywhere and lands in interval 0.
"""
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


#: groups of 8 codes per parallel chunk of index_pack / scale_by_level: whole groups in
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


@njit(parallel=True, cache=True)
def index_pack(x, bp, k, even, out):
    """Few-bit forward: interval index of every x (|x| if even), packed.  Compares in
    x's own dtype when ``bp`` has it (see :func:`thresholds`).

    Per chunk the codes are counted with the loops interchanged (breakpoints outer,
    elements inner: a vectorised compare-add, ``v > b`` is ``b < v``, NaN adds 0),
    then packed; k > 4 uses the binary search per element."""
    n = x.size
    full = n // 8
    nb = bp.size
    for c in prange((full + GROUPS - 1) // GROUPS):
        i0 = c * CHUNK
        m = min(CHUNK, 8 * full - i0)
        codes = np.zeros(CHUNK, np.uint8)
        v = np.empty(CHUNK, x.dtype)
        for i in range(m):
            v[i] = abs(x[i0 + i]) if even else x[i0 + i]
        if k <= 4:
            for j in range(nb):
                b = bp[j]
                for i in range(m):
                    codes[i] += v[i] > b
        else:
            for i in range(m):
                codes[i] = _bucket(v[i], bp, k)
        for g in range(m // 8):
            acc = np.uint64(0)
            for e in range(8):
                acc |= np.uint64(codes[8 * g + e]) << np.uint64(k * e)
            _store_group(acc, out, i0 // 8 + g, k, out.size)
    if 8 * full < n:
        _store_group(_tail_codes(x, 8 * full, bp, k, even), out, full, k, out.size)


@njit(parallel=True, cache=True)
def scale_by_level(grad, packed, k, levels, out):
    """Few-bit backward: out = grad * levels[code] (one rounding, like torch's mul)."""
    n, nbytes = grad.size, packed.size
    full = n // 8
    mask = np.uint64((1 << k) - 1)
    for c in prange((full + GROUPS - 1) // GROUPS):
        for g in range(c * GROUPS, min(full, (c + 1) * GROUPS)):
            acc = np.uint64(0)
            for b in range(k):
                acc |= np.uint64(packed[g * k + b]) << np.uint64(8 * b)
            for e in range(8):
                out[8 * g + e] = grad[8 * g + e] * levels[(acc >> np.uint64(k * e)) & mask]
    if 8 * full < n:
        acc = _load_group(packed, full, k, nbytes)
        for e in range(n - 8 * full):
            out[8 * full + e] = grad[8 * full + e] * levels[(acc >> np.uint64(k * e)) & mask]


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


@njit(cache=True, inline="always")
def _poly(coef, u0, u1, u):
    """Piecewise polynomial on a uniform grid of [u0, u1] (see inverted._Fit)."""
    n = coef.shape[0]
    p = min(max((u - u0) * (n / (u1 - u0)), 0.0), n * (1 - 1e-16))
    j = int(p)
    s = 2.0 * (p - j) - 1.0
    acc = 0.0
    for c in range(coef.shape[1]):
        acc = acc * s + coef[j, c]
    return acc


@njit(parallel=True, cache=True)
def inverted_scale(grad, y, packed, is_f32, ymin, right, t_right, near, t_left, tail, z_tail,
                   z_left, first, window, out):
    """Inverted-activation backward: out = grad * f'(f⁻¹(y)) on the branch in ``packed``
    (1 = right of the minimum).  float32 y near the minimum use the exact-midpoint
    ``window`` (uint32 patterns first..first+len); the derivative is rounded to
    grad's precision before the (single-rounding) product."""
    n = grad.size
    count = window.shape[1]
    for g in prange((n + 7) // 8):
        bits = packed[g]
        for e in range(min(8, n - 8 * g)):
            i = 8 * g + e
            b = (bits >> e) & 1
            v = np.float64(y[i])
            d = np.nan
            if is_f32:
                off = np.int64(np.float32(y[i]).view(np.uint32)) - first
                if 0 <= off < count:
                    d = window[b, off]
            if d != d:
                if v != v:
                    d = v
                else:
                    t = np.sqrt(max(v - ymin, 0.0))
                    if b == 1:
                        d = 1.0 if t >= t_right else _poly(right, 0.0, t_right, t)
                    elif t <= t_left:
                        d = _poly(near, 0.0, t_left, t)
                    else:
                        z = np.log(-v) if v < 0 else -np.inf
                        d = 0.0 if z < z_tail else _poly(tail, z_tail, z_left, z)
            if is_f32:
                d = np.float64(np.float32(d))
            out[i] = grad[i] * d

"""The memory-saving kernels' definitions, one source for every backend.

Each function here is ``register_jitable``: compiled into the CPU kernels of
_kernels.py (``@njit``), into the CUDA kernels of _cuda.py (``@cuda.jit``), and plain
Python under Numba's CUDA simulator, as emu/_scalar.py is for emu.  The kernels add
only the iteration (parallel chunks on the CPU, a grid-stride loop over groups of 8
codes on the GPU).  Under the simulator integers are NumPy int32/uint32 scalars that
wrap, so offsets are widened to int64 before they grow.

Bit layout of a packed code stream (packing.py): code i occupies stream bits
[i*k, i*k + k), stream bit b is bit b % 8 of byte b // 8 (little endian).  Eight
codes fill exactly k bytes: group g of 8 codes is bytes [g*k, g*k + k), which is why
every kernel works on independent groups.

Floating point: one IEEE operation per operator, no contraction to FMA on any
backend (``mul`` is a product the CUDA compiler may not fuse with the add after it:
NVVM contracts by default), so the CPU, the GPU and the simulator round alike.
"""
import math

import numpy as np
from numba.extending import register_jitable


@register_jitable
def mul(a, b):
    """a * b rounded on its own (emu/_cuda.py-style CUDA overload in _cuda.py: fmul_rn,
    dmul_rn); on the CPU Numba never contracts without fast-math."""
    return a * b


@register_jitable
def bucket(v, bp, k):
    """The interval index of v: #{breakpoints < v} among the 2**k - 1 sorted ``bp``
    (padded with +inf); NaN compares false everywhere and lands in interval 0.
    Directly for k <= 4, else a branch-free uniform binary search."""
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


@register_jitable
def code_of(v, bp, k, even):
    """The few-bit code of v: its interval among ``bp``, of |v| for an even f'."""
    return bucket(abs(v) if even else v, bp, k)


@register_jitable
def put_code(acc, code, e, k):
    """acc with ``code`` as the e-th k-bit code of its group."""
    return acc | (np.uint64(code) << np.uint64(k * e))


@register_jitable
def get_code(acc, e, k):
    """The e-th k-bit code of a packed group."""
    return (acc >> np.uint64(k * e)) & np.uint64((1 << k) - 1)


@register_jitable
def group_size(n, g):
    """Elements of group g of a stream of n (8, fewer in the last group)."""
    return min(8, np.int64(n) - 8 * np.int64(g))


@register_jitable
def store_group(acc, out, g, k):
    """Write the packed group ``acc`` to bytes [g*k, g*k + k) of ``out`` (those that exist)."""
    base = np.int64(g) * k
    for b in range(k):
        if base + b < out.size:
            out[base + b] = np.uint8((acc >> np.uint64(8 * b)) & np.uint64(0xFF))


@register_jitable
def load_group(packed, g, k):
    """The packed group g (its missing bytes read as 0)."""
    acc = np.uint64(0)
    base = np.int64(g) * k
    for b in range(k):
        if base + b < packed.size:
            acc |= np.uint64(packed[base + b]) << np.uint64(8 * b)
    return acc


# --- one group of 8 elements: what every kernel's iteration calls ------------------------

@register_jitable
def pack_group(codes, g, k, out):
    """pack_bits: group g of the uint8 ``codes``."""
    i0 = 8 * np.int64(g)
    acc = np.uint64(0)
    for e in range(group_size(codes.size, g)):
        acc = put_code(acc, codes[i0 + e], e, k)
    store_group(acc, out, g, k)


@register_jitable
def unpack_group(packed, g, k, out):
    """unpack_bits: the codes of group g into ``out``."""
    i0 = 8 * np.int64(g)
    acc = load_group(packed, g, k)
    for e in range(group_size(out.size, g)):
        out[i0 + e] = np.uint8(get_code(acc, e, k))


@register_jitable
def index_group(x, g, bp, k, even, out):
    """Few-bit forward (Few-Bit Backward, Listing 1): the codes of group g, packed."""
    i0 = 8 * np.int64(g)
    acc = np.uint64(0)
    for e in range(group_size(x.size, g)):
        acc = put_code(acc, code_of(x[i0 + e], bp, k, even), e, k)
    store_group(acc, out, g, k)


@register_jitable
def scale_group(grad, packed, g, k, levels, out):
    """Few-bit / PA backward: out = grad * levels[code] (one rounding) over group g."""
    i0 = 8 * np.int64(g)
    acc = load_group(packed, g, k)
    for e in range(group_size(grad.size, g)):
        out[i0 + e] = grad[i0 + e] * levels[get_code(acc, e, k)]


@register_jitable
def affine_group(x, g, bp, k, slope, intercept, y, out):
    """PA forward over group g: y = x * slope[i] + intercept[i] (two roundings) with
    i the segment of x among the knots ``bp`` (float64 compares), and the packed i."""
    i0 = 8 * np.int64(g)
    acc = np.uint64(0)
    for e in range(group_size(x.size, g)):
        v = x[i0 + e]
        i = bucket(np.float64(v), bp, k)
        y[i0 + e] = mul(v, slope[i]) + intercept[i]
        acc = put_code(acc, i, e, k)
    store_group(acc, out, g, k)


@register_jitable
def window_offset(bits, first):
    """The offset of a bit pattern from ``first`` as uint64: a pattern below ``first``
    is huge, so ``window_offset(b, first) < count`` is the window test."""
    return np.uint64(np.int64(bits) - np.int64(first))


@register_jitable
def branch_group(x, xbits, g, t, first, ytab, y, out):
    """Inverted forward over group g, after the native y was written: the packed
    branch bits (x > t, bit e of byte g) and y = ytab[i] where x's pattern is
    first + i, 0 <= i < len(ytab) (the float32 window around the minimum)."""
    i0 = 8 * np.int64(g)
    byte = np.uint64(0)
    for e in range(group_size(x.size, g)):
        byte = put_code(byte, x[i0 + e] > t, e, 1)
        off = window_offset(xbits[i0 + e], first)
        if off < np.uint64(ytab.size):
            y[i0 + e] = ytab[off]
    out[g] = np.uint8(byte)


@register_jitable
def horner(table, j, s, words):
    """Horner on row j of a (rows, words) coefficient table, highest power first."""
    acc = table[j, 0]
    for k in range(1, words):
        acc = mul(acc, s) + table[j, k]
    return acc


@register_jitable
def inverted_piece(v, bits, right, fcst, icst, it, ft):
    """(row, s): the coefficient row and Horner's variable of f'(f⁻¹(y)) for y = v (bit
    pattern ``bits``) on a branch (inverted.py; the piece selection of
    ``inverted.Inverter.__call__``), all arithmetic in v's dtype ``ft``, integers in
    ``it`` of its width:

    * t = sqrt(y - ymin) on the piece int(min(t * n / t_end, n)) of the branch;
    * left tail, |y| < 2**e_split: the binade coordinate of |y| (its bits >> low)
      picks one piece per 1/2**lm binade, the constant 0 below 2**e_tail;
    * float32 y with pattern first + i, 0 <= i < count: the window's row.

    fcst = (ymin_hi, ymin_lo, n / t_right, n / t_left, n, 2 / 2**low) in ft; icst = (abs mask,
    row of the left branch's first piece, row of the constant 0, tail row offset, low,
    low mask, |bits| at 2**e_tail, at 2**e_split, first, count, window rows left,
    right) in it (_kernels.inverted_constants)."""
    ymin_hi, ymin_lo, r_right, r_near, nf, s_scale = fcst
    abs_mask, near0, zero, tail_off, low, low_mask, below_tail, below_split, \
        first, count, win_left, win_right = icst
    one, two = ft(1.0), ft(2.0)
    ab = it(bits & abs_mask)
    d = v - ymin_hi - ymin_lo
    t = ft(math.sqrt(d if d > ft(0.0) else ft(0.0)))    # correctly rounded in ft
    p = t * (r_right if right else r_near)
    p = p if p < nf else nf
    jp = it(p)
    j = jp if right else it(jp + near0)
    s = two * (p - ft(jp)) - one                # exact products: powers of two
    if not right and ab < below_split:
        j = it(it(ab >> low) + tail_off) if ab >= below_tail else zero
        s = ft(it(ab & low_mask)) * s_scale - one
    off = it(np.int64(bits) - np.int64(first))     # wraps to 32 bits for float32, as meant
    if np.uint32(off) < np.uint32(count):
        j = it(off + (win_right if right else win_left))
    return np.uint16(j), s                      # small unsigned index: no wraparound


@register_jitable
def inverted_slope(v, bits, right, table, words, fcst, icst, it, ft):
    """f'(f⁻¹(y)) for y = v on a branch: Horner on the row :func:`inverted_piece`
    picks (NaN stays NaN)."""
    j, s = inverted_piece(v, bits, right, fcst, icst, it, ft)
    acc = horner(table, j, s, words)
    return acc if v == v else v

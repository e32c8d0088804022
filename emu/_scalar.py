"""The one scalar definition of every emu operation, on integer bit patterns.

Each function here is ``register_jitable``: plain Python when called from Python,
inlined into ``@njit`` CPU kernels (emu/_kernels.py) and callable from
``@cuda.jit`` kernels.  Only integer arithmetic is used; every intermediate fits
in int64 (shift counts are clamped below 63), so Python ints, Numba int64 and
CUDA int64 give the same bits.  Public entry points widen their arguments with
``np.int64`` because the CUDA simulator hands in wrapping numpy int32 scalars.

Values travel as **float32 bit patterns** (the low 32 bits of an int64): every
format is a subset of float32 (emu/formats.py), so an operand of format ``fmt``
is the float32 pattern of a value of ``fmt``.  The semantics implemented are
specified in docs/semantics.md; equation numbers refer to Kosson & Jaggi,
"Multiplication-Free Transformer Training via Piecewise Affine Operations".
"""
import numpy as np
from numba.extending import register_jitable

SIGN32 = 0x80000000
ABS32 = 0x7FFFFFFF
INF32 = 0x7F800000
QNAN32 = 0x7FC00000        # the canonical NaN every emu op returns
ONE32 = 0x3F800000         # pattern of 1.0 == bias << 23, the PAM offset
M32 = 0xFFFFFFFF

# NaN policies (emu.formats.NAN_POLICIES, FmtConsts.nan_kind)
NAN_IEEE = 0               # every all-ones-exponent code with a non-zero mantissa
NAN_FN = 1                 # one per sign: exponent and mantissa all ones
NAN_FNUZ = 2               # the single code where -0 would be
NAN_NONE = 3               # no NaN (and no inf): overflow saturates

# rounding modes
RNE = 0                    # round to nearest, ties to even
RTZ = 0 + 1                # toward zero (truncation)
SR = 2                     # stochastic


@register_jitable
def bitlen(x):
    """Number of significant bits of 0 <= x < 2**63 (0 for 0), by binary search."""
    n = 0
    step = 32
    while step:
        if x >= (np.int64(1) << step):
            x >>= step
            n += step
        step >>= 1
    return n + x


@register_jitable
def mix32(x):
    """A 32-bit integer hash (Wellons' lowbias32); every step fits in int64."""
    x = x & M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32                    # < 2^32 * 2^31
    x ^= x >> 15
    # x * 0x846CA68B mod 2^32 without the product reaching 2^63 (int64 wrap under
    # the CUDA simulator): 0x846CA68B = 2^31 + 0x046CA68B, and x * 2^31 mod 2^32
    # keeps only x's lowest bit
    x = (x * 0x046CA68B + ((x & 1) << 31)) & M32
    x ^= x >> 16
    return x


@register_jitable
def rand32(key, idx):
    """Counter-based uniform 32-bit random number for element ``idx`` under ``key``.

    ``key`` packs two 32-bit keys (see emu.ops._stochastic_key).  The stream is a
    pure function of (key, idx), so CPU, GPU and any chunking agree.
    """
    idx = np.int64(idx)
    key = np.int64(key)
    return mix32(mix32((idx + (key >> 32)) & M32) ^ (key & M32) ^ ((idx >> 32) & M32))


@register_jitable
def enc_to_f32(enc, fc):
    """Float32 pattern of the finite, non-negative format encoding ``enc``."""
    man = fc.man_bits
    ef = enc >> man
    mf = enc & ((1 << man) - 1)
    if ef == 0:
        if mf == 0:
            return np.int64(0)
        n = bitlen(mf)
        e = fc.emin - man + n - 1
        if e >= -126:
            return ((e + 127) << 23) | ((mf << (24 - n)) & 0x7FFFFF)
        return mf << (fc.emin - man + 149)       # a float32 subnormal (E = 8 only)
    return ((ef - 1 + fc.emin + 127) << 23) | (mf << (23 - man))


@register_jitable
def round_to_fmt(sign, sig, exp, fc, mode, subnormals, saturate, u):
    """Round the exact value (-1)^sign * sig * 2^exp into the format; float32 pattern out.

    ``0 <= sig < 2**62``.  The format's grid is used at every magnitude (subnormal
    quantum below the smallest normal).  ``mode`` is RNE, RTZ or SR; for SR, ``u``
    is a uniform 32-bit integer and the magnitude rounds up iff
    ``u + floor(frac * 2^32) >= 2^32`` (frac = discarded fraction of a quantum).
    Then, in order: a result beyond the largest finite magnitude becomes ±max if
    ``saturate`` or mode is RTZ (IEEE 754 §7.4) or the format has neither inf nor NaN,
    else ±inf (IEEE and P3109 formats) or the canonical NaN (fn, fnuz formats); with
    ``subnormals`` false a result below the smallest normal becomes ±0.  A zero
    result is +0 where the format has no -0 (fnuz).
    """
    if sig == 0:
        return (sign << 31) & fc.negzero32
    man = fc.man_bits
    top = exp + bitlen(sig) - 1                  # exponent of the leading bit
    qe = max(top, fc.emin) - man                 # exponent of one quantum here
    sh = qe - exp                                # bits below the quantum
    if sh <= 0:
        n = sig << (-sh)
    else:
        if sh > 62:
            n = np.int64(0)
            rem = sig                            # < 2^62 <= half a quantum
        else:
            n = sig >> sh
            rem = sig & ((np.int64(1) << sh) - 1)
        if mode == RNE:
            if sh <= 62:
                half = np.int64(1) << (sh - 1)
                # ties to the even encoding: n's parity, or with M = 0 the exponent's
                odd = (n + ((qe - fc.emin + man) << man)) & 1
                if rem > half or (rem == half and odd == 1):
                    n += 1
        elif mode == SR:
            if sh <= 32:
                frac = rem << (32 - sh)
            elif sh - 32 <= 62:
                frac = rem >> (sh - 32)
            else:
                frac = np.int64(0)
            if u + frac >= (np.int64(1) << 32):
                n += 1
    if n == 0:
        return (sign << 31) & fc.negzero32
    # n * 2^qe as a magnitude encoding; n == 2^(M+1) carries into the exponent
    enc = n + ((qe - fc.emin + man) << man)
    if enc > fc.maxenc:
        if saturate or mode == RTZ or fc.nan_kind == NAN_NONE:
            return (sign << 31) | fc.max32
        if fc.has_inf:
            return (sign << 31) | INF32
        return np.int64(QNAN32)
    if not subnormals and enc < (1 << man):
        return (sign << 31) & fc.negzero32
    return (sign << 31) | enc_to_f32(enc, fc)


@register_jitable
def quantize(x, fc, mode, subnormals, saturate, key, idx):
    """Round the float32 pattern ``x`` into the format (emu.quantize)."""
    x = np.int64(x)
    sign = (x >> 31) & 1
    a = x & ABS32
    if a > INF32:
        if fc.nan_kind == NAN_NONE:
            return (sign ^ 1) << 31               # ml_dtypes: zero of the other sign
        return np.int64(QNAN32)
    if a == INF32:
        if fc.has_inf:
            return (sign << 31) | INF32
        if saturate or fc.nan_kind == NAN_NONE:
            return (sign << 31) | fc.max32
        return np.int64(QNAN32)
    sh = 23 - fc.man_bits
    if mode == SR:
        u = rand32(key, idx)
    else:
        u = np.int64(0)
    if a >= fc.minnorm32 and a <= fc.max32:
        # Fast twin of round_to_fmt for results in the normal range: round the
        # float32 pattern in place, letting a mantissa carry run into the exponent.
        if sh == 0:
            return (sign << 31) | a
        low = (np.int64(1) << sh) - 1
        if mode == RNE:
            # the encoding's last bit: the pattern's, but the exponent's parity with
            # M = 0 differs from float32's unless the bias is odd like 127
            a = a + (low >> 1) + (((a >> sh) - ((126 + fc.emin) << fc.man_bits)) & 1)
        elif mode == SR:
            a = a + (u >> (32 - sh))
        return (sign << 31) | (a & ~low)
    if a >= 0x800000:
        sig = (a & 0x7FFFFF) | 0x800000
        exp = (a >> 23) - 150
    else:
        sig = a
        exp = np.int64(-149)
    return round_to_fmt(sign, sig, exp, fc, mode, subnormals, saturate, u)


@register_jitable
def operand(x, fc):
    """An operand of any op (float32 pattern ``x``) rounded into the format: RNE,
    subnormals kept (docs/semantics.md §3).

    Rounding to float32 changes only NaN payloads, and every op maps any NaN
    operand to the canonical NaN itself: skip it (the kernels' loops are then
    unswitched and vectorised by LLVM).
    """
    if is_float32(fc):
        return np.int64(x)
    return quantize(x, fc, RNE, True, False, 0, 0)


@register_jitable
def is_float32(fc):
    """Whether ``fc`` is float32's, where :func:`operand` is the identity: the CPU
    kernels test it once, outside their loops, so that LLVM vectorises the float32 one
    (it no longer unswitches the test itself once ``quantize`` is inlined)."""
    return fc.exp_bits == 8 and fc.man_bits == 23


@register_jitable
def f32_to_bits(x, fc):
    """Format encoding (low ``width`` bits) of the float32 pattern of a format value."""
    x = np.int64(x)
    man = fc.man_bits
    sign = (x >> 31) & 1
    a = x & ABS32
    top = ((np.int64(1) << fc.exp_bits) - 1) << man
    if a > INF32:
        return np.int64(fc.nanenc)
    if a == INF32:                                # P3109 (fnuz with inf): the all-ones code
        enc = top if fc.nan_kind == NAN_IEEE else top | ((np.int64(1) << man) - 1)
    elif a >= 0x800000:
        e = (a >> 23) - 127
        if e >= fc.emin:
            enc = ((e - fc.emin + 1) << man) | ((a & 0x7FFFFF) >> (23 - man))
        else:                                     # a format subnormal
            enc = ((a & 0x7FFFFF) | 0x800000) >> (fc.emin - man - e + 23)
    else:                                         # float32 subnormal (E = 8)
        enc = a >> (23 - man)
    return (sign << (fc.exp_bits + man)) | enc


@register_jitable
def bits_to_f32(b, fc):
    """Float32 pattern of the format encoding ``b`` (NaNs become the canonical NaN).

    NaN codes by policy: IEEE all-ones exponent with mantissa != 0; fn all ones;
    fnuz the sign bit alone (the code of -0), with ±inf at all ones where it has inf."""
    b = np.int64(b)
    man = fc.man_bits
    nbits = fc.exp_bits + man
    sign = (b >> nbits) & 1
    mag = b & ((np.int64(1) << nbits) - 1)
    top = ((np.int64(1) << fc.exp_bits) - 1) << man
    if fc.nan_kind == NAN_IEEE:
        if mag == top:
            return (sign << 31) | INF32
        if mag > top:
            return np.int64(QNAN32)
    elif fc.nan_kind == NAN_FN:
        if mag == (np.int64(1) << nbits) - 1:
            return np.int64(QNAN32)
    elif fc.nan_kind == NAN_FNUZ:
        if b == np.int64(1) << nbits:
            return np.int64(QNAN32)
        if fc.has_inf and mag == (np.int64(1) << nbits) - 1:     # P3109's ±inf
            return (sign << 31) | INF32
    return (sign << 31) | enc_to_f32(mag, fc)


# --- piecewise affine operations (operands are patterns of format values) ----------

@register_jitable
def pam_mul(a, b, fc):
    """PAM, eqs. (5)-(8): add the magnitudes' bit patterns, subtract the bias.

    The pattern sum does not depend on the format's bias or NaN policy: values are
    values; the policy enters through the thresholds and the special results in ``fc``.

    In float32-pattern space ``|a| + |b| - ONE32`` equals the format-encoding sum
    ``|a|bits + |b|bits - (bias << M)`` mapped to float32 (docs/semantics.md).
    """
    return pam_sum(a, b, fc, 0)


@register_jitable
def pam_sum(a, b, fc, c):
    """PAM with the integer ``c`` (float32-pattern units) added to the pattern sum of
    normal operands: the multipliers of docs/semantics.md "Multipliers" (emu/_scalar_mul.py).
    A carry or borrow of ``c`` moves the exponent; specials, flush and overflow are PAM's."""
    a = np.int64(a)
    b = np.int64(b)
    s = (a ^ b) & SIGN32
    ua = a & ABS32
    ub = b & ABS32
    if ua > INF32 or ub > INF32:
        return np.int64(fc.nan32)
    if ua == INF32 or ub == INF32:
        if ua < fc.minnorm32 or ub < fc.minnorm32:
            return np.int64(fc.nan32)
        return s | INF32
    if ua < fc.minnorm32 or ub < fc.minnorm32:   # zero or subnormal: DAZ
        return s & fc.negzero32
    r = ua + ub - ONE32 + c
    if r < fc.minnorm32:                          # flush, no subnormal results
        return s & fc.negzero32
    if r > fc.max32:
        return s | fc.ovf32
    return s | r


@register_jitable
def pam_mul32(a, b, fc):
    """:func:`pam_mul` as :func:`pam_sum32` (32-bit lanes, no branches)."""
    return pam_sum32(a, b, fc, 0)


@register_jitable
def pam_sum32(a, b, fc, c):
    """:func:`pam_sum` of two uint32 patterns in 32-bit arithmetic and without branches,
    the same result for every pair of patterns and every constant |c| < 2^29: LLVM
    if-converts every case, and the uint32 casts of each intermediate (Numba computes in
    64 bits) let it narrow the vectors to 32-bit lanes, twice as many as the int64
    definition gets.  The pattern sum |a| + |b| < 2^32 is compared against the
    thresholds plus the bias ONE32 - c before the bias comes off, so nothing wraps."""
    u = np.uint32
    bias, inf = u(ONE32 - c), u(INF32)
    s = u(u(a ^ b) & u(SIGN32))
    ua = u(a & u(ABS32))
    ub = u(b & u(ABS32))
    mn = u(fc.minnorm32)
    nz = u(s & u(fc.negzero32 & M32))
    nan = u(fc.nan32)
    hi = u(max(ua, ub))     # NaN or inf among the operands: the larger one is
    small = u(min(ua, ub)) < mn
    t = u(ua + ub)
    r = u(s | u(t - bias))
    r = nz if t < u(mn + bias) else r
    r = u(s | u(fc.ovf32)) if t > u(u(fc.max32) + bias) else r
    r = nz if small else r
    r = (nan if small else u(s | inf)) if hi == inf else r
    return nan if hi > inf else r


@register_jitable
def pa_div(a, b, fc):
    """PA division, eqs. (14)-(17): subtract the magnitudes' patterns, add the bias."""
    a = np.int64(a)
    b = np.int64(b)
    s = (a ^ b) & SIGN32
    ua = a & ABS32
    ub = b & ABS32
    if ua > INF32 or ub > INF32:
        return np.int64(fc.nan32)
    a_zero = ua < fc.minnorm32
    b_zero = ub < fc.minnorm32
    if ua == INF32:
        if ub == INF32:
            return np.int64(fc.nan32)
        return s | INF32
    if ub == INF32:
        return s & fc.negzero32
    if b_zero:
        # x/0 is the overflow value: inf, or max where there is neither inf nor NaN
        if a_zero or fc.nan_kind == NAN_FN or fc.nan_kind == NAN_FNUZ:
            return np.int64(fc.nan32)
        return s | fc.ovf32
    if a_zero:
        return s & fc.negzero32
    r = ua - ub + ONE32
    if r < fc.minnorm32:
        return s & fc.negzero32
    if r > fc.max32:
        return s | fc.ovf32
    return s | r


@register_jitable
def pa_div32(a, b, fc):
    """:func:`pa_div` of two uint32 patterns in 32-bit arithmetic and without branches
    (as :func:`pam_mul32`), the same result for every pair of patterns: the difference
    |a| - |b| + ONE32 is compared as |a| + ONE32 against |b| plus the thresholds, so
    nothing wraps."""
    u = np.uint32
    one, inf = u(ONE32), u(INF32)
    s = u(u(a ^ b) & u(SIGN32))
    ua = u(a & u(ABS32))
    ub = u(b & u(ABS32))
    mn = u(fc.minnorm32)
    nz = u(s & u(fc.negzero32 & M32))
    nan = u(fc.nan32)
    ovf = u(s | u(fc.ovf32))
    a_zero = ua < mn
    b_zero = ub < mn
    t = u(ua + one)
    r = u(t - ub) | s
    r = nz if t < u(ub + mn) else r
    r = ovf if t > u(ub + u(fc.max32)) else r
    r = nz if a_zero else r
    r = (nan if a_zero or fc.nan_kind == NAN_FN or fc.nan_kind == NAN_FNUZ else ovf) \
        if b_zero else r
    r = nz if ub == inf else r
    r = (nan if ub == inf else u(s | inf)) if ua == inf else r
    return nan if (ua > inf) | (ub > inf) else r


@register_jitable
def _paexp2_exact(n, sh, fc):
    """paexp2 of the exact value n * 2^-sh (eq. 9), rounded once into the format."""
    fl = n >> sh                                  # floor, also for negative n
    frac = n - (fl << sh)                         # in [0, 2^sh)
    sig = (np.int64(1) << sh) + frac              # 2^fl * (1 + frac / 2^sh)
    return round_to_fmt(0, sig, fl - sh, fc, RNE, False, not fc.has_inf, 0)


@register_jitable
def pa_exp2(x, fc):
    """paexp2(x) = 2^floor(x) * (1 + x - floor(x)), eq. (9)."""
    x = np.int64(x)
    ux = x & ABS32
    neg = (x >> 31) & 1
    if ux > INF32:
        return np.int64(fc.nan32)
    if ux < fc.minnorm32 or ux < fc.tiny_exp2_32:
        # zero and (DAZ) subnormals give 2^0 = 1; so does |x| < 2^-(M+2), where
        # 1 + x and (2 - |x|) / 2 both round to exactly 1.0 (docs/semantics.md)
        return np.int64(ONE32)
    if ux >= 0x43800000:                          # |x| >= 256: past every exponent range
        if neg:
            return np.int64(0)
        return fc.ovf32
    sig = (ux & 0x7FFFFF) | 0x800000
    if neg:
        sig = -sig
    # x = sig * 2^-sh with 15 <= sh <= 48 because 2^-(M+2) <= |x| < 256
    return _paexp2_exact(sig, 150 - (ux >> 23), fc)


@register_jitable
def pa_exp2_e8(x, fc):
    """:func:`pa_exp2` without branches (a loop of it vectorises), for a format with
    float32's exponent range (8 exponent bits, M >= 1).  Every lane computes the main
    case on |x| clamped into [2^-(M+2), 256): 2^fl (1 + frac 2^-sh) with x = n 2^-sh,
    fl = floor(x), the fraction's sh bits rounded RNE to M (a carry moves the exponent),
    as :func:`_paexp2_exact` rounds it.  From fl = 128 up that is the overflow value; below
    2^-126 it is +0, or the smallest normal where the fraction rounds up to 2 on the
    subnormal grid (fl = -127, frac >= 1 - 2^-M).  The special cases are selected last."""
    x = np.int64(x)
    ux = x & ABS32
    neg = (x >> 31) & 1
    man = np.int64(fc.man_bits)
    uc = min(max(ux, np.int64(fc.tiny_exp2_32)), np.int64(0x437FFFFF))
    sh = 150 - (uc >> 23)                         # 16 <= sh <= 25 + M <= 48
    m = (uc & 0x7FFFFF) | 0x800000
    n = (m ^ -neg) + neg                          # -m for a negative x
    fl = n >> sh
    frac = n - (fl << sh)                         # in [0, 2^sh)
    d = sh - man                                  # fraction bits below the format's
    dp = max(d, np.int64(1))
    q = (frac + ((np.int64(1) << (dp - 1)) - 1) + ((frac >> dp) & 1)) >> dp
    q = q if d > 0 else frac << max(-d, np.int64(0))
    r = ((fl + 127) << 23) + (q << (23 - man))
    r = np.int64(fc.ovf32) if r > fc.max32 else r
    # below 2^-126 (fl = -127 has sh = 17): 1 + frac >= 2 - 2^-M rounds up to 2^-126
    up = (fl == -127) & (frac >= (np.int64(1) << sh) - ((np.int64(1) << sh) >> man))
    r = (np.int64(fc.minnorm32) if up else np.int64(0)) if fl < -126 else r
    r = (np.int64(0) if neg else np.int64(fc.ovf32)) if ux >= 0x43800000 else r
    r = np.int64(ONE32) if ux < fc.tiny_exp2_32 else r
    return np.int64(fc.nan32) if ux > INF32 else r


@register_jitable
def pa_exp_e8(x, fc):
    """:func:`pa_exp` by :func:`pa_exp2_e8` (no branches)."""
    return pa_exp2_e8(pam_mul(x, fc.log2e32, fc), fc)


@register_jitable
def pa_log2(x, fc):
    """palog2(x) = E_x + M_x, eq. (10): the pattern minus the bias, scaled by 2^-23."""
    x = np.int64(x)
    ux = x & ABS32
    if ux > INF32:
        return np.int64(fc.nan32)
    if ux < fc.minnorm32:                         # ±0 and (DAZ) subnormals
        return SIGN32 | fc.ovf32
    if (x >> 31) & 1:
        return np.int64(fc.nan32)
    if ux == INF32:
        return np.int64(INF32)
    t = ux - ONE32
    if t < 0:
        return round_to_fmt(1, -t, -23, fc, RNE, False, not fc.has_inf, 0)
    return round_to_fmt(0, t, -23, fc, RNE, False, not fc.has_inf, 0)


@register_jitable
def pa_sqrt(x, fc):
    """pasqrt(x) = paexp2(palog2(x) / 2), eq. (20), evaluated exactly, rounded once."""
    x = np.int64(x)
    ux = x & ABS32
    if ux > INF32:
        return np.int64(fc.nan32)
    if ux < fc.minnorm32:                         # ±0 and (DAZ) subnormals keep their sign
        return x & fc.negzero32
    if (x >> 31) & 1:
        return np.int64(fc.nan32)
    if ux == INF32:
        return np.int64(INF32)
    # palog2(x) = (ux - ONE32) * 2^-23, so half of it is (ux - ONE32) * 2^-24
    return _paexp2_exact(ux - ONE32, 24, fc)


@register_jitable
def pa_sqrt_e8(x, fc):
    """:func:`pa_sqrt` without branches (a loop of it vectorises), for a format with
    float32's exponent range (8 exponent bits, M >= 1): for a normal x > 0, palog2(x)/2
    = (ux - ONE32) 2^-24, whose paexp2 is the pattern ux + ONE32 read with a 24-bit
    mantissa field; rounding its low 24 - M bits RNE in place is the one rounding (a
    carry moves the exponent), and the result is normal (2^-63 <= it < 2^64)."""
    x = np.int64(x)
    ux = x & ABS32
    sh = 24 - fc.man_bits
    low = (np.int64(1) << sh) - 1
    p = ux + ONE32
    r = ((p + (low >> 1) + ((p >> sh) & 1)) & ~low) >> 1
    r = np.int64(INF32) if ux == INF32 else r
    r = np.int64(fc.nan32) if (x >> 31) & 1 else r
    r = x & fc.negzero32 if ux < fc.minnorm32 else r
    return np.int64(fc.nan32) if ux > INF32 else r


@register_jitable
def in_place_consts(fc, mode):
    """The loop invariants of :func:`round_in_place` for the format and mode (RNE or
    toward zero): (shift, half, rne, keep) as uint32."""
    low = (np.int64(1) << (23 - fc.man_bits)) - 1
    rne = np.uint32(1) if mode == RNE else np.uint32(0)
    return (np.uint32(23 - fc.man_bits), np.uint32(low >> 1) * rne, rne,
            np.uint32(~low & 0xFFFFFFFF))


@register_jitable
def round_in_place(x, k):
    """The float32 pattern ``x`` (uint32) rounded in place onto the grid whose low bits
    ``k`` (:func:`in_place_consts`) clears, RNE (+ half - 1 + the last kept bit) or
    toward zero, without branches; a NaN becomes the canonical NaN.  This is
    :func:`quantize` for the formats of _kernels._in_place."""
    sh, half, rne, keep = k
    a = x & np.uint32(ABS32)
    r = ((a + half + ((a >> sh) & rne)) & keep) | (x & np.uint32(SIGN32))
    return np.uint32(QNAN32) if a > np.uint32(INF32) else r


@register_jitable
def pa_exp(x, fc):
    """paexp(x) = paexp2(log2(e) ·̂ x), eq. (18), log2(e) rounded to the format."""
    return pa_exp2(pam_mul(x, fc.log2e32, fc), fc)


@register_jitable
def pa_log(x, fc):
    """palog(x) = palog2(x) ÷̂ log2(e), eq. (19), log2(e) rounded to the format."""
    return pa_div(pa_log2(x, fc), fc.log2e32, fc)


def unary_ops(e8: bool) -> dict:
    """The unary PA functions by name; ``e8`` (float32's exponent range, the caller's
    loops meant to vectorise): the branch-free twins of paexp2, paexp and pasqrt."""
    ops = {"pa_exp2": pa_exp2, "pa_exp": pa_exp, "pa_sqrt": pa_sqrt, "pa_log2": pa_log2,
           "pa_log": pa_log}
    if e8:
        ops.update(pa_exp2=pa_exp2_e8, pa_exp=pa_exp_e8, pa_sqrt=pa_sqrt_e8)
    return ops


# --- IEEE arithmetic: the accumulator and the standard-multiplier baseline ---------

@register_jitable
def _unpack(a):
    """(sig, exp) with value = sig * 2^exp for a finite float32 magnitude pattern."""
    if a >= 0x800000:
        return (a & 0x7FFFFF) | 0x800000, (a >> 23) - 150
    return a, np.int64(-149)


@register_jitable
def fp_add(a, b, fc):
    """IEEE 754 addition of two float32 patterns, correctly rounded (RNE) into the format.

    Subnormals are kept; exact zero sums are +0 unless both operands are -0; any
    NaN result is the canonical NaN.  For float32 this is numpy float32 ``+``.
    """
    a = np.int64(a)
    b = np.int64(b)
    ua = a & ABS32
    ub = b & ABS32
    if ua > INF32 or ub > INF32:
        return np.int64(fc.nan32)
    if ua == INF32 or ub == INF32:
        if ua == INF32 and ub == INF32 and ((a ^ b) & SIGN32):
            return np.int64(fc.nan32)                # inf - inf
        big = a if ua == INF32 else b
        return quantize(big, fc, RNE, True, False, 0, 0)
    if ua < ub:                                   # make |a| >= |b|
        a, b = b, a
        ua, ub = ub, ua
    sa = (a >> 31) & 1
    if ub == 0:
        if ua == 0:
            return a & b & fc.negzero32           # -0 only for (-0) + (-0)
        return quantize(a, fc, RNE, True, False, 0, 0)
    siga, expa = _unpack(ua)
    sigb, expb = _unpack(ub)
    d = expa - expb                               # >= 0 because |a| >= |b|
    if d <= 38:
        big = siga << d                           # exact: < 2^62
        exp = expb
        small = sigb
    else:
        # |b| is below 2^-14 of one unit of siga * 2^15: standing in for it by one
        # unit (a sticky bit) cannot change any rounding decision (docs/semantics.md).
        big = siga << 15
        exp = expa - 15
        small = np.int64(1)
    if (a ^ b) & SIGN32:
        s = big - small
    else:
        s = big + small
    if s == 0:
        return np.int64(0)                        # x + (-x) = +0 under RNE
    return round_to_fmt(sa, s, exp, fc, RNE, True, False, 0)


@register_jitable
def fp_mul(a, b, fc, subnormals):
    """IEEE 754 multiplication of two float32 patterns, correctly rounded (RNE) into the format.

    With ``subnormals`` false, subnormal operands are read as zero (DAZ) and
    subnormal results flushed to zero (FTZ), as cheap hardware multipliers do.
    """
    a = np.int64(a)
    b = np.int64(b)
    s = (a ^ b) & SIGN32
    ua = a & ABS32
    ub = b & ABS32
    if ua > INF32 or ub > INF32:
        return np.int64(fc.nan32)
    zlim = 1 if subnormals else fc.minnorm32     # zero, or zero-or-subnormal under DAZ
    if ua == INF32 or ub == INF32:
        if ua < zlim or ub < zlim:
            return np.int64(fc.nan32)
        return quantize(s | INF32, fc, RNE, True, False, 0, 0)
    if ua < zlim or ub < zlim:
        return s & fc.negzero32
    siga, expa = _unpack(ua)
    sigb, expb = _unpack(ub)
    return round_to_fmt(s >> 31, siga * sigb, expa + expb, fc, RNE, subnormals, False, 0)


@register_jitable
def _align(sig, exp, unit):
    """sig * 2^exp on the grid of 2^unit: exact if exp >= unit, else truncated with the
    discarded bits ORed into the last one (a sticky bit)."""
    if exp >= unit:
        return sig << (exp - unit)
    d = unit - exp
    if d > 62:
        return np.int64(1)                        # sig != 0, all below the unit
    low = sig & ((np.int64(1) << d) - 1)
    return (sig >> d) | (np.int64(1) if low != 0 else np.int64(0))


@register_jitable
def fp_fma(s, a, b, fc):
    """IEEE 754 fused multiply-add: ``s + a * b`` exact, correctly rounded (RNE) once into
    the format; float32 patterns (``s`` a value of the format, ``a``, ``b`` any values,
    subnormals kept).  Zero sums and specials as fp_add of ``s`` and the exact product.

    The two addends (the product has at most 48 significant bits) are placed on one
    integer grid.  Where they span more than 61 bits, the grid's unit is 61 bits below
    the larger top and the smaller addend, then wholly below the other's 22nd bit,
    keeps a sticky bit: at least 38 bits separate the result's top from the unit, so
    no rounding decision into <= 24 bits changes (docs/semantics.md "Multipliers")."""
    s = np.int64(s)
    a = np.int64(a)
    b = np.int64(b)
    sp = (a ^ b) & SIGN32
    us = s & ABS32
    ua = a & ABS32
    ub = b & ABS32
    if us > INF32 or ua > INF32 or ub > INF32:
        return np.int64(fc.nan32)
    if ua == INF32 or ub == INF32:
        if ua == 0 or ub == 0:
            return np.int64(fc.nan32)             # inf * 0
        return fp_add(s, sp | INF32, fc)          # inf - inf is NaN there
    if ua == 0 or ub == 0 or us == INF32:
        return fp_add(s, sp, fc)                  # a zero product, or s infinite
    sa_, ea = _unpack(ua)
    sb_, eb = _unpack(ub)
    sx, ex = sa_ * sb_, ea + eb
    if us == 0:
        return round_to_fmt(sp >> 31, sx, ex, fc, RNE, True, False, 0)
    sy, ey = _unpack(us)
    top = max(ex + bitlen(sx), ey + bitlen(sy))
    unit = max(min(ex, ey), top - 61)
    vx = _align(sx, ex, unit)
    vy = _align(sy, ey, unit)
    if sp == (s & SIGN32):
        return round_to_fmt(sp >> 31, vx + vy, unit, fc, RNE, True, False, 0)
    if vx == vy:
        return np.int64(0)                        # exact cancellation: +0 under RNE
    if vx > vy:
        return round_to_fmt(sp >> 31, vx - vy, unit, fc, RNE, True, False, 0)
    return round_to_fmt((s >> 31) & 1, vy - vx, unit, fc, RNE, True, False, 0)

"""PAM matmul with a narrow accumulator (acc narrower than float32) at vector speed.

The spec's step (docs/semantics.md §5) is ``acc <- RNE_acc(acc + y)``: the exact sum of
the accumulator ``x`` (a value of acc) and the product ``y`` (a value of fmt), rounded
once into acc.  ``S.fp_add`` does it with an integer adder (~50 M steps/s).  Here the
step is a float32 add followed by one rounding of the float32 pattern into acc, which
vectorises; it is exact by one of two arguments, chosen per call:

PLAIN  (``y`` has p_y <= p_acc significant bits and 2 p_acc + 2 <= 24, i.e. p_acc <= 11:
       bf16/fp16/fp8 accumulators with operands no wider than them):
       RNE_acc(RN32(x + y)) = RNE_acc(x + y), innocuous double rounding (Figueroa,
       "When is double rounding innocuous?", SIGNUM 1995: both addends are p_acc-bit
       numbers and 24 >= 2 p_acc + 2).  The theorem is for unbounded exponents; the
       range ends are fine: (i) float32 sums in float32's subnormal range are exact;
       (ii) acc overflow is decided on the unbounded rounding, which the theorem keeps,
       and a float32 overflow (|x + y| >= 2^128 (1 - 2^-25)) lies beyond every acc's
       overflow threshold; (iii) in acc's subnormal range (|z| < 2^emin, quantum
       q = 2^(emin - p_acc + 1)) RN32 could only spoil the result by landing on an odd
       multiple m of q/2 with z = x + y not a float32.  If y's last bit is at least
       2^(emin - 23), z is a multiple of it below 2^emin: a float32.  Otherwise
       |y| < 2^(emin - 23 + p_acc) and |z - m| >= |x - m| - |y| >= q/2 - |y| >=
       2^(emin - p_acc - 1) > ulp32(m) / 2 = 2^(emin - 25): RN32(z) != m.
STICKY (any other y, e.g. float32 operands with a bf16 accumulator, and p_acc <= 22):
       the float32 sum is made round-to-odd with the exact error of 2Sum (Knuth; exact
       when the sum does not overflow, and no intermediate overflows then, Boldo,
       Graillat & Muller, ACM TOMS 2017): if the error is non-zero the pattern is moved
       to the odd neighbour on the error's side, ``(s - toward_zero) | inexact``.
       RNE_acc(RO32(z)) = RNE_acc(z) whenever float32's spacing at |z| is at most a
       quarter of acc's (Boldo & Melquiond, IEEE TC 2008): every point and midpoint of
       the acc grid is then an even float32 point, so RO32(z) (odd unless exact) lies in
       the same open interval between them as z.  Float32's spacing is 2^(e-23)
       (>= 2^-149) and acc's 2^(max(e, emin) - p_acc + 1) (>= 2^(-126-21)): it holds
       for p_acc <= 22.  A sum that overflows float32 overflows acc as well.

Wider accumulators (p_acc 23, e.g. e8m22) keep the integer fold (emu/_kernels.py).

A PLAIN call rounds the float32 sum s = RN32(x + y) with the fewest operations its
operands allow (step_kind):
SCALED (scaled_ok: no inf/NaN, every non-zero product at least 2^(emin + p_acc - 1),
       and a bound on every |s| below half of acc's max and of 2^(127 - sh),
       sh = 23 - M_acc >= 13): with c = 2^sh s (exact), RN32(RN32(s - c) + c) is
       RNE_acc(s).  Let 2^E <= |s| < 2^(E+1), E >= emin, and q = 2^(E - M_acc), acc's
       spacing there; c is m q, m the 24-bit integer significand of s.  |s - c| =
       (2^sh - 1) |s| lies in float32's binade of spacing q, so RN32(s - c) = -c +
       (the multiple k q nearest s), ties to an even -m + k: a tie has m = 2^(sh-1) mod
       2^sh, so m and k are even, acc's RNE.  Only in the sliver |s| < 2^E (1 +
       1/(2^sh - 1)) is |s - c| below that binade (spacing q/2): there RNE_acc(s) =
       ±2^E, and ±2^E - c is on the q/2 grid within 2^(E-sh+1) <= q/4 of s - c (sh >=
       13), so RN32 takes it.  The last add is exact (its result is an acc value), and
       c being exact, fmuladd is the same fused or not: 2 vector operations per step on
       top of the float32 kernel's 2.  No subnormal arises: x and y are multiples of Q
       = 2^(e_y - p_acc + 1), e_y the smallest product exponent, so is their sum, and a
       rounding keeps it (a sum below 2^(e_y) has at most p_acc - 1 bits: exact), so
       |s| >= Q >= 2^emin unless s = 0; an exact cancellation gives +0, so the
       accumulator is never -0 and adding a ±0 product is the identity: zero products
       are skipped as in the float32 kernel, which runs it register-blocked
       (K.matmul_blocked).
CLAMPED (clamped_ok: every block CLEAN and the same bound; sums may be subnormal; acc
       has emin >= -126), two ways, by the host:
       with vrangeps (AVX-512DQ, 16 lanes): the SCALED rounding with g = s where |s| >=
       1.5 2^emin, else g = ±1.5 2^emin with s's sign (one vrangeps), and c = 2^sh g.
       Above the clamp it is SCALED's argument; below it c = ±3 2^22 q_min (q_min =
       2^(emin - M_acc), acc's subnormal spacing: an even multiple) and |s - c| lies in
       (2^(emin+sh), 1.5 2^(emin+sh)], float32's binade of spacing q_min, so RN32(s -
       c) + c is s rounded RNE onto that grid.  A sum that rounds to zero comes out +0
       where acc's RNE gives s's sign: no product is ±0, so the next step's sum is y
       either way, and only the last step of each micro-kernel call ORs s's sign into
       the result (``negzero``, nothing in fnuz formats).  3 operations per step on top
       of the float32 kernel's 2.
       elsewhere, in place: within each micro-kernel call the accumulator and every
       product are scaled by 2^(-126 - emin).  Scaled, acc's grid is float32's patterns
       with the low sh bits clear: its normals are float32 normals, its subnormals
       (quantum Q = 2^(sh - 149)) float32 subnormals.  So RNE_acc of a scaled float32
       sum is the finite rounding in place on its pattern (below): per step one fused
       multiply-add, RN32(x + 2^(-126 - emin) y), and five integer operations (the
       generic clamp took seven, all in each accumulator's chain).  PLAIN's argument
       holds in the scaled range, the FMA rounding the scaled sum once: where it is not
       a float32, y's last bit is below 2^-149, so |y| < 2^(p_acc - 150) <= Q/8 (p_acc
       <= 11) and the sum lies at least Q/2 - Q/8 from every odd multiple of Q/2 (its
       (iii)).  A sum that rounds to zero keeps its sign (through the FMA's rounding
       too); where acc has no -0 (fnuz), a -0 is stored as +0.  Loading and storing the
       accumulator, the scaling is exact (acc's values are multiples of Q).
F16    (acc IEEE binary16 on a host with F16C, any operands): RNE_acc(s) is the
       hardware conversion to binary16 and back (overflow to inf, subnormals, NaN);
       NaNs are made canonical when C is written.  Where every block is CLEAN
       (clean_ok: no ±0 product, so a -0 accumulator is harmless) it runs
       register-blocked (F16_BLOCKED), else in the column loops below.
otherwise the integer rounding below.

A STICKY call where every block is CLEAN (clean_ok) and acc is IEEE-style with E = 8
(bf16, e8mX) or binary16 on a host with F16C runs register-blocked too
(STICKY_BLOCKED): the round-to-odd sum, rounded in place on its pattern (E = 8: the
finite step below; every product is finite, so no sum is NaN and inf stays inf) or
by the F16 conversion.  No product is ±0, so a -0 accumulator is harmless.

The rounding of the float32 pattern ``v`` into acc is quantize's (RNE, subnormals,
overflow to inf, NaN or max by the policy, docs/semantics.md §9) without branches: in
acc's normal range (and everywhere for E = 8, whose subnormal grid is float32 patterns
with low bits clear) round the pattern in place; below acc's smallest normal (E < 8)
``(|v| + c) - c`` with c = 2^(emin - M + 23), whose float32 spacing is acc's subnormal
quantum, rounds RNE onto that grid; then a magnitude above max overflows and NaN
becomes the policy's invalid result (canonical NaN; -0 without NaN codes).

The loops run the spec's order: each output folds k = 0..K-1 in increasing order from
+0.0; vectorised over JW columns of B (a long loop: no per-row overhead), blocked
over QR rows, parallel over (batch, row block, column block) tasks.  Products use the
tile modes of emu/_tiles.py: CLEAN (one wrapping add, as in the float32 kernel),
ZEROS (MASKED and SKIP blocks: a zero/subnormal operand gives the signed zero, which
matters here because a narrow accumulator can hold -0: -0 + +0 = +0) and GENERAL
(branch-free pam_mul).
"""
import math
from typing import NamedTuple

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, register_jitable

from . import _kernels as K
from . import _scalar as S
from . import _scalar_mul as SM
from ._kernels import KG, MB, NB, QR
from ._numba_cache import drop_stale, njit_variant
from ._tiles import CLEAN, GENERAL, task_index, tile_mode


drop_stale(__file__, config=f"qr={QR}")

JW = 256        # columns per vectorised loop: QR rows of JW accumulators stay in L1
F16, SCALED, F16_BLOCKED, CLAMPED = 1, 2, 3, 5  # the fast PLAIN steps (module docstring)
STICKY_BLOCKED = 4      # the STICKY step register-blocked (module docstring)
#: the F16 step needs the F16C conversions (else LLVM would call a library routine)
HAS_F16C = bool(llvm.get_host_cpu_features().get("f16c", False))

_SIGN = np.int32(-0x80000000)
_ABS = np.int32(S.ABS32)
_INF = np.int32(S.INF32)
_QNAN = np.int32(S.QNAN32)


def fast_path(acc) -> bool:
    """Whether acc (a Format narrower than float32) runs these kernels: p_acc <= 22."""
    return acc.man_bits <= 21


@njit(cache=True)
def _mantissa_or(x, mn):
    """OR of the mantissa fields of the normal-or-larger patterns of x (int32, flat)."""
    acc = np.int32(0)
    for i in range(x.size):
        v = x[i]
        acc |= (v & np.int32(0x7FFFFF)) if (v & _ABS) >= mn else np.int32(0)
    return acc


def needs_sticky(a, b, fc, fca, extra=0) -> bool:
    """False when PLAIN is exact (module docstring): every product has p_y <= p_acc
    significant bits and p_acc <= 11.  A product's pattern is |a| + |b| - ONE32, so its
    low bits are clear wherever both operands' are.  ``b`` may be None; ``extra``:
    mantissa bits of further addends (the exact gradient's saturated ±max)."""
    if fca.man_bits > 10:
        return True
    bits = int(_mantissa_or(a.reshape(-1), np.int32(fc.minnorm32))) | int(extra)
    if b is not None:
        bits |= int(_mantissa_or(b.reshape(-1), np.int32(fc.minnorm32)))
    tz = (bits & -bits).bit_length() - 1 if bits else 23     # trailing zeros
    return 23 - tz > fca.man_bits


class AccConsts(NamedTuple):
    """The accumulator's rounding constants as the steps take them (int32 patterns,
    ``csub`` float32), from :func:`acc_consts`."""
    sh: np.int32        # 23 - M_acc: the float32 mantissa bits below acc's
    half: np.int32      # (2^sh - 1) >> 1: RNE's half spacing, less the tie's even bit
    keep: np.int32      # ~(2^sh - 1): the bits of acc's mantissa
    min_normal: np.int32    # acc's smallest normal magnitude
    max_finite: np.int32    # acc's largest finite magnitude
    ovf: np.int32       # an overflow's result: inf (ieee), NaN (fn, fnuz), max (none)
    ovf_sign: np.int32  # the sign bit if an overflow keeps the sign (inf, max), else 0
    csub: np.float32    # 2^(emin - M + 23): (|v| + csub) - csub rounds onto acc's subnormals
    negzero: np.int32   # a -0 result (0 in fnuz formats): applied when C is written, as a
    #                     -0 in the accumulator behaves as +0 in every later step but -0 + -0
    nan: np.int32       # an invalid sum: the canonical NaN, -0 in none formats (§9 rule 3)


def acc_consts(fca) -> AccConsts:
    """The :class:`AccConsts` of the accumulator format ``fca`` (its ``consts``)."""
    sh = 23 - fca.man_bits
    low = (1 << sh) - 1
    # overflow (docs/semantics.md §9 rule 1): ±inf (ieee), NaN (fn, fnuz), ±max (none)
    sat = fca.nan_kind == S.NAN_NONE
    return AccConsts(
        np.int32(sh), np.int32(low >> 1), np.int32(~low), np.int32(fca.minnorm32),
        np.int32(fca.max32), _INF if fca.has_inf else (np.int32(fca.max32) if sat else _QNAN),
        _SIGN if fca.has_inf or sat else np.int32(0),
        np.float32(2.0 ** (fca.emin - fca.man_bits + 23)),
        np.int32(np.uint32(fca.negzero32)), np.int32(np.uint32(fca.nan32)))


def _step(sticky, e8, finite, f16=False):
    """``step(x, y, sh, half, keep, amn, amx, ovf, ovf_sign, csub, nan)``: RNE_acc(x + y) for
    the int32 pattern x of an acc value and y of a float32 value, the constants those of
    :class:`AccConsts` (``amn``/``amx``: min_normal/max_finite).  LLVM IR on i32/float so
    that the column loop vectorises in 32-bit lanes (Numba's integer arithmetic would
    widen to int64).

    ``finite``: y is finite and x is not a NaN other than the canonical one (CLEAN and
    ZEROS blocks: every step's NaN is canonical), and acc has E = 8 (so IEEE-style).
    Then rounding the signed pattern in place is the whole rounding: a carry runs from
    the mantissa into the exponent and from max into inf, inf and the canonical NaN
    are fixed points, and no sum is NaN (no inf - inf).

    ``f16``: the F16 step (module docstring) instead, for any x and y."""
    i32, f32 = ir.IntType(32), ir.FloatType()

    @intrinsic
    def step(typingctx, x, y, sh, half, keep, amn, amx, ovf, ovf_sign, csub, nan):
        sig = types.int32(types.int32, types.int32, types.int32, types.int32, types.int32,
                          types.int32, types.int32, types.int32, types.int32, types.float32,
                          types.int32)

        def codegen(context, builder, signature, args):
            x, y, sh, half, keep, amn, amx, ovf, ovf_sign, csub, nan = args
            b = builder

            def c(v):
                return ir.Constant(i32, v)

            xf = b.bitcast(x, f32)
            yf = b.bitcast(y, f32)
            s = b.fadd(xf, yf)
            if f16:
                # the hardware's float32 -> binary16 conversion is RNE_acc itself
                return b.bitcast(b.fpext(b.fptrunc(s, ir.HalfType()), f32), i32)
            v = b.bitcast(s, i32)
            if sticky:
                # 2Sum's exact error; the pattern moves to the odd neighbour on its side
                bb = b.fsub(s, xf)
                err = b.fadd(b.fsub(xf, b.fsub(s, bb)), b.fsub(yf, bb))
                nz = b.fcmp_ordered("!=", err, ir.Constant(f32, 0.0))   # false for NaN
                away = b.icmp_signed(">=", b.xor(b.bitcast(err, i32), v), c(0))
                tz = b.and_(nz, b.not_(away))
                v = b.or_(b.sub(v, b.zext(tz, i32)), b.zext(nz, i32))
            if finite:
                return b.and_(b.add(b.add(v, half), b.and_(b.lshr(v, sh), c(1))), keep)
            a = b.and_(v, c(S.ABS32))
            sign = b.and_(v, c(S.SIGN32 - (1 << 32)))
            n = b.and_(b.add(b.add(a, half), b.and_(b.lshr(a, sh), c(1))), keep)
            if not e8:
                ns = b.bitcast(b.fsub(b.fadd(b.bitcast(a, f32), csub), csub), i32)
                n = b.select(b.icmp_signed("<", a, amn), ns, n)
            r = b.or_(sign, n)
            r = b.select(b.icmp_signed(">", n, amx), b.or_(ovf, b.and_(sign, ovf_sign)), r)
            return b.select(b.icmp_signed(">", a, c(S.INF32)), nan, r)

        return sig, codegen

    return step


def steps(sticky, e8, f16=False):
    """``(step, step_finite)``: ``step(x, y, ac)`` = RNE_acc(x + y) for int32 patterns, ac
    an :class:`AccConsts`, by the STICKY or PLAIN argument (the caller's), for an E = 8
    accumulator or a narrower one, or (``f16``) the F16 step; ``step_finite`` for a
    finite y and an x that is no NaN but the canonical one (_step's ``finite``).  Used
    by the matmul kernels below and the exact-gradient kernels (emu/_kernels_grad.py)."""
    step_ir = _step(sticky, e8, False, f16)
    step_fin = _step(sticky, e8, e8, f16)

    @register_jitable
    def step(x, y, ac):
        return step_ir(x, y, ac.sh, ac.half, ac.keep, ac.min_normal, ac.max_finite, ac.ovf,
                       ac.ovf_sign, ac.csub, ac.nan)

    @register_jitable
    def step_finite(x, y, ac):
        """step for a finite y (CLEAN and ZEROS blocks)."""
        return step_fin(x, y, ac.sh, ac.half, ac.keep, ac.min_normal, ac.max_finite, ac.ovf,
                        ac.ovf_sign, ac.csub, ac.nan)

    return step, step_finite


def _make(sticky, e8, f16=False):
    """The kernel for STICKY or PLAIN steps, for an E = 8 accumulator or a narrower one,
    or (``f16``) for F16 steps."""
    step, step_finite = steps(sticky, e8, f16)

    # Each loop: for k in [k0, k0 + nk), for each of the QR rows, acc[r, :jw] <- step(
    # acc[r, :jw], a[r, k] ·̂ B[k, j0:j0 + jw]); the long column loop vectorises.
    @register_jitable
    def run_clean(acc, A, B, i0, j0, jw, k0, nk, one, ac):
        for k in range(k0, k0 + nk):
            brow = B[k, j0:j0 + jw]       # indexed from 0: no wraparound code
            for r in range(QR):
                am = np.int32(A[i0 + r, k] - one)   # a ·̂ b = (a - ONE32 + c32) + b mod 2^32
                ar = acc[r]
                for j in range(jw):
                    ar[j] = step_finite(ar[j], np.int32(am + brow[j]), ac)

    @register_jitable
    def run_zeros(acc, A, B, i0, j0, jw, k0, nk, fmn, one, ac):
        for k in range(k0, k0 + nk):
            brow = B[k, j0:j0 + jw]       # indexed from 0: no wraparound code
            for r in range(QR):
                av = A[i0 + r, k]
                am = np.int32(av - one)
                za = (av & _ABS) < fmn
                ar = acc[r]
                for j in range(jw):
                    b = brow[j]
                    y = np.int32((av ^ b) & _SIGN) if (za | ((b & _ABS) < fmn)) \
                        else np.int32(am + b)
                    ar[j] = step_finite(ar[j], y, ac)

    @register_jitable
    def run_general(acc, A, B, i0, j0, jw, k0, nk, fc, c32, ac):
        for k in range(k0, k0 + nk):
            brow = B[k, j0:j0 + jw]       # indexed from 0: no wraparound code
            for r in range(QR):
                av = np.uint32(A[i0 + r, k])
                ar = acc[r]
                for j in range(jw):
                    ar[j] = step(ar[j], np.int32(S.pam_sum32(av, np.uint32(brow[j]), fc, c32)),
                                 ac)

    @njit_variant(f"sticky={sticky} e8={e8} f16={f16} qr={QR}", parallel=True)  # as _kernels
    def kernel(A, sta, B, stb, ia, ib, C, fc, ac, c32):
        """C (nout, M, N) int32 patterns from A (nA, Mq, K) patterns (rows padded to a
        multiple of QR), B (nB, K, N) patterns and the statistics of
        K.matmul_prepare_a/_b (per QR rows / NB columns, and KG k); ``c32``: the
        pattern-sum multiplier's constant (PAM: 0)."""
        nout, M, N = C.shape
        Kd = A.shape[2]
        nq = A.shape[1] // QR
        ng = (Kd + KG - 1) // KG
        qt = MB // QR
        nti = (nq + qt - 1) // qt
        ntj = (N + NB - 1) // NB
        fmn = np.int32(fc.minnorm32)
        one = np.int32(np.uint32((S.ONE32 - np.int64(c32)) & S.M32))
        for t in prange(nout * nti * ntj):
            bo, bi, bj = task_index(t, nti, ntj)
            ba = ia[bo]
            bb = ib[bo]
            Ab = A[ba]
            Bb = B[bb]
            acc = np.zeros((QR, JW), np.int32)
            for q in range(bi * qt, min(nq, bi * qt + qt)):
                i0 = q * QR
                for j0 in range(bj * NB, min(N, bj * NB + NB), JW):
                    jw = min(JW, N - j0)
                    acc[:] = 0
                    g = 0
                    while g < ng:
                        sa = sta[ba, q, g]
                        sb = stb[bb, bj, g]
                        m = tile_mode(sa[0], sa[1], sa[2], sb[0], sb[1], sb[2], fc, c32)
                        # a run of groups in the same mode is one loop
                        g1 = g + 1
                        while g1 < ng:
                            sa = sta[ba, q, g1]
                            sb = stb[bb, bj, g1]
                            if tile_mode(sa[0], sa[1], sa[2], sb[0], sb[1], sb[2], fc,
                                         c32) != m:
                                break
                            g1 += 1
                        k0 = g * KG
                        nk = min(Kd, g1 * KG) - k0
                        if m == CLEAN:
                            run_clean(acc, Ab, Bb, i0, j0, jw, k0, nk, one, ac)
                        elif m == GENERAL:
                            run_general(acc, Ab, Bb, i0, j0, jw, k0, nk, fc, c32,
                                        ac)
                        else:
                            run_zeros(acc, Ab, Bb, i0, j0, jw, k0, nk, fmn, one, ac)
                        g = g1
                    for r in range(min(QR, M - i0)):
                        for j in range(jw):     # the F16 step leaves x86's NaN
                            v = acc[r, j]
                            v = ac.negzero if v == _SIGN else v
                            C[bo, i0 + r, j0 + j] = _QNAN if (v & _ABS) > _INF else v

    return kernel


class StepKind(NamedTuple):
    """Which float32-add-and-round step a narrow accumulator's kernels take (_step)."""
    sticky: bool        # STICKY (round to odd first), else PLAIN
    e8: bool            # an IEEE-style accumulator with E = 8 (its finite step)
    f16: bool = False   # binary16 through F16C conversions


_KERNELS = {StepKind(sticky, e8): _make(sticky, e8) for sticky in (False, True)
            for e8 in (False, True)}
if HAS_F16C:
    _KERNELS[StepKind(False, False, True)] = _make(False, False, True)


def is_e8(fca) -> bool:
    """Whether acc is IEEE-style with E = 8 (bf16, e8mX): the finite step's case (_step)."""
    return fca.exp_bits == 8 and fca.nan_kind == S.NAN_IEEE


def is_binary16(fca) -> bool:
    """Whether acc is IEEE binary16 (inf, NaNs, -0, bias 15): what the F16 step rounds to."""
    return (fca.exp_bits, fca.man_bits, fca.emin, fca.nan_kind) == (5, 10, -14, S.NAN_IEEE)


def scaled_ok(A, sta, B, stb, fc, fca, c32=0) -> bool:
    """Whether every SCALED step is exact (module docstring): from the statistics, no
    inf/NaN operand and every product of normal operands normal in fmt and at least
    2^(emin_acc + p_acc - 1); and the sums bounded (_bounded).  ``c32``: the
    pattern-sum multiplier's constant (PAM: 0)."""
    if sta.size == 0 or stb.size == 0:
        return False
    amn, amx = int(sta[..., 0].min()), int(sta[..., 1].max())
    bmn, bmx = int(stb[..., 0].min()), int(stb[..., 1].max())
    if max(amx, bmx) >= S.INF32:
        return False
    if amn > fc.max32 or bmn > fc.max32:      # no normal operand: every product is ±0
        return True
    p = fca.man_bits + 1
    one = S.ONE32 - c32
    if (amn + bmn - one < max(fc.minnorm32, (fca.emin + p - 1 + 127) << 23)
            or amx + bmx - one > fc.max32):
        return False
    return _bounded(A, B, fca, c32)


def clamped_ok(A, sta, B, stb, fc, fca, c32=0) -> bool:
    """Whether every CLAMPED step is exact (module docstring): every block CLEAN and the
    sums bounded (_bounded)."""
    return clean_ok(sta, stb, fc, c32) and _bounded(A, B, fca, c32)


def _bounded(A, B, fca, c32=0) -> bool:
    """Whether every sum of finite operands is below half of both acc's max and
    2^(127 - sh): |x_k| <= (1 + 2^-p_acc)^K · sum_k |a_ik| |b_kj| · 2^ceil(c32⁺ / 2^23)
    (each step rounds |x + y| up by at most that factor; PAM's error is <= 0, and a
    positive constant adds at most one binade per 2^23 pattern units), bounded with
    max_i sum_k |a_ik| · max |b| and max |a| · max_j sum_k |b_kj|."""
    a_rows, a_max, b_cols, b_max = _abs_sums(A, B)
    top = min(a_rows * b_max, a_max * b_cols)
    lim = min(float(np.int32(fca.max32).view(np.float32)), 2.0 ** (127 - (23 - fca.man_bits)))
    k = A.shape[2]
    grow = -(-max(int(c32), 0) >> 23)
    return (math.log2(top) + grow + k * math.log2(1 + 2.0 ** -(fca.man_bits + 1))
            < math.log2(lim) - 1)


@njit(parallel=True, cache=True)
def _abs_sums(A, B):
    """(max_i Σ_k |a_ik|, max |a|, max_j Σ_k |b_kj|, max |b|) over every batch of the
    int32 patterns A (nA, M, K) and B (nB, K, N) of finite values, float64 sums of
    float32 magnitudes (exact to 2^-53 relative: far inside scaled_ok's bound), in one
    pass without temporaries (numpy's float64 copies cost 6 ms at 1024^2)."""
    nA, M, nk = A.shape
    nB, _, N = B.shape
    ra = np.zeros(nA * M)
    ma = np.zeros(nA * M)
    for t in prange(nA * M):
        row = A[t // M, t % M]
        s, m = 0.0, 0.0
        for k in range(nk):
            v = abs(np.float64(K.as_f32(row[k])))
            s += v
            m = max(m, v)
        ra[t], ma[t] = s, m
    cb = np.zeros((nB, N))
    mb = np.zeros((nB, N))
    for t in prange(nB):
        for k in range(nk):
            for j in range(N):
                v = abs(np.float64(K.as_f32(B[t, k, j])))
                cb[t, j] += v
                mb[t, j] = max(mb[t, j], v)
    return ra.max(), ma.max(), cb.max(), mb.max()


def clean_ok(sta, stb, fc, c32=0) -> bool:
    """Whether every block is CLEAN (emu/_tiles.py), from the statistics: no zero,
    subnormal, inf or NaN operand, and no product flushes or overflows."""
    if sta.size == 0 or stb.size == 0 or sta[..., 2].any() or stb[..., 2].any():
        return False
    one = S.ONE32 - int(c32)
    return (int(sta[..., 1].max()) + int(stb[..., 1].max()) - one <= fc.max32
            and int(sta[..., 0].min()) + int(stb[..., 0].min()) - one >= fc.minnorm32)


def step_kind(sticky, A, sta, B, stb, fc, fca, c32=0):
    """The fast step of a PLAIN call: SCALED where scaled_ok (fewest operations), else
    CLAMPED where clamped_ok, else for a binary16 accumulator on a host with F16C F16
    (register-blocked where every block is CLEAN: no ±0 product meets a -0
    accumulator), else None (integer rounding).  A STICKY call: STICKY_BLOCKED where
    every block is CLEAN and acc is an IEEE-style E = 8 format (its rounding in place)
    or binary16 with F16C, else None."""
    if sticky:
        if (is_e8(fca) or (HAS_F16C and is_binary16(fca))) and clean_ok(sta, stb, fc, c32):
            return STICKY_BLOCKED
        return None
    if scaled_ok(A, sta, B, stb, fc, fca, c32):
        return SCALED
    if clamped_ok(A, sta, B, stb, fc, fca, c32):
        return CLAMPED
    if HAS_F16C and is_binary16(fca):
        return F16_BLOCKED if clean_ok(sta, stb, fc, c32) else F16
    return None


def matmul_narrow(A, Am, sta, B, Bp, Bm, stb, ia, ib, C, fc, fca, sticky, fast=-1, c32=0):
    """The matmul by the pattern-sum multiplier of constant ``c32`` (PAM: 0)
    accumulating in ``fca`` (fast_path(fca)): A, B patterns and the rest from
    K.matmul_prepare_a/_b (with the same c32), C (nout, M, N) int32; ``sticky`` from
    needs_sticky, ``fast`` from step_kind unless given (tests force each)."""
    if fast == -1:
        fast = step_kind(sticky, A, sta, B, stb, fc, fca, c32)
    if fast in (SCALED, CLAMPED, F16_BLOCKED, STICKY_BLOCKED):
        sh = K.F16 if fast == F16_BLOCKED or (fast == STICKY_BLOCKED and is_binary16(fca)) \
            else 23 - fca.man_bits
        key = (sh, fast == STICKY_BLOCKED) + ((fca.emin, fca.negzero32) if fast == CLAMPED else ())
        K.blocked(*key)(A, Am, sta, Bp, Bm, stb, ia, ib, C.view(np.float32), fc,
                        SM.MulParams(SM.SUM, c32, K.NO_TABLE, 0), K.float_consts(fc),
                        K.NO_OFFSETS)
    else:
        _KERNELS[StepKind(sticky, is_e8(fca) and fast != F16, fast == F16)](
            A, sta, B, stb, ia, ib, C, fc, acc_consts(fca), c32)

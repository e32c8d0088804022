"""Vectorised CPU kernels (``@njit(parallel=True)``) built on the scalar definitions.

Every kernel calls the ``register_jitable`` functions of emu/_scalar.py; the only
logic added here is iteration order and, in the PAM matmul, fast paths whose
preconditions guarantee that they produce the same bits as the scalar
definition (tests compare both against the reference, exhaustively where small).
Arrays are flat, C-contiguous ``uint32`` views of float32 data; shape handling and
argument checking live in emu/ops.py and emu/matmul.py.
"""
import functools
import os
from typing import NamedTuple

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, register_jitable

from . import _scalar as S
from . import _scalar_mul as SM
from ._numba_cache import drop_stale, njit_variant
from .formats import float32
from .registry import ops
from ._tiles import CLEAN, GENERAL, MASKED, task_index, tile_mode_range


def _lanes() -> int:
    """Lanes per vector of the matmul micro-kernel: 16 on AVX-512 hosts (two ALU ports
    of 16 lanes beat three of 8), else 8; PAMSIM_VECTOR_LANES=8|16 overrides it (tests
    use it to run the other configuration)."""
    env = os.environ.get("PAMSIM_VECTOR_LANES")
    if env is None:
        return 16 if llvm.get_host_cpu_features().get("avx512f", False) else 8
    if env not in ("8", "16"):
        raise ValueError(f"PAMSIM_VECTOR_LANES must be 8 or 16, got {env!r}")
    return int(env)


W = _lanes()
#: the CLAMPED step's clamp is one vrangeps (AVX-512DQ), else it rounds in place (_micro_kernel)
_RANGE = W == 16 and llvm.get_host_cpu_features().get("avx512dq", False)
drop_stale(__file__, config=f"lanes={W}")


@intrinsic
def as_f32(typingctx, x):
    """Reinterpret an int32 as float32 (a register move, no conversion)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def as_i32(typingctx, x):
    """Reinterpret a float32 as int32 (a register move, no conversion)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


F16 = -1    # matmul_blocked's shift for a binary16 accumulator


@intrinsic
def f16_round(typingctx, x):
    """A float32 rounded (RNE) to IEEE binary16 and back: the F16C conversions."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


# --- elementwise ------------------------------------------------------------------
#
# Each elementwise kernel comes twice, from one loop: compiled parallel (prange splits
# the elements over Numba's threads) and serial (prange is then range).  A parallel
# region has a fixed cost even on one thread, and on a loaded machine it can wait for a
# descheduled worker, so below sizes.SERIAL elements the backends run the serial twin.


def twins(variant, py_func):
    """``{True: parallel, False: serial}`` kernels of ``py_func`` (a prange loop),
    cached under ``variant`` (which must name every factory argument compiled in)."""
    return {par: njit_variant(f"{variant} parallel={par}", parallel=par)(py_func)
            for par in (True, False)}


def _quantize(x, out, fc, mode, subnormals, saturate, key):
    if _in_place(fc, mode, subnormals, saturate):
        k = S.in_place_consts(fc, mode)
        for i in prange(x.size):        # branch-free: a loop LLVM vectorises
            out[i] = S.round_in_place(x[i], k)
    else:
        for i in prange(x.size):
            out[i] = S.quantize(x[i], fc, mode, subnormals, saturate, key, i)


@register_jitable
def _in_place(fc, mode, subnormals, saturate):
    """Whether rounding into the format is rounding the float32 pattern in place, as in
    S.quantize's normal-range branch, for *every* input: an IEEE format narrower than
    float32 with 8 exponent bits (float32's exponent range, so its subnormals are float32's subnormals on a
    coarser grid), RNE or toward zero, subnormals kept, no saturation.  A carry out of
    the mantissa moves to the next binade and past max to inf (RNE's overflow); toward
    zero never rounds up, so it ends at max (its overflow); ±0 and ±inf stay; a NaN
    becomes the canonical NaN."""
    return (fc.exp_bits == 8 and fc.man_bits < 23 and fc.nan_kind == S.NAN_IEEE
            and mode != S.SR and subnormals and not saturate)


def _to_bits(x, out, fc):
    for i in prange(x.size):
        out[i] = S.f32_to_bits(S.quantize(x[i], fc, S.RNE, True, False, 0, 0), fc)


def _from_bits(b, out, fc):
    for i in prange(b.size):
        out[i] = S.bits_to_f32(b[i], fc)


QUANTIZE = twins("quantize", _quantize)
quantize = QUANTIZE[True]
to_bits = twins("to_bits", _to_bits)[True]
from_bits = twins("from_bits", _from_bits)[True]


def _unary(op, parallel):
    scalar = op.scalar

    def kernel(x, out, fc):
        if S.is_float32(fc):        # operands need no rounding: a loop LLVM vectorises
            for i in prange(x.size):
                out[i] = scalar(np.int64(x[i]), fc)
        else:
            for i in prange(x.size):
                out[i] = scalar(S.operand(x[i], fc), fc)
    return njit_variant(f"unary {op.name} parallel={parallel}", parallel=parallel)(kernel)


def pairwise(f, variant, parallel, f32=None):
    """The kernel ``out[i] = f(x[i], y[i], fc)`` with both operands rounded into the
    format first: a binary op, or the exact derivative of a unary one
    (emu/_kernels_grad.py, whose scalar definitions this module's cache depends on).
    ``f32``: f's twin on uint32 patterns (Op.scalar32), where no operand is rounded."""
    if f32 is None:
        @register_jitable
        def f32(a, b, fc):
            return f(np.int64(a), np.int64(b), fc)

    def kernel(x, y, out, fc):
        if S.is_float32(fc):        # operands need no rounding: a loop LLVM vectorises
            for i in prange(x.size):
                out[i] = f32(x[i], y[i], fc)
        elif _in_place(fc, S.RNE, True, False):     # bf16, e8mM: rounded in place
            k = S.in_place_consts(fc, S.RNE)
            for i in prange(x.size):
                out[i] = f32(S.round_in_place(x[i], k), S.round_in_place(y[i], k), fc)
        else:
            for i in prange(x.size):
                out[i] = f(S.operand(x[i], fc), S.operand(y[i], fc), fc)
    return njit_variant(variant, parallel=parallel)(kernel)


def _binary(op, parallel):
    return pairwise(op.scalar, f"binary {op.name} parallel={parallel}", parallel, op.scalar32)


#: one CPU kernel per elementwise op of the registry (emu/registry.py), by name, and
#: its serial twin; the CUDA kernels (emu/_cuda.py) are built from the same scalar
#: definitions
UNARY = {op.name: _unary(op, True) for op in ops(1)}
BINARY = {op.name: _binary(op, True) for op in ops(2)}
UNARY_SERIAL = {op.name: _unary(op, False) for op in ops(1)}
BINARY_SERIAL = {op.name: _binary(op, False) for op in ops(2)}


# --- PAM matmul -----------------------------------------------------------------
#
# C[i, j] = fold over k = 0..K-1 (increasing) of acc <- acc + pam_mul(A[i,k], B[k,j]),
# acc starting at +0.0.  The kernel is a register-blocked GEMM that never reorders k
# for a given output: a micro-kernel keeps a QR x PW block of C in vector registers and
# walks k in order, each step one vector load of B and, per row, a broadcast of A's
# pattern, a wrapping integer add and a float32 add (emu/_tiles.py: a + b - ONE32 is the
# product when the block is CLEAN).  B is packed once into column panels of PW holding
# b - ONE32, so the product is a single add.  Per (block of QR rows, group of KG k) and
# (column block of NB, group) statistics pick the block's mode (_tiles.tile_mode):
# CLEAN, MASKED (zero/subnormal operands: their products are skipped with a lane mask
# precomputed per operand, exact since the accumulator is never -0.0), SKIP, or
# GENERAL (S.pam_mul per product, in the same k order).

QR = 8 if W == 16 else 4    # rows of C per micro-kernel: QR * NV accumulators in registers
NV = 2          # vectors per row of the micro-kernel
PW = W * NV     # columns per packed panel of B
KG = 8          # k per statistics group: the granularity of modes
MB = 128        # rows of C per task
NB = 1024       # columns of C per task (and per B statistics block)
KC = 256        # k per pass: a panel slice (KC * PW * 4 bytes) stays in L1 across row blocks
MT = {8: np.uint8, 16: np.uint16}[W]      # one lane mask
_M_ALL = MT((1 << W) - 1)
_MASK_A, _MASK_B, _MASK_AB = 4, 5, 6      # MASKED, by which operand holds the zeros
# GENERAL blocks of finite operands, vectorised (matmul_blocked): a FLUSH product, or
# FLUSH_OVF where a product may overflow; + 1 mask_a, + 2 mask_b, + 3 both
_FLUSH, _FLUSH_OVF = 7, 11
# the micro-kernel's product: the pattern sum a + (b - ONE32 + c32) (PAM, L-Mul, offsets);
# the float32 product (the ``exact`` multiplier, where it is exact: the step is then its
# fused multiply-add); or that product rounded in place onto fmt's grid (``float``)
ADD, FMUL, FMUL_ROUND, CARRY = 0, 1, 2, 3
# the micro-kernel's FLUSH product (ADD): products below min normal are ±0; FLUSH_OVF: and
# products above max overflow
FLUSH, FLUSH_OVF = 1, 2
_F32C = float32.consts      # FMUL's GENERAL step: S.fp_fma into float32


def _micro_kernel(mask_a, mask_b, sh=0, sticky=False, emin=None, negzero=0, prod=ADD, psh=0,
                  variants=False, flush=0, rows=QR, blocks=False):
    """``acc[r, :] += A[r, k] ·̂ B[k, :]`` for QR rows, PW columns and k = 0..nk-1 in
    increasing order, the accumulators in vector registers (LLVM IR, so the block is
    register-allocated as written).  Masked-off products are not added.  ``sh`` > 0:
    each sum is then rounded onto the grid of a format with 23 - sh mantissa bits, the
    SCALED step of emu/_kernels_acc.py; with ``emin``, its CLAMPED step onto the grid
    of a format with that smallest normal exponent (subnormals included): in place on
    the patterns of values scaled by 2^(-126 - emin), a -0 stored as +0 where
    ``negzero`` (the format's -0 pattern) is 0; ``sh`` = F16:
    rounded to binary16 (its F16 step).  ``sticky``: the sum is first made round-to-odd
    with 2Sum's error (E = 8: only in a k where some sum is a midpoint of the grid, the
    one case where it can change the result; one branch per k), then rounded to binary16 (``sh`` = F16) or, in place on its
    pattern, onto the grid of an E = 8 format with 23 - sh mantissa bits (the STICKY
    step with _kernels_acc's finite rounding).  ``prod``: how B's packed entries and A's
    pattern make the product (ADD, FMUL, or FMUL_ROUND onto fmt's grid: for ``psh`` >= 13
    the SCALED rounding by 2^(23 - M), read from ``fl``, else RNE on the pattern's low
    ``psh`` bits; CARRY: the exact PAM derivative's term a·y, y =
    (m + b) & 0xFF800000 = ±2^(E_b + carry) (B packed as b itself), fused into the add,
    ``m`` the QR x PW tile of mantissas at ``xm_off`` in ``xm``, emu/_kernels_grad.py);
    ``variants``: each row's B entries come from the
    packed variant its A entry names (``ao``: element offsets, a table's row per a: the
    corrected-PAM products).  ``flush`` (ADD or FMUL_ROUND, float32 accumulation), FLUSH
    or FLUSH_OVF: S.pam_sum's flush (and overflow) for finite operands whose pattern sums
    stay in [0, 2^31): a product whose magnitude pattern is below fmt's min normal is ±0
    (not added; the accumulator is never -0), (FLUSH_OVF) above its max the overflow
    pattern with the product's sign; FMUL_ROUND: float_nb's rule for products normal
    in float32 (below min normal: min normal from thr, else ±0; the overflow value with
    its sign policy); ``fl``: flush_consts or float_flush_consts (read with ``flush``
    or FMUL_ROUND's SCALED rounding); CARRY with ``flush``: the same for its term g·y, exact in
    float32 (the caller's blocks keep it normal there).  ``rows``: the rows of one call, QR or fewer (CARRY's mantissa tile takes as
    many registers as the accumulators).  ``blocks`` (ADD, float32): K-blocks of
    ``xm_off`` steps (nk a multiple of it): each block's sums start at +0 in the
    registers and are then added to ``acc`` in memory, ``acc + sum`` rounded once (the
    fold of emu.recipe_matmul's block sums, scales applied to the operands before).
    The preconditions are the caller's."""
    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    vi, vf, vm = ir.VectorType(i32, W), ir.VectorType(f32, W), ir.VectorType(ir.IntType(1), W)
    mt = ir.IntType(W)
    # CLAMPED (emin): with vrangeps the SCALED rounding of the clamped sum, whose peeled last
    # step sets a zero's sign (fewest operations there); else in place (fewest without it)
    clamped = emin is not None
    inplace = clamped and not _RANGE
    fix = clamped and _RANGE and negzero != 0
    if clamped:
        assert prod == ADD and not sticky and -126 <= emin and 13 <= sh, (emin, sh)
    assert not blocks or (prod == ADD and sh == 0 and not sticky and not flush), "blocks"

    @intrinsic
    def kernel(typingctx, acc, acc_off, bp, b_off, bm, bm_off, a, am, ao, a_off, a_stride, nk,
               xm, xm_off, fl):
        """acc/bp/bm/a/am/ao/xm/fl: 1-D arrays; *_off: element offsets of the block's
        first entry (acc and xm: QR rows of PW; bp: nk rows of PW; bm: nk rows of NV
        masks; a/am/ao: QR rows of stride a_stride; ao read only with ``variants``, xm
        only with CARRY, fl only with ``flush``)."""
        sig = types.void(acc, acc_off, bp, b_off, bm, bm_off, a, am, ao, a_off, a_stride, nk,
                         xm, xm_off, fl)

        def codegen(context, builder, signature, args):
            ta = signature.args

            def as_i64(i):
                return context.cast(builder, args[i], ta[i], types.int64)

            def base(i, off, ty):
                data = context.make_array(ta[i])(context, builder, args[i]).data
                return builder.bitcast(builder.gep(data, [as_i64(off)]), ty.as_pointer())

            def at(p, idx, ty=None):
                q = builder.gep(p, [idx if isinstance(idx, ir.Value) else ir.Constant(i64, idx)])
                return q if ty is None else builder.bitcast(q, ty.as_pointer())

            accp, bpp, bmp = base(0, 1, f32), base(2, 3, i32), base(4, 5, mt)
            ap, amp = base(6, 9, i32), base(7, 9, mt)
            aop = base(8, 9, i32) if variants else None
            a_stride, nk = as_i64(10), as_i64(11)
            def splat(x):
                one = builder.insert_element(ir.Constant(vi, ir.Undefined), x,
                                             ir.Constant(i32, 0))
                return builder.shuffle_vector(one, ir.Constant(vi, ir.Undefined),
                                              ir.Constant(vi, [0] * W))

            scaled_prod = prod == FMUL_ROUND and psh >= 13
            if flush or scaled_prod:    # fl's constants: loop-invariant
                flp = builder.bitcast(context.make_array(ta[14])(context, builder, args[14]).data,
                                      i32.as_pointer())
                fmn, fmx, fovf, fthr, fosg, fpow = (splat(builder.load(at(flp, i)))
                                                    for i in range(6))
                pscale = builder.bitcast(fpow, vf)      # 2^psh, psh = 23 - M of fmt
                nscale = builder.fmul(pscale, ir.Constant(vf, [-1.0] * W))
            # the float product's FLUSH with vrangeps: rounded onto fmt's grid with
            # subnormals (the scale's g clamped to 1.5 min normal), then kept from min normal
            range_flush = prod == FMUL_ROUND and flush and scaled_prod and _RANGE
            if range_flush:
                vrange_p = builder.module.declare_intrinsic(
                    "llvm.x86.avx512.mask.range.ps.512", (), ir.FunctionType(
                        vf, [vf, vf, i32, vf, ir.IntType(16), i32]))
                gmin = builder.bitcast(builder.or_(fmn, ir.Constant(vi, [1 << 22] * W)), vf)
            if prod == CARRY or inplace:
                cfma = builder.module.declare_intrinsic(
                    f"llvm.fma.v{W}f32", (), ir.FunctionType(vf, [vf, vf, vf]))
            if prod == CARRY:       # the mantissa tile: loop-invariant
                xmp = base(12, 13, i32)
                xms = [builder.load(at(xmp, r * PW + v * W, vi), align=4)
                       for r in range(rows) for v in range(NV)]
            ptrs = [at(accp, r * PW + v * W, vf) for r in range(rows) for v in range(NV)]
            zeros = [ir.Constant(vf, [0.0] * W)] * (rows * NV)
            init = zeros if blocks else [builder.load(p, align=4) for p in ptrs]
            offs = [builder.mul(a_stride, ir.Constant(i64, r)) for r in range(rows)]
            if sh > 0 and not sticky:
                fmuladd = builder.module.declare_intrinsic(
                    f"llvm.fmuladd.v{W}f32", (), ir.FunctionType(vf, [vf, vf, vf]))
                if clamped and _RANGE:
                    vrange = builder.module.declare_intrinsic(
                        "llvm.x86.avx512.mask.range.ps.512", (), ir.FunctionType(
                            vf, [vf, vf, i32, vf, ir.IntType(16), i32]))

            def vec(x, ty=vf):
                return ir.Constant(ty, [x] * W)

            if inplace:     # exact: acc's values are multiples of its subnormal quantum
                init = [builder.fmul(x, vec(2.0 ** (-126 - emin))) for x in init]

            if prod == FMUL_ROUND:
                pmuladd = builder.module.declare_intrinsic(
                    f"llvm.fmuladd.v{W}f32", (), ir.FunctionType(vf, [vf, vf, vf]))

            def scaled(t):
                """The SCALED rounding of t (emu/_kernels_acc.py): with c = 2^sh g,
                RN(RN(t - c) + c); g = t, or (CLAMPED) t clamped to |g| >= 1.5 2^emin
                with t's sign.  c is exact, so fmuladd is the same with or without an
                FMA."""
                g = t
                if clamped:     # imm 7: the larger magnitude (bits 1:0), t's sign (3:2)
                    g = builder.call(vrange, [t, vec(1.5 * 2.0 ** emin), ir.Constant(i32, 7),
                                              vec(0.0), ir.Constant(ir.IntType(16), -1),
                                              ir.Constant(i32, 4)])
                return builder.call(fmuladd, [g, vec(2.0 ** sh), builder.call(
                    fmuladd, [g, vec(-2.0 ** sh), t])])

            def in_place(tv, sh, inexact=None, away=None):
                """RNE of the float32 pattern tv onto the grid with its low sh bits clear;
                a tie goes to the even neighbour, or where ``inexact``, away from zero
                exactly where ``away`` (the round-to-odd pattern's rounding)."""
                low = (1 << sh) - 1
                tie = builder.and_(builder.lshr(tv, vec(sh, vi)), vec(1, vi))
                if inexact is not None:
                    tie = builder.select(inexact, builder.zext(away, vi), tie)
                return builder.and_(builder.add(builder.add(tv, vec(low >> 1, vi)), tie),
                                    vec(~low, vi))

            def masked(t, s, ma, mb):
                """t where this step's product is not masked off, else s."""
                if ma is not None and mb is not None:
                    return builder.select(builder.and_(ma, mb), t, s)
                if ma is not None or mb is not None:
                    return builder.select(ma if ma is not None else mb, t, s)
                return t

            def odd_step(s, y, t):
                """The STICKY step for t = RN(s + y): round-to-odd, to the odd neighbour on
                2Sum's error's side; then the F16 conversion's input, or (E = 8, finite
                operands) rounded in place, the tie bit (which only decides exact ties)
                being, for an inexact sum, whether the error points away from zero: what
                rounding its round-to-odd pattern gives."""
                bb = builder.fsub(t, s)
                err = builder.fadd(builder.fsub(s, builder.fsub(t, bb)), builder.fsub(y, bb))
                nz = builder.fcmp_ordered("!=", err, vec(0.0))
                tv = builder.bitcast(t, vi)
                away = builder.icmp_signed(
                    ">=", builder.xor(builder.bitcast(err, vi), tv), vec(0, vi))
                if sh == F16:
                    tz = builder.and_(nz, builder.not_(away))
                    return builder.bitcast(builder.or_(builder.sub(tv, builder.zext(tz, vi)),
                                                       builder.zext(nz, vi)), vf)
                return builder.bitcast(in_place(tv, sh, nz, away), vf)

            def step(k, accs, last):
                """One k: the accumulators after it (``last``: the zero takes t's sign)."""
                kb = builder.mul(k, ir.Constant(i64, PW))
                km = builder.mul(k, ir.Constant(i64, NV))
                bs = [builder.load(at(bpp, builder.add(kb, ir.Constant(i64, v * W)), vi), align=4)
                      for v in range(NV)]
                mb = [builder.bitcast(builder.load(at(bmp, builder.add(km, ir.Constant(i64, v)))),
                                      vm) for v in range(NV)] if mask_b else None
                new, mids, pend, mas = [], [], [], []
                for r in range(rows):
                    kr = builder.add(offs[r], k)
                    one = builder.insert_element(ir.Constant(vi, ir.Undefined),
                                                 builder.load(at(ap, kr)), ir.Constant(i32, 0))
                    av = builder.shuffle_vector(one, ir.Constant(vi, ir.Undefined),
                                                ir.Constant(vi, [0] * W))
                    ma = builder.bitcast(builder.load(at(amp, kr)), vm) if mask_a else None
                    mas.append(ma)
                    if variants:    # this row's B variant
                        vo = builder.add(kb, builder.sext(builder.load(at(aop, kr)), i64))
                        bs = [builder.load(at(bpp, builder.add(vo, ir.Constant(i64, v * W)), vi),
                                           align=4) for v in range(NV)]
                    for v in range(NV):
                        s = accs[r * NV + v]
                        if prod == ADD and flush:
                            yi = builder.add(bs[v], av)     # sign | magnitude: no wrap
                            mag = builder.and_(yi, vec(S.ABS32, vi))
                            if flush == FLUSH_OVF:
                                ovf = builder.or_(builder.and_(
                                    yi, vec(S.SIGN32 - (1 << 32), vi)), fovf)
                                yi = builder.select(builder.icmp_signed(">", mag, fmx), ovf, yi)
                            y = builder.bitcast(yi, vf)
                            kept = builder.icmp_signed(">=", mag, fmn)  # else ±0: s stays
                        elif prod == ADD:
                            y = builder.bitcast(builder.add(bs[v], av), vf)
                        elif prod == CARRY:     # y = ±2^(E_b + carry), the term a·y
                            y = builder.bitcast(builder.and_(
                                builder.add(xms[r * NV + v], bs[v]), vec(-0x800000, vi)), vf)
                        else:
                            y = builder.fmul(builder.bitcast(bs[v], vf), builder.bitcast(av, vf))
                        y0 = y
                        if range_flush:
                            # c = 2^psh g, g = y with |g| >= 1.5 min normal (imm 7: the
                            # larger magnitude, y's sign): RN(RN(y - c) + c) is y rounded
                            # RNE onto fmt's grid, subnormals included, so a product from
                            # thr up rounds to min normal and one below it to less
                            g = builder.call(vrange_p, [y, gmin, ir.Constant(i32, 7),
                                                        vec(0.0), ir.Constant(ir.IntType(16), -1),
                                                        ir.Constant(i32, 4)])
                            y = builder.call(pmuladd, [g, pscale, builder.call(
                                pmuladd, [g, nscale, y])])
                        elif scaled_prod:
                            # the SCALED rounding (emu/_kernels_acc.py): c = 2^psh y is
                            # exact, RN(RN(y - c) + c) is y rounded RNE to 23 - psh bits
                            # (2^psh from fl: one kernel for every format)
                            y = builder.call(pmuladd, [y, pscale, builder.call(
                                pmuladd, [y, nscale, y])])
                        elif prod == FMUL_ROUND:    # RNE on the pattern
                            lowp = (1 << psh) - 1
                            yv = builder.bitcast(y, vi)
                            lsb = builder.and_(builder.lshr(yv, vec(psh, vi)), vec(1, vi))
                            y = builder.bitcast(builder.and_(builder.add(builder.add(
                                yv, vec(lowp >> 1, vi)), lsb), vec(~lowp, vi)), vf)
                        if range_flush:     # float_nb's rule on the rounded product
                            yi = builder.bitcast(y, vi)
                            mag = builder.and_(yi, vec(S.ABS32, vi))
                            if flush == FLUSH_OVF:
                                yi = builder.select(builder.icmp_signed(">", mag, fmx),
                                                    builder.or_(builder.and_(yi, fosg), fovf), yi)
                            kept = builder.icmp_signed(">=", mag, fmn)
                            y = builder.bitcast(yi, vf)
                        elif prod == FMUL_ROUND and flush:
                            # float_nb's rule for the exact product v (normal in float32):
                            # rounded above max, the overflow value; v below min normal,
                            # min normal at or above thr, else ±0 (not added)
                            vmag = builder.and_(builder.bitcast(y0, vi), vec(S.ABS32, vi))
                            yi = builder.bitcast(y, vi)
                            if flush == FLUSH_OVF:
                                yi = builder.select(
                                    builder.icmp_signed(">", builder.and_(yi, vec(S.ABS32, vi)),
                                                        fmx),
                                    builder.or_(builder.and_(yi, fosg), fovf), yi)
                            yi = builder.select(
                                builder.icmp_signed("<", vmag, fmn), builder.or_(
                                    builder.and_(yi, vec(S.SIGN32 - (1 << 32), vi)), fmn), yi)
                            kept = builder.icmp_signed(">=", vmag, fthr)
                            y = builder.bitcast(yi, vf)
                        if prod == CARRY and flush:
                            # the term a·y, exact and normal in float32, flushed or
                            # overflowed in fmt like a PAM product
                            yi = builder.bitcast(builder.fmul(builder.bitcast(av, vf), y), vi)
                            mag = builder.and_(yi, vec(S.ABS32, vi))
                            if flush == FLUSH_OVF:
                                ovf = builder.or_(builder.and_(
                                    yi, vec(S.SIGN32 - (1 << 32), vi)), fovf)
                                yi = builder.select(builder.icmp_signed(">", mag, fmx), ovf, yi)
                            kept = builder.icmp_signed(">=", mag, fmn)
                            t = builder.fadd(s, builder.bitcast(yi, vf))
                        elif prod == CARRY:
                            # a·y is exact, so one fused rounding is the add's
                            t = builder.call(cfma, [builder.bitcast(av, vf), y, s])
                        elif inplace:   # the scaled sum, rounded once
                            t = builder.call(cfma, [y, vec(2.0 ** (-126 - emin)), s])
                        else:
                            t = builder.fadd(s, y)
                        if sticky and sh != F16:
                            # E = 8, finite operands: the float32 sum rounds in place as the
                            # exact one unless it is a midpoint of acc's grid (then its
                            # exact neighbours lie on either side); those take odd_step
                            tv = builder.bitcast(t, vi)
                            low = (1 << sh) - 1
                            mids.append(builder.icmp_signed("==", builder.and_(
                                tv, vec(low, vi)), vec(1 << (sh - 1), vi)))
                            pend.append((len(new), s, y, t))
                            t = builder.bitcast(in_place(tv, sh), vf)
                        elif sticky:
                            t = odd_step(s, y, t)
                        if sh == F16:
                            t = builder.fpext(
                                builder.fptrunc(t, ir.VectorType(ir.HalfType(), W)), vf)
                        elif inplace:
                            t = builder.bitcast(in_place(builder.bitcast(t, vi), sh), vf)
                        elif sh and not sticky:
                            r0 = scaled(t)
                            if last:    # a sum that rounds to zero: -0 if it was negative
                                sign = builder.and_(builder.bitcast(t, vi),
                                                    vec(negzero - (1 << 32), vi))
                                r0 = builder.bitcast(builder.or_(builder.bitcast(r0, vi), sign), vf)
                            t = r0
                        if flush:
                            t = builder.select(kept, t, s)
                        t = masked(t, s, ma, mb[v] if mask_b else None)
                        new.append(t)
                if pend:    # rare: one branch per k for every accumulator's midpoints
                    hit = mids[0]
                    for m in mids[1:]:
                        hit = builder.or_(hit, m)
                    hit = builder.icmp_unsigned("!=", builder.bitcast(hit, mt), ir.Constant(mt, 0))
                    fast, slow = builder.basic_block, builder.append_basic_block("mk.mid")
                    cont = builder.append_basic_block("mk.cont")
                    builder.cbranch(hit, slow, cont).set_weights([1, 1000])
                    builder.position_at_end(slow)
                    fixed = list(new)
                    for i, s, y, t in pend:
                        r, v = divmod(i, NV)
                        fixed[i] = masked(odd_step(s, y, t), s, mas[r],
                                          mb[v] if mask_b else None)
                    builder.branch(cont)
                    builder.position_at_end(cont)
                    new = merge(new, fast, fixed, slow)
                return new

            def merge(a, block_a, b, block_b):
                """Per accumulator, a from block_a or b from block_b (phi nodes)."""
                out = []
                for x, y in zip(a, b):
                    out.append(builder.phi(vf))
                    out[-1].add_incoming(x, block_a)
                    out[-1].add_incoming(y, block_b)
                return out

            # the loop runs k = 0 .. nk - 1, or to nk - 2 where the last step is peeled
            stop = builder.sub(nk, ir.Constant(i64, 1)) if fix else nk
            pre = builder.basic_block
            loop = builder.append_basic_block("mk.loop")
            after = builder.append_basic_block("mk.after")
            builder.cbranch(builder.icmp_signed(">", stop, ir.Constant(i64, 0)), loop, after)

            builder.position_at_end(loop)
            k = builder.phi(i64)
            k.add_incoming(ir.Constant(i64, 0), pre)
            accs = []
            for x in init:
                accs.append(builder.phi(vf))
                accs[-1].add_incoming(x, pre)
            if blocks:      # steps left in this K-block
                kb = as_i64(13)
                left = builder.phi(i64)
                left.add_incoming(kb, pre)
            new = step(k, accs, False)
            if blocks:      # at a block's end: acc + its sums, once rounded; sums from +0
                left1 = builder.sub(left, ir.Constant(i64, 1))
                body = builder.basic_block
                fold = builder.append_basic_block("mk.fold")
                cont = builder.append_basic_block("mk.next")
                builder.cbranch(builder.icmp_signed("==", left1, ir.Constant(i64, 0)),
                                fold, cont)
                builder.position_at_end(fold)
                for p, x in zip(ptrs, new):
                    builder.store(builder.fadd(builder.load(p, align=4), x), p, align=4)
                builder.branch(cont)
                builder.position_at_end(cont)
                new = merge(new, body, zeros, fold)
                nxt = builder.phi(i64)
                nxt.add_incoming(left1, body)
                nxt.add_incoming(kb, fold)
            k1 = builder.add(k, ir.Constant(i64, 1))
            end = builder.basic_block
            k.add_incoming(k1, end)
            if blocks:
                left.add_incoming(nxt, end)
            for ph, t in zip(accs, new):
                ph.add_incoming(t, end)
            builder.cbranch(builder.icmp_signed("<", k1, stop), loop, after)

            builder.position_at_end(after)
            outs = merge(init, pre, new, end)
            if fix:
                last = builder.append_basic_block("mk.last")
                done = builder.append_basic_block("mk.done")
                builder.cbranch(builder.icmp_signed(">", nk, ir.Constant(i64, 0)), last, done)
                builder.position_at_end(last)
                fixed = step(stop, outs, True)
                builder.branch(done)
                builder.position_at_end(done)
                outs = merge(outs, after, fixed, last)
            if inplace:     # exact; a -0 is +0 in formats without one
                outs = [builder.fmul(x, vec(2.0 ** (126 + emin))) for x in outs]
                if not negzero:
                    outs = [builder.select(builder.fcmp_ordered("==", x, vec(0.0)), vec(0.0), x)
                            for x in outs]
            if not blocks:  # (blocks: every block was added at its end)
                for p, x in zip(ptrs, outs):
                    builder.store(x, p, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return kernel


@register_jitable
def flush_mode(sa, sb, lo, hi, floor, ceil, fc):
    """_FLUSH or _FLUSH_OVF plus the mask offset for a GENERAL block of finite tiles
    (statistics sa, sb) whose products' patterns, between those of the pattern sums with
    the constants lo and hi, lie in [floor, ceil); else GENERAL."""
    if (sa[1] < S.INF32 and sb[1] < S.INF32 and sa[0] + sb[0] - S.ONE32 + lo >= floor
            and sa[1] + sb[1] - S.ONE32 + hi < ceil):
        return ((_FLUSH_OVF if sa[1] + sb[1] - S.ONE32 + hi > fc.max32 else _FLUSH)
                + (1 if sa[2] else 0) + (2 if sb[2] else 0))
    return GENERAL


@register_jitable
def flush_consts(fc):
    """The FLUSH micro-kernels' constants for a pattern sum: fmt's min normal, max and
    overflow patterns, then three that only the float product reads (float_flush_consts)."""
    return np.array((fc.minnorm32, fc.max32, fc.ovf32, 0, S.SIGN32 - (1 << 32), 0), np.int32)


@register_jitable
def float_flush_consts(fx):
    """The FMUL_ROUND micro-kernels' constants (float_nb's rule): fmt's min normal, max,
    the overflow value, the threshold below which a product is ±0, the overflow's sign
    mask, and the float32 pattern of 2^sh (the SCALED rounding's scale, sh = 23 - M)."""
    return np.array((fx.minnorm, fx.max_finite, fx.ovf, fx.thr, fx.ovf_sign,
                     (127 + fx.sh) << 23), np.int32)


@register_jitable
def _fold(mn, mx, z, e, fc):
    """Fold the pattern e into (min normal |x| (INF32 if none), max |x|, zero/subnormal
    present), the statistics of _tiles.tile_mode; int32 so that loops vectorise."""
    u = e & np.int32(S.ABS32)
    normal = u >= np.int32(fc.minnorm32)
    return (min(mn, u if normal else np.int32(S.INF32)), max(mx, u),
            z | np.int32(not normal))


@njit(parallel=True, cache=True)
def matmul_prepare_a(A, fc):
    """A (nA, M, K) patterns, M a multiple of QR: the lane masks Am (all ones where a is
    normal) and the statistics per (row block, k group)."""
    na, M, K = A.shape
    nq = M // QR
    ng = (K + KG - 1) // KG
    Am = np.empty((na, M, K), MT)
    st = np.empty((na, nq, ng, 3), np.int64)
    for t in prange(na * nq):
        ba = t // nq
        q = t % nq
        # per k over the block's rows first (vectorised), then per group
        mn = np.full(ng * KG, np.int32(S.INF32))
        mx = np.zeros(ng * KG, np.int32)
        z = np.zeros(ng * KG, np.int32)
        for i in range(q * QR, q * QR + QR):
            a_row = A[ba, i]
            m_row = Am[ba, i]
            for k in range(K):
                mn[k], mx[k], z[k] = _fold(mn[k], mx[k], z[k], a_row[k], fc)
                m_row[k] = _M_ALL if (a_row[k] & np.int32(S.ABS32)) >= np.int32(fc.minnorm32) else MT(0)
        for g in range(ng):
            k0 = g * KG
            st[ba, q, g, 0] = mn[k0:k0 + KG].min()
            st[ba, q, g, 1] = mx[k0:k0 + KG].max()
            st[ba, q, g, 2] = z[k0:k0 + KG].max()
    return Am, st


@njit(parallel=True, cache=True)
def matmul_prepare_b(B, fc, c32, table, tk):
    """B (nB, K, N) patterns: the packed panels Bp[., p, -1, k, :] = B[., k,
    p*PW:(p+1)*PW] - ONE32 + c32 (mod 2^32, zero padded; c32 the multiplier's constant)
    and, for a corrected-PAM ``table`` (4^tk entries, float32-pattern units; tk > 0),
    before it one variant per table row i, Bp[., p, i, k, :] = that + table[i, j(b)];
    their lane masks Bm (bit set where b is normal;
    filled only for k groups that hold zeros, the only ones a kernel reads), and the
    statistics per (column block of NB, k group)."""
    nbt, K, N = B.shape
    npan = (N + PW - 1) // PW
    ng = (K + KG - 1) // KG
    nb = (N + NB - 1) // NB
    st = np.empty((nbt, nb, ng, 3), np.int64)
    for t in prange(nbt * ng):
        bb = t // ng
        g = t % ng
        for jb in range(nb):
            mn, mx, z = np.int32(S.INF32), np.int32(0), np.int32(0)
            for k in range(g * KG, min(K, g * KG + KG)):
                b_row = B[bb, k]
                for j in range(jb * NB, min(N, jb * NB + NB)):
                    mn, mx, z = _fold(mn, mx, z, b_row[j], fc)
            st[bb, jb, g, 0], st[bb, jb, g, 1], st[bb, jb, g, 2] = mn, mx, z
    nvar = (1 << tk) + 1 if tk > 0 else 1
    Bp = np.zeros((nbt, npan, nvar, K, PW), np.int32)
    Bm = np.zeros((nbt, npan, K, NV), MT)
    one = S.ONE32 - np.int64(c32)
    jmask = (np.int64(1) << tk) - 1
    for t in prange(nbt * K):
        bb = t // K
        k = t % K
        b_row = B[bb, k]
        zeros = st[bb, :, k // KG, 2]
        for p in range(npan):
            j0 = p * PW
            out = Bp[bb, p, nvar - 1, k]
            for j in range(min(PW, N - j0)):
                out[j] = np.int32(np.uint32((np.int64(b_row[j0 + j]) - one) & S.M32))
            for i in range(nvar - 1):
                vout = Bp[bb, p, i, k]
                for j in range(min(PW, N - j0)):
                    jb = (np.int64(b_row[j0 + j]) >> (23 - tk)) & jmask
                    vout[j] = np.int32(np.uint32((np.int64(out[j]) + table[(i << tk) | jb])
                                                 & S.M32))
            if zeros[j0 // NB]:
                for j in range(min(PW, N - j0)):
                    if (b_row[j0 + j] & np.int32(S.ABS32)) >= np.int32(fc.minnorm32):
                        Bm[bb, p, k, j // W] |= MT(1) << MT(j % W)
    return Bp, Bm, st


class FloatConsts(NamedTuple):
    """fmt's constants for the FLOAT product (float_consts)."""
    sh: np.int32        # 23 - M
    half: np.int32      # (2^sh - 1) >> 1
    keep: np.int32      # ~(2^sh - 1)
    minnorm: np.int32   # fmt's smallest normal magnitude
    max_finite: np.int32
    thr: np.int32       # minnorm - q/2: the smallest magnitude that rounds to minnorm
    ovf: np.int32       # an overflow: inf (ieee), the canonical NaN (fn, fnuz)...
    ovf_sign: np.int32  # ... with the sign (inf, max) or without (NaN)
    negzero: np.int32   # a -0 result (0 in fnuz)
    nan: np.int32       # an invalid product


@functools.lru_cache(maxsize=None)
def float_consts(fc) -> FloatConsts:
    """The :class:`FloatConsts` of fmt (its ``consts``)."""
    sh = 23 - fc.man_bits
    low = (1 << sh) - 1
    # the tie below minnorm goes to minnorm (odd n = 2^M - 1 below it), or with M = 0
    # to zero (even code 0)
    thr = (np.int32(fc.minnorm32).view(np.float32)
           * np.float32(1.0 - 2.0 ** -(fc.man_bits + 1))).view(np.int32) \
        + np.int32(fc.man_bits == 0)
    none = fc.nan_kind == S.NAN_NONE
    inf = fc.ovf32 == S.INF32
    ovf = fc.max32 if none else (S.INF32 if inf else S.QNAN32)
    return FloatConsts(np.int32(sh), np.int32(low >> 1), np.int32(~low),
                       np.int32(fc.minnorm32), np.int32(fc.max32), thr, np.int32(ovf),
                       np.int32(-(1 << 31)) if (none or inf) else np.int32(0),
                       np.int32(np.uint32(fc.negzero32)), np.int32(np.uint32(fc.nan32)))


@register_jitable
def float_nb(a, b, fx):
    """S.fp_mul(a, b, fc, False) for int32 patterns of fmt values, M <= 11, no branch."""
    s = (a ^ b) & np.int32(-(1 << 31))
    ua = a & np.int32(S.ABS32)
    ub = b & np.int32(S.ABS32)
    v = as_i32(as_f32(ua) * as_f32(ub))
    # the pattern's last kept bit is the encoding's: with M = 0 (whose products of powers
    # of two are exact) only the tie below minnorm rounds, by thr
    r = (v + fx.half + ((v >> fx.sh) & 1)) & fx.keep
    res = s | r
    res = (fx.ovf | (s & fx.ovf_sign)) if r > fx.max_finite else res
    res = (s | fx.minnorm) if v < fx.minnorm else res
    zero = (ua < fx.minnorm) | (ub < fx.minnorm)
    res = (s & fx.negzero) if (zero | (v < fx.thr)) else res
    inf = (ua == np.int32(S.INF32)) | (ub == np.int32(S.INF32))
    res = (s | np.int32(S.INF32)) if inf else res
    nan = (ua > np.int32(S.INF32)) | (ub > np.int32(S.INF32)) | (inf & zero)
    return fx.nan if nan else res


@register_jitable(inline="always")
def task_span(t, nti, ntj, qt, pt, nq, npan, ia, ib):
    """Task t of a register-blocked kernel's loop over nout · nti · ntj tasks of ``qt``
    row blocks and ``pt`` panels: (output batch, A's batch, B's batch, first row block,
    row blocks, first panel, panels)."""
    bo, bi, bj = task_index(t, nti, ntj)
    q0 = bi * qt
    p0 = bj * pt
    return bo, ia[bo], ib[bo], q0, min(nq, q0 + qt) - q0, p0, min(npan, p0 + pt) - p0


@register_jitable(inline="always")
def store_tiles(C, bo, tiles, q0, nql, p0, npl):
    """C[bo] where a task's (npl, nql·QR, PW) tiles of sums fall inside it, every NaN
    the canonical NaN."""
    M, N = C.shape[1], C.shape[2]
    for p in range(npl):
        for q in range(nql):
            for r in range(QR):
                i = (q0 + q) * QR + r
                if i < M:
                    for j in range(min(PW, N - (p0 + p) * PW)):
                        v = tiles[p, q * QR + r, j]
                        C[bo, i, (p0 + p) * PW + j] = np.float32(np.nan) if v != v else v


def matmul_blocked(sh, sticky=False, emin=None, negzero=0, prod=ADD, psh=0, variants=False):
    """The register-blocked matmul: float32 accumulation for ``sh`` = 0, else the
    SCALED step onto a 23 - sh mantissa-bit grid (``emin``: the CLAMPED step for that
    smallest normal exponent, the zero's sign ``negzero``) or (``sh`` = F16) the F16 step, of emu/_kernels_acc.py
    (whose preconditions make MASKED and SKIP exact); ``sticky``: its STICKY step,
    rounded to binary16 (F16) or in place onto an E = 8 grid (called only where every
    block is CLEAN).

    ``prod`` (float32 accumulation only for FMUL and FMUL_ROUND): ADD, a pattern sum
    with one constant (c32; the modes of emu/_tiles.py); FMUL, ``exact`` where every
    product is exact in float32 (emu/_kernels_mul.py exact_ok): CLEAN blocks without
    masks (a subnormal operand's product is not zero), GENERAL (S.fp_fma per step) where
    inf/NaN occur; FMUL_ROUND, ``float`` for fmt with 23 - ``psh`` <= 11 mantissa bits:
    the modes with every product of normal operands normal in fmt after rounding (CLEAN
    and MASKED also need max |a| max |b| < max: the pattern sum plus one binade bounds
    the product; and, for the SCALED rounding (psh >= 13: one kernel for every such
    fmt), below 2^(126 - 23 + M)),
    GENERAL S.fp_mul's rule per product.  B is packed with c32 = ONE32 (b itself)
    for both.  ``variants`` (ADD): corrected PAM, B packed once per row of the table
    (matmul_prepare_b), each product a + Bp[i(a)] (matmul_variant_offsets), the modes
    with the constant between c32 + min T and c32 + max T."""
    # STICKY (E = 8) at 16 lanes: its CLEAN kernel in half tiles (the midpoint branch keeps
    # each step's sums and products live; 1024^3 on one thread 153-175 -> 110-116 ms, at 8
    # lanes half tiles are slower: 120 -> 137 ms)
    rh = QR // 2 if sticky and sh != F16 and W == 16 else QR
    mk_clean, mk_mask_a, mk_mask_b, mk_mask_ab = (
        _micro_kernel(ma, mb, sh, sticky, emin, negzero, prod, psh, variants,
                      rows=rh if not (ma or mb) else QR)
        for ma, mb in ((False, False), (True, False), (False, True), (True, True)))
    # FLUSH: a ±0 product leaves a float32 accumulator (never -0) unchanged
    flushes = prod in (ADD, FMUL_ROUND) and sh == 0 and not sticky
    mk_fl, mk_fl_a, mk_fl_b, mk_fl_ab, mk_ov, mk_ov_a, mk_ov_b, mk_ov_ab = (
        _micro_kernel(ma, mb, sh, sticky, emin, negzero, prod, psh, variants,
                      fl if flushes else 0)
        for fl in (FLUSH, FLUSH_OVF)
        for ma, mb in ((False, False), (True, False), (False, True), (True, True)))
    f32c = _F32C

    @register_jitable
    def top_of(fc):
        """FMUL_ROUND's SCALED rounding needs |product| 2^psh below float32's overflow
        (psh = 23 - M of fmt)."""
        return ((126 - (23 - fc.man_bits)) + 127) << 23 if psh >= 13 else S.INF32

    @register_jitable
    def const_range(fc, mp):
        """(lo, hi): the product lies between the pattern sums with these constants."""
        lo = hi = np.int64(mp.c32)
        if prod == FMUL_ROUND:      # the product is at least PAM's, below twice it
            lo, hi = 0, (1 << 23) + max(0, fc.max32 - top_of(fc))
        elif variants:
            lo, hi = lo + mp.table.min(), hi + mp.table.max()
        return lo, hi

    @register_jitable
    def mode_of(sa, sb, fc, lo, hi):
        """The block's mode for this kernel's product (``lo``, ``hi``: const_range)."""
        if prod == FMUL:
            return GENERAL if sa[1] >= S.INF32 or sb[1] >= S.INF32 else CLEAN
        m = tile_mode_range(sa[0], sa[1], sa[2], sb[0], sb[1], sb[2], fc, lo, hi)
        if m == MASKED:
            return _MASK_AB if sa[2] and sb[2] else (_MASK_A if sa[2] else _MASK_B)
        if m == GENERAL and flushes and prod == FMUL_ROUND:
            # products normal in float32 (so exact, M <= 11), below the SCALED rounding's
            # top; at least PAM's, below twice it
            return flush_mode(sa, sb, 0, 1 << 23, 1 << 23, top_of(fc), fc)
        if m == GENERAL and flushes:      # pattern sums that do not wrap: FLUSH(_OVF)
            return flush_mode(sa, sb, lo, hi, 0, 1 << 31, fc)
        return m

    @register_jitable
    def general(acc, a, b, fc, c32, fx):
        """One GENERAL step: the accumulator after the product of a and b (ADD: with the
        pattern sum's constant ``c32``; ``fx``: the FLOAT product's float_consts(fc))."""
        if prod == FMUL:
            return as_f32(np.int32(np.uint32(S.fp_fma(as_i32(acc), a, b, f32c))))
        if prod == FMUL_ROUND:
            return add_rnd(acc, as_f32(float_nb(np.int32(a), np.int32(np.uint32(b)), fx)))
        return add_rnd(acc, as_f32(np.int32(S.pam_sum32(np.uint32(a), np.uint32(b), fc, c32))))
    low = (1 << max(sh, 0)) - 1
    tiny = np.float32(1.5 * 2.0 ** (emin or 0))

    @register_jitable
    def add_rnd(x, y):
        """The micro-kernel's step for one product y (any value: GENERAL blocks)."""
        s = x + y
        if sticky:
            bb = s - x
            err = (x - (s - bb)) + (y - bb)
            v = np.int64(as_i32(s))
            if err > 0 or err < 0:          # inexact (a NaN error: s is ±inf)
                if (np.int64(as_i32(err)) ^ v) < 0:
                    v -= 1
                v |= 1
            if sh == F16:
                return f16_round(as_f32(np.int32(v)))
            if (v & S.ABS32) > S.INF32:
                return s                    # NaN (made canonical when C is written)
            return as_f32(np.int32((v + (low >> 1) + ((v >> sh) & 1)) & ~np.int64(low)))
        if sh == 0:
            return s
        if sh == F16:
            return f16_round(s)
        g = s if emin is None or abs(s) > tiny else (-tiny if s < 0 else tiny)
        c = g * np.float32(2.0 ** sh)
        return (s - c) + c

    @register_jitable(inline="always")       # as written in the loop: no call per tile
    def run_tile(acc, accf, p, q, modes, kc0, kc1, A, af, amf, aof, Bp, bpf, bmf, ba, bb, q0,
                 p0, K, fc, c32, one, vsh, vmask, fx, flc):
        """acc[p, q·QR:(q+1)·QR] (one QR x PW tile of the task's accumulators; ``accf`` its
        flat view, ``af``/``amf``/``aof`` A's batch's, ``bpf``/``bmf`` panel p's) after
        the products of k in [kc0, kc1), kc0 a multiple of KG: each run of groups in one
        mode one micro-kernel call, GENERAL blocks the scalar step; ``flc``:
        flush_consts(fc) for the FLUSH modes."""
        off = (p * (acc.shape[1] // QR) + q) * QR * PW
        g = kc0 // KG
        while g * KG < kc1:
            # a run of groups in the same mode is one kernel call
            m = modes[q, g]
            g1 = g + 1
            while g1 * KG < kc1 and modes[q, g1] == m:
                g1 += 1
            ka = g * KG
            nk = min(kc1, g1 * KG) - ka
            ao = (q0 + q) * QR * K + ka
            if m == CLEAN:
                for h in range(0, QR, rh):
                    mk_clean(accf, off + h * PW, bpf, ka * PW, bmf, ka * NV, af, amf, aof,
                             ao + h * K, K, nk, aof, 0, flc)
            elif m == _MASK_A:
                mk_mask_a(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
            elif m == _MASK_B:
                mk_mask_b(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
            elif m == _MASK_AB:
                mk_mask_ab(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof,
                           0, flc)
            elif flushes and m >= _FLUSH:   # (a constant: no code where no FLUSH mode)
                if m == _FLUSH:
                    mk_fl(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
                elif m == _FLUSH + 1:
                    mk_fl_a(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
                elif m == _FLUSH + 2:
                    mk_fl_b(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
                elif m == _FLUSH + 3:
                    mk_fl_ab(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
                elif m == _FLUSH_OVF:
                    mk_ov(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
                elif m == _FLUSH_OVF + 1:
                    mk_ov_a(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
                elif m == _FLUSH_OVF + 2:
                    mk_ov_b(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
                elif m == _FLUSH_OVF + 3:
                    mk_ov_ab(accf, off, bpf, ka * PW, bmf, ka * NV, af, amf, aof, ao, K, nk, aof, 0, flc)
            elif m == GENERAL:
                for r in range(QR):
                    a_row = A[ba, (q0 + q) * QR + r]
                    acc_row = acc[p, q * QR + r]
                    for k in range(ka, ka + nk):
                        b_row = Bp[bb, p0 + p, -1, k]
                        # variants: a's row of the table is its variant less the plain
                        # packing (|c32 + T| < 2^31)
                        v_row = Bp[bb, p0 + p, (a_row[k] >> vsh) & vmask, k] \
                            if variants else b_row
                        for j in range(PW):
                            b = (np.int64(b_row[j]) + one) & S.M32
                            c = c32 + np.int64(np.int32(v_row[j] - b_row[j]))
                            acc_row[j] = general(acc_row[j], a_row[k], b, fc, c, fx)
            g = g1

    @register_jitable
    def task_modes(sta, stb, ba, bb, q0, nql, bj, ng, fc, mp):
        """modes[q, g] of a task's (row block, k group) blocks against column block bj."""
        modes = np.empty((nql, ng), np.int8)
        lo, hi = const_range(fc, mp)
        for q in range(nql):
            for g in range(ng):
                modes[q, g] = mode_of(sta[ba, q0 + q, g], stb[bb, bj, g], fc, lo, hi)
        return modes

    # the lanes are in the key too: an index entry written by a process with another
    # PAMSIM_VECTOR_LANES (drop_stale's config races with concurrent processes) is
    # never taken for this one
    @njit_variant(f"sh={sh} sticky={sticky} emin={emin} negzero={negzero} prod={prod} "
                  f"psh={psh} variants={variants} lanes={W}", parallel=True)
    def kernel(A, Am, sta, Bp, Bm, stb, ia, ib, C, fc, mp, fx, Ao):
        """The matmul by the multiplier ``mp`` (emu/_scalar_mul.py MulParams; ADD: a
        pattern sum with the constant ``mp.c32``, PAM: 0, or with ``variants`` its table)
        with float32 (or SCALED) accumulation.

        A: (nA, Mq, K) int32 patterns of format values, rows padded to Mq, a multiple
        of QR; the rest from matmul_prepare_a/_b (with the same multiplier); C: (nout, M,
        N) float32; ia/ib map each output batch to its A and B batch; ``fx``:
        float_consts(fc) (read by FMUL_ROUND only); ``Ao``: matmul_variant_offsets (read
        with ``variants`` only).
        """
        nout, M, N = C.shape
        K = A.shape[2]
        nq = A.shape[1] // QR
        ng = (K + KG - 1) // KG
        npan = Bp.shape[1]
        qt = MB // QR                       # row blocks per task
        pt = NB // PW                       # panels per task
        c32 = np.int64(mp.c32)
        one = S.ONE32 - c32                 # Bp[..., -1, ...] + one is b
        vsh = np.int32(23 - mp.k)           # variants: a's top k mantissa bits
        vmask = np.int32((1 << mp.k) - 1)
        flc = float_flush_consts(fx) if prod == FMUL_ROUND else flush_consts(fc)
        nti = (nq + qt - 1) // qt
        ntj = (npan + pt - 1) // pt
        for t in prange(nout * nti * ntj):
            bo, ba, bb, q0, nql, p0, npl = task_span(t, nti, ntj, qt, pt, nq, npan, ia, ib)
            modes = task_modes(sta, stb, ba, bb, q0, nql, (p0 * PW) // NB, ng, fc, mp)
            acc = np.zeros((npl, nql * QR, PW), np.float32)
            accf = acc.reshape(-1)
            af = A[ba].reshape(-1)
            amf = Am[ba].reshape(-1)
            aof = Ao[ba if variants else 0].reshape(-1)
            for kc0 in range(0, K, KC):
                kc1 = min(K, kc0 + KC)
                for p in range(npl):
                    bpf = Bp[bb, p0 + p].reshape(-1)
                    bmf = Bm[bb, p0 + p].reshape(-1)
                    for q in range(nql):
                        run_tile(acc, accf, p, q, modes, kc0, kc1, A, af, amf, aof, Bp, bpf,
                                 bmf, ba, bb, q0, p0, K, fc, c32, one, vsh, vmask, fx, flc)
            store_tiles(C, bo, acc, q0, nql, p0, npl)

    kernel.run_tile = run_tile
    kernel.task_modes = task_modes
    return kernel


@njit(parallel=True, cache=True)
def matmul_variant_offsets(A, tk, K):
    """Ao (nA, M, K) int32: the element offset, i(a) K PW, of the B variant that the
    corrected-PAM product of each a reads (i(a): its top tk mantissa bits)."""
    na, M, Kd = A.shape
    Ao = np.empty((na, M, Kd), np.int32)
    mask = np.int32((1 << tk) - 1)
    for t in prange(na * M):
        row = A[t // M, t % M]
        out = Ao[t // M, t % M]
        for k in range(Kd):
            out[k] = ((row[k] >> (23 - tk)) & mask) * np.int32(K * PW)
    return Ao


#: the table and variant offsets of a kernel without a table (PAM, L-Mul, exact, float)
NO_TABLE = np.zeros(1, np.int64)
NO_OFFSETS = np.zeros((1, 1, 1), np.int32)
_BLOCKED = {}       # matmul_blocked kernels by their arguments


def blocked(sh=0, sticky=False, emin=None, negzero=0, prod=ADD, psh=0, variants=False):
    """The :func:`matmul_blocked` kernel of these arguments (made once).  ``psh`` only
    matters to FMUL_ROUND, and there only below 13 (the rounding on the pattern): from 13
    one kernel reads 2^psh at run time (float_flush_consts)."""
    psh = 0 if prod != FMUL_ROUND else min(psh, 13)
    key = (sh, sticky, emin, negzero, prod, psh, variants)
    if key not in _BLOCKED:
        _BLOCKED[key] = matmul_blocked(*key)
    return _BLOCKED[key]


matmul_f32acc = blocked(0)


@njit(parallel=True, cache=True)
def matmul_repeated(A, B, ia, ib, C, K, fc, fca, mp):
    """The matmul of operands constant along k (A: (batches, M, 1), B: (batches, 1, N),
    each standing for K equal terms): every output is K steps of SM.mac adding the same
    product from +0, as matmul_fmtacc.  A step that leaves the sum as it is leaves it so
    for good (the same step from the same sum), so the loop stops there: after at most
    about 2^(p+1) steps for an accumulator of p bits, whatever K."""
    nout = C.shape[0]
    M = A.shape[1]
    N = B.shape[2]
    for t in prange(nout * M):
        bo = t // M
        i = t % M
        a = np.int64(A[ia[bo], i, 0])
        for j in range(N):
            b = np.int64(B[ib[bo], 0, j])
            acc = np.int64(0)
            for _ in range(K):
                nxt = SM.mac(acc, a, b, fc, fca, mp)
                if nxt == acc:
                    break
                acc = nxt
            C[bo, i, j] = np.int32(np.uint32(acc))


@njit(parallel=True, cache=True)
def matmul_fmtacc(A, B, ia, ib, C, fc, fca, mp):
    """The matmul by any multiplier ``mp`` (emu/_scalar_mul.py's MulParams) accumulating
    in the format ``fca`` (float32 included): every step is one SM.mac, the product
    added and rounded once.  A, B, C: int32 patterns; C holds the canonical NaN."""
    nout = C.shape[0]
    M = A.shape[1]
    K = A.shape[2]
    N = B.shape[2]
    for t in prange(nout * M):
        bo = t // M
        i = t % M
        ba = ia[bo]
        bb = ib[bo]
        acc = np.zeros(N, np.int64)
        for k in range(K):
            # no skipping of ±0 products: a narrow accumulator can hold -0 (a negative
            # sum that rounds to zero), and -0 + +0 = +0
            a = np.int64(A[ba, i, k])
            for j in range(N):
                acc[j] = SM.mac(acc[j], a, B[bb, k, j], fc, fca, mp)
        for j in range(N):
            C[bo, i, j] = np.int32(np.uint32(acc[j]))

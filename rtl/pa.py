"""Piecewise-affine multiplier, divider and square root: one integer adder each
(Kosson & Jaggi).

All are combinational ``wiring.Component``s with inputs ``a``, ``b`` (the square
root: ``a`` only) and output ``y``, each a :class:`~rtl.FloatLayout` of the format,
i.e. ``width`` bits holding the format encoding.  The rules are docs/semantics.md §3,
with the encoding policy's overflow, invalid and zero results of §9 (any bias, inf or
not, NaN codes ieee/fn/fnuz/none, −0 or not); the golden models are ``emu.pam_mul`` /
``emu.pa_div`` / ``emu.pa_sqrt`` (emu/_scalar.py).
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed

import emu
from emu.multipliers import cpam_table, lmul_level

from ._float import BinaryOp, Decoded, UnaryOp, invalid_encoding, pa_overflow, signed_zero
from ._names import mul_slug

__all__ = ["PAMMultiplier", "LMulMultiplier", "PatternSumMultiplier", "PADivider", "PASqrt"]


class _PABinary(BinaryOp):
    """The shared flush/overflow/packing of the PA multiplier and divider."""

    def constant_ulps(self) -> int:
        """ULPs of the format added to the encoding sum (a pattern-sum multiplier's
        constant, emu.Multiplier.params): none for PAM and PA division."""
        return 0

    def corrections(self) -> tuple:
        """A corrected multiplier's 4^k table in ULPs (index: the operands' top k
        mantissa bits, a's first), added to the sum as a ROM output; () for none."""
        return ()

    def _start(self, sign_b: int):
        """Module, format, decoded operands, result sign (a XOR b), the integer result
        ``|a| + sign_b |b| - sign_b (bias << M)`` on the magnitude encodings, and the
        output value."""
        m = Module()
        f = self.fmt
        a, b, s = self._operands(m)
        # any bias, also 0 or negative; a multiplier's constant (L-Mul) in the same adder
        off = -sign_b * (f.bias << f.man_bits) + self.constant_ulps()
        top = (1 << (f.width - 1)) - 1                    # largest magnitude encoding
        table = self.corrections()
        lo, hi = off + min(table, default=0), off + max(table, default=0)
        r = Signal(range(min(0, -top) + min(0, lo), 2 * top + max(0, hi) + 1))
        total = (a.mag + b.mag if sign_b > 0 else a.mag - b.mag) + off
        if table:                                         # the correction ROM
            k, M = (len(table).bit_length() - 1) // 2, f.man_bits
            corr = Signal(signed(max(abs(t) for t in table).bit_length() + 1))
            rom = Array(Const(t, corr.shape()) for t in table)
            m.d.comb += corr.eq(rom[Cat(b.man[M - k:], a.man[M - k:])])
            total = total + corr
        m.d.comb += r.eq(total)
        return m, f, a, b, s, r, self.y.as_value()

    def _pack(self, m: Module, r, s, y):
        """Drive ``y`` from the wide integer result ``r`` (eqs. 8/17): flush below the
        smallest normal, overflow to inf, or max without inf (§9 rule 1)."""
        f = self.fmt
        with m.If(r < (1 << f.man_bits)):
            m.d.comb += y.eq(signed_zero(f, s))
        with m.Elif(r > f.max_encoding):
            m.d.comb += y.eq(pa_overflow(f, s))
        with m.Else():
            m.d.comb += y.eq((s << (f.width - 1)) | r[:f.width - 1])


class PAMMultiplier(_PABinary):
    """PAM multiply ``y = a ·̂ b`` (eqs. 5-8, 11-13): ``|a| + |b| - (bias << M)`` on the
    encodings, sign ``S_a XOR S_b``; exactly ``emu.pam_mul(a, b, fmt)``.

    NaN operand → NaN; inf × (zero or subnormal) → NaN; inf × x → ±inf; zero or
    subnormal operand (DAZ) → ±0; otherwise the integer sum, flushed to ±0 below
    the smallest normal and ±inf (formats without inf: ±max) on overflow.  NaNs are
    canonical; where there is no −0 (fnuz) every zero is +0 (§9).
    """

    kind = "pam_mul"

    def elaborate(self, platform):
        m, f, a, b, s, r, y = self._start(+1)
        with m.If(a.is_nan | b.is_nan | (a.is_inf & b.is_sub) | (b.is_inf & a.is_sub)):
            m.d.comb += y.eq(invalid_encoding(f))
        with m.Elif(a.is_inf | b.is_inf):                 # never true without inf
            m.d.comb += y.eq(pa_overflow(f, s))
        with m.Elif(a.is_sub | b.is_sub):
            m.d.comb += y.eq(signed_zero(f, s))
        with m.Else():
            self._pack(m, r, s, y)
        return m


class LMulMultiplier(PAMMultiplier):
    """L-Mul (Luo & Sun 2024): PAM with ``2^-l(M)`` added to the mantissa sum, one more
    constant in the same adder; exactly ``emu.mul(a, b, fmt, mul="lmul")`` (a positive
    constant can carry into the exponent and overflow where PAM does not)."""

    kind = "lmul"

    def constant_ulps(self) -> int:
        f = self.fmt
        return 1 << (f.man_bits - lmul_level(f.man_bits))


class PatternSumMultiplier(PAMMultiplier):
    """Any pattern-sum multiplier of emu's registry (docs/semantics.md §11): PAM's
    adder with the constant ``C`` of ``pam±N``/``lmul±N`` and, for ``cpamK-*``, a ROM of
    the 4^K corrections indexed by the top K mantissa bits of ``a`` and ``b``; exactly
    ``emu.mul(a, b, fmt, mul)``.  ``module_name``: ``{slug}_mul_{fmt}``."""

    def __init__(self, fmt, mul="pam"):
        self.mul = emu.multiplier(mul)
        if self.mul.kind not in ("pam", "lmul", "cpam"):
            raise ValueError(f"mul={str(self.mul)!r} is not a pattern-sum multiplier "
                             "(pam, lmul, their offsets, cpam)")
        super().__init__(fmt)
        self.mul.params(self.fmt)                         # ValueError: no table for fmt
        self.kind = f"{mul_slug(self.mul)}_mul"

    def constant_ulps(self) -> int:
        f, m = self.fmt, self.mul
        lm = 1 << (f.man_bits - lmul_level(f.man_bits)) if m.kind == "lmul" else 0
        return m.offset + lm

    def corrections(self) -> tuple:
        m = self.mul
        if m.kind != "cpam":
            return ()
        return m.table if isinstance(m.table, tuple) else cpam_table(self.fmt.man_bits, m.k,
                                                                     m.table)


class PADivider(_PABinary):
    """PA division ``y = a ÷̂ b`` (eqs. 14-17): ``|a| - |b| + (bias << M)`` on the
    encodings; exactly ``emu.pa_div(a, b, fmt)``.

    In order: NaN → NaN; inf/inf → NaN; inf/x → ±inf; x/inf → ±0; 0/0 → NaN (zero
    includes subnormals); x/0 → the overflow value where the format has one without
    NaN (±inf, or ±max in ``none`` formats), NaN in ``fn``/``fnuz`` (§9 rule 2); 0/x →
    ±0; otherwise the integer difference with the multiplier's flush and overflow
    rules.  "NaN" is −0 in formats without NaN (§9 rule 3).
    """

    kind = "pa_div"

    def elaborate(self, platform):
        m, f, a, b, s, r, y = self._start(-1)
        nan = invalid_encoding(f)
        with m.If(a.is_nan | b.is_nan | (a.is_inf & b.is_inf)):
            m.d.comb += y.eq(nan)
        with m.Elif(a.is_inf):
            m.d.comb += y.eq(pa_overflow(f, s))
        with m.Elif(b.is_inf):
            m.d.comb += y.eq(signed_zero(f, s))
        with m.Elif(b.is_sub):
            if f.nan in ("fn", "fnuz"):
                m.d.comb += y.eq(nan)
            else:
                m.d.comb += y.eq(Mux(a.is_sub, nan, pa_overflow(f, s)))
        with m.Elif(a.is_sub):
            m.d.comb += y.eq(signed_zero(f, s))
        with m.Else():
            self._pack(m, r, s, y)
        return m


class PASqrt(UnaryOp):
    """PA square root ``y = pasqrt(a) = paexp2(palog2(a) / 2)`` (eq. 20); exactly
    ``emu.pa_sqrt(a, fmt)``.

    On the encodings the root is ``(bias << M) + (|a| - (bias << M)) / 2``, i.e.
    ``u = (|a| + (bias << M)) / 2``: one adder and a shift.  An odd sum leaves exactly
    half an ulp, rounded to the even result (RNE).  NaN, or a negative operand other
    than ±0 → NaN (−0 in formats without NaN); ±0 and subnormals (DAZ) → ±0 (+0 where
    there is no −0); +inf → +inf.

    The root of a normal number lies between it and 1.0, so where 1.0 is a normal
    number (every catalog format) nothing flushes or overflows.  Other biases get the
    two ends of ``round_to_fmt`` (emu/_scalar.py), built only where they can occur:
    above the largest finite encoding the PA overflow value (±inf, or ±max); below the
    smallest normal, the root rounds on the subnormal grid, whose quantum is two units
    of ``u`` in the binade under ``emin``, so ``u >= 2^M - 1`` still gives the smallest
    normal and anything less flushes to +0.
    """

    kind = "pa_sqrt"

    def elaborate(self, platform):
        m = Module()
        f = self.fmt
        M = f.man_bits
        a = Decoded(m, self.a, f, "a")
        y = self.y.as_value()
        base = f.bias << M
        total = Signal(range(min(0, base), (1 << (f.width - 1)) + max(0, base)))   # 2u
        m.d.comb += total.eq(a.mag + base)
        half = total >> 1
        root = Signal(range(min(0, base), (1 << (f.width - 1)) + max(0, base)))    # RNE(u)
        m.d.comb += root.eq(half + (total[0] & half[0]))
        with m.If(a.is_nan | (a.sign & ~a.is_sub)):
            m.d.comb += y.eq(invalid_encoding(f))
        with m.Elif(a.is_sub):
            m.d.comb += y.eq(signed_zero(f, a.sign))
        with m.Elif(a.is_inf):                           # +inf; never true without inf
            m.d.comb += y.eq(pa_overflow(f, 0))
        if base < 1 << M:                                # 1.0 below the smallest normal
            with m.Elif(total < (2 << M) - 2):
                m.d.comb += y.eq(0)
            with m.Elif(total < 2 << M):
                m.d.comb += y.eq(1 << M)
        if base > f.max_encoding:                        # 1.0 above the largest finite
            with m.Elif(root > f.max_encoding):
                m.d.comb += y.eq(pa_overflow(f, 0))
        with m.Else():
            m.d.comb += y.eq(root)
        return m

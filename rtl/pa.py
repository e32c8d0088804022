"""Piecewise-affine multiplier, divider and square root: one integer adder each
(Kosson & Jaggi).

All are combinational ``wiring.Component``s with inputs ``a``, ``b`` (the square
root: ``a`` only) and output ``y``, each a :class:`~rtl.FloatLayout` of the format,
i.e. ``width`` bits holding the format encoding.  The rules are docs/semantics.md §3;
the golden models are ``emu.pam_mul`` / ``emu.pa_div`` / ``emu.pa_sqrt`` (emu/_scalar.py).
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed

from ._float import BinaryOp, Decoded, UnaryOp

__all__ = ["PAMMultiplier", "PADivider", "PASqrt"]


class _PABinary(BinaryOp):
    """The shared flush/overflow/packing of the PA multiplier and divider."""

    def _start(self, integer_op):
        """Module, format, decoded operands, result sign (a XOR b), the signed integer
        result ``integer_op(a, b, fmt)`` on the magnitudes, and the output value."""
        m = Module()
        f = self.fmt
        a, b, s = self._operands(m)
        r = Signal(signed(f.width + 1))
        m.d.comb += r.eq(integer_op(a, b, f))
        return m, f, a, b, s, r, self.y.as_value()

    def _pack(self, m: Module, r, s, y):
        """Drive ``y`` from the wide integer result ``r`` (eqs. 8/17): flush below the
        smallest normal, overflow to inf (IEEE) or max (fn, saturate)."""
        f = self.fmt
        sign = s << (f.width - 1)
        with m.If(r < (1 << f.man_bits)):
            m.d.comb += y.eq(sign)
        with m.Elif(r > f.max_encoding):
            m.d.comb += y.eq(sign | (f.inf_encoding if f.has_inf else f.max_encoding))
        with m.Else():
            m.d.comb += y.eq(sign | r[:f.width - 1])


class PAMMultiplier(_PABinary):
    """PAM multiply ``y = a ·̂ b`` (eqs. 5-8, 11-13): ``|a| + |b| - (bias << M)`` on the
    encodings, sign ``S_a XOR S_b``; exactly ``emu.pam_mul(a, b, fmt)``.

    NaN operand → NaN; inf × (zero or subnormal) → NaN; inf × x → ±inf; zero or
    subnormal operand (DAZ) → ±0; otherwise the integer sum, flushed to ±0 below
    the smallest normal and ±inf (fn formats: ±max) on overflow.  NaNs are canonical.
    """

    kind = "pam_mul"

    def elaborate(self, platform):
        m, f, a, b, s, r, y = self._start(lambda a, b, f: a.mag + b.mag - (f.bias << f.man_bits))
        with m.If(a.is_nan | b.is_nan | (a.is_inf & b.is_sub) | (b.is_inf & a.is_sub)):
            m.d.comb += y.eq(f.nan_encoding)
        with m.Elif(a.is_inf | b.is_inf):                 # never true in fn formats
            m.d.comb += y.eq((s << (f.width - 1)) | (f.inf_encoding or 0))
        with m.Elif(a.is_sub | b.is_sub):
            m.d.comb += y.eq(s << (f.width - 1))
        with m.Else():
            self._pack(m, r, s, y)
        return m


class PADivider(_PABinary):
    """PA division ``y = a ÷̂ b`` (eqs. 14-17): ``|a| - |b| + (bias << M)`` on the
    encodings; exactly ``emu.pa_div(a, b, fmt)``.

    In order: NaN → NaN; inf/inf → NaN; inf/x → ±inf; x/inf → ±0; 0/0 → NaN (zero
    includes subnormals); x/0 → ±inf (fn formats: NaN); 0/x → ±0; otherwise the
    integer difference with the multiplier's flush and overflow rules.
    """

    kind = "pa_div"

    def elaborate(self, platform):
        m, f, a, b, s, r, y = self._start(lambda a, b, f: a.mag - b.mag + (f.bias << f.man_bits))
        signed_zero = s << (f.width - 1)
        with m.If(a.is_nan | b.is_nan | (a.is_inf & b.is_inf)):
            m.d.comb += y.eq(f.nan_encoding)
        with m.Elif(a.is_inf):
            m.d.comb += y.eq(signed_zero | (f.inf_encoding or 0))
        with m.Elif(b.is_inf):
            m.d.comb += y.eq(signed_zero)
        with m.Elif(b.is_sub):
            if f.has_inf:
                m.d.comb += y.eq(Mux(a.is_sub, f.nan_encoding, signed_zero | f.inf_encoding))
            else:                                         # fn formats have no inf
                m.d.comb += y.eq(f.nan_encoding)
        with m.Elif(a.is_sub):
            m.d.comb += y.eq(signed_zero)
        with m.Else():
            self._pack(m, r, s, y)
        return m


class PASqrt(UnaryOp):
    """PA square root ``y = pasqrt(a) = paexp2(palog2(a) / 2)`` (eq. 20); exactly
    ``emu.pa_sqrt(a, fmt)``.

    On the encodings the root is ``(bias << M) + (|a| - (bias << M)) / 2``, i.e.
    ``(|a| + (bias << M)) / 2``: one adder and a shift.  An odd sum leaves exactly half
    an ulp, rounded to the even result (RNE).  NaN, or a negative operand other than
    ±0 → NaN; ±0 and subnormals (DAZ) → ±0; +inf → +inf.  The root of a normal
    number is normal and finite, so nothing flushes or overflows.
    """

    kind = "pa_sqrt"

    def elaborate(self, platform):
        m = Module()
        f = self.fmt
        a = Decoded(m, self.a, f, "a")
        y = self.y.as_value()
        total = Signal(f.width)                           # |a| + (bias << M) < 2^width
        m.d.comb += total.eq(a.mag + (f.bias << f.man_bits))
        half = total[1:]
        with m.If(a.is_nan | (a.sign & ~a.is_sub)):
            m.d.comb += y.eq(f.nan_encoding)
        with m.Elif(a.is_sub):
            m.d.comb += y.eq(a.sign << (f.width - 1))
        with m.Elif(a.is_inf):                           # +inf; never true in fn formats
            m.d.comb += y.eq(f.inf_encoding or 0)
        with m.Else():
            m.d.comb += y.eq(half + (total[0] & half[0]))
        return m

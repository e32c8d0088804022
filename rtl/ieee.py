"""IEEE 754 adder (the accumulator) and multiplier (the baseline PAM is compared to).

Combinational ``wiring.Component``s with ports ``a``, ``b`` and ``y`` as
:class:`~rtl.FloatLayout`.  Semantics: docs/semantics.md §4 (``emu.fp_add``,
``emu.fp_mul``), §5 (the narrow accumulator of ``emu.pam_matmul``) and §9 (every
encoding policy: overflow to ±inf, NaN or ±max, invalid results, no −0 in fnuz).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._float import (BinaryOp, Decoded, FloatLayout, as_format, drive_rounded,
                     invalid_encoding, rounded_overflow, round_pack, signed_zero)

__all__ = ["FloatAdder", "FloatMultiplier"]

_GUARD = 3   # guard, round and sticky positions below the wider operand's significand


class FloatAdder(wiring.Component):
    """``y = a + b`` correctly rounded (RNE) into ``fmt``, subnormals kept (IEEE 754).

    Equals numpy float32 ``+`` for float32 and ``emu.fp_add(a, b, fmt)`` for any
    format: ``x + (-x) = +0``, ``(-0) + (-0) = -0``, ``inf - inf = NaN``, overflow →
    ±inf (fn, fnuz formats: NaN; none: ±max), canonical NaNs (none: −0).

    ``b_fmt`` lets operand ``b`` come from another format (default ``fmt``): the sum
    of the exact operands is rounded once into ``fmt``.  This is the accumulator of
    :class:`~rtl.PAMMac` (``a`` the accumulator in the accumulation format, ``b`` a
    PAM product in the input format; docs/semantics.md §5).  ``b_daz=True`` reads a
    subnormal ``b`` as zero; a PAM product is never subnormal, so that is exact there.

    Datapath: the operand with the larger exponent field is aligned against (ties:
    ``a``), the other one is shifted right into a window ``_GUARD`` bits below the
    wider significand and every bit shifted further out is OR-ed into the lowest
    window bit (a sticky bit), the signed sum is taken in magnitude, and
    :func:`~rtl._float.round_pack` normalises and rounds.  The sticky bit cannot
    change a rounding decision because every rounding boundary near the sum is a
    multiple of two window units; that holds when the aligned-against operand is
    normalised, and for a subnormal one as long as its format's subnormal grid is
    not finer than 4 window units below ``fmt``'s — checked at construction.
    """

    kind = "fp_add"

    def __init__(self, fmt, *, b_fmt=None, b_daz: bool = False):
        self.fmt = as_format(fmt, "fmt")
        self.b_fmt = self.fmt if b_fmt is None else as_format(b_fmt, "b_fmt")
        if not isinstance(b_daz, bool):
            raise TypeError(f"b_daz must be a bool, got {b_daz!r}")
        self.b_daz = b_daz
        self._sig_bits = max(self.fmt.man_bits, self.b_fmt.man_bits) + 1
        if not b_daz and self.b_fmt.emin - self._sig_bits > self.fmt.emin - self.fmt.man_bits:
            raise ValueError(
                f"FloatAdder: a subnormal b (b_fmt={self.b_fmt.name}) can be the operand the "
                f"other is aligned against, and rounding into fmt={self.fmt.name} then needs bits "
                "below the alignment window; this adder does not normalise subnormal operands. "
                "Pass b_daz=True if b is never subnormal (e.g. a PAM product), or use a b_fmt "
                "whose smallest subnormal is within the significand width of fmt's")
        super().__init__({"a": In(FloatLayout(self.fmt)), "b": In(FloatLayout(self.b_fmt)),
                          "y": Out(FloatLayout(self.fmt))})

    @property
    def module_name(self) -> str:
        if self.b_fmt == self.fmt:
            return f"{self.kind}_{self.fmt.name}"
        return f"{self.kind}_{self.fmt.name}_{self.b_fmt.name}" + ("_daz" if self.b_daz else "")

    def elaborate(self, platform):
        m = Module()
        f, P, G = self.fmt, self._sig_bits, _GUARD
        a = Decoded(m, self.a, f, "a")
        b = Decoded(m, self.b, self.b_fmt, "b")
        # significands on a common P-bit scale: bit P-1 has weight 2^e
        sig_a = Signal(P)
        sig_b = Signal(P)
        m.d.comb += [sig_a.eq(a.sig << (P - 1 - f.man_bits)),
                     sig_b.eq(b.sig << (P - 1 - self.b_fmt.man_bits))]
        if self.b_daz:
            with m.If(b.is_sub):
                m.d.comb += sig_b.eq(0)
        d = Signal(signed(max(len(a.e), len(b.e)) + 2))
        m.d.comb += d.eq(a.e - b.e)
        a_big = d >= 0
        big_sig, small_sig = Signal(P), Signal(P)
        big_e = Signal(range(min(f.emin, self.b_fmt.emin), max(f.emax, self.b_fmt.emax) + 2))
        big_sign, small_sign = Signal(), Signal()
        shift = Signal(range(P + G + 1))
        dist = Mux(a_big, d, -d)
        m.d.comb += [big_sig.eq(Mux(a_big, sig_a, sig_b)), small_sig.eq(Mux(a_big, sig_b, sig_a)),
                     big_e.eq(Mux(a_big, a.e, b.e)),
                     big_sign.eq(Mux(a_big, a.sign, b.sign)),
                     small_sign.eq(Mux(a_big, b.sign, a.sign)),
                     shift.eq(Mux(dist > P + G, P + G, dist))]
        # align: shift the smaller-exponent significand into the window, jam the rest
        window = Cat(Const(0, G), small_sig)                  # P + G bits
        aligned = Signal(P + G)
        back = Signal(range(P + G + 1))                       # shifts the lost bits back in view
        m.d.comb += back.eq(P + G - shift)
        sticky = (window << back)[:P + G] != 0
        m.d.comb += aligned.eq((window >> shift) | sticky)
        big = Cat(Const(0, G), big_sig)
        total = Signal(signed(P + G + 2))
        m.d.comb += total.eq(Mux(big_sign ^ small_sign, big - aligned, big + aligned))
        R = Signal(P + G + 1)
        m.d.comb += R.eq(Mux(total < 0, -total, total))
        e_top = Signal.like(big_e)   # weight of R's top bit: one above big's leading bit
        m.d.comb += e_top.eq(big_e + 1)
        e_lo = min(f.emin, self.b_fmt.emin) + 1
        e_hi = max(f.emax, self.b_fmt.emax) + 2
        enc, zero, overflow = round_pack(m, R, e_top, (e_lo, e_hi), f, "rnd")
        sign = Mux(total < 0, small_sign, big_sign)
        drive_rounded(m, self.y.as_value(), f, [
            (a.is_nan | b.is_nan | (a.is_inf & b.is_inf & (a.sign != b.sign)),
             invalid_encoding(f)),
            (a.is_inf | b.is_inf,                             # inf rounded into fmt
             rounded_overflow(f, Mux(a.is_inf, a.sign, b.sign))),
            (R == 0, signed_zero(f, a.sign & b.sign)),        # exact zero: -0 only for -0 + -0
            (zero, signed_zero(f, sign)),                     # rounded to zero: keeps its sign
        ], sign, enc, overflow)
        return m


class FloatMultiplier(BinaryOp):
    """``y = a × b`` correctly rounded (RNE) into ``fmt`` with **subnormals flushed**:
    subnormal operands read as zero (DAZ) and results below the smallest normal
    become ±0 after rounding on the format's grid (FTZ) — the cheap hardware
    multiplier, exactly ``emu.fp_mul(a, b, fmt, subnormals=False)``.

    The baseline that costs/ compares PAM against: like PAM it never sees or makes a
    subnormal, so the two differ only in the significand multiplier and rounding.
    NaN → NaN; inf × (zero or subnormal) → NaN; inf × x → ±inf; overflow → ±inf
    (fn, fnuz formats: NaN; none: ±max).  NaNs are canonical (none: −0); zeros are
    +0 where there is no −0.
    """

    kind = "fp_mul"

    def elaborate(self, platform):
        m = Module()
        f = self.fmt
        M = f.man_bits
        a, b, s = self._operands(m)
        prod = Signal(2 * M + 2)                   # in [2^2M, 2^(2M+2)) for normal operands
        m.d.comb += prod.eq(a.sig * b.sig)
        e_top = Signal(range(2 * f.emin + 1, 2 * f.emax + 4))
        m.d.comb += e_top.eq(a.e + b.e + 1)
        enc, zero, overflow = round_pack(m, prod, e_top, (2 * f.emin + 1, 2 * f.emax + 3), f,
                                         "rnd", ftz=True, lzc_limit=1)
        drive_rounded(m, self.y.as_value(), f, [
            (a.is_nan | b.is_nan | (a.is_inf & b.is_sub) | (b.is_inf & a.is_sub),
             invalid_encoding(f)),
            (a.is_inf | b.is_inf, rounded_overflow(f, s)),     # never true without inf
            (a.is_sub | b.is_sub | zero, signed_zero(f, s)),
        ], s, enc, overflow)
        return m

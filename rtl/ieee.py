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
                     invalid_encoding, lzc, rounded_overflow, round_pack, signed_zero,
                     wide_format)

__all__ = ["FloatAdder", "FloatMultiplier", "ExactMultiplier", "ExactProduct",
           "exact_product_format"]

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
        if not b_daz and not self.takes_subnormal_b(self.fmt, self.b_fmt):
            raise ValueError(
                f"FloatAdder: a subnormal b (b_fmt={self.b_fmt.name}) can be the operand the "
                f"other is aligned against, and rounding into fmt={self.fmt.name} then needs bits "
                "below the alignment window; this adder does not normalise subnormal operands. "
                "Pass b_daz=True if b is never subnormal (e.g. a PAM product), or use a b_fmt "
                "whose smallest subnormal is within the significand width of fmt's")
        super().__init__({"a": In(FloatLayout(self.fmt)), "b": In(FloatLayout(self.b_fmt)),
                          "y": Out(FloatLayout(self.fmt))})

    @staticmethod
    def takes_subnormal_b(fmt, b_fmt) -> bool:
        """Whether ``FloatAdder(fmt, b_fmt=b_fmt)`` rounds subnormal ``b`` operands
        exactly (else it needs ``b_daz=True``; see the class docstring)."""
        sig_bits = max(fmt.man_bits, b_fmt.man_bits) + 1
        return b_fmt.emin - sig_bits <= fmt.emin - fmt.man_bits

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


class ExactMultiplier(BinaryOp):
    """``y = a × b`` correctly rounded (RNE) into ``fmt``, **subnormals kept** (operands
    and results): exactly ``emu.mul(a, b, fmt, "exact")`` = ``emu.fp_mul(a, b, fmt)``.
    NaN, inf × 0 → NaN; inf × x (x subnormal too) → the rounded overflow of inf."""

    kind = "exact_mul"

    def elaborate(self, platform):
        m = Module()
        f = self.fmt
        M = f.man_bits
        a, b, s = self._operands(m)
        a_zero, b_zero = a.is_sub & (a.man == 0), b.is_sub & (b.man == 0)
        prod = Signal(2 * M + 2)
        m.d.comb += prod.eq(a.sig * b.sig)
        e_top = Signal(range(2 * f.emin + 1, 2 * f.emax + 4))
        m.d.comb += e_top.eq(a.e + b.e + 1)
        enc, zero, overflow = round_pack(m, prod, e_top, (2 * f.emin + 1, 2 * f.emax + 3), f,
                                         "rnd")
        drive_rounded(m, self.y.as_value(), f, [
            (a.is_nan | b.is_nan | (a.is_inf & b_zero) | (b.is_inf & a_zero),
             invalid_encoding(f)),
            (a.is_inf | b.is_inf, rounded_overflow(f, s)),
            (a_zero | b_zero | zero, signed_zero(f, s)),
        ], s, enc, overflow)
        return m


def exact_product_format(fmt):
    """The :class:`~rtl._float.WideFormat` holding every exact product of two values
    of ``fmt`` (subnormals included) as a normal number: 2M + 1 mantissa bits."""
    f = as_format(fmt, "fmt")
    M = f.man_bits
    return wide_format(2 * M + 1, 2 * (f.emin - M), 2 * f.emax + 1)


class ExactProduct(wiring.Component):
    """The exact product ``a · b`` of two values of ``fmt`` (subnormals kept), normalised
    into :func:`exact_product_format`: the multiplier half of the fused MAC of
    ``emu.matmul(..., mul="exact")`` (``s <- RN_acc(s + a·b)``, emu/_scalar.py
    ``fp_fma``).  NaN operand, inf × 0 → NaN; inf × x → ±inf; a zero operand → ±0 (sign
    ``S_a XOR S_b``)."""

    kind = "exact_prod"

    def __init__(self, fmt):
        self.fmt = as_format(fmt, "fmt")
        self.out_fmt = exact_product_format(self.fmt)
        super().__init__({"a": In(FloatLayout(self.fmt)), "b": In(FloatLayout(self.fmt)),
                          "y": Out(FloatLayout(self.out_fmt))})

    @property
    def module_name(self) -> str:
        return f"{self.kind}_{self.fmt.name}"

    def elaborate(self, platform):
        m = Module()
        f, w = self.fmt, self.out_fmt
        M = f.man_bits
        a = Decoded(m, self.a, f, "a")
        b = Decoded(m, self.b, f, "b")
        s = a.sign ^ b.sign
        a_zero, b_zero = a.is_sub & (a.man == 0), b.is_sub & (b.man == 0)
        prod = Signal(2 * M + 2)
        m.d.comb += prod.eq(a.sig * b.sig)
        z = lzc(m, prod, "plzc")
        norm = Signal(2 * M + 2)
        m.d.comb += norm.eq(prod << z)
        field = Signal(range(1 << w.exp_bits))
        m.d.comb += field.eq(a.e + b.e + 1 - z + w.bias)
        y = self.y.as_value()
        top = w.width - 1
        with m.If(a.is_nan | b.is_nan | (a.is_inf & b_zero) | (b.is_inf & a_zero)):
            m.d.comb += y.eq(w.nan_encoding)
        with m.Elif(a.is_inf | b.is_inf):
            m.d.comb += y.eq((s << top) | w.inf_encoding)
        with m.Elif(a_zero | b_zero):
            m.d.comb += y.eq(s << top)
        with m.Else():
            m.d.comb += y.eq(Cat(norm[:2 * M + 1], field[:w.exp_bits], s))
        return m

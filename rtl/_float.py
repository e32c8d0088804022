"""Shared datapath pieces: the float layout, operand decoding, a leading-zero counter
and the one rounding/packing block every IEEE-style unit uses.

Everything here is parameterised by :class:`emu.Format` and works on *format
encodings* (1 sign, E exponent, M mantissa bits), not float32 patterns.  The rules
implemented are docs/semantics.md §1 (encodings, canonical NaN), §2/§4 (RNE on the
format's grid, subnormals, overflow) and §9 (the encoding policies: which codes are
NaN or inf, whether −0 exists, what overflow and invalid operations give); the golden
definitions are in emu/_scalar.py.
"""
from __future__ import annotations

import numpy as np
from amaranth.hdl import Cat, Const, Mux, Module, Signal, Value, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

import emu

__all__ = ["FloatLayout", "Decoded", "FloatOp", "UnaryOp", "BinaryOp", "lzc", "round_pack",
           "as_format", "invalid_encoding", "signed_zero", "pa_overflow", "rounded_overflow",
           "WideFormat", "Widen", "wide_format", "wide_encodings"]


def as_format(spec, argname: str) -> emu.Format:
    """``emu.format`` with the argument name in the error message.  Every signed format
    (every encoding policy and bias of docs/semantics.md §9) has units; the unsigned
    scale type (``float8_e8m0fnu``) has no arithmetic (ValueError), and P3109's infinities
    (at the all-ones code) and formats without a mantissa bit have no units yet."""
    fmt = emu.format(spec, argname=argname)
    if not fmt.signed:
        raise ValueError(f"{argname}={fmt.name} is the unsigned scale type, which has no "
                         "arithmetic (docs/semantics.md §9); the RTL units take signed formats")
    if fmt.man_bits == 0 or (fmt.has_inf and fmt.nan == "fnuz"):
        raise ValueError(f"{argname}={fmt.name}: the RTL units take formats with a mantissa "
                         "bit and the ieee, fn, fnuz or none policy; P3109's extended domain "
                         "and M = 0 formats are emu-only for now (the finite domain is fnuz, "
                         "e.g. float8_e4m3fnuz)")
    return fmt


class WideFormat(emu.Format):
    """An RTL-internal IEEE-style format (inf, NaN, subnormals) that may exceed emu's
    float32 range: exact products and table results widened so that every value is
    normal, as the accumulator's ``b`` operand (:class:`~rtl.FloatAdder` with
    ``b_daz=True``).  emu's own checks (float32 range, E <= 8) are skipped."""

    def __post_init__(self):
        object.__setattr__(self, "nan", "ieee")

    @property
    def name(self) -> str:
        return f"x{self.exp_bits}m{self.man_bits}b{self.bias}".replace("-", "n")


def wide_format(man_bits: int, emin: int, emax: int) -> WideFormat:
    """The narrowest :class:`WideFormat` with ``man_bits`` mantissa bits whose normal
    exponents cover ``emin..emax``."""
    bias = 1 - emin
    exp_bits = max(2, (emax + bias + 1).bit_length())
    return WideFormat(exp_bits, man_bits, True, "ieee", bias)


class Widen(wiring.Component):
    """``y``: the value of ``a`` (an encoding of ``fmt``) as an encoding of ``wide``
    (:func:`wide_format` of fmt's mantissa bits, its subnormals' exponents and emax),
    where every value of fmt is a normal number: subnormals normalised (the leading one
    found, the mantissa shifted past it), zeros and infinities with their sign, every
    NaN as wide's canonical NaN.  What :func:`wide_encodings` gives a ROM's contents,
    as logic: the stage between an instantiated multiplier's results and an adder that
    needs them normal (``FloatAdder(b_daz=True)``)."""

    def __init__(self, fmt, wide: WideFormat):
        self.fmt, self.wide = fmt, wide
        if wide.man_bits != fmt.man_bits or wide.bias != fmt.bias + fmt.man_bits:
            raise ValueError(f"wide={wide.name} is not the widened {fmt.name}")
        super().__init__({"a": In(FloatLayout(fmt)), "y": Out(FloatLayout(wide))})

    @property
    def module_name(self) -> str:
        return f"widen_{self.fmt.name}_{self.wide.name}"

    def elaborate(self, platform):
        m = Module()
        f, w, M = self.fmt, self.wide, self.fmt.man_bits
        a = Decoded(m, self.a, f, "a")
        y = self.y.as_value()
        shift = Signal(range(M + 2))            # subnormal: past the leading one
        m.d.comb += shift.eq(lzc(m, a.man, "lz") + 1)
        top = w.width - 1
        with m.If(a.is_nan):
            m.d.comb += y.eq(w.nan_encoding)
        with m.Elif(a.is_inf):
            m.d.comb += y.eq((a.sign << top) | w.inf_encoding)
        with m.Elif(a.is_sub & (a.man == 0)):
            m.d.comb += y.eq(a.sign << top)
        field = Signal(w.exp_bits)
        with m.Elif(a.is_sub):                  # field M + 1 - shift: w.bias + emin - shift
            m.d.comb += [field.eq(M + 1 - shift), y.eq(Cat((a.man << shift)[:M], field, a.sign))]
        with m.Else():                          # w.bias = f.bias + M
            m.d.comb += [field.eq(a.exp_field + M), y.eq(Cat(a.man, field, a.sign))]
        return m


def wide_encodings(values, fmt: WideFormat) -> np.ndarray:
    """Encodings in ``fmt`` of float values that it holds exactly as normal numbers
    (or zero, inf, NaN: canonical); ValueError otherwise."""
    v = np.asarray(values, np.float64).reshape(-1)
    M = fmt.man_bits
    out = np.zeros(v.size, np.uint64)
    sign = np.signbit(v).astype(np.uint64) << np.uint64(fmt.width - 1)
    nan, inf = np.isnan(v), np.isinf(v)
    fin = ~nan & ~inf & (v != 0)
    mant, e = np.frexp(np.abs(np.where(fin, v, 1.0)))          # v = mant 2^e, mant in [0.5, 1)
    field = e - 1 + fmt.bias
    man = np.ldexp(mant, M + 1) - (1 << M)
    if fin.any() and ((field[fin] < 1) | (field[fin] > (1 << fmt.exp_bits) - 2)
                      | (man[fin] != np.floor(man[fin]))).any():
        raise ValueError(f"values outside the normal numbers of {fmt.name}")
    out[fin] = (field[fin].astype(np.uint64) << np.uint64(M)) | man[fin].astype(np.uint64)
    out[inf] = fmt.inf_encoding
    out |= np.where(nan, np.uint64(0), sign)
    out[nan] = fmt.nan_encoding
    return out


# --- the policy's special results (docs/semantics.md §9), as encodings ------------------

def invalid_encoding(fmt: emu.Format) -> int:
    """What an invalid operation gives (§9 rule 3): the canonical NaN, or −0 in a
    format without NaN (``none``)."""
    return 1 << (fmt.width - 1) if fmt.nan_encoding is None else fmt.nan_encoding


def signed_zero(fmt: emu.Format, sign: Value) -> Value:
    """The zero of ``sign``: ±0, always +0 where there is no −0 (``fnuz``, §9 rule 4)."""
    return sign << (fmt.width - 1) if fmt.has_neg_zero else Const(0, fmt.width)


def pa_overflow(fmt: emu.Format, sign: Value) -> Value:
    """A PA operation's overflow (§9 rule 1): ±inf, or ±max without inf."""
    return (sign << (fmt.width - 1)) | (fmt.inf_encoding if fmt.has_inf else fmt.max_encoding)


def rounded_overflow(fmt: emu.Format, sign: Value) -> Value:
    """A correctly rounded operation's overflow, also ``quantize`` of ±inf (§9 rules 1
    and 5): ±inf (``ieee``), NaN (``fn``, ``fnuz``), ±max (``none``)."""
    if fmt.has_inf or fmt.saturates:
        return pa_overflow(fmt, sign)
    return Const(fmt.nan_encoding, fmt.width)


def drive_rounded(m: Module, y: Value, fmt: emu.Format, specials, sign: Value, enc: Value,
                  overflow: Value) -> None:
    """Drive a correctly rounded unit's output ``y``: the value of the first of
    ``specials`` ((condition, value) pairs, in priority order) that holds, else the
    overflow of ``sign`` where ``overflow``, else ``sign`` with round_pack's ``enc``."""
    top = fmt.width - 1
    for i, (condition, value) in enumerate(specials):
        with (m.Elif if i else m.If)(condition):
            m.d.comb += y.eq(value)
    with m.Elif(overflow):
        m.d.comb += y.eq(rounded_overflow(fmt, sign))
    with m.Else():
        m.d.comb += y.eq((sign << top) | enc[:top])


class FloatLayout(data.StructLayout):
    """A value of ``fmt`` as a struct: ``man`` (M bits), ``exp`` (E bits), ``sign`` (1 bit).

    Field order is LSB first, so the flat bits are exactly the format encoding
    (emu.to_bits / emu.from_bits).
    """

    def __init__(self, fmt):
        self.fmt = as_format(fmt, "fmt")
        super().__init__({"man": unsigned(self.fmt.man_bits),
                          "exp": unsigned(self.fmt.exp_bits),
                          "sign": unsigned(1)})

    def __repr__(self):
        return f"FloatLayout({self.fmt.name})"


class Decoded:
    """Classification and unpacked fields of one operand (combinational signals).

    ``e`` is the unbiased exponent (``emin`` for exponent field 0), ``sig`` the
    significand with the hidden bit (``M + 1`` bits, hidden bit 0 for zero and
    subnormals), so a finite value is ``(-1)^sign * sig * 2^(e - M)``.
    """

    def __init__(self, m: Module, view, fmt: emu.Format, name: str):
        E, M = fmt.exp_bits, fmt.man_bits
        self.fmt = fmt
        self.sign = view.sign
        self.exp_field = view.exp
        self.man = view.man
        self.mag = Cat(view.man, view.exp)               # encoding without the sign
        all_ones = (1 << E) - 1
        self.is_nan = Signal(name=f"{name}_nan")         # the NaN codes of the policy (§9)
        self.is_inf = Signal(name=f"{name}_inf")
        if fmt.has_inf:
            m.d.comb += [self.is_nan.eq((view.exp == all_ones) & (view.man != 0)),
                         self.is_inf.eq((view.exp == all_ones) & (view.man == 0))]
        elif fmt.nan == "fn":                             # only S.1..1.1..1
            m.d.comb += self.is_nan.eq(self.mag == (1 << (E + M)) - 1)
        elif fmt.nan == "fnuz":                           # the code of −0
            m.d.comb += self.is_nan.eq(view.sign & (self.mag == 0))
        # "none": no NaN, no inf; both stay 0
        # the fnuz NaN code also has exponent field 0: every unit tests is_nan first
        self.is_sub = Signal(name=f"{name}_sub")         # zero or subnormal (exp field 0)
        m.d.comb += self.is_sub.eq(view.exp == 0)
        self.e = Signal(range(fmt.emin, fmt.emax + 2), name=f"{name}_e")
        m.d.comb += self.e.eq(Mux(view.exp == 0, fmt.emin, view.exp - fmt.bias))
        self.sig = Signal(M + 1, name=f"{name}_sig")
        m.d.comb += self.sig.eq(Cat(view.man, view.exp != 0))


class FloatOp(wiring.Component):
    """A combinational float unit of ``fmt``: input ports ``operands`` and output ``y``
    (:class:`FloatLayout`), Verilog module ``{kind}_{fmt}``."""

    kind = ""
    operands = ("a", "b")

    def __init__(self, fmt):
        self.fmt = as_format(fmt, "fmt")
        layout = FloatLayout(self.fmt)
        super().__init__({**{p: In(layout) for p in self.operands}, "y": Out(layout)})

    @property
    def module_name(self) -> str:
        return f"{self.kind}_{self.fmt.name}"


class UnaryOp(FloatOp):
    """A combinational one-operand float unit: ports ``a`` and ``y``."""

    operands = ("a",)


class BinaryOp(FloatOp):
    """A combinational two-operand float unit: ports ``a``, ``b`` and ``y``."""

    def _operands(self, m: Module):
        """The decoded operands and the result sign ``a.sign ^ b.sign``."""
        a = Decoded(m, self.a, self.fmt, "a")
        b = Decoded(m, self.b, self.fmt, "b")
        s = Signal()
        m.d.comb += s.eq(a.sign ^ b.sign)
        return a, b, s


def lzc(m: Module, v: Value, name: str, limit: int | None = None) -> Signal:
    """Leading-zero count of ``v`` (``len(v)`` when ``v == 0``) as a log-depth tree.

    ``limit`` (optional) states that a nonzero ``v`` never has more than ``limit``
    leading zeros, which lets a 1-bit normaliser (multiplier) skip the tree.
    """
    n = len(v)
    out = Signal(range(n + 1), name=name)
    if limit == 1:
        m.d.comb += out.eq(Mux(v[-1], 0, Mux(v[-2], 1, n)))
        return out
    size = 1
    while size < max(n, 2):
        size *= 2
    padded = Cat(Const(0, size - n), v)                  # zeros below: same leading zeros

    def tree(bits):
        if len(bits) == 2:
            return ~(bits[0] | bits[1]), ~bits[1]
        half = len(bits) // 2
        z_lo, c_lo = tree(bits[:half])
        z_hi, c_hi = tree(bits[half:])
        return z_hi & z_lo, Cat(Mux(z_hi, c_lo, c_hi), z_hi)

    zero, count = tree(padded)
    m.d.comb += out.eq(Mux(zero, n, count))
    return out


def _bits_for(lo: int, hi: int):
    return signed(max(lo.bit_length(), hi.bit_length()) + 1) if lo < 0 else unsigned(max(hi.bit_length(), 1))


def round_pack(m: Module, R: Value, e_top: Value, e_range: tuple[int, int], fmt: emu.Format,
               name: str, *, ftz: bool = False, lzc_limit: int | None = None):
    """Round the exact magnitude ``R * 2^(e_top - (len(R) - 1))`` into ``fmt`` (RNE).

    This is ``round_to_fmt`` of emu/_scalar.py in hardware: the quantum is the
    format's grid at the result's magnitude (the subnormal quantum below the
    smallest normal), ties go to the even significand, a carry out of the
    significand runs into the exponent.  ``e_top`` is the exponent of the weight of
    the top bit of ``R`` and lies in ``e_range`` (inclusive, used for sizing).  The
    lowest bit of ``R`` may be a sticky bit (its weight is below every rounding
    boundary the caller can reach).  Returns ``(enc, zero, overflow)``: the
    magnitude encoding (meaningful when neither flag is set), ``zero`` if the
    rounded result is 0 (``R == 0``, rounded away, or flushed with ``ftz``), and
    ``overflow`` if it exceeds the largest finite magnitude.
    """
    W = len(R)
    M = fmt.man_bits
    assert W >= M + 2, "need the significand plus a rounding bit"
    z = lzc(m, R, f"{name}_lzc", lzc_limit)
    t_lo, t_hi = e_range[0] - fmt.emin, e_range[1] - fmt.emin
    t = Signal(_bits_for(t_lo, t_hi), name=f"{name}_t")  # top bit's height above emin
    m.d.comb += t.eq(e_top - fmt.emin)
    X = Signal(W, name=f"{name}_x")                       # R shifted: hidden bit at W-1
    lost = Signal(name=f"{name}_lost")                    # nonzero bits shifted out
    shift_l = Signal(range(W + 1), name=f"{name}_shl")
    # normalise left by the leading zeros, but never below emin (subnormal grid)
    if t_hi >= 0:
        m.d.comb += shift_l.eq(Mux(t < 0, 0, Mux(z < t, z, t)) if t_lo < 0 else Mux(z < t, z, t))
    m.d.comb += X.eq((R << shift_l)[:W])
    e_res_shape = _bits_for(fmt.emin, max(e_range[1], fmt.emin) + 1)
    e_res = Signal(e_res_shape, name=f"{name}_eres")      # exponent of X's top bit
    m.d.comb += e_res.eq(e_top - shift_l)
    if t_lo < 0:
        # below the subnormal range: shift right onto the subnormal grid with sticky
        amount = Signal(range(W + 1), name=f"{name}_shr")
        back = Signal(range(W + 1), name=f"{name}_back")
        neg_t = Signal(range(-t_lo + 1), name=f"{name}_negt")
        m.d.comb += [neg_t.eq(-t), back.eq(W - amount)]
        with m.If(t < 0):
            m.d.comb += [amount.eq(Mux(neg_t > W, W, neg_t)),
                         X.eq(R >> amount),
                         lost.eq((R << back)[:W] != 0),
                         e_res.eq(fmt.emin)]
    N = X[W - 1 - M:]                                     # hidden bit + M mantissa bits
    rnd = X[W - 2 - M]
    sticky = (X[:W - 2 - M] != 0) | lost if W - 2 - M > 0 else lost
    up = rnd & (sticky | N[0])
    enc_hi = ((max(e_range[1], fmt.emin) + 1 - fmt.emin) << M) + (2 << M)
    enc = Signal(range(enc_hi + 1), name=f"{name}_enc")
    # enc = (e_res - emin) * 2^M + rounded significand: a hidden bit or a rounding
    # carry lands in the exponent field exactly as for round_to_fmt's ``enc``
    m.d.comb += enc.eq(((e_res - fmt.emin) << M) + N + up)
    zero = Signal(name=f"{name}_zero")
    overflow = Signal(name=f"{name}_ovf")
    m.d.comb += [overflow.eq(enc > fmt.max_encoding),
                 zero.eq((R == 0) | (enc == 0) | ((enc < (1 << M)) if ftz else 0))]
    return enc, zero, overflow

"""Number formats as frozen data: an encoding policy, a catalog of named formats, a parser.

A format is a sign bit (unless unsigned), ``E`` exponent bits, ``M`` mantissa bits, a
bias and an **encoding policy** (in the manner of gfloat's ``FormatInfo``):

* ``has_inf`` — whether all-ones exponent with mantissa 0 is ±inf;
* ``nan`` — how many NaN codes there are and where:
  ``"ieee"``: every all-ones-exponent code with a non-zero mantissa (``2 (2^M - 1)`` codes);
  ``"fn"``: one per sign, exponent and mantissa all ones (``ml_dtypes.float8_e4m3fn``);
  ``"fnuz"``: the single code ``1 << (width - 1)``, where −0 would be (so no −0);
  with ``has_inf`` (IEEE P3109's "extended" domain) ±inf are the all-ones codes
  ``0x7F``/``0xFF`` and the largest finite is the code below;
  ``"none"``: no NaN at all (the OCP MX element types ``float4_e2m1fn``, ``float6_*``);
* ``bias`` — ``2^(E-1) - 1`` unless given (fnuz formats default to ``2^(E-1)``, as
  ml_dtypes; ``float8_e4m3b11fnuz`` has bias 11);
* ``signed`` — False only for the MX scale type ``float8_e8m0fnu`` (no sign bit, no
  mantissa, no zero, every code ``2^(code-127)`` except the NaN 0xFF).

IEEE P3109 binary8 (``p3109_p1`` … ``p3109_p7``: precision P, ``E = 8 − P``,
``M = P − 1``, bias ``2^(E−1)``) is the fnuz policy with infinities, ``"e5m2uz"`` in the
suffix syntax; its finite domain is fnuz itself (``float8_e5m2fnuz`` is P3 finite).
``M = 0`` formats (``e7m0uz`` = P1) have no subnormals; their ties round to the even
*encoding*, as gfloat (docs/formats.md "P3109").

Derived: ``has_neg_zero`` (not fnuz, signed) and ``saturates`` (no inf and no NaN:
overflow can only give ±max).  Exponent field 0 holds zero and subnormals (except
for the unsigned scale type).  Every value of every format is a float32 value (checked
at construction), which is why emu works on float32 arrays throughout
(docs/semantics.md §1 and §9).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from fractions import Fraction
from typing import NamedTuple

__all__ = ["Format", "format", "FORMATS", "P3109_FORMATS", "NAN_POLICIES", "float32", "bfloat16", "float16",
           "float8_e5m2", "float8_e5m2fnuz", "float8_e4m3", "float8_e4m3fn",
           "float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e3m4", "float8_e8m0fnu",
           "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn"]

_ONE32 = 0x3F800000
_INF32 = 0x7F800000
_QNAN32 = 0x7FC00000
_SIGN32 = 0x80000000

#: NaN policies (see the module docstring); the index is ``FmtConsts.nan_kind``.
NAN_POLICIES = ("ieee", "fn", "fnuz", "none")
_SUFFIX = {"ieee": "", "fn": "fn", "fnuz": "fnuz", "none": "sat"}


class FmtConsts(NamedTuple):
    """Integer constants of a format handed to the Numba scalar kernels.

    ``*32`` fields are float32 bit patterns of the named value of the format.
    Fields are only ever appended (other kernels index them by name).
    """
    exp_bits: int
    man_bits: int
    has_inf: int      # 1 for IEEE-style formats, 0 for fn/fnuz/saturating formats
    emin: int         # exponent of the smallest normal, 1 - bias
    minnorm32: int    # smallest normal magnitude
    max32: int        # largest finite magnitude
    maxenc: int       # largest finite magnitude as a format encoding
    ovf32: int        # what a PA op returns on overflow: inf (IEEE) or max (no inf)
    tiny_exp2_32: int  # 2^-(M+2): below it pa_exp2(x) rounds to exactly 1
    log2e32: int      # log2(e) rounded (RNE) to the format: the constant of eqs. (18)-(19)
    nan_kind: int     # index into NAN_POLICIES: 0 ieee, 1 fn, 2 fnuz, 3 none
    negzero32: int    # pattern a -0 result takes: 0x80000000, or 0 where there is no -0 (fnuz)
    nan32: int        # what an invalid operation returns: canonical NaN, or -0 without NaN
    nanenc: int       # encoding of the canonical NaN (0 where there is none)
    ln2_32: int       # ln(2) rounded (RNE) to the format: the constant of the approximate
    #                   derivatives of paexp2 and palog2 (Table 1)


def _default_bias(exp_bits: int, nan: str) -> int:
    half = 1 << (exp_bits - 1)
    return half if nan == "fnuz" else half - 1


@dataclass(frozen=True)
class Format:
    """A binary floating-point format with an explicit encoding policy.

    ``Format(exp_bits, man_bits, has_inf=True, nan=None, bias=None, signed=True)``;
    ``nan`` defaults to ``"ieee"`` with inf and ``"fn"`` without, ``bias`` to
    ``2^(E-1) - 1`` (``2^(E-1)`` for fnuz).  Attributes mirror :class:`numpy.finfo`:
    ``max``, ``smallest_normal`` (alias ``tiny``), ``smallest_subnormal``, ``eps``,
    ``bits``, ``bias``.
    """
    exp_bits: int
    man_bits: int
    has_inf: bool = True
    nan: str | None = None
    bias: int | None = None
    signed: bool = True

    def __post_init__(self):
        if isinstance(self.exp_bits, bool) or not isinstance(self.exp_bits, int) \
                or not 1 <= self.exp_bits <= 8:
            raise ValueError(f"exp_bits must be an int in [1, 8], got {self.exp_bits!r}")
        if not isinstance(self.signed, bool):
            raise ValueError(f"signed must be a bool, got {self.signed!r}")
        if isinstance(self.man_bits, bool) or not isinstance(self.man_bits, int) \
                or not 0 <= self.man_bits <= 23:
            raise ValueError(f"man_bits must be an int in [0, 23], got {self.man_bits!r}")
        if not isinstance(self.has_inf, bool):
            raise ValueError(f"has_inf must be a bool, got {self.has_inf!r}")
        if self.nan is None:
            object.__setattr__(self, "nan", "ieee" if self.has_inf else "fn")
        if self.nan not in NAN_POLICIES:
            raise ValueError(f"nan must be one of {NAN_POLICIES}, got {self.nan!r}")
        if self.has_inf and self.nan not in ("ieee", "fnuz"):
            raise ValueError(f"has_inf=True needs nan='ieee' (inf at the all-ones exponent) "
                             f"or nan='fnuz' (P3109: inf at the all-ones code); got "
                             f"nan={self.nan!r}")
        if self.nan == "ieee" and not (self.has_inf and self.man_bits >= 1
                                       and self.exp_bits >= 2):
            raise ValueError(f"nan='ieee' needs has_inf=True, man_bits >= 1 (its NaNs are "
                             "the non-zero mantissas) and exp_bits >= 2; got "
                             f"has_inf={self.has_inf}, exp_bits={self.exp_bits}, "
                             f"man_bits={self.man_bits}")
        if not self.signed and (self.man_bits != 0 or self.nan != "fn"):
            raise ValueError("an unsigned format is an E8M0-style scale: man_bits=0, "
                             f"nan='fn', has_inf=False; got man_bits={self.man_bits}, "
                             f"nan={self.nan!r}")
        if self.bias is None:
            object.__setattr__(self, "bias", _default_bias(self.exp_bits, self.nan))
        if isinstance(self.bias, bool) or not isinstance(self.bias, int):
            raise ValueError(f"bias must be an int, got {self.bias!r}")
        # every value must be a float32 value: emu's arrays are float32
        if self.max_encoding < 1:
            raise ValueError(f"e{self.exp_bits}m{self.man_bits} with nan={self.nan!r} has no "
                             "positive finite value")
        if self.emax > 127 or self.emin - self.man_bits < -149:
            raise ValueError(f"{self.name} spans 2^{self.emin - self.man_bits}..2^{self.emax}, "
                             "beyond float32's 2^-149..2^127 (fn formats need exp_bits <= 7)")

    # -- the policy ---------------------------------------------------------------
    @property
    def has_neg_zero(self) -> bool:
        """Whether −0 exists (fnuz formats put their NaN there; unsigned has no zero)."""
        return self.signed and self.nan != "fnuz"

    @property
    def saturates(self) -> bool:
        """Whether overflow gives ±max by default: neither inf nor NaN to give."""
        return self.nan == "none"

    @property
    def nan_codes(self) -> int:
        """How many encodings are NaN."""
        return {"ieee": 2 * ((1 << self.man_bits) - 1), "fn": 2 if self.signed else 1,
                "fnuz": 1, "none": 0}[self.nan]

    # -- derived integer facts ------------------------------------------------
    @property
    def width(self) -> int:
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def bits(self) -> int:
        """Alias of width, as in numpy.finfo."""
        return self.width

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number (exponent field 1; 0 unsigned)."""
        return (1 if self.signed else 0) - self.bias

    @property
    def _top_code_special(self) -> bool:
        """Whether the all-ones code (per sign) alone is special: NaN (fn), inf (P3109)."""
        return self.nan == "fn" or (self.nan == "fnuz" and self.has_inf)

    @property
    def _top_finite_field(self) -> int:
        top = (1 << self.exp_bits) - 1          # all-ones exponent field
        if self.nan == "ieee" or (self._top_code_special and self.man_bits == 0):
            return top - 1
        return top

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number."""
        return self._top_finite_field - self.bias

    @property
    def max_encoding(self) -> int:
        """Encoding (sign 0) of the largest finite magnitude."""
        ones = (1 << self.man_bits) - 1
        man = ones - 1 if (self._top_code_special and self.man_bits) else ones
        return (self._top_finite_field << self.man_bits) | man

    @property
    def inf_encoding(self) -> int | None:
        """Encoding of +inf, or None for formats without inf: the all-ones exponent
        (IEEE), the all-ones code (P3109)."""
        if not self.has_inf:
            return None
        top = ((1 << self.exp_bits) - 1) << self.man_bits
        return top if self.nan == "ieee" else top | ((1 << self.man_bits) - 1)

    @property
    def nan_encoding(self) -> int | None:
        """The canonical NaN emu produces: IEEE: sign 0, quiet bit set; fn: all ones
        (sign 0); fnuz: the −0 code; None for formats without NaN."""
        top = ((1 << self.exp_bits) - 1) << self.man_bits
        if self.nan == "ieee":
            return top | (1 << (self.man_bits - 1))
        if self.nan == "fn":
            return top | ((1 << self.man_bits) - 1)
        if self.nan == "fnuz":
            return 1 << (self.width - 1)
        return None

    # -- numpy.finfo-like values ----------------------------------------------
    @cached_property
    def max(self) -> float:
        man = self.max_encoding & ((1 << self.man_bits) - 1)
        return float(Fraction((1 << self.man_bits) + man)
                     * Fraction(2) ** (self.emax - self.man_bits))

    @cached_property
    def smallest_normal(self) -> float:
        return float(Fraction(2) ** self.emin)

    @property
    def tiny(self) -> float:
        """Alias of smallest_normal, as in numpy.finfo."""
        return self.smallest_normal

    @cached_property
    def smallest_subnormal(self) -> float:
        return float(Fraction(2) ** (self.emin - (self.man_bits if self.signed else 0)))

    @cached_property
    def eps(self) -> float:
        return float(Fraction(2) ** -self.man_bits)

    # -- names ------------------------------------------------------------------
    @property
    def name(self) -> str:
        for catalog in (FORMATS, P3109_FORMATS):
            for name, fmt in catalog.items():
                if fmt == self:
                    return name
        bias = "" if self.bias == _default_bias(self.exp_bits, self.nan) else f"b{self.bias}"
        suffix = "uz" if self.nan == "fnuz" and self.has_inf else _SUFFIX[self.nan]
        suffix = suffix if self.signed else "fnu"
        return f"e{self.exp_bits}m{self.man_bits}{bias}{suffix}"

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Format({self.name})"

    @property
    def consts(self) -> FmtConsts:
        """Integer constants for the scalar kernels (see emu/_scalar.py).

        Raises ValueError for the unsigned scale type, which has no arithmetic:
        emu quantizes, encodes and decodes it (docs/semantics.md §9).
        """
        return _consts(self.arithmetic())

    def arithmetic(self, argname: str = "fmt") -> "Format":
        """The format itself, or a ValueError naming ``argname`` for the unsigned scale
        type, which has no arithmetic (operands, accumulators)."""
        if not self.signed:
            raise ValueError(f"{argname}={self.name} is a scale format without sign, mantissa "
                             "or zero: only quantize, to_bits, from_bits and the MX functions "
                             "accept it")
        return self

    def accumulator(self, argname: str = "acc") -> "Format":
        """The format as an accumulator (its :meth:`arithmetic`), or a ValueError naming
        ``argname`` for an ``M = 0`` format: sums are rounded in float32-pattern space,
        where ties to even need a mantissa bit (docs/semantics.md §1)."""
        self.arithmetic(argname)
        if self.man_bits == 0:
            raise ValueError(f"{argname}={self.name} has no mantissa bit: an accumulator "
                             "needs man_bits >= 1 (M = 0 formats are operand formats)")
        return self


def _f32_pattern(value: Fraction) -> int:
    """Float32 bit pattern of a positive value that float32 represents exactly."""
    import numpy as np
    pattern = int(np.array([float(value)], dtype=np.float32).view(np.uint32)[0])
    assert Fraction(float(np.array([pattern], np.uint32).view(np.float32)[0])) == value
    return pattern


# log2(e) to 40 significant decimal digits: far more than the 25 bits any rounding needs.
_LOG2E = Fraction("1.442695040888963407359924681001892137427")


def _round_nearest_even(value: Fraction, man_bits: int) -> Fraction:
    """Round a value in [1, 2) to ``man_bits`` fraction bits, ties to even."""
    assert 1 <= value < 2
    scaled = value * (1 << man_bits)
    n = round(scaled)                       # Fraction.__round__ rounds half to even
    return Fraction(n, 1 << man_bits)


# ln(2) to 40 significant digits: far more than any rounding to <= 24 bits needs
_LN2 = Fraction("0.6931471805599453094172321214581765680755")


def _ln2(fmt: Format) -> Fraction:
    """ln(2) rounded (RNE) to ``fmt``: a subnormal where 2^-1 is below its smallest normal."""
    quantum = Fraction(2) ** (max(-1, fmt.emin) - fmt.man_bits)   # ln2 = 2^-1 (1.386...)
    return round(_LN2 / quantum) * quantum                         # Fraction: ties to even


_CONSTS_CACHE: dict = {}


def _consts(fmt: Format) -> FmtConsts:
    c = _CONSTS_CACHE.get(fmt)
    if c is None:
        minnorm32 = _f32_pattern(Fraction(2) ** fmt.emin)
        max32 = _f32_pattern(Fraction(fmt.max))
        c = FmtConsts(
            exp_bits=fmt.exp_bits, man_bits=fmt.man_bits, has_inf=int(fmt.has_inf),
            emin=fmt.emin, minnorm32=minnorm32, max32=max32,
            maxenc=fmt.max_encoding, ovf32=_INF32 if fmt.has_inf else max32,
            tiny_exp2_32=_f32_pattern(Fraction(2) ** -(fmt.man_bits + 2)),
            log2e32=_f32_pattern(_round_nearest_even(_LOG2E, fmt.man_bits)),
            nan_kind=NAN_POLICIES.index(fmt.nan),
            negzero32=_SIGN32 if fmt.has_neg_zero else 0,
            nan32=_SIGN32 if fmt.nan == "none" else _QNAN32,
            nanenc=fmt.nan_encoding or 0,
            ln2_32=_f32_pattern(_ln2(fmt)))
        _CONSTS_CACHE[fmt] = c
    return c


float32 = Format(8, 23)
bfloat16 = Format(8, 7)
float16 = Format(5, 10)
float8_e5m2 = Format(5, 2)
float8_e5m2fnuz = Format(5, 2, False, "fnuz")
float8_e4m3 = Format(4, 3)
float8_e4m3fn = Format(4, 3, has_inf=False)
float8_e4m3fnuz = Format(4, 3, False, "fnuz")
float8_e4m3b11fnuz = Format(4, 3, False, "fnuz", bias=11)
float8_e3m4 = Format(3, 4)
float8_e8m0fnu = Format(8, 0, False, "fn", signed=False)
float6_e3m2fn = Format(3, 2, False, "none")
float6_e2m3fn = Format(2, 3, False, "none")
float4_e2m1fn = Format(2, 1, False, "none")

#: The catalog: every ml_dtypes float type under its ml_dtypes name (canonical name ->
#: Format).  ``Format.name`` reports these names.  Note ml_dtypes' "fn" means "no inf":
#: float8_e4m3fn has a NaN per sign, the MX element types float6_*fn / float4_e2m1fn none.
FORMATS: dict[str, Format] = {
    "float32": float32,
    "bfloat16": bfloat16,
    "float16": float16,
    "float8_e5m2": float8_e5m2,
    "float8_e5m2fnuz": float8_e5m2fnuz,
    "float8_e4m3": float8_e4m3,
    "float8_e4m3fn": float8_e4m3fn,
    "float8_e4m3fnuz": float8_e4m3fnuz,
    "float8_e4m3b11fnuz": float8_e4m3b11fnuz,
    "float8_e3m4": float8_e3m4,
    "float8_e8m0fnu": float8_e8m0fnu,
    "float6_e3m2fn": float6_e3m2fn,
    "float6_e2m3fn": float6_e2m3fn,
    "float4_e2m1fn": float4_e2m1fn,
}

def _p3109(k: int, p: int, extended: bool = True) -> Format:
    """IEEE P3109 (interim report v3) signed binary K, precision P: gfloat's
    ``format_info_p3109(k, p)``, extended (±inf) or finite domain."""
    return Format(k - p, p - 1, extended, "fnuz", bias=1 << (k - p - 1))


#: IEEE P3109 binary8, signed, extended domain: P1 (e7m0) ... P7 (e1m6).  The finite
#: domain of P3/P4 is float8_e5m2fnuz / float8_e4m3fnuz; others parse as 'p3109_k8p2sf'.
P3109_FORMATS: dict[str, Format] = {f"p3109_p{p}": _p3109(8, p) for p in range(1, 8)}

_ALIASES = {
    "fp32": "float32", "f32": "float32", "single": "float32",
    "bf16": "bfloat16",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "fp8_e5m2": "float8_e5m2",
    "fp8_e4m3fn": "float8_e4m3fn",
}

# [floatN_]eXmY[bB][fn|fnuz|uz|sat|fnu]: N (if given) must be the width
_EXMY = re.compile(r"(?:float(\d+)_)?e(\d+)m(\d+)(?:b(\d+))?(fnuz|fnu|fn|uz|sat)?")
_POLICY = {None: (True, "ieee", True), "fn": (False, "fn", True),
           "fnuz": (False, "fnuz", True), "uz": (True, "fnuz", True),
           "sat": (False, "none", True), "fnu": (False, "fn", False)}
# p3109_k<K>p<P>[s][e|f]: P3109's own names (gfloat's, less the unsigned ones)
_P3109 = re.compile(r"p3109_k(\d+)p(\d+)(s?)([ef]?)")

_ACCEPTED = ("a Format, a catalog name (" + ", ".join(FORMATS) + "), an alias ("
             + ", ".join(_ALIASES) + "), or '[floatN_]eXmY[bB][fn|fnuz|uz|sat]' with "
             "1 <= X <= 8, 0 <= Y <= 23, optional bias B: IEEE (e.g. 'e8m4', Y >= 1), 'fn' = "
             "no inf, one NaN per sign (e.g. 'e4m3fn', X <= 7), 'fnuz' = no inf, the NaN at "
             "-0 (e.g. 'e5m2fnuz'), 'uz' = the NaN at -0, inf at the all-ones codes (P3109, "
             "e.g. 'e7m0uz'), 'sat' = no inf, no NaN, saturating (e.g. 'e2m1sat'), "
             "the unsigned scale 'e8m0fnu', IEEE P3109 'p3109_p1' ... 'p3109_p7' or "
             "'p3109_k<K>p<P>s[e|f]' (signed, K <= 9)")


def format(spec, *, argname: str = "fmt") -> Format:  # noqa: A001 - mirrors emu.format in the spec
    """Parse a format spec: a :class:`Format`, ``"bfloat16"``, ``"bf16"``, ``"e8m4"``,
    ``"e4m3fn"``, ``"e4m3b11fnuz"``, ``"e2m1sat"``, ``"float6_e2m3fn"``.

    Raises ``ValueError`` naming ``argname`` and the accepted forms otherwise.
    """
    if isinstance(spec, Format):
        return spec
    if isinstance(spec, str):
        key = spec.strip().lower()
        key = _ALIASES.get(key, key)
        if key in FORMATS:
            return FORMATS[key]
        if key in P3109_FORMATS:
            return P3109_FORMATS[key]
        m = _P3109.fullmatch(key)
        if m and 1 <= int(m[2]) < int(m[1]) <= 9:
            try:
                return _p3109(int(m[1]), int(m[2]), m[4] != "f")
            except ValueError:
                pass
        m = _EXMY.fullmatch(key)
        if m:
            width, e, mant, bias, suffix = m.groups()
            has_inf, nan, signed = _POLICY[suffix]
            try:
                fmt = Format(int(e), int(mant), has_inf, nan,
                             None if bias is None else int(bias), signed)
            except ValueError:
                fmt = None
            if fmt is not None and (width is None or int(width) == fmt.width):
                return fmt
    raise ValueError(f"{argname}={spec!r} is not a format; expected {_ACCEPTED}")

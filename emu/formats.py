"""Number formats as frozen data: a catalog of named formats and an ``eXmY`` parser.

Every format is a sign bit, ``E`` exponent bits and ``M`` mantissa bits with an
IEEE-style bias ``2^(E-1) - 1``; exponent field 0 holds zero and subnormals.  Two
families exist:

* IEEE-style (``has_inf=True``): all-ones exponent with mantissa 0 is ±inf, with a
  non-zero mantissa NaN (float32, bfloat16, float16, float8_e5m2, any ``eXmY``).
* ``fn`` ("finite, NaN") formats (``has_inf=False``) in the style of OCP FP8
  E4M3 / ``ml_dtypes.float8_e4m3fn``: no infinity, the single NaN encoding per sign
  is all-ones exponent *and* mantissa, every other all-ones-exponent code is finite.

With ``2 <= E <= 8`` and ``1 <= M <= 23`` every value of every format is a float32
value, which is why emu works on float32 arrays throughout (docs/semantics.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from fractions import Fraction
from typing import NamedTuple

__all__ = ["Format", "format", "FORMATS", "float32", "bfloat16", "float16",
           "float8_e5m2", "float8_e4m3fn"]

_ONE32 = 0x3F800000
_INF32 = 0x7F800000


class FmtConsts(NamedTuple):
    """Integer constants of a format handed to the Numba scalar kernels.

    ``*32`` fields are float32 bit patterns of the named value of the format.
    """
    exp_bits: int
    man_bits: int
    has_inf: int      # 1 for IEEE-style formats, 0 for fn formats
    emin: int         # exponent of the smallest normal, 1 - bias
    minnorm32: int    # smallest normal magnitude
    max32: int        # largest finite magnitude
    maxenc: int       # largest finite magnitude as a format encoding
    ovf32: int        # what a PA op returns on overflow: inf (IEEE) or max (fn)
    tiny_exp2_32: int  # 2^-(M+2): below it pa_exp2(x) rounds to exactly 1
    log2e32: int      # log2(e) rounded (RNE) to the format: the constant of eqs. (18)-(19)


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: 1 sign bit, ``exp_bits`` E, ``man_bits`` M.

    Attributes mirror :class:`numpy.finfo`: ``max``, ``smallest_normal`` (alias
    ``tiny``), ``smallest_subnormal``, ``eps``, ``bits``, ``bias``.
    """
    exp_bits: int
    man_bits: int
    has_inf: bool = True

    def __post_init__(self):
        if not isinstance(self.exp_bits, int) or not 2 <= self.exp_bits <= 8:
            raise ValueError(f"exp_bits must be an int in [2, 8], got {self.exp_bits!r}")
        if not isinstance(self.man_bits, int) or not 1 <= self.man_bits <= 23:
            raise ValueError(f"man_bits must be an int in [1, 23], got {self.man_bits!r}")
        if not isinstance(self.has_inf, bool):
            raise ValueError(f"has_inf must be a bool, got {self.has_inf!r}")
        if not self.has_inf and self.exp_bits == 8:
            # emax would be 128: such a format is no longer a subset of float32.
            raise ValueError("fn formats (has_inf=False) need exp_bits <= 7, got 8")

    # -- derived integer facts ------------------------------------------------
    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def width(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def bits(self) -> int:
        """Alias of width, as in numpy.finfo."""
        return self.width

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number."""
        top = (1 << self.exp_bits) - 1          # all-ones exponent field
        return (top - 1 if self.has_inf else top) - self.bias

    @property
    def max_encoding(self) -> int:
        """Encoding (sign 0) of the largest finite magnitude."""
        top = (1 << self.exp_bits) - 1
        if self.has_inf:
            return ((top - 1) << self.man_bits) | ((1 << self.man_bits) - 1)
        return (top << self.man_bits) | ((1 << self.man_bits) - 2)

    @property
    def inf_encoding(self) -> int | None:
        """Encoding of +inf, or None for fn formats."""
        if not self.has_inf:
            return None
        return ((1 << self.exp_bits) - 1) << self.man_bits

    @property
    def nan_encoding(self) -> int:
        """The canonical NaN emu produces: sign 0; IEEE: quiet bit set; fn: all ones."""
        top = ((1 << self.exp_bits) - 1) << self.man_bits
        if self.has_inf:
            return top | (1 << (self.man_bits - 1))
        return top | ((1 << self.man_bits) - 1)

    # -- numpy.finfo-like values ----------------------------------------------
    @cached_property
    def max(self) -> float:
        return float(Fraction((1 << (self.man_bits + 1)) - (1 if self.has_inf else 2))
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
        return float(Fraction(2) ** (self.emin - self.man_bits))

    @cached_property
    def eps(self) -> float:
        return float(Fraction(2) ** -self.man_bits)

    # -- names ------------------------------------------------------------------
    @property
    def name(self) -> str:
        for name, fmt in FORMATS.items():
            if fmt == self:
                return name
        return f"e{self.exp_bits}m{self.man_bits}" + ("" if self.has_inf else "fn")

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Format({self.name})"

    @property
    def consts(self) -> FmtConsts:
        """Integer constants for the scalar kernels (see emu/_scalar.py)."""
        return _consts(self)


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
            log2e32=_f32_pattern(_round_nearest_even(_LOG2E, fmt.man_bits)))
        _CONSTS_CACHE[fmt] = c
    return c


float32 = Format(8, 23)
bfloat16 = Format(8, 7)
float16 = Format(5, 10)
float8_e5m2 = Format(5, 2)
float8_e4m3fn = Format(4, 3, has_inf=False)

#: The catalog: canonical name -> Format.  ``Format.name`` reports these names.
FORMATS: dict[str, Format] = {
    "float32": float32,
    "bfloat16": bfloat16,
    "float16": float16,
    "float8_e5m2": float8_e5m2,
    "float8_e4m3fn": float8_e4m3fn,
}

_ALIASES = {
    "fp32": "float32", "f32": "float32", "single": "float32",
    "bf16": "bfloat16",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "fp8_e5m2": "float8_e5m2",
    "fp8_e4m3fn": "float8_e4m3fn",
}

_EXMY = re.compile(r"e(\d+)m(\d+)(fn)?")

_ACCEPTED = ("a Format, a catalog name (" + ", ".join(FORMATS) + "), an alias ("
             + ", ".join(_ALIASES) + "), or 'eXmY' with 2 <= X <= 8, 1 <= Y <= 23 "
             "(e.g. 'e8m4') or 'eXmYfn' with 2 <= X <= 7 (e.g. 'e4m3fn')")


def format(spec, *, argname: str = "fmt") -> Format:  # noqa: A001 - mirrors emu.format in the spec
    """Parse a format spec: a :class:`Format`, ``"bfloat16"``, ``"bf16"``, ``"e8m4"``, ``"e4m3fn"``.

    Raises ``ValueError`` naming ``argname`` and the accepted forms otherwise.
    """
    if isinstance(spec, Format):
        return spec
    if isinstance(spec, str):
        key = spec.strip().lower()
        key = _ALIASES.get(key, key)
        if key in FORMATS:
            return FORMATS[key]
        m = _EXMY.fullmatch(key)
        if m:
            e, mant = int(m.group(1)), int(m.group(2))
            fn = m.group(3) is not None
            if 2 <= e <= (7 if fn else 8) and 1 <= mant <= 23:
                return Format(e, mant, has_inf=not fn)
    raise ValueError(f"{argname}={spec!r} is not a format; expected {_ACCEPTED}")

"""OCP Microscaling (MX) block formats, v1.0, and the E8M0 scale type.

A block of ``block`` (32 in the OCP spec) consecutive elements along one axis shares
one E8M0 scale ``X = 2^s``; element ``i`` stands for ``X · P_i``.  The MX types
(OCP MX v1.0, §5):

=============  ====================  ===================
MX type        element               emax of the element
=============  ====================  ===================
mxfp8_e4m3     float8_e4m3fn         8
mxfp8_e5m2     float8_e5m2           15
mxfp6_e3m2     float6_e3m2fn         4
mxfp6_e2m3     float6_e2m3fn         2
mxfp4_e2m1     float4_e2m1fn         2
mxint8         int8 · 2^-6           0
=============  ====================  ===================

Elements travel as float32 arrays of element values (``emu.to_bits`` gives the
codes of the float elements), scales as uint8 E8M0 codes.  docs/semantics.md
("MX block formats") has the rules; emu/reference.py the oracle.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats import (Format, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, float8_e4m3fn,
                      float8_e5m2, format)

__all__ = ["MX_TYPES", "MXFormat", "mx_format", "mx_type", "mx_quantize", "mx_dequantize",
           "mx_pam_matmul", "e8m0_quantize", "e8m0_decode", "e8m0_op"]

#: MX type name -> element: a Format, or "int8" (two's complement, implicit scale 2^-6)
MX_TYPES: dict[str, Format | str] = {
    "mxfp8_e4m3": float8_e4m3fn, "mxfp8_e5m2": float8_e5m2,
    "mxfp6_e3m2": float6_e3m2fn, "mxfp6_e2m3": float6_e2m3fn,
    "mxfp4_e2m1": float4_e2m1fn, "mxint8": "int8",
}
_MX_ALIASES = {"mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e3m2", "mxfp4": "mxfp4_e2m1"}
E8M0_BIAS = 127
E8M0_NAN = 0xFF
_INT8_MAX = 127            # symmetric saturation: the element range is ±127 · 2^-6


def mx_type(spec, *, argname: str = "elem") -> str:
    """Canonical MX type name of ``spec``: an MX name, or the element format itself."""
    if isinstance(spec, str):
        key = spec.strip().lower()
        key = _MX_ALIASES.get(key, key)
        if key in MX_TYPES:
            return key
        if key == "int8":
            return "mxint8"
    try:
        fmt = format(spec)
    except ValueError:
        fmt = None
    for name, elem in MX_TYPES.items():
        if elem == fmt:
            return name
    raise ValueError(f"{argname}={spec!r} is not an MX element type; expected one of "
                     f"{sorted(MX_TYPES)} (aliases {sorted(_MX_ALIASES)}), their element "
                     "formats (e.g. 'float4_e2m1fn') or 'int8'")


def _emax(name: str) -> int:
    elem = MX_TYPES[name]
    return 0 if elem == "int8" else elem.emax


# --- the E8M0 scale type ---------------------------------------------------------

def e8m0_quantize(x) -> np.ndarray:
    """E8M0 codes (uint8) of float32 values, as ml_dtypes rounds (docs/semantics.md):
    NaN for x <= 0, NaN, inf or past 2^127; float32 normals round to the nearest power
    of two, ties up; float32 subnormals give code 1 above 2^-127, else 0."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
    sub = bits < 0x800000
    # pattern-space rounding to a multiple of 2^23: ties up for normals, down below
    code = (bits + np.where(sub, 0x3FFFFF, 0x400000)) >> 23
    bad = (bits == 0) | (bits >= 0x7F800000)           # +0, inf, NaN, any negative
    return np.where(bad, E8M0_NAN, code).astype(np.uint8)  # past 2^127 code is 255 itself


def e8m0_decode(codes) -> np.ndarray:
    """Float32 values of E8M0 codes: 2^(code - 127), NaN for 0xFF."""
    c = np.asarray(codes).astype(np.int64)
    v = np.ldexp(1.0, c - E8M0_BIAS)
    return np.where(c == E8M0_NAN, np.nan, v).astype(np.float32)


def e8m0_op(op: str, x, rounding="nearest_even", subnormals=True, overflow=None,
            seed=None):
    """``emu.quantize`` (op "quantize"), ``to_bits``, ``from_bits`` for float8_e8m0fnu."""
    from .ops import as_float32
    if op == "from_bits":
        arr = np.asarray(x)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"bits must have an integer dtype, got {arr.dtype}")
        if arr.size and (arr.min() < 0 or int(arr.max()) > E8M0_NAN):
            raise ValueError(f"bits must lie in [0, 2**8) for float8_e8m0fnu; got values "
                             f"in [{arr.min()}, {arr.max()}]")
        out = e8m0_decode(arr)
    else:
        if (rounding, subnormals, overflow, seed) != ("nearest_even", True, None, None):
            raise ValueError("float8_e8m0fnu is quantized with the defaults only "
                             "(rounding='nearest_even', subnormals=True, overflow=None)")
        codes = e8m0_quantize(as_float32(x, "x"))
        out = codes.astype(np.uint32) if op == "to_bits" else e8m0_decode(codes)
    return out[()] if np.ndim(x) == 0 else out


# --- block layout -----------------------------------------------------------------

def _check_block(block, axis, ndim):
    if isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer)) \
            or block < 1:
        raise ValueError(f"block must be a positive int (OCP MX: 32), got {block!r}")
    if ndim == 0:
        raise ValueError("x must have at least one dimension to form blocks along")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) \
            or not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis!r} is out of range for an array of {ndim} dimensions")
    return int(block), int(axis) % ndim


def _blocks(x: np.ndarray, block: int, axis: int) -> np.ndarray:
    """x with ``axis`` moved last and split into zero-padded blocks: (..., nb, block)."""
    x = np.moveaxis(x, axis, -1)
    n = x.shape[-1]
    nb = -(-n // block)
    pad = np.zeros(x.shape[:-1] + (nb * block - n,), x.dtype)
    return np.concatenate([x, pad], axis=-1).reshape(x.shape[:-1] + (nb, block))


def _unblocks(b: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Inverse of :func:`_blocks` for an axis of length ``n``."""
    flat = b.reshape(b.shape[:-2] + (-1,))[..., :n]
    return np.moveaxis(flat, -1, axis)


# --- quantize / dequantize ----------------------------------------------------------

def mx_quantize(x, elem, block: int = 32, axis: int = -1):
    """OCP MX quantization: ``(elements, scales)``.

    Per block of ``block`` elements along ``axis``: ``s = floor(log2 amax) - emax_elem``
    (clamped below at -127; amax = 0 gives -127), scale code ``s + 127``; elements
    ``quantize(x / 2^s, elem)`` RNE saturating at ±max (mxint8: ``round(x / 2^s · 64)``
    clamped to ±127, over 64).  A block holding a NaN or ±inf gets the NaN scale
    0xFF and +0 elements.  ``elements`` is float32 of x's shape, ``scales`` uint8 with
    the axis shortened to ``ceil(n / block)``.
    """
    from .ops import as_float32, quantize
    name = mx_type(elem)
    x = as_float32(x, "x")
    block, axis = _check_block(block, axis, x.ndim)
    n = x.shape[axis]
    b = _blocks(x, block, axis).astype(np.float64)
    finite = np.isfinite(b).all(axis=-1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(b), b, 0.0)).max(axis=-1), 0.0)
    _, e = np.frexp(amax)                              # amax = m 2^e, 1/2 <= m < 1
    s = np.where(amax > 0, e - 1 - _emax(name), -E8M0_BIAS)
    s = np.maximum(s, -E8M0_BIAS)
    # x / 2^s is exact in float64; in float32 too wherever it can round to a nonzero
    # element (>= 2^-126: every element type's half-quantum is >= 2^-17)
    scaled = np.where(finite[..., None], b * np.ldexp(1.0, -s)[..., None], 0.0)
    if MX_TYPES[name] == "int8":
        k = np.clip(np.rint(scaled * 64.0), -_INT8_MAX, _INT8_MAX)
        p = (k / 64.0 + 0.0).astype(np.float32)       # + 0.0: an integer code has no -0
    else:
        p = quantize(scaled.astype(np.float32), MX_TYPES[name], overflow="saturate")
    scales = np.where(finite, s + E8M0_BIAS, E8M0_NAN).astype(np.uint8)
    return _unblocks(np.asarray(p, np.float32), n, axis), np.moveaxis(scales, -1, axis)


def mx_dequantize(elements, scales, block: int = 32, axis: int = -1) -> np.ndarray:
    """The values ``P_i · 2^(code - 127)`` of MX data, rounded RNE to float32 (exact
    unless beyond float32's range); a NaN scale (0xFF) makes its block NaN."""
    from .ops import as_float32
    p = as_float32(elements, "elements")
    block, axis = _check_block(block, axis, p.ndim)
    sc = np.asarray(scales)
    n = p.shape[axis]
    want = p.shape[:axis] + (-(-n // block),) + p.shape[axis + 1:]
    if sc.dtype != np.uint8 or sc.shape != want:
        raise ValueError(f"scales must be uint8 E8M0 codes of shape {want} (elements "
                         f"{p.shape}, block={block}, axis={axis}); got {sc.dtype} {sc.shape}")
    b = _blocks(p, block, axis).astype(np.float64)
    code = np.moveaxis(sc, axis, -1).astype(np.int64)
    v = b * np.ldexp(1.0, code - E8M0_BIAS)[..., None]
    v = np.where((code == E8M0_NAN)[..., None], np.nan, v)
    with np.errstate(over="ignore"):
        return _unblocks(v.astype(np.float32), n, axis)


@dataclass(frozen=True)
class MXFormat:
    """An MX type as the format of matmul operands (torch_bridge ``fmt="mxfp8_e4m3"``):
    operands are MX-quantized along the contraction axis and dequantized, so a PAM
    matmul of the results in float32 is :func:`mx_pam_matmul`."""
    mx: str
    block: int = 32

    def __post_init__(self):
        object.__setattr__(self, "mx", mx_type(self.mx))
        _check_block(self.block, -1, 1)

    @property
    def name(self) -> str:
        return self.mx if self.block == 32 else f"{self.mx}/{self.block}"

    def __str__(self) -> str:
        return self.name

    def round(self, x, axis: int = -1) -> np.ndarray:
        """``x`` as its MX values: quantized in blocks along ``axis``, dequantized."""
        return mx_dequantize(*mx_quantize(x, self.mx, self.block, axis), self.block, axis)


def mx_format(spec, *, argname: str = "fmt") -> MXFormat:
    """An :class:`MXFormat` from ``"mxfp8_e4m3"``, ``"mxfp4"``, ... (block 32), or
    ``"mxfp4/16"`` for another block size; ValueError naming ``argname`` otherwise."""
    if isinstance(spec, MXFormat):
        return spec
    if isinstance(spec, str) and spec.strip().lower().startswith("mx"):
        name, _, block = spec.strip().lower().partition("/")
        if block == "" or block.isdigit():
            return MXFormat(mx_type(name, argname=argname), int(block or 32))
    raise ValueError(f"{argname}={spec!r} is not an MX format; expected one of "
                     f"{sorted(MX_TYPES)} (aliases {sorted(_MX_ALIASES)}), optionally "
                     "'/<block>' (default 32)")


def mx_pam_matmul(a, b, elem, block: int = 32, acc="float32"):
    """PAM matmul on MX operands: ``a`` blocked along its last axis (K), ``b`` along
    its second-to-last (K; a 1-D ``b`` along its only axis), each product the PAM of
    the elements with the two scales' exponents added, folded over k in increasing
    order into ``acc`` from +0 (docs/semantics.md, "MX block formats")."""
    from .matmul import pam_matmul
    from .ops import as_float32
    a = as_float32(a, "a")
    b = as_float32(b, "b")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"a and b must have at least one dimension, got shapes "
                         f"{a.shape} and {b.shape}")
    mx = MXFormat(elem, block)
    return pam_matmul(mx.round(a, -1), mx.round(b, -2 if b.ndim >= 2 else -1), "float32", acc)

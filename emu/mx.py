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

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .backend import backend_for, backend_of
from .formats import (Format, float4_e2m1fn, float32, float6_e2m3fn, float6_e3m2fn, float8_e4m3fn,
                      float8_e5m2, format)
from .matmul import matmul
from .multipliers import MULTIPLIERS, multiplier
from .shapes import matmul_shapes
from ._scalar_mx import E8M0_NAN  # noqa: F401 (the NaN code of E8M0, a NaN block's scale)

__all__ = ["MX_TYPES", "MXFormat", "mx_format", "mx_type", "mx_quantize", "mx_dequantize",
           "mx_matmul", "mx_pam_matmul", "mx_element_multiplier"]

#: MX type name -> element: a Format, or "int8" (two's complement, implicit scale 2^-6)
MX_TYPES: dict[str, Format | str] = {
    "mxfp8_e4m3": float8_e4m3fn, "mxfp8_e5m2": float8_e5m2,
    "mxfp6_e3m2": float6_e3m2fn, "mxfp6_e2m3": float6_e2m3fn,
    "mxfp4_e2m1": float4_e2m1fn, "mxint8": "int8",
}
_MX_ALIASES = {"mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e3m2", "mxfp4": "mxfp4_e2m1"}
E8M0_BIAS = 127


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

def e8m0_check(rounding="nearest_even", subnormals=True, overflow=None, seed=None):
    """ValueError unless quantize's options are the defaults: E8M0 has one rounding."""
    if (rounding, subnormals, overflow, seed) != ("nearest_even", True, None, None):
        raise ValueError("float8_e8m0fnu is quantized with the defaults only "
                         "(rounding='nearest_even', subnormals=True, overflow=None)")


# --- block layout -----------------------------------------------------------------

#: mxint8's element grid: below 2, e3m6 with bias 1 is the fixed-point grid k · 2^-6
#: (emu/_scalar_mx.py mx_element clamps it to ±127/64)
_INT8_GRID = Format(3, 6, bias=1)


class MXPlan(NamedTuple):
    """An MX call on an array of ``shape`` viewed as (outer, n, inner) with blocks of
    ``block`` along n (the blocked axis): ``nb`` blocks per row, ``ntask`` =
    outer · nb · inner blocks in all, scales of shape ``scales``; the element format's
    kernel constants ``efc``, its ``emax``, and ``int8`` for mxint8."""
    shape: tuple
    scales: tuple
    ntask: int
    nb: int
    n: int
    inner: int
    block: int
    efc: object
    emax: int
    int8: bool


#: the largest block: far beyond any row MX is used on (OCP's blocks are 32), and it
#: keeps the kernels' index arithmetic (block · blocks per row) far from int64's range
MAX_BLOCK = 2**20


def _check_block(block, axis, ndim):
    if isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer)) \
            or not 1 <= block <= MAX_BLOCK:
        raise ValueError(f"block must be an int in [1, {MAX_BLOCK}] (OCP MX: 32), got "
                         f"{block!r}")
    if ndim == 0:
        raise ValueError("x must have at least one dimension to form blocks along")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) \
            or not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis!r} is out of range for an array of {ndim} dimensions")
    return int(block), int(axis) % ndim


def _plan(shape, block, axis, name=None) -> MXPlan:
    """The plan of a call on ``shape`` (``name``: the MX type, for quantizing)."""
    shape = tuple(int(d) for d in shape)
    block, axis = _check_block(block, axis, len(shape))
    n = shape[axis]
    nb = -(-n // block)
    inner = math.prod(shape[axis + 1:])
    elem = MX_TYPES.get(name)
    int8 = elem == "int8"
    efc = None if elem is None else (_INT8_GRID if int8 else elem).consts
    return MXPlan(shape, shape[:axis] + (nb,) + shape[axis + 1:],
                  math.prod(shape[:axis]) * nb * inner, nb, n, inner, block, efc,
                  0 if elem is None else _emax(name), int8)


def _quantize(x, name, block, axis, values, stream):
    """(elements, scales), or (``values``) the dequantized values, by the kernels of the
    backend ``x`` picks (CPU, or CUDA for a device array: docs/gpu.md)."""
    backend, (xv,) = backend_for(stream, {"x": x})
    return backend.mx_quantize(_plan(xv.shape, block, axis, name), xv, values)


# --- quantize / dequantize ----------------------------------------------------------

def mx_quantize(x, elem, block: int = 32, axis: int = -1, *, stream=None):
    """OCP MX quantization: ``(elements, scales)``.

    Per block of ``block`` elements along ``axis``: ``s = floor(log2 amax) - emax_elem``
    (clamped below at -127; amax = 0 gives -127), scale code ``s + 127``; elements
    ``quantize(x / 2^s, elem)`` RNE saturating at ±max (mxint8: ``round(x / 2^s · 64)``
    clamped to ±127, over 64).  A block holding a NaN or ±inf gets the NaN scale
    0xFF and +0 elements.  ``elements`` is float32 of x's shape, ``scales`` uint8 with
    the axis shortened to ``ceil(n / block)``.  A CUDA ``x`` (torch, CuPy, Numba) runs
    on the device and gives device arrays of its kind (emu/_cuda.py), on ``stream``
    if given.
    """
    return _quantize(x, mx_type(elem), block, axis, False, stream)


def mx_dequantize(elements, scales, block: int = 32, axis: int = -1, *, stream=None):
    """The values ``P_i · 2^(code - 127)`` of MX data, rounded RNE to float32 (exact
    unless beyond float32's range); a NaN scale (0xFF) makes its block NaN.  CUDA
    operands (both on the device) run there."""
    backend = backend_of(stream, elements=elements, scales=scales)
    p = backend.operand(elements, "elements")
    sc = backend.operand(scales, "scales", bits=True)
    plan = _plan(p.shape, block, axis)
    if sc.dtype != np.uint8 or tuple(sc.shape) != plan.scales:
        raise ValueError(f"scales must be uint8 E8M0 codes of shape {plan.scales} (elements "
                         f"{plan.shape}, block={plan.block}, axis={axis}); got {sc.dtype} "
                         f"{tuple(sc.shape)}")
    return backend.mx_dequantize(plan, p, sc)


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

    def round(self, x, axis: int = -1, *, stream=None):
        """``x`` as its MX values: quantized in blocks along ``axis`` and dequantized,
        in one pass (a CUDA ``x`` on the device)."""
        return _quantize(x, self.mx, self.block, axis, True, stream)


def mx_format(spec, *, argname: str = "fmt") -> MXFormat:
    """An :class:`MXFormat` from ``"mxfp8_e4m3"``, ``"mxfp4"``, ... (block 32), or
    ``"mxfp4/16"`` for another block size; ValueError naming ``argname`` otherwise."""
    if isinstance(spec, MXFormat):
        return spec
    if isinstance(spec, str) and spec.strip().lower().startswith("mx"):
        name, _, block = spec.strip().lower().partition("/")
        if block.isdigit() and not 1 <= int(block) <= MAX_BLOCK:
            raise ValueError(f"{argname}={spec!r}: block {int(block)} is outside [1, "
                             f"{MAX_BLOCK}] (OCP MX: 32)")
        if block == "" or block.isdigit():
            return MXFormat(mx_type(name, argname=argname), int(block or 32))
    raise ValueError(f"{argname}={spec!r} is not an MX format; expected one of "
                     f"{sorted(MX_TYPES)} (aliases {sorted(_MX_ALIASES)}), optionally "
                     "'/<block>' (default 32)")


def mx_element_multiplier(mx: "MXFormat", mul):
    """``(multiplier, the format of its rule)`` for the products of ``mx``'s values:
    any multiplier but ``float`` and tables by the element format's rule (PAM: float32's,
    the same bits); ValueError for ``float`` (its product is rounded into the element
    format, which a scaled value does not fit), for a table (indexed by encodings, which
    scaled values do not have) and for another multiplier of mxint8."""
    m = multiplier(mul)
    elem = MX_TYPES[mx.mx]
    if m == MULTIPLIERS["pam"]:
        return m, float32
    if m.kind in ("float", "table") or not isinstance(elem, Format):
        raise ValueError(f"mul={str(m)!r} with {mx.name}: MX products take every multiplier "
                         "but 'float' and tables, on float elements (mxint8 takes PAM only)")
    return m, elem


def mx_matmul(a, b, elem, block: int = 32, acc="float32", *, mul="pam", stream=None):
    """Matmul on MX operands: ``a`` blocked along its last axis (K), ``b`` along its
    second-to-last (K; a 1-D ``b`` along its only axis), each product the multiplier's
    (``mul``, by the element format's rule) of the elements with the two scales'
    exponents added, folded over k in increasing order into ``acc`` from +0
    (docs/semantics.md, "MX block formats").  It is :meth:`MXFormat.round` of each
    operand and ``emu.matmul`` in float32 on the results, so CUDA operands stay on
    the device."""
    mx = MXFormat(elem, block)
    m, mul_fmt = mx_element_multiplier(mx, mul)
    acc = format(acc, argname="acc").accumulator("acc")
    _, (av, bv) = backend_for(stream, {"a": a, "b": b})       # checked before any kernel
    matmul_shapes(av.shape, bv.shape, "mx_matmul")
    return matmul(mx.round(a, -1, stream=stream),
                  mx.round(b, -2 if len(bv.shape) >= 2 else -1, stream=stream),
                  "float32", acc, mul=m, mul_fmt=mul_fmt, stream=stream)


def mx_pam_matmul(a, b, elem, block: int = 32, acc="float32", *, stream=None):
    """:func:`mx_matmul` with PAM."""
    return mx_matmul(a, b, elem, block, acc, stream=stream)

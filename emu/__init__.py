"""emu — the numeric truth of pamsim: bit-exact piecewise-affine arithmetic.

Number formats as data (:mod:`emu.formats`), rounding (:func:`quantize`), the
piecewise affine operations of Kosson & Jaggi (PAM multiply, PA division,
paexp2/palog2/paexp/palog/pasqrt), IEEE addition/multiplication into any format,
and PAM matmul with a defined accumulation order.  Each operation has one scalar
definition on bit patterns (``emu._scalar``) compiled by Numba into CPU kernels,
and an independent exact oracle in :mod:`emu.reference`.  The rules are written
down in docs/semantics.md; every elementwise operation has one entry in
:data:`emu.OPS` (emu/registry.py), from which its kernels and front ends derive.
"""
from . import ops as _ops
from .formats import (FORMATS, Format, bfloat16, float8_e4m3fn, float8_e5m2, float16,
                      float32, format)
from .matmul import pam_matmul
from .ops import *  # noqa: F403 -- quantize, to_bits, from_bits, one function per registry op
from .registry import OPS

__all__ = ["FORMATS", "Format", "format", "float32", "bfloat16", "float16", "float8_e5m2",
           "float8_e4m3fn", *_ops.__all__, "pam_matmul", "OPS"]

"""emu — the numeric truth of pamsim: bit-exact piecewise-affine arithmetic.

Number formats as data (:mod:`emu.formats`), rounding (:func:`quantize`), the
piecewise affine operations of Kosson & Jaggi (PAM multiply, PA division,
paexp2/palog2/paexp/palog/pasqrt), IEEE addition/multiplication into any format,
and matmul (``matmul``, with any multiplier; ``pam_matmul``) with a defined
accumulation order; OCP MX block formats
(:mod:`emu.mx`: ``mx_quantize``, ``mx_dequantize``, ``mx_matmul``, ``mx_pam_matmul``); multipliers as
data (:mod:`emu.multipliers`: ``multiplier``, ``MULTIPLIERS``, ``mul``).  Each
operation has one scalar definition on bit patterns (``emu._scalar``) compiled by Numba into CPU kernels,
and an independent exact oracle in :mod:`emu.reference`.  The rules are written
down in docs/semantics.md; every elementwise operation has one entry in
:data:`emu.OPS` (emu/registry.py), from which its kernels and front ends derive.
"""
from . import ops as _ops
from .formats import (FORMATS, P3109_FORMATS, Format, bfloat16, float4_e2m1fn, float6_e2m3fn,
                      float6_e3m2fn, float8_e3m4, float8_e4m3, float8_e4m3b11fnuz, float8_e4m3fn,
                      float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, float8_e8m0fnu, float16,
                      float32, format)
from .matmul import matmul, pam_matmul
from .multipliers import MULTIPLIERS, Multiplier, mul, multiplier, table_multiplier
from .mx import MX_TYPES, mx_dequantize, mx_matmul, mx_pam_matmul, mx_quantize
from .ops import *  # noqa: F403 -- quantize, to_bits, from_bits, one function per registry op
from .recipes import (RECIPES, Recipe, RecipeState, recipe, recipe_dequantize, recipe_matmul,
                      recipe_quantize)
from .reduce import fold_sum
from .registry import OPS

__all__ = ["FORMATS", "P3109_FORMATS", "Format", "format", "float32", "bfloat16", "float16", "float8_e5m2",
           "float8_e5m2fnuz", "float8_e4m3", "float8_e4m3fn", "float8_e4m3fnuz",
           "float8_e4m3b11fnuz", "float8_e3m4", "float8_e8m0fnu", "float6_e3m2fn",
           "float6_e2m3fn", "float4_e2m1fn", "MX_TYPES", "mx_quantize", "mx_dequantize",
           "mx_matmul", "mx_pam_matmul", *_ops.__all__, "matmul", "pam_matmul", "fold_sum", "OPS", "Multiplier", "table_multiplier",
           "MULTIPLIERS", "multiplier", "mul", "RECIPES", "Recipe", "RecipeState", "recipe",
           "recipe_quantize", "recipe_dequantize", "recipe_matmul"]

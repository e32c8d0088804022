"""rtl — Amaranth HDL units of piecewise-affine arithmetic, parameterised by emu.Format.

``amaranth.lib.wiring.Component`` designs whose outputs equal emu's operations bit
for bit (verified by the cocotb benches in sim/tb against emu, see docs/rtl.md):

* :class:`PAMMultiplier`, :class:`PADivider`, :class:`PASqrt` — ``emu.pam_mul`` /
  ``emu.pa_div`` / ``emu.pa_sqrt``; :class:`LMulMultiplier` — ``emu.mul(..., mul="lmul")``;
* :class:`FloatAdder` — IEEE RNE addition with subnormals (``emu.fp_add``);
* :class:`FloatMultiplier` — IEEE RNE multiplication, subnormals flushed
  (``emu.fp_mul(..., subnormals=False)``), the baseline PAM is compared to;
* :class:`PatternSumMultiplier` (``pam±N``, ``lmul±N``, ``cpamK-*``),
  :class:`ExactMultiplier`, :class:`TableMultiplier` (a ROM): every multiplier of emu's
  registry, built by :func:`multiplier_unit` (unit ``mul`` with ``mul=``; rtl/multipliers.py);
* :class:`PAMMac` — pipelined stream multiply-accumulate (an entry of ``emu.pam_matmul``);
* :class:`PAMDotArray` — a grid of MACs computing a tile of ``emu.pam_matmul``.

Every signed format of emu has units: any bias and every encoding policy of
docs/semantics.md §9 (ieee, fn, fnuz, none); :func:`as_format` is the check.

:data:`UNITS` (rtl/registry.py) is the one registry of units by ``--unit`` name;
:func:`make_unit` builds a unit by that name and :func:`verilog` emits synthesizable
Verilog.
"""
from ._float import FloatLayout, as_format
from .emit import make_unit, rtlil, verilog
from .ieee import ExactMultiplier, ExactProduct, FloatAdder, FloatMultiplier
from .mac import PAMDotArray, PAMMac
from .multipliers import TableMultiplier, multiplier_unit
from .pa import LMulMultiplier, PADivider, PAMMultiplier, PASqrt, PatternSumMultiplier
from .registry import UNITS, Unit

__all__ = ["FloatLayout", "as_format", "PAMMultiplier", "LMulMultiplier", "PADivider", "PASqrt", "FloatAdder",
           "FloatMultiplier", "PAMMac", "PAMDotArray", "UNITS", "Unit", "make_unit", "rtlil", "verilog",
           "PatternSumMultiplier", "ExactMultiplier", "ExactProduct", "TableMultiplier",
           "multiplier_unit"]

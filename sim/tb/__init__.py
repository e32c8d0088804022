"""cocotb benches of the rtl units, one test module per unit, run against lane
harnesses by sim.rtl_sim.run_cocotb (pytest: tests/test_rtl_cocotb.py; CLI: pamsim
verify).  Golden model: emu, compared bit for bit (NaNs by class)."""

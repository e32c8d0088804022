"""cocotb bench of every combinational unit of the registry (rtl.UNITS): the unit's
outputs against its golden model (emu), bit for bit (NaNs by class).

One test per unit of the run (parameter ``units``, default every unit of the harness)
and vector kind: every operand set for formats of 8 bits or fewer; else all sets of
special encodings, the unit's boundary construction (its registry ``vectors``:
flush and overflow boundaries, alignment distances, cancellation, ties, subnormal sums,
square roots at the ends of the range) and uniform random sets.  The float32 adder is
held against numpy's float32 ``+`` instead of emu (driver.CombTB.golden).
"""
import cocotb

from sim.tb import driver


@cocotb.test()
@cocotb.parametrize(unit=driver.comb_units(), kind=driver.comb_kinds())
async def unit_matches_emu(dut, unit, kind):
    await driver.CombTB(dut, unit).check(kind, *driver.comb_vectors(unit, kind))

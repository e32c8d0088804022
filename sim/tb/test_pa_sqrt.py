"""cocotb bench: rtl.PASqrt against emu.pa_sqrt, bit for bit (NaNs by class).

Every encoding for 8-bit formats; else every special encoding, operands at both ends
of the exponent range and around 1 (half of them exact ties), and uniform random ones.
"""
import cocotb

from sim.tb import driver


class PASqrtTB(driver.CombTB):
    unit = "sqrt"


@cocotb.test()
@cocotb.parametrize(kind=driver.comb_kinds())
async def pa_sqrt_matches_emu(dut, kind):
    await PASqrtTB(dut).check(kind, *driver.comb_vectors("sqrt", kind))

"""cocotb bench: rtl.PAMMultiplier against emu.pam_mul, bit for bit (NaNs by class).

Every operand pair for 8-bit formats; else all pairs of special encodings, pairs
whose result lands at the flush and overflow boundaries, and uniform random pairs.
"""
import cocotb

from sim.tb import driver


class PAMMultiplierTB(driver.CombTB):
    unit = "mul"


@cocotb.test()
@cocotb.parametrize(kind=driver.comb_kinds())
async def pam_mul_matches_emu(dut, kind):
    await PAMMultiplierTB(dut).check(kind, *driver.comb_vectors("mul", kind))

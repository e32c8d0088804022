"""cocotb bench: rtl.FloatMultiplier against emu.fp_mul(..., subnormals=False), bit for
bit (NaNs by class): IEEE RNE with subnormal operands read as zero and subnormal
results flushed after rounding on the format's grid.

Boundary vectors: products around the flush boundary (including the band that
rounds up to the smallest normal) and around overflow.
"""
import cocotb

from sim.tb import driver


class FloatMultiplierTB(driver.CombTB):
    unit = "fmul"


@cocotb.test()
@cocotb.parametrize(kind=driver.comb_kinds())
async def fp_mul_matches_emu(dut, kind):
    await FloatMultiplierTB(dut).check(kind, *driver.comb_vectors("fmul", kind))

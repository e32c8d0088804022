"""cocotb bench: rtl.PADivider against emu.pa_div, bit for bit (NaNs by class).

Every operand pair for 8-bit formats; else all pairs of special encodings, pairs
whose quotient lands at the flush and overflow boundaries, and uniform random pairs.
"""
import cocotb

from sim.tb import driver


class PADividerTB(driver.CombTB):
    unit = "div"


@cocotb.test()
@cocotb.parametrize(kind=driver.comb_kinds())
async def pa_div_matches_emu(dut, kind):
    await PADividerTB(dut).check(kind, *driver.comb_vectors("div", kind))

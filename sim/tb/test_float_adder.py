"""cocotb bench: rtl.FloatAdder against numpy float32 ``+`` (float32) and emu.fp_add
(every other format), bit for bit (NaNs by class).

Boundary vectors: every alignment distance up to past the sticky window, massive
cancellation, exact ties, subnormal sums, ``x + (-x)`` and overflow.
"""
import cocotb
import numpy as np

import emu
from sim.tb import driver


class FloatAdderTB(driver.CombTB):
    unit = "add"

    def golden(self, a, b):
        if self.fmt == emu.float32:                      # IEEE binary32 as numpy does it
            with np.errstate(all="ignore"):
                return (a.view(np.float32) + b.view(np.float32)).view(np.uint32)
        return super().golden(a, b)


@cocotb.test()
@cocotb.parametrize(kind=driver.comb_kinds())
async def fp_add_matches_reference(dut, kind):
    await FloatAdderTB(dut).check(kind, *driver.comb_vectors("add", kind))

"""CPU kernels of ``emu.mul``: every multiplier's scalar definition (emu/_scalar_mul.py)
on each element, operands rounded into the format first; a parallel and a serial twin."""
from numba import prange

from . import _scalar as S
from . import _scalar_mul as SM
from ._kernels import twins
from ._numba_cache import drop_stale

drop_stale(__file__)


def _mul(x, y, out, fc, mp):
    for i in prange(x.size):
        out[i] = SM.product(S.operand(x[i], fc), S.operand(y[i], fc), fc, mp)


MUL = twins("mul", _mul)

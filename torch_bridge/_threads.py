"""Numba's threads beside torch's: the pool started at import, and a thread count per
emu call."""
from __future__ import annotations

from contextlib import contextmanager

import numba
import torch

from emu import sizes


def _start_numba_threads():
    """Start Numba's thread pool now, keeping torch's thread count: with the OpenMP
    threading layer, starting the pool sets the OpenMP thread count that torch shares
    to NUMBA_NUM_THREADS, which would silently undo an earlier torch.set_num_threads."""
    n = torch.get_num_threads()
    numba.get_num_threads()
    torch.set_num_threads(n)


_start_numba_threads()


@contextmanager
def emu_threads(work: int):
    """Numba threads for an emu call: one for small work, else as many as torch uses."""
    n = 1 if work < sizes.SERIAL_WORK else max(1, min(torch.get_num_threads(),
                                                numba.config.NUMBA_NUM_THREADS))
    old = numba.get_num_threads()
    if n == old:
        yield
        return
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(old)

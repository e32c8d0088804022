"""Numba's threads beside torch's: the pool started at import, and a thread count per
emu call."""
from __future__ import annotations

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


class emu_threads:
    """Numba threads for an emu call (a context manager): one for small work, else as
    many as torch uses.  A class, not a generator: it is entered on every PA call."""
    __slots__ = ("n", "old")

    def __init__(self, work: int):
        self.n = 1 if work < sizes.SERIAL_WORK else max(1, min(torch.get_num_threads(),
                                                        numba.config.NUMBA_NUM_THREADS))

    def __enter__(self):
        self.old = numba.get_num_threads()
        if self.n != self.old:
            numba.set_num_threads(self.n)

    def __exit__(self, *exc):
        if self.n != self.old:
            numba.set_num_threads(self.old)

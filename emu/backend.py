"""Which backend runs a call: the CUDA backend (emu/cuda_backend.py) for CUDA operands,
else the CPU backend (emu/host.py).  Every front end (emu/ops.py, emu/matmul.py,
emu/mx.py, emu/reduce.py, emu/grad.py) dispatches here, so none imports another for it.
"""
from __future__ import annotations

from . import cuda_backend
from .host import HOST

__all__ = ["backend_of", "backend_for"]


def backend_of(stream, **operands):
    """The backend the named operands pick (``stream`` only goes with CUDA operands;
    ValueError for mixed devices, emu/cuda_backend.py ``prepare``)."""
    return cuda_backend.prepare(stream, **operands) or HOST


def backend_for(stream, operands: dict, bits: bool = False):
    """``(backend, the operands as it reads them)``: :func:`backend_of` ``operands``.
    ``bits``: the operands are integer encodings, read as they are, not converted to
    float32."""
    backend = backend_of(stream, **operands)
    return backend, [backend.operand(v, n, bits) for n, v in operands.items()]

"""Which emu backend CPU tensors go to: emu's CPU kernels, or (under Numba's CUDA
simulator, for the tests) its CUDA kernels."""
from __future__ import annotations

from contextlib import contextmanager

import numba
import torch

_CUDA_FOR_CPU = False


@contextmanager
def cuda_backend():
    """Under Numba's CUDA simulator (docs/gpu.md), run CPU tensors through emu's CUDA
    backend instead of its CPU backend: how the tests prove without a GPU that
    torch_bridge gets the CPU's bits from the CUDA kernels.  The simulator's device
    memory is host memory, so a tensor's numpy view is wrapped as it is, strides
    included.  (On a GPU, pass CUDA tensors: they always use the CUDA backend.)"""
    global _CUDA_FOR_CPU
    if not numba.config.ENABLE_CUDASIM:
        raise RuntimeError("cuda_backend() needs Numba's CUDA simulator "
                           "(NUMBA_ENABLE_CUDASIM=1); on a GPU pass CUDA tensors")
    old, _CUDA_FOR_CPU = _CUDA_FOR_CPU, True
    try:
        yield
    finally:
        _CUDA_FOR_CPU = old


def cuda_backend_active() -> bool:
    """Whether :func:`cuda_backend` is routing CPU tensors through the CUDA backend."""
    return _CUDA_FOR_CPU


def on_cuda_backend(t: torch.Tensor) -> bool:
    """Whether ``t`` goes to a CUDA backend: a CUDA tensor, or any under :func:`cuda_backend`."""
    return t.is_cuda or _CUDA_FOR_CPU

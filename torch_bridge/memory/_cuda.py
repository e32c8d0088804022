"""CUDA kernels of the memory-saving layers: the twins of _kernels.py.

Each kernel is a grid-stride loop over independent groups of 8 codes (or over
elements) calling the same ``register_jitable`` definitions of _scalar.py as the CPU
kernels, with the same tables; nothing is computed differently.  The same source
runs compiled for a GPU, compiled to PTX without one (tests/test_cuda_ptx.py), and as
Python under Numba's CUDA simulator (tests/test_memory_cuda.py).

Tensors reach the kernels through emu's CUDA backend (emu/device.py: a CUDA tensor
itself, read through ``__cuda_array_interface__``, on torch's current stream) and
torch_bridge/_tensors.py's ``device_view``; :func:`launch` is the one place that
happens.  Tables (breakpoints, levels, coefficients) are tensors on the operand's
device, passed as arguments.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import config, cuda

from emu.cuda_backend import prepare

from .._tensors import device_view, same_device
from . import _scalar as S

SIM = bool(config.ENABLE_CUDASIM)

if not SIM:
    from numba import types
    from numba.cuda import libdevice
    from numba.cuda.extending import overload

    @overload(S.mul, target="cuda")
    def _mul_cuda(a, b):
        """A product NVVM may not contract into an FMA with the add after it (it does
        by default): __fmul_rn / __dmul_rn."""
        if a == types.float32 and b == types.float32:
            return lambda a, b: libdevice.fmul_rn(a, b)
        if a == types.float64 and b == types.float64:
            return lambda a, b: libdevice.dmul_rn(a, b)
        return None


def launch(kernel, nthreads: int, **args) -> None:
    """``kernel[grid, block, stream](*args.values())`` with each tensor argument handed
    over by ``device_view``, on torch's current stream.  Tensors must be
    contiguous; on two devices they are a ValueError naming them (``same_device``)."""
    tensors = {n: v for n, v in args.items() if isinstance(v, torch.Tensor)}
    same_device(**tensors)
    views = {n: device_view(v.detach()) for n, v in tensors.items()}
    call = prepare(**views)
    with call.device():
        call.launch(kernel, nthreads, *(call.operand(views[n], n) if n in views else v
                                        for n, v in args.items()))


def groups(n: int) -> int:
    """Groups of 8 codes in a stream of n."""
    return (int(n) + 7) // 8


# --- kernels: one thread per group of 8 codes (whole bytes: no two threads share one) ----

@cuda.jit
def pack(codes, k, out):
    for g in range(cuda.grid(1), (codes.size + 7) // 8, cuda.gridsize(1)):
        S.pack_group(codes, g, k, out)


@cuda.jit
def unpack(packed, k, out):
    for g in range(cuda.grid(1), (out.size + 7) // 8, cuda.gridsize(1)):
        S.unpack_group(packed, g, k, out)


@cuda.jit
def index_pack(x, bp, k, even, out):
    """Few-bit forward: the packed code of every x (the CPU's ``index_packer``)."""
    for g in range(cuda.grid(1), (x.size + 7) // 8, cuda.gridsize(1)):
        S.index_group(x, g, bp, k, even, out)


@cuda.jit
def scale(grad, packed, k, levels, out):
    """Few-bit / PA backward: out = grad * levels[code] (the CPU's ``level_scaler``)."""
    for g in range(cuda.grid(1), (grad.size + 7) // 8, cuda.gridsize(1)):
        S.scale_group(grad, packed, g, k, levels, out)


@cuda.jit
def affine_index_pack(x, bp, k, slope, intercept, y, out):
    """PA forward: y and the packed segment index."""
    for g in range(cuda.grid(1), (x.size + 7) // 8, cuda.gridsize(1)):
        S.affine_group(x, g, bp, k, slope, intercept, y, out)


@cuda.jit
def inverted_forward(x, xbits, t, first, ytab, y, out):
    """Inverted forward after the native y: branch bits and the float32 window."""
    for g in range(cuda.grid(1), (x.size + 7) // 8, cuda.gridsize(1)):
        S.branch_group(x, xbits, g, t, first, ytab, y, out)


def _inverted_scale(ft, it):
    @cuda.jit
    def kernel(grad, y, ybits, packed, table, fcst, icst, out):
        """out = grad * f'(f⁻¹(y)), one thread per element (the CPU's
        ``inverted_scale``; the table is an argument here)."""
        for i in range(cuda.grid(1), grad.size, cuda.gridsize(1)):
            right = S.get_code(np.uint64(packed[i // 8]), i % 8, 1) != 0
            out[i] = grad[i] * S.inverted_slope(y[i], ybits[i], right, table, table.shape[1],
                                                fcst, icst, it, ft)
    return kernel


#: the inverted backward per dtype of y
INVERTED_SCALE = {np.dtype(np.float32): _inverted_scale(np.float32, np.int32),
                  np.dtype(np.float64): _inverted_scale(np.float64, np.int64)}


def signatures():
    """``(name, kernel, argument types)`` of every kernel as the layers launch it:
    what tests/test_cuda_ptx.py compiles for each GPU architecture."""
    from numba import types

    def vec(dt, ndim=1):
        return types.Array(getattr(types, dt), ndim, "C")

    u8, i64 = vec("uint8"), types.int64
    sigs = [("memory.pack", pack, (u8, i64, u8)), ("memory.unpack", unpack, (u8, i64, u8))]
    for ft, it in (("float32", "int32"), ("float64", "int64")):
        f = vec(ft)
        sigs += [
            (f"memory.index_pack[{ft}]", index_pack, (f, f, i64, types.boolean, u8)),
            (f"memory.scale[{ft}]", scale, (f, u8, i64, f, f)),
            (f"memory.affine_index_pack[{ft}]", affine_index_pack,
             (f, vec("float64"), i64, f, f, f, u8)),
            (f"memory.inverted_forward[{ft}]", inverted_forward,
             (f, vec(it), getattr(types, ft), i64, f, f, u8)),
            (f"memory.inverted_scale[{ft}]", INVERTED_SCALE[np.dtype(ft)],
             (f, f, vec(it), u8, vec(ft, 2), types.UniTuple(getattr(types, ft), 6),
              types.UniTuple(getattr(types, it), 12), f))]
    return sigs

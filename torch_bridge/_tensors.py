"""torch <-> emu: tensors handed to emu's backends and back, and operand rounding.

A CPU tensor is handed to emu's CPU backend as a zero-copy float32 numpy view (strided
views included) and the result comes back with ``torch.from_numpy``; a CUDA tensor is
handed to emu's CUDA backend as the tensor itself (emu/device.py reads it through
``__cuda_array_interface__`` and runs on torch's current stream) and the result is a
CUDA tensor, with the CPU's bits.  Other floating dtypes go through float32 (exact
for float16/bfloat16; float64 is rounded RNE, as emu documents) and results are cast
to the operands' promoted dtype.  Operands on different devices are a ValueError.
"""
from __future__ import annotations

import numpy as np
import torch

import emu
import emu.mx
import emu.shapes

from ._backend import cuda_backend_active

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(t, name: str) -> torch.Tensor:
    """A floating CPU or CUDA tensor, or a clear TypeError/ValueError naming ``name``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOATS:
        raise TypeError(f"{name} must have a floating dtype (float16, bfloat16, float32, "
                        f"float64), got {t.dtype}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {t.device}; torch_bridge runs on the CPU and on "
                         "CUDA devices")
    return t


def same_device(**tensors) -> None:
    """ValueError naming the operands when the tensors among them are on different
    devices (numbers are fine anywhere)."""
    devices = {n: t.device for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        raise ValueError("mixed devices: " + ", ".join(f"{n} on {d}" for n, d in devices.items())
                         + "; move every operand to one device (.to(device))")


def as_float32(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values, detached, as float32 (itself, detached, when it is one)."""
    t = t.detach()
    return t if t.dtype == torch.float32 else t.float()


def to_emu(t: torch.Tensor):
    """A tensor as an emu operand: a CUDA tensor itself, a CPU tensor as a zero-copy
    float32 numpy view (a simulated device array under ``cuda_backend()``)."""
    return device_view(as_float32(t))


def host_view(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's numpy view (no copy), through numpy's array interface (DLPack for
    other dtypes and empty tensors): ``Tensor.numpy()`` marks the storage non-resizable
    for good, and FSDP2 frees an unsharded parameter by resizing its storage to 0 after
    forward and backward (docs/torch_bridge.md, "FSDP2").  The interface is the cheaper
    of the two by a microsecond, and models make this call a few hundred times a step."""
    typestr = _TYPESTR.get(t.dtype)
    if typestr is None or t.is_neg() or not t.numel():
        return np.from_dlpack(t.detach())
    return np.asarray(_Memory(t, typestr))


_TYPESTR = {torch.float32: "<f4", torch.float64: "<f8", torch.int32: "<i4",
            torch.int64: "<i8", torch.uint8: "|u1", torch.int8: "|i1", torch.bool: "|b1"}


class _Memory:
    """A CPU tensor's memory as numpy's array interface; the array keeps this object,
    and so the tensor, alive."""
    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor, typestr: str):
        self.tensor = t
        # strides None: C-contiguous (half the cost of this call on a small tensor)
        self.__array_interface__ = {
            "version": 3, "shape": t.shape, "typestr": typestr, "data": (t.data_ptr(), False),
            "strides": None if t.is_contiguous() else
            tuple(st * t.element_size() for st in t.stride())}


def device_view(t: torch.Tensor):
    """A detached tensor of any dtype as a kernel operand, without a copy: a CUDA
    tensor itself, a CPU tensor as a numpy view (a simulated device array under
    ``cuda_backend()``)."""
    if t.is_cuda:           # emu wraps it and picks torch's stream: GPU only (docs/gpu.md)
        return t
    if cuda_backend_active():
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray(host_view(t))
    return host_view(t)


def from_emu(r, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An emu result (numpy, a CUDA tensor, or a Numba device array under
    ``cuda_backend()``) as a tensor of ``dtype`` on the operands' device."""
    if isinstance(r, torch.Tensor):     # a CUDA result: GPU only (docs/gpu.md)
        t = r
    elif hasattr(r, "copy_to_host"):
        t = torch.from_numpy(r.copy_to_host())
    else:
        t = torch.from_numpy(np.asarray(r, np.float32))
    return t if dtype == torch.float32 else t.to(dtype)


def emu_call(fn, *args, **kwargs):
    """``fn`` (an emu function) with its tensor arguments handed over by :func:`to_emu`
    and its result(s) returned as float32 tensors (None stays None)."""
    out = fn(*(to_emu(a) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
    if isinstance(out, tuple):
        return tuple(None if o is None else from_emu(o) for o in out)
    return from_emu(out)


def next_seed() -> int:
    """A stochastic-rounding stream drawn from torch's default generator."""
    return int(torch.randint(0, 2 ** 62, ()).item())


def round_to(x: torch.Tensor, fmt: emu.Format, rounding: str, axis: int = -1) -> torch.Tensor:
    """The float32 tensor ``x`` rounded into ``fmt`` (``x`` itself when nothing changes);
    an MX ``fmt`` (emu.mx.MXFormat) blocks along ``axis``."""
    if isinstance(fmt, emu.mx.MXFormat):     # emu.mx's kernels, on the tensor's device
        return from_emu(fmt.round(to_emu(x), axis))
    if fmt == emu.float32:          # every mode is the identity (NaNs are canonicalised by emu)
        return x
    one = emu.shapes.broadcast_base(x.shape, x.stride())
    if rounding != "stochastic" and one is not None:
        # a broadcast view (expand): its values rounded once, not copied out; stochastic
        # rounding draws for every element
        return round_to(x[one], fmt, rounding, axis).expand(x.shape)
    if rounding == "stochastic":
        return emu_call(emu.quantize, x, fmt, "stochastic", seed=next_seed())
    return emu_call(emu.quantize, x, fmt, rounding)


def round_scalar(v: float, fmt: emu.Format, rounding: str) -> np.float32:
    """The number ``v`` rounded into ``fmt`` (a host scalar, usable with any device)."""
    if fmt == emu.float32:
        return np.float32(v)
    seed = next_seed() if rounding == "stochastic" else None
    return np.float32(emu.quantize(np.float32(v), fmt, rounding, seed=seed))


def kernel_fmt(fmt: emu.Format) -> emu.Format:
    """The format to hand emu's matmul kernels once operands are values of ``fmt``
    (MX values are PAM-multiplied as float32: emu.mx_pam_matmul)."""
    return emu.float32 if isinstance(fmt, emu.mx.MXFormat) or fmt.exp_bits == 8 else fmt


def broadcast_shape(a, b):
    """The broadcast of two shapes (a torch.Size), or None if they do not broadcast
    (torch.broadcast_shapes costs ~70 us a call)."""
    if a == b:
        return torch.Size(a)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return torch.Size(out)

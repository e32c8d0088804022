"""The per-call path: emu's serial kernels run on small CPU tensors' memory directly."""
from __future__ import annotations

import numpy as np
import torch

import emu
import emu.shapes
from emu import lowlevel as LL
from emu import sizes

from ._backend import cuda_backend_active
from ._tensors import broadcast_shape, host_view

# Models run PA ops on tensors of a few hundred elements, where every microsecond of
# Python per call counts, not the arithmetic.  CPU operands of at most sizes.SERIAL_WORK
# elements therefore skip emu's front ends (formats, operands and shapes are already
# checked here) and run emu's serial kernel twins on the tensors' memory directly:
# rounding into the format (a kernel per operand, only when the format is not float32),
# then one kernel for the op, one for its two derivatives.  The kernels are emu's, so
# the bits are those of the emu calls of the general path (tests/test_fused.py).


class KernelConsts:
    """What the kernels need of (fmt, rounding): constants, rounding code, ln2."""
    __slots__ = ("fc", "f32", "mode", "ln2")

    def __init__(self, fmt, rounding):
        self.fc = fmt.consts
        self.f32 = fmt == emu.float32
        self.mode = LL.ROUNDING[rounding]
        self.ln2 = LL.ln2_pattern(fmt)


_KERNEL_CONSTS: dict = {}


def kernel_consts(fmt, rounding) -> KernelConsts:
    """The (cached) kernel constants of ``fmt`` and ``rounding``."""
    key = (fmt, rounding)
    n = _KERNEL_CONSTS.get(key)
    if n is None:
        n = _KERNEL_CONSTS[key] = KernelConsts(fmt, rounding)
    return n


def lean(rounding: str, *tensors, limit: int | None = None) -> bool:
    """Whether a call takes the per-call path: deterministic rounding, CPU tensors (not
    routed to the CUDA backend) of at most ``limit`` elements each (sizes.SERIAL_WORK
    by default)."""
    if limit is None:
        limit = sizes.SERIAL_WORK
    if rounding == "stochastic" or cuda_backend_active():
        return False
    for t in tensors:
        if t.device.type != "cpu" or t.numel() > limit:
            return False
    return True


def flat(t: torch.Tensor, shape=None) -> np.ndarray:
    """A float32 CPU tensor (broadcast to ``shape`` if given) as a flat uint32 array,
    the kernels' operand: a view when it is contiguous, else a contiguous copy."""
    if shape is not None and t.shape != shape:
        t = t.expand(shape)
    a = host_view(t)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint32)


def new(shape):
    """A new float32 CPU tensor of ``shape`` and the flat uint32 view kernels write it
    through (numpy's allocation: cheaper than torch.empty and a view of it)."""
    a = np.empty(shape, np.float32)
    return torch.from_numpy(a), a.reshape(-1).view(np.uint32)


def out_flat(t: torch.Tensor) -> np.ndarray:
    """The flat uint32 view a kernel writes a new (contiguous) float32 tensor through."""
    return host_view(t.view(-1)).view(np.uint32)


def round_lean(x: torch.Tensor, fmt: emu.Format, rounding: str) -> torch.Tensor:
    """:func:`~torch_bridge._tensors.round_to` for the per-call path (deterministic
    rounding, a float32 CPU tensor): emu's serial quantize kernel."""
    nm = kernel_consts(fmt, rounding)
    if nm.f32:
        return x
    out, o = new(x.shape)
    LL.QUANTIZE[False](flat(x), o, nm.fc, nm.mode, True, False, 0)
    return out


def rounded_lean(ctx, tensors, fmt, rounding):
    """The general path's rounding (torch_bridge/_functions.py) on the per-call path: the
    same tensors rounded and saved."""
    f32 = kernel_consts(fmt, rounding).f32
    rounded, saved = [], []
    for t in tensors:
        x = t.detach() if t.dtype == torch.float32 else t.detach().float()
        r = x if f32 else round_lean(x, fmt, rounding)
        rounded.append(r)
        saved.append(t if r is x and t.dtype == torch.float32 else r)
    ctx.save_for_backward(*saved)
    ctx.operands = [(t.shape, t.dtype) for t in tensors]
    return rounded


def binary_kernel(op, a, b, nm):
    """emu's op ``op`` (a binary registry op) of two float32 CPU tensors that are values
    of the format, with broadcasting, by its serial kernel: the result and the operands'
    flat arrays at its shape (for :func:`binary_grad_kernel`)."""
    shape = a.shape if a.shape == b.shape else broadcast_shape(a.shape, b.shape)
    if shape is None:           # emu's error, naming the shapes
        emu.shapes.broadcast(("a", a.shape), ("b", b.shape))
    out, o = new(shape)
    operands = flat(a, shape), flat(b, shape)
    LL.BINARY_SERIAL[op](*operands, o, nm.fc)
    return out, operands


def unary_kernel(op, x, nm):
    out, o = new(x.shape)
    LL.UNARY_SERIAL[op](flat(x), o, nm.fc)
    return out


def binary_grad_kernel(op, kind, a, b, g, nm, operands=None):
    """emu.grad's (δA, δB) of ``op`` (Table 1, ``kind``) by one serial kernel, at the
    broadcast shape of ``g``; ``operands``: a's and b's flat arrays at that shape, as
    :func:`binary_kernel` returned them (made here if None)."""
    shape = g.shape
    (da, oa), (db, ob) = new(shape), new(shape)
    args = *(operands or (flat(a, shape), flat(b, shape))), flat(g), oa, ob
    if kind == "exact":
        LL.GRAD_BINARY_SERIAL[op](*args, nm.fc)
    else:
        LL.GRAD_APPROX[False][op](*args, nm.ln2, nm.fc)
    return da, db


def unary_grad_kernel(op, kind, x, g, nm):
    dx, o = new(g.shape)
    if kind == "exact":
        LL.GRAD_UNARY_SERIAL[op](flat(x, g.shape), flat(g), o, nm.fc)
    else:
        LL.GRAD_APPROX[False][op](flat(x, g.shape), flat(g), o, nm.ln2, nm.fc)
    return dx

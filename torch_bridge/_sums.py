"""The composites' sums, in emu.fold_sum's defined order (docs/semantics.md §6), and
the broadcasts whose backward sums that way."""
from __future__ import annotations

import torch

import emu
from emu.host import host_fold
from emu.reduce import fold_plan

from ._backend import cuda_backend_active
from ._tensors import as_float32, emu_call, host_view


def fold(x: torch.Tensor, dims) -> torch.Tensor:
    """emu.fold_sum of ``x`` over ``dims`` (a tuple) with the reduced dimensions kept (size
    1), as a float32 tensor on x's device (no autograd)."""
    if x.device.type == "cpu" and not cuda_backend_active():
        key = (x.shape, dims)
        plan = _PLANS.get(key)
        if plan is None:
            plan = fold_plan(x.shape, dims, True)
            if len(_PLANS) < 4096:
                _PLANS[key] = plan
        return torch.from_numpy(host_fold(host_view(as_float32(x)), plan))
    return emu_call(emu.fold_sum, x, dims, True)


#: (shape, dims) -> fold_plan, and (shape, target shape) -> fold_to's dims: a model asks
#: again with the same few every step
_PLANS: dict = {}
_FOLD_TO: dict = {}


class FoldSum(torch.autograd.Function):
    """The float32 sum over ``dims`` (kept as size-1 dimensions) in emu.fold_sum's
    defined order (docs/semantics.md §6); its backward broadcasts the gradient back, as
    torch's sum does; without ``keepdim`` they are squeezed."""

    @staticmethod
    def forward(ctx, x, dims, keepdim=True):
        y = fold(x, dims).to(x.dtype)
        ctx.shapes = x.shape, y.shape
        return y if keepdim or not dims else y.squeeze(dims)

    @staticmethod
    def backward(ctx, g):
        shape, kept = ctx.shapes
        return g.reshape(kept).expand(shape), None, None


class Expand(torch.autograd.Function):
    """``t`` broadcast to ``shape``, its backward summing the gradient over the broadcast
    dimensions with emu.fold_sum (torch's expand sums with torch's order): the
    composites' broadcasts of row statistics."""

    @staticmethod
    def forward(ctx, t, shape):
        ctx.tshape = t.shape
        return t.expand(shape)

    @staticmethod
    def backward(ctx, g):
        return fold_to(g, ctx.tshape), None


def fold_to(g: torch.Tensor, shape) -> torch.Tensor:
    """``g`` summed over the dimensions it was broadcast along from ``shape`` (leading
    ones, and those of size 1 there), in emu.fold_sum's order."""
    key = (g.shape, tuple(shape))
    dims = _FOLD_TO.get(key)
    if dims is None:
        lead = g.dim() - len(shape)
        dims = tuple(range(lead)) + tuple(lead + d for d, s in enumerate(shape)
                                          if s == 1 and g.shape[lead + d] != 1)
        if len(_FOLD_TO) < 4096:
            _FOLD_TO[key] = dims
    if not dims:
        return g.reshape(shape)
    return fold(g, dims).reshape(shape).to(g.dtype)


def fold_sum(x: torch.Tensor, dims=None, keepdim: bool = True) -> torch.Tensor:
    """:class:`FoldSum` over ``dims`` (an int, a tuple, or None: all), as
    ``x.sum(dims, keepdim)``."""
    dims = tuple(range(x.dim())) if dims is None else (dims,) if isinstance(dims, int) \
        else tuple(dims)
    return FoldSum.apply(x, dims, keepdim)


def expand(t: torch.Tensor, shape) -> torch.Tensor:
    """:class:`Expand`: ``t`` broadcast to ``shape`` (itself if it has that shape)."""
    return t if tuple(t.shape) == tuple(shape) else Expand.apply(t, tuple(shape))


class Add(torch.autograd.Function):
    """``a + b`` with torch's broadcasting (the same float32 adds); the gradient of a
    broadcast operand (a bias) reduced by :func:`fold_to`, in emu.fold_sum's order,
    instead of by autograd's sum."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = a.shape, b.shape
        return a + b

    @staticmethod
    def backward(ctx, g):
        (sa, sb), need = ctx.shapes, ctx.needs_input_grad
        return fold_to(g, sa) if need[0] else None, fold_to(g, sb) if need[1] else None


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b``, by :class:`Add` where the operands broadcast (a bias add)."""
    return a + b if a.shape == b.shape else Add.apply(a, b)


def grad_out(g, operand) -> torch.Tensor:
    """A gradient from emu as a tensor shaped and typed like its operand ``(shape,
    dtype)``; a broadcast operand's gradient is reduced in emu.fold_sum's order
    (:func:`fold_to`)."""
    shape, dtype = operand
    if g.shape != shape:
        g = fold_to(g, shape)
    return g.to(dtype)

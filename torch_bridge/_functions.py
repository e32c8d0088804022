"""The primitives' autograd Functions: PAM matmul and the registry's elementwise ops
(with :class:`Constant` for a binary op with a number operand).

Every number these Functions produce comes from emu (forward: emu.pam_matmul and the
elementwise ops; backward: emu.grad).  Operands are rounded into the format *once*,
here (RNE, stochastic with a fresh seed from torch's RNG, or toward zero), and the
rounded values are what the backward pass differentiates at.  For formats with 8
exponent bits PAM and its exact derivative on values of the format equal the float32
ones bit for bit (same flush threshold, and the extra low bits of max are zero in every
product), so the kernels then run with ``fmt=float32`` and skip a second rounding pass
(tests/test_torch_grad.py::test_e8_formats_need_no_second_rounding).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import prange

import emu
import emu.grad as G
import emu.mx
from emu import sizes
from emu.grad import host_matmul_grad
from emu.lowlevel import scalar as S
from emu.lowlevel import scalar_approx as A
from emu.lowlevel import drop_stale, twins
from emu.matmul import host_matmul

from ._compose import fusable
from ._lean import (binary_grad_kernel, binary_kernel, flat, kernel_consts, lean, new,
                    round_lean, rounded_lean, unary_grad_kernel, unary_kernel)
from ._sums import grad_out as _grad_out
from ._tensors import (as_float32, broadcast_shape, emu_call, host_view, kernel_fmt, round_to,
                       same_device)
from ._threads import emu_threads

drop_stale(__file__)        # Constant's kernels inline emu's scalar definitions


def _rounded(ctx, tensors, fmt, rounding, axes=None):
    """Round each input into ``fmt`` (MX: in blocks along ``axes[i]``) and save the
    results for backward.  An input that rounding leaves alone is saved as the tensor
    itself (autograd then notices later in-place changes); rounded copies are saved as
    new tensors."""
    same_device(**{f"operand {i}": t for i, t in enumerate(tensors)})
    rounded, saved = [], []
    for t, axis in zip(tensors, axes or (-1,) * len(tensors)):
        x = as_float32(t)
        r = round_to(x, fmt, rounding, axis)
        rounded.append(r)
        saved.append(t if r is x and t.dtype == torch.float32 else r)
    ctx.save_for_backward(*saved)
    ctx.operands = [(t.shape, t.dtype) for t in tensors]
    return rounded


def _matmul_work(a, b) -> int:
    """Multiply-adds of torch.matmul(a, b)."""
    m = a.shape[-2] if a.dim() > 1 else 1
    n = b.shape[-1] if b.dim() > 1 else 1
    if a.dim() <= 2 and b.dim() <= 2:
        return m * n * a.shape[-1]
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    return math.prod(batch) * m * n * a.shape[-1] if batch is not None else 0


def _mm_args(nm):
    """(fmt, acc, multiplier params) for emu's matmul kernels: PAM runs E = 8 formats as
    float32 (kernel_fmt); another multiplier's products depend on the format itself
    (MX values: float32 by the element format's rule, emu.mx_matmul)."""
    if nm.mul is None:
        return kernel_fmt(nm.fmt), nm.acc, None
    return kernel_fmt(nm.fmt) if _mx(nm) else nm.fmt, nm.acc, nm.mul.params(_mul_fmt(nm))


def _mx(nm) -> bool:
    return isinstance(nm.fmt, emu.mx.MXFormat)


def _mul_fmt(nm):
    """The format whose rule of the multiplier the products follow."""
    return emu.mx.mx_element_multiplier(nm.fmt, nm.mul)[1] if _mx(nm) else nm.fmt


class PAMMatmul(torch.autograd.Function):
    """PAM matmul with torch.matmul's shapes; backward 'approx' or 'exact' (emu.grad);
    ``nm``: the call's checked :class:`~torch_bridge.config.Numerics`."""

    @staticmethod
    def forward(ctx, a, b, nm):
        fmt, rounding = nm.fmt, nm.rounding
        work = _matmul_work(a, b)
        ctx.lean = (work <= sizes.SERIAL_WORK and not isinstance(fmt, emu.mx.MXFormat)
                    and lean(rounding, a, b))
        with emu_threads(work):
            if ctx.lean:
                A, B = rounded_lean(ctx, (a, b), fmt, rounding)
                C = torch.from_numpy(host_matmul(host_view(A), host_view(B),
                                                 *_mm_args(nm)))
            else:
                # MX blocks run along the contraction axis of each operand
                A, B = _rounded(ctx, (a, b), fmt, rounding, (-1, -2 if b.dim() > 1 else -1))
                C = emu_call(emu.matmul, A, B, *_mm_args(nm)[:2], mul=nm.mul or "pam",
                             mul_fmt=_mul_fmt(nm) if nm.mul else None)
        ctx.nm, ctx.work = nm, work
        return C.to(torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, dc):
        nm, work = ctx.nm, ctx.work
        fmt, kind, rounding = nm.fmt, nm.backward, nm.rounding
        a, b = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        kfmt, acc, mp = _mm_args(nm)
        with emu_threads(work):
            if ctx.lean and dc.device.type == "cpu":
                g = round_lean(as_float32(dc), fmt, rounding)
                dA, dB = (None if r is None else torch.from_numpy(r) for r in host_matmul_grad(
                    host_view(as_float32(a)), host_view(as_float32(b)), host_view(g),
                    kfmt, acc, kind, need, mp))
            else:
                dA, dB = emu_call(G.matmul, a, b, round_to(as_float32(dc), fmt, rounding),
                                  kfmt, acc, kind, need=need, mul=nm.mul or "pam",
                                  mul_fmt=_mul_fmt(nm) if nm.mul else None)
        return (_grad_out(dA, ctx.operands[0]) if need[0] else None,
                _grad_out(dB, ctx.operands[1]) if need[1] else None, None)


class PABinary(torch.autograd.Function):
    """A binary op of emu's registry (emu.OPS: pam_mul, pa_div) with torch broadcasting;
    a broadcast operand's gradient is reduced in emu.fold_sum's order."""

    @staticmethod
    def forward(ctx, a, b, op, nm):
        fmt, rounding = nm.fmt, nm.rounding
        # another multiplier's products: emu.mul and emu.grad.mul (no lean kernels)
        other = op == "pam_mul" and nm.mul is not None
        ctx.lean = not other and lean(rounding, a, b, limit=sizes.LEAN_ELEMENTWISE)
        if ctx.lean:
            A, B = rounded_lean(ctx, (a, b), fmt, rounding)
            y, ctx.flats = binary_kernel(op, A, B, kernel_consts(fmt, rounding))
        else:
            with emu_threads(max(a.numel(), b.numel())):
                A, B = _rounded(ctx, (a, b), fmt, rounding)
                y = emu_call(emu.mul, A, B, fmt, nm.mul) if other else \
                    emu_call(getattr(emu, op), A, B, fmt)
        ctx.op, ctx.nm, ctx.other = op, nm, other
        return y if a.dtype is b.dtype is torch.float32 else \
            y.to(torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, dy):
        op, nm = ctx.op, ctx.nm
        fmt, kind, rounding = nm.fmt, nm.backward, nm.rounding
        a, b = ctx.saved_tensors
        if ctx.other:
            with emu_threads(dy.numel()):
                da, db = emu_call(G.mul, a, b, round_to(as_float32(dy), fmt, rounding), fmt,
                                  kind, nm.mul)
        elif ctx.lean and lean(rounding, dy, limit=sizes.LEAN_ELEMENTWISE):
            g = round_lean(as_float32(dy), fmt, rounding)
            da, db = binary_grad_kernel(op, kind, a, b, g, kernel_consts(fmt, rounding),
                                        ctx.flats)      # a, b: read for the version check
        else:
            with emu_threads(dy.numel()):
                da, db = emu_call(getattr(G, op), a, b,
                                  round_to(as_float32(dy), fmt, rounding), fmt, kind)
        need = ctx.needs_input_grad
        return (_grad_out(da, ctx.operands[0]) if need[0] else None,
                _grad_out(db, ctx.operands[1]) if need[1] else None, None, None)


class PAUnary(torch.autograd.Function):
    """A unary op of emu's registry (emu.OPS: pa_exp2, pa_log2, pa_exp, pa_log, pa_sqrt)."""

    @staticmethod
    def forward(ctx, x, op, nm):
        fmt, rounding = nm.fmt, nm.rounding
        ctx.lean = lean(rounding, x, limit=sizes.LEAN_ELEMENTWISE)
        if ctx.lean:
            (X,) = rounded_lean(ctx, (x,), fmt, rounding)
            y = unary_kernel(op, X, kernel_consts(fmt, rounding))
        else:
            with emu_threads(x.numel()):
                (X,) = _rounded(ctx, (x,), fmt, rounding)
                y = emu_call(getattr(emu, op), X, fmt)
        ctx.op, ctx.nm = op, nm
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        op, nm = ctx.op, ctx.nm
        fmt, kind, rounding = nm.fmt, nm.backward, nm.rounding
        (x,) = ctx.saved_tensors
        if ctx.lean and lean(rounding, dy, limit=sizes.LEAN_ELEMENTWISE):
            g = round_lean(as_float32(dy), fmt, rounding)
            dx = unary_grad_kernel(op, kind, as_float32(x), g, kernel_consts(fmt, rounding))
        else:
            with emu_threads(dy.numel()):
                dx = emu_call(getattr(G, op), x, round_to(as_float32(dy), fmt, rounding), fmt,
                              kind)
        return _grad_out(dx, ctx.operands[0]), None, None


# --- a binary primitive with a number operand ---------------------------------------------

def _constant_kernels(op):
    """pam_mul / pa_div of a tensor and a number (``c``, a pattern of a value of the
    format), the tensor already rounded: emu's kernels of the op on the tensor and the
    broadcast constant, without the broadcast."""
    entry = emu.OPS[op]
    scalar, (ga, gb) = entry.scalar, entry.grads
    rule, rule32 = entry.approx_scalar, A.FLOAT32[entry.approx_scalar.__name__]

    def forward(x, out, c, swap, fc):
        for i in prange(x.size):
            v = np.int64(x[i])
            out[i] = scalar(c, v, fc) if swap else scalar(v, c, fc)

    def backward(x, g, out, c, swap, exact, ln2, fc):
        if exact:
            for i in prange(x.size):
                v, d = np.int64(x[i]), np.int64(g[i])
                out[i] = gb(c, v, d, fc) if swap else ga(v, c, d, fc)
        elif S.is_float32(fc):
            for i in prange(x.size):
                v, d = np.int64(x[i]), np.int64(g[i])
                out[i] = rule32(c, v, d, ln2, fc)[1] if swap else rule32(v, c, d, ln2, fc)[0]
        else:
            for i in prange(x.size):
                v, d = np.int64(x[i]), np.int64(g[i])
                out[i] = rule(c, v, d, ln2, fc)[1] if swap else rule(v, c, d, ln2, fc)[0]
    # at most sizes.LEAN_ELEMENTWISE elements (constant_ok): the serial twins
    return (twins(f"constant {op} forward", forward)[False],
            twins(f"constant {op} backward", backward)[False])


CONSTANT = {op: _constant_kernels(op) for op in ("pam_mul", "pa_div")}

_CONSTANT_PATTERNS: dict = {}


def constant_ok(op, nm, x) -> bool:
    """Whether ``x op number`` takes :class:`Constant` under the Numerics ``nm``: PAM's
    or PA division's kernels, fusable and small."""
    return ((op == "pa_div" or nm.mul is None) and fusable(nm, x)
            and x.numel() <= sizes.LEAN_ELEMENTWISE)


def _constant(v, fmt, rounding) -> int:
    """The number ``v`` as functional._operand makes it beside a float32 tensor (float32),
    rounded into ``fmt`` as round_to rounds an operand: a pattern."""
    key = (v if v == v else "nan", fmt, rounding)      # (NaN != NaN as a key)
    c = _CONSTANT_PATTERNS.get(key)
    if c is None:
        r = round_lean(torch.tensor(float(v), dtype=torch.float32), fmt, rounding)
        c = int(host_view(r).reshape(1).view(np.uint32)[0])
        if len(_CONSTANT_PATTERNS) > 4096:
            _CONSTANT_PATTERNS.clear()
        _CONSTANT_PATTERNS[key] = c
    return c


class Constant(torch.autograd.Function):
    """PABinary with a number operand (``swap``: the number is the first): the same emu
    ops on the tensor and the broadcast constant, without making and broadcasting a
    tensor of the number."""

    @staticmethod
    def forward(ctx, x, v, swap, op, fmt, kind, rounding):
        nm = kernel_consts(fmt, rounding)
        c = _constant(v, fmt, rounding)
        (X,) = rounded_lean(ctx, (x,), fmt, rounding)
        out, o = new(x.shape)
        CONSTANT[op][0](flat(X), o, c, swap, nm.fc)
        ctx.op, ctx.c, ctx.swap, ctx.kc, ctx.exact = op, c, swap, nm, kind == "exact"
        ctx.fmt, ctx.rounding = fmt, rounding
        return out

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        g = round_lean(as_float32(dy), ctx.fmt, ctx.rounding)
        out, o = new(g.shape)
        CONSTANT[ctx.op][1](flat(as_float32(x)), flat(g), o, ctx.c, ctx.swap, ctx.exact,
                            ctx.kc.ln2, ctx.kc.fc)
        return out, None, None, None, None, None, None

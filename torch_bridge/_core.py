"""torch <-> emu: tensor conversion, operand rounding and the autograd Functions.

Every number these Functions produce comes from emu (forward: emu.pam_matmul and the
elementwise ops; backward: emu.grad).  Tensors are handed to emu as float32 numpy
arrays — zero-copy for float32 CPU tensors, strided views included — and results
come back with ``torch.from_numpy``; other floating dtypes go through float32
(exact for float16/bfloat16; float64 is rounded RNE, as emu documents) and results
are cast to the operands' promoted dtype.

Operands are rounded into the format *once*, here (RNE, stochastic with a fresh
seed from torch's RNG, or toward zero), and the rounded values are what the backward
pass differentiates at.  For formats with 8 exponent bits PAM and its exact
derivative on values of the format equal the float32 ones bit for bit (same flush
threshold, and the extra low bits of max are zero in every product), so the
kernels then run with ``fmt=float32`` and skip a second rounding pass
(tests/test_torch_grad.py::test_e8_formats_need_no_second_rounding).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import numba
import numpy as np
import torch

import emu
import emu.mx
import emu.grad as G

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(t, name: str) -> torch.Tensor:
    """A floating CPU tensor, or a clear TypeError/ValueError naming ``name``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOATS:
        raise TypeError(f"{name} must have a floating dtype (float16, bfloat16, float32, "
                        f"float64), got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; torch_bridge emulates PA hardware on "
                         "the CPU (move it with .cpu())")
    return t


def to_np(t: torch.Tensor) -> np.ndarray:
    """The tensor's values as a float32 numpy array (a view for float32 tensors)."""
    t = t.detach()
    if t.dtype != torch.float32:
        t = t.float()
    return t.numpy()


def from_np(a, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(np.asarray(a, dtype=np.float32))
    return t if dtype == torch.float32 else t.to(dtype)


def next_seed() -> int:
    """A stochastic-rounding stream drawn from torch's default generator."""
    return int(torch.randint(0, 2 ** 62, ()).item())


def round_np(x: np.ndarray, fmt: emu.Format, rounding: str, axis: int = -1) -> np.ndarray:
    """``x`` rounded into ``fmt`` (a new array, or ``x`` itself when nothing changes);
    an MX ``fmt`` (emu.mx.MXFormat) blocks along ``axis``."""
    if isinstance(fmt, emu.mx.MXFormat):
        return fmt.round(x, axis)
    if fmt == emu.float32:          # every mode is the identity (NaNs are canonicalised by emu)
        return x
    if rounding == "stochastic":
        return np.asarray(emu.quantize(x, fmt, "stochastic", seed=next_seed()))
    return np.asarray(emu.quantize(x, fmt, rounding))


def _start_numba_threads():
    """Start Numba's thread pool now, keeping torch's thread count: with the OpenMP
    threading layer, starting the pool sets the OpenMP thread count that torch shares
    to NUMBA_NUM_THREADS, which would silently undo an earlier torch.set_num_threads."""
    n = torch.get_num_threads()
    numba.get_num_threads()
    torch.set_num_threads(n)


_start_numba_threads()

#: below this much work (elements, or multiply-adds for a matmul) emu runs on one
#: thread: waking a second one costs more than it saves, and on a loaded machine a
#: parallel region can wait milliseconds for a descheduled worker
SERIAL_WORK = 1 << 18


@contextmanager
def emu_threads(work: int):
    """Numba threads for an emu call: one for small work, else as many as torch uses."""
    n = 1 if work < SERIAL_WORK else max(1, min(torch.get_num_threads(),
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


def kernel_fmt(fmt: emu.Format) -> emu.Format:
    """The format to hand emu's matmul kernels once operands are values of ``fmt``
    (MX values are PAM-multiplied as float32: emu.mx_pam_matmul)."""
    return emu.float32 if isinstance(fmt, emu.mx.MXFormat) or fmt.exp_bits == 8 else fmt


def _rounded(ctx, tensors, fmt, rounding, axes=None):
    """Round each input into ``fmt`` (MX: in blocks along ``axes[i]``) and save the
    results for backward.  An input that rounding leaves alone is saved as the tensor
    itself (autograd then notices later in-place changes); rounded copies are saved as
    new tensors."""
    arrays, saved = [], []
    for t, axis in zip(tensors, axes or (-1,) * len(tensors)):
        raw = to_np(t)
        arr = round_np(raw, fmt, rounding, axis)
        arrays.append(arr)
        saved.append(t if arr is raw and t.dtype == torch.float32 else torch.from_numpy(arr))
    ctx.save_for_backward(*saved)
    ctx.operands = [(t.shape, t.dtype) for t in tensors]
    return arrays


def _grad_out(g, operand) -> torch.Tensor:
    """A gradient from emu as a tensor shaped and typed like its operand; a broadcast
    operand's gradient is reduced with float32 additions."""
    shape, dtype = operand
    g = torch.from_numpy(np.asarray(g, np.float32))
    if g.shape != shape:
        g = g.sum_to_size(shape)
    return g.to(dtype)


def _matmul_work(a, b) -> int:
    """Multiply-adds of torch.matmul(a, b)."""
    m = a.shape[-2] if a.dim() > 1 else 1
    n = b.shape[-1] if b.dim() > 1 else 1
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return math.prod(batch) * m * n * a.shape[-1]


class PAMMatmul(torch.autograd.Function):
    """PAM matmul with torch.matmul's shapes; backward 'approx' or 'exact' (emu.grad)."""

    @staticmethod
    def forward(ctx, a, b, fmt, acc, kind, rounding):
        work = _matmul_work(a, b)
        with emu_threads(work):
            # MX blocks run along the contraction axis of each operand
            A, B = _rounded(ctx, (a, b), fmt, rounding, (-1, -2 if b.dim() > 1 else -1))
            C = emu.pam_matmul(A, B, kernel_fmt(fmt), acc)
        ctx.meta = (fmt, acc, kind, rounding, work)
        return from_np(C, torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, dc):
        fmt, acc, kind, rounding, work = ctx.meta
        a, b = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        with emu_threads(work):
            dA, dB = G.pam_matmul(to_np(a), to_np(b), round_np(to_np(dc), fmt, rounding),
                                  kernel_fmt(fmt), acc, kind, need=need)
        return (_grad_out(dA, ctx.operands[0]) if need[0] else None,
                _grad_out(dB, ctx.operands[1]) if need[1] else None, None, None, None, None)


_FORWARD = {"pam_mul": emu.pam_mul, "pa_div": emu.pa_div, "pa_exp2": emu.pa_exp2,
            "pa_log2": emu.pa_log2, "pa_exp": emu.pa_exp, "pa_log": emu.pa_log,
            "pa_sqrt": emu.pa_sqrt}
_GRAD = {"pam_mul": G.pam_mul, "pa_div": G.pa_div, "pa_exp2": G.pa_exp2,
         "pa_log2": G.pa_log2, "pa_exp": G.pa_exp, "pa_log": G.pa_log, "pa_sqrt": G.pa_sqrt}
BINARY = ("pam_mul", "pa_div")
UNARY = ("pa_exp2", "pa_log2", "pa_exp", "pa_log", "pa_sqrt")


class PABinary(torch.autograd.Function):
    """Elementwise pam_mul / pa_div with torch broadcasting."""

    @staticmethod
    def forward(ctx, a, b, op, fmt, kind, rounding):
        with emu_threads(max(a.numel(), b.numel())):
            A, B = _rounded(ctx, (a, b), fmt, rounding)
            y = _FORWARD[op](A, B, fmt)
        ctx.meta = (op, fmt, kind, rounding)
        return from_np(y, torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, dy):
        op, fmt, kind, rounding = ctx.meta
        a, b = ctx.saved_tensors
        with emu_threads(dy.numel()):
            da, db = _GRAD[op](to_np(a), to_np(b), round_np(to_np(dy), fmt, rounding), fmt,
                               kind)
        need = ctx.needs_input_grad
        return (_grad_out(da, ctx.operands[0]) if need[0] else None,
                _grad_out(db, ctx.operands[1]) if need[1] else None, None, None, None, None)


class PAUnary(torch.autograd.Function):
    """Elementwise pa_exp2 / pa_log2 / pa_exp / pa_log / pa_sqrt."""

    @staticmethod
    def forward(ctx, x, op, fmt, kind, rounding):
        with emu_threads(x.numel()):
            (X,) = _rounded(ctx, (x,), fmt, rounding)
            y = _FORWARD[op](X, fmt)
        ctx.meta = (op, fmt, kind, rounding)
        return from_np(y, x.dtype)

    @staticmethod
    def backward(ctx, dy):
        op, fmt, kind, rounding = ctx.meta
        (x,) = ctx.saved_tensors
        with emu_threads(dy.numel()):
            dx = _GRAD[op](to_np(x), round_np(to_np(dy), fmt, rounding), fmt, kind)
        return _grad_out(dx, ctx.operands[0]), None, None, None, None

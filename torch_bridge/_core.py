"""torch <-> emu: tensors to emu's backends and back, operand rounding and the autograd
Functions.

Every number these Functions produce comes from emu (forward: emu.pam_matmul and the
elementwise ops; backward: emu.grad).  Tensors stay torch tensors: a CPU tensor is
handed to emu's CPU backend as a zero-copy float32 numpy view (strided views
included) and the result comes back with ``torch.from_numpy``; a CUDA tensor is
handed to emu's CUDA backend as the tensor itself (emu/device.py reads it through
``__cuda_array_interface__`` and runs on torch's current stream) and the result is a
CUDA tensor, with the CPU's bits.  Other floating dtypes go through float32 (exact
for float16/bfloat16; float64 is rounded RNE, as emu documents) and results are cast
to the operands' promoted dtype.  Operands on different devices are a ValueError.

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


def as_float32(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values, detached, as float32 (itself, detached, when it is one)."""
    t = t.detach()
    return t if t.dtype == torch.float32 else t.float()


def to_emu(t: torch.Tensor):
    """A tensor as an emu operand: a CUDA tensor itself, a CPU tensor as a zero-copy
    float32 numpy view (a simulated device array under :func:`cuda_backend`)."""
    return device_view(as_float32(t))


def on_cuda_backend(t: torch.Tensor) -> bool:
    """Whether ``t`` goes to a CUDA backend: a CUDA tensor, or any under :func:`cuda_backend`."""
    return t.is_cuda or _CUDA_FOR_CPU


def device_view(t: torch.Tensor):
    """A detached tensor of any dtype as a kernel operand, without a copy: a CUDA
    tensor itself, a CPU tensor as a numpy view (a simulated device array under
    :func:`cuda_backend`)."""
    if t.is_cuda:           # emu wraps it and picks torch's stream: GPU only (docs/gpu.md)
        return t
    if _CUDA_FOR_CPU:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray(t.numpy())
    return t.numpy()


def from_emu(r, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An emu result (numpy, a CUDA tensor, or a Numba device array under
    :func:`cuda_backend`) as a tensor of ``dtype`` on the operands' device."""
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
    if rounding == "stochastic":
        return emu_call(emu.quantize, x, fmt, "stochastic", seed=next_seed())
    return emu_call(emu.quantize, x, fmt, rounding)


def round_scalar(v: float, fmt: emu.Format, rounding: str) -> np.float32:
    """The number ``v`` rounded into ``fmt`` (a host scalar, usable with any device)."""
    if fmt == emu.float32:
        return np.float32(v)
    seed = next_seed() if rounding == "stochastic" else None
    return np.float32(emu.quantize(np.float32(v), fmt, rounding, seed=seed))


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


def _grad_out(g, operand) -> torch.Tensor:
    """A gradient from emu as a tensor shaped and typed like its operand; a broadcast
    operand's gradient is reduced with float32 additions."""
    shape, dtype = operand
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
            C = emu_call(emu.pam_matmul, A, B, kernel_fmt(fmt), acc)
        ctx.meta = (fmt, acc, kind, rounding, work)
        return C.to(torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, dc):
        fmt, acc, kind, rounding, work = ctx.meta
        a, b = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        with emu_threads(work):
            dA, dB = emu_call(G.pam_matmul, a, b, round_to(as_float32(dc), fmt, rounding),
                              kernel_fmt(fmt), acc, kind, need=need)
        return (_grad_out(dA, ctx.operands[0]) if need[0] else None,
                _grad_out(dB, ctx.operands[1]) if need[1] else None, None, None, None, None)


class PABinary(torch.autograd.Function):
    """A binary op of emu's registry (emu.OPS: pam_mul, pa_div) with torch broadcasting."""

    @staticmethod
    def forward(ctx, a, b, op, fmt, kind, rounding):
        with emu_threads(max(a.numel(), b.numel())):
            A, B = _rounded(ctx, (a, b), fmt, rounding)
            y = emu_call(getattr(emu, op), A, B, fmt)
        ctx.meta = (op, fmt, kind, rounding)
        return y.to(torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, dy):
        op, fmt, kind, rounding = ctx.meta
        a, b = ctx.saved_tensors
        with emu_threads(dy.numel()):
            da, db = emu_call(getattr(G, op), a, b, round_to(as_float32(dy), fmt, rounding),
                              fmt, kind)
        need = ctx.needs_input_grad
        return (_grad_out(da, ctx.operands[0]) if need[0] else None,
                _grad_out(db, ctx.operands[1]) if need[1] else None, None, None, None, None)


class PAUnary(torch.autograd.Function):
    """A unary op of emu's registry (emu.OPS: pa_exp2, pa_log2, pa_exp, pa_log, pa_sqrt)."""

    @staticmethod
    def forward(ctx, x, op, fmt, kind, rounding):
        with emu_threads(x.numel()):
            (X,) = _rounded(ctx, (x,), fmt, rounding)
            y = emu_call(getattr(emu, op), X, fmt)
        ctx.meta = (op, fmt, kind, rounding)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        op, fmt, kind, rounding = ctx.meta
        (x,) = ctx.saved_tensors
        with emu_threads(dy.numel()):
            dx = emu_call(getattr(G, op), x, round_to(as_float32(dy), fmt, rounding), fmt, kind)
        return _grad_out(dx, ctx.operands[0]), None, None, None, None

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
from emu import sizes
import emu.mx
import emu.shapes
import emu.grad as G
from emu import _kernels as K
from emu import _kernels_grad as KG
from emu._scalar_approx import ln2_pattern
from emu.grad import host_matmul_grad
from emu.host import host_fold
from emu.matmul import host_matmul
from emu.ops import ROUNDING
from emu.reduce import fold_plan

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

@contextmanager
def emu_threads(work: int):
    """Numba threads for an emu call: one for small work, else as many as torch uses."""
    n = 1 if work < sizes.SERIAL_WORK else max(1, min(torch.get_num_threads(),
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
    operand's gradient is reduced in emu.fold_sum's order (:func:`fold_to`)."""
    shape, dtype = operand
    if g.shape != shape:
        g = fold_to(g, shape)
    return g.to(dtype)


def _matmul_work(a, b) -> int:
    """Multiply-adds of torch.matmul(a, b)."""
    m = a.shape[-2] if a.dim() > 1 else 1
    n = b.shape[-1] if b.dim() > 1 else 1
    if a.dim() <= 2 and b.dim() <= 2:
        return m * n * a.shape[-1]
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    return math.prod(batch) * m * n * a.shape[-1] if batch is not None else 0


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


# --- the per-call path ---------------------------------------------------------------
#
# Models run PA ops on tensors of a few hundred elements, where every microsecond of
# Python per call counts, not the arithmetic.  CPU operands of at most sizes.SERIAL_WORK
# elements therefore skip emu's front ends (formats, operands and shapes are already
# checked here) and run emu's serial kernel twins on the tensors' memory directly:
# rounding into the format (a kernel per operand, only when the format is not float32),
# then one kernel for the op, one for its two derivatives.  The kernels are emu's, so
# the bits are those of the emu calls of the general path (tests/test_fused.py).


class _Numerics:
    """What the kernels need of (fmt, rounding): constants, rounding code, ln2."""
    __slots__ = ("fc", "f32", "mode", "ln2")

    def __init__(self, fmt, rounding):
        self.fc = fmt.consts
        self.f32 = fmt == emu.float32
        self.mode = ROUNDING[rounding]
        self.ln2 = ln2_pattern(fmt)


_NUMERICS: dict = {}


def numerics(fmt, rounding) -> _Numerics:
    """The (cached) kernel constants of ``fmt`` and ``rounding``."""
    key = (fmt, rounding)
    n = _NUMERICS.get(key)
    if n is None:
        n = _NUMERICS[key] = _Numerics(fmt, rounding)
    return n


def lean(rounding: str, *tensors, limit: int | None = None) -> bool:
    """Whether a call takes the per-call path: deterministic rounding, CPU tensors (not
    routed to the CUDA backend) of at most ``limit`` elements each (sizes.SERIAL_WORK
    by default)."""
    if limit is None:
        limit = sizes.SERIAL_WORK
    if rounding == "stochastic" or _CUDA_FOR_CPU:
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
    a = t.detach().numpy() if t.requires_grad else t.numpy()
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
    return t.view(-1).numpy().view(np.uint32)


def round_lean(x: torch.Tensor, fmt: emu.Format, rounding: str) -> torch.Tensor:
    """:func:`round_to` for the per-call path (deterministic rounding, a float32 CPU
    tensor): emu's serial quantize kernel."""
    nm = numerics(fmt, rounding)
    if nm.f32:
        return x
    out, o = new(x.shape)
    K.QUANTIZE[False](flat(x), o, nm.fc, nm.mode, True, False, 0)
    return out


def _rounded_lean(ctx, tensors, fmt, rounding):
    """:func:`_rounded` on the per-call path: the same tensors rounded and saved."""
    f32 = numerics(fmt, rounding).f32
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
    of the format, with broadcasting, by its serial kernel."""
    shape = a.shape if a.shape == b.shape else broadcast_shape(a.shape, b.shape)
    if shape is None:           # emu's error, naming the shapes
        emu.shapes.broadcast(("a", a.shape), ("b", b.shape))
    out, o = new(shape)
    K.BINARY_SERIAL[op](flat(a, shape), flat(b, shape), o, nm.fc)
    return out


def unary_kernel(op, x, nm):
    out, o = new(x.shape)
    K.UNARY_SERIAL[op](flat(x), o, nm.fc)
    return out


def binary_grad_kernel(op, kind, a, b, g, nm):
    """emu.grad's (δA, δB) of ``op`` (Table 1, ``kind``) by one serial kernel, at the
    broadcast shape of ``g``."""
    shape = g.shape
    (da, oa), (db, ob) = new(shape), new(shape)
    args = flat(a, shape), flat(b, shape), flat(g), oa, ob
    if kind == "exact":
        KG.BINARY_SERIAL[op](*args, nm.fc)
    else:
        KG.APPROX[False][op](*args, nm.ln2, nm.fc)
    return da, db


def unary_grad_kernel(op, kind, x, g, nm):
    dx, o = new(g.shape)
    if kind == "exact":
        KG.UNARY_SERIAL[op](flat(x, g.shape), flat(g), o, nm.fc)
    else:
        KG.APPROX[False][op](flat(x, g.shape), flat(g), o, nm.ln2, nm.fc)
    return dx


# --- the autograd Functions -------------------------------------------------------------

class PAMMatmul(torch.autograd.Function):
    """PAM matmul with torch.matmul's shapes; backward 'approx' or 'exact' (emu.grad)."""

    @staticmethod
    def forward(ctx, a, b, fmt, acc, kind, rounding):
        work = _matmul_work(a, b)
        ctx.lean = (work <= sizes.SERIAL_WORK and not isinstance(fmt, emu.mx.MXFormat)
                    and lean(rounding, a, b))
        with emu_threads(work):
            if ctx.lean:
                A, B = _rounded_lean(ctx, (a, b), fmt, rounding)
                C = torch.from_numpy(host_matmul(A.detach().numpy(), B.detach().numpy(),
                                                 kernel_fmt(fmt), acc))
            else:
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
            if ctx.lean and dc.device.type == "cpu":
                g = round_lean(as_float32(dc), fmt, rounding)
                dA, dB = (None if r is None else torch.from_numpy(r) for r in host_matmul_grad(
                    as_float32(a).numpy(), as_float32(b).numpy(), g.detach().numpy(),
                    kernel_fmt(fmt), acc, kind, need))
            else:
                dA, dB = emu_call(G.pam_matmul, a, b, round_to(as_float32(dc), fmt, rounding),
                                  kernel_fmt(fmt), acc, kind, need=need)
        return (_grad_out(dA, ctx.operands[0]) if need[0] else None,
                _grad_out(dB, ctx.operands[1]) if need[1] else None, None, None, None, None)


class PAMLinear(torch.autograd.Function):
    """functional.pam_linear on the per-call path as one Function: its graph — ``x``
    reshaped to rows, PAMMatmul of (rows, ``weight.t()``), reshaped back, ``+ bias`` in
    float32 — with the graph's bits (the same emu kernels on the same rounded operands; the
    bias gradient reduced by :func:`fold_to`, as the graph's :func:`add` reduces it) and one
    autograd node instead of five.  Float32 tensors, deterministic rounding.  Products of
    at most emu's small-matmul size with a float32 accumulator round and multiply in one
    kernel call each way (torch_bridge._fused.LINEAR; approximate backward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, fmt, acc, kind, rounding):
        from . import _fused
        x2 = x.reshape(-1, x.shape[-1])
        (M, K), N = x2.shape, weight.shape[0]
        nm = numerics(fmt, rounding)
        one_call = acc is emu.float32 and M * N * K <= sizes.SMALL
        ctx.meta = fmt, acc, kind, rounding, x.shape, None if bias is None else bias.shape
        ctx.one_call = one_call
        if one_call:
            a = x2.detach().numpy() if x2.is_contiguous() else x2.detach().contiguous().numpy()
            w = weight.detach().numpy() if weight.is_contiguous() else \
                weight.detach().contiguous().numpy()
            ra, rw = (a, w) if nm.f32 else (np.empty_like(a), np.empty_like(w))
            out = np.empty((M, N), np.float32)
            _fused.LINEAR[0](a, w, ra, rw, out, not nm.f32, nm.fc, nm.mode,
                             kernel_fmt(fmt).consts)
            if nm.f32:
                ctx.save_for_backward(x, weight)
            else:
                ctx.save_for_backward(torch.from_numpy(ra), torch.from_numpy(rw))
            C = torch.from_numpy(out)
        else:
            with emu_threads(M * N * K):
                A, W = _rounded_lean(ctx, (x2, weight), fmt, rounding)
                C = torch.from_numpy(host_matmul(A.detach().numpy(), W.detach().numpy().T,
                                                 kernel_fmt(fmt), acc))
        y = C.reshape(*x.shape[:-1], N)
        return y if bias is None else y + bias.detach()

    @staticmethod
    def backward(ctx, dy):
        from . import _fused
        fmt, acc, kind, rounding, xshape, bshape = ctx.meta
        a, w = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        N, K = w.shape
        g = as_float32(dy).reshape(-1, N)
        if ctx.one_call and kind == "approx":
            nm = numerics(fmt, rounding)
            gn = g.numpy() if g.is_contiguous() else g.contiguous().numpy()
            dA = np.empty((gn.shape[0], K), np.float32) if need[0] else _fused._EMPTY2
            dW = np.empty((N, K), np.float32) if need[1] else _fused._EMPTY2
            _fused.LINEAR[1](as_float32(a).reshape(-1, K).contiguous().numpy(),
                             as_float32(w).contiguous().numpy(), gn,
                             gn if nm.f32 else np.empty_like(gn), dA, dW, not nm.f32, nm.fc,
                             nm.mode, kernel_fmt(fmt).consts, need[0], need[1])
        else:
            g = round_lean(g, fmt, rounding)
            with emu_threads(a.numel() * N):
                dA, dB = host_matmul_grad(as_float32(a).reshape(-1, K).numpy(),
                                          as_float32(w).numpy().T, g.detach().numpy(),
                                          kernel_fmt(fmt), acc, kind, need)
            dW = dB.T if need[1] else None
        dx = torch.from_numpy(dA).reshape(xshape) if need[0] else None
        dw = torch.from_numpy(dW) if need[1] else None
        db = fold_to(dy, bshape) if bshape is not None and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None, None


class PABinary(torch.autograd.Function):
    """A binary op of emu's registry (emu.OPS: pam_mul, pa_div) with torch broadcasting;
    a broadcast operand's gradient is reduced in emu.fold_sum's order."""

    @staticmethod
    def forward(ctx, a, b, op, fmt, kind, rounding):
        ctx.lean = lean(rounding, a, b, limit=sizes.LEAN_ELEMENTWISE)
        if ctx.lean:
            A, B = _rounded_lean(ctx, (a, b), fmt, rounding)
            y = binary_kernel(op, A, B, numerics(fmt, rounding))
        else:
            with emu_threads(max(a.numel(), b.numel())):
                A, B = _rounded(ctx, (a, b), fmt, rounding)
                y = emu_call(getattr(emu, op), A, B, fmt)
        ctx.meta = (op, fmt, kind, rounding)
        return y.to(torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, dy):
        op, fmt, kind, rounding = ctx.meta
        a, b = ctx.saved_tensors
        if ctx.lean and lean(rounding, dy, limit=sizes.LEAN_ELEMENTWISE):
            g = round_lean(as_float32(dy), fmt, rounding)
            da, db = binary_grad_kernel(op, kind, as_float32(a), as_float32(b), g,
                                        numerics(fmt, rounding))
        else:
            with emu_threads(dy.numel()):
                da, db = emu_call(getattr(G, op), a, b,
                                  round_to(as_float32(dy), fmt, rounding), fmt, kind)
        need = ctx.needs_input_grad
        return (_grad_out(da, ctx.operands[0]) if need[0] else None,
                _grad_out(db, ctx.operands[1]) if need[1] else None, None, None, None, None)


class PAUnary(torch.autograd.Function):
    """A unary op of emu's registry (emu.OPS: pa_exp2, pa_log2, pa_exp, pa_log, pa_sqrt)."""

    @staticmethod
    def forward(ctx, x, op, fmt, kind, rounding):
        ctx.lean = lean(rounding, x, limit=sizes.LEAN_ELEMENTWISE)
        if ctx.lean:
            (X,) = _rounded_lean(ctx, (x,), fmt, rounding)
            y = unary_kernel(op, X, numerics(fmt, rounding))
        else:
            with emu_threads(x.numel()):
                (X,) = _rounded(ctx, (x,), fmt, rounding)
                y = emu_call(getattr(emu, op), X, fmt)
        ctx.meta = (op, fmt, kind, rounding)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        op, fmt, kind, rounding = ctx.meta
        (x,) = ctx.saved_tensors
        if ctx.lean and lean(rounding, dy, limit=sizes.LEAN_ELEMENTWISE):
            g = round_lean(as_float32(dy), fmt, rounding)
            dx = unary_grad_kernel(op, kind, as_float32(x), g, numerics(fmt, rounding))
        else:
            with emu_threads(dy.numel()):
                dx = emu_call(getattr(G, op), x, round_to(as_float32(dy), fmt, rounding), fmt,
                              kind)
        return _grad_out(dx, ctx.operands[0]), None, None, None, None


# --- the composites' sums: emu.fold_sum's defined order ----------------------------------

def fold(x: torch.Tensor, dims) -> torch.Tensor:
    """emu.fold_sum of ``x`` over ``dims`` (a tuple) with the reduced dimensions kept (size
    1), as a float32 tensor on x's device (no autograd)."""
    if x.device.type == "cpu" and not _CUDA_FOR_CPU:
        key = (x.shape, dims)
        plan = _PLANS.get(key)
        if plan is None:
            plan = fold_plan(x.shape, dims, True)
            if len(_PLANS) < 4096:
                _PLANS[key] = plan
        return torch.from_numpy(host_fold(as_float32(x).numpy(), plan))
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

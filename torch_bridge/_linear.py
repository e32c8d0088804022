"""pam_linear on the per-call path as one autograd Function, and its one-call kernels
for small products (rounding and products in one kernel call each way)."""
from __future__ import annotations

import numpy as np
import torch
from numba import njit
from numba.extending import register_jitable

import emu
from emu import lowlevel as LL
from emu import sizes
from emu.grad import host_matmul_grad
from emu.matmul import host_matmul

from ._functions import _mm_args
from ._lean import kernel_consts, round_lean, rounded_lean
from ._sums import fold_to
from ._tensors import as_float32, host_view
from ._threads import emu_threads


# the kernels below inline emu's quantize and small-matmul kernels (and their scalars)
LL.drop_stale(__file__)

_QUANTIZE = LL.QUANTIZE[False]
_MM = LL.matmul_small
_Z1 = np.zeros(1, np.int64)
_SUM = LL.scalar_mul.SUM


@register_jitable
def _round_into(x, out, rnd, fcq, mode):
    """out = round_to(x) (emu's quantize kernel), or x itself when nothing rounds."""
    if rnd:
        _QUANTIZE(x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint32), fcq, mode,
                  True, False, 0)
        return out
    return x


def _linear_forward(x, w, rx, rw, out, rnd, fcq, mode, fcm, c32):
    """out (M, N) = matmul(R(x) (M, K), R(w)ᵀ) by the pattern-sum multiplier of constant
    ``c32`` (PAM: 0): what PAMMatmul's per-call path computes (emu.matmul.host_matmul's
    small kernel, operands rounded by emu's quantize kernel)."""
    a = _round_into(x, rx, rnd, fcq, mode)
    b = _round_into(w, rw, rnd, fcq, mode)
    _MM(a.view(np.int32).reshape(1, a.shape[0], a.shape[1]),
        np.ascontiguousarray(b.T).view(np.int32).reshape(1, b.shape[1], b.shape[0]),
        _Z1, _Z1, out.reshape(1, out.shape[0], out.shape[1]), fcm, c32)


def _linear_backward(a, w, dy, rg, dx, dw, rnd, fcq, mode, fcm, c32, need_x, need_w):
    """The approximate gradients of ``matmul(a, wᵀ)`` as emu.grad.host_matmul_grad
    forms them for 2-D operands: dx = R(dy) w, dwᵀ = aᵀ R(dy) or (R(dy)ᵀ a)ᵀ (a
    constant pattern sum commutes)."""
    g = _round_into(dy, rg, rnd, fcq, mode)
    M, K = a.shape
    N = w.shape[0]
    if need_x:
        _MM(g.view(np.int32).reshape(1, M, N), w.view(np.int32).reshape(1, N, K), _Z1, _Z1,
            dx.reshape(1, M, K), fcm, c32)
    if need_w:
        if M * K <= M * N:
            db = np.empty((1, K, N), np.float32)
            _MM(np.ascontiguousarray(a.T).view(np.int32).reshape(1, K, M),
                g.view(np.int32).reshape(1, M, N), _Z1, _Z1, db, fcm, c32)
            dw[:, :] = db[0].T
        else:
            _MM(np.ascontiguousarray(g.T).view(np.int32).reshape(1, N, M),
                a.view(np.int32).reshape(1, M, K), _Z1, _Z1, dw.reshape(1, N, K), fcm, c32)


#: (forward, backward): the one-call kernels of :class:`LinearFunction` (and of
#: torch_bridge._recurrence.Recurrence's hidden projections)
LINEAR = (njit(cache=True)(_linear_forward), njit(cache=True)(_linear_backward))
#: the output of a gradient that is not needed
EMPTY2 = np.zeros((0, 0), np.float32)


class LinearFunction(torch.autograd.Function):
    """functional.pam_linear on the per-call path as one Function: its graph — ``x``
    reshaped to rows, PAMMatmul of (rows, ``weight.t()``), reshaped back, ``+ bias`` in
    float32 — with the graph's bits (the same emu kernels on the same rounded operands; the
    bias gradient reduced by :func:`fold_to`, as the graph's :func:`add` reduces it) and one
    autograd node instead of five.  Float32 tensors, deterministic rounding; ``nm``: the
    call's checked :class:`~torch_bridge.config.Numerics`.  Products of at most emu's
    small-matmul size with a float32 accumulator round and multiply in one kernel call
    each way (:data:`LINEAR`; approximate backward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, nm):
        fmt, rounding = nm.fmt, nm.rounding
        x2 = x.reshape(-1, x.shape[-1])
        (M, K), N = x2.shape, weight.shape[0]
        kc = kernel_consts(fmt, rounding)
        kfmt, acc, mp = _mm_args(nm)
        one_call = (acc is emu.float32 and M * N * K <= sizes.SMALL
                    and (mp is None or (mp.kind == _SUM and mp.k == 0)))
        ctx.nm, ctx.one_call = nm, one_call
        ctx.shapes = x.shape, None if bias is None else bias.shape
        if one_call:
            a = host_view(x2.detach().contiguous())
            w = host_view(weight.detach().contiguous())
            ra, rw = (a, w) if kc.f32 else (np.empty_like(a), np.empty_like(w))
            out = np.empty((M, N), np.float32)
            LINEAR[0](a, w, ra, rw, out, not kc.f32, kc.fc, kc.mode, kfmt.consts,
                      0 if mp is None else mp.c32)
            if kc.f32:
                ctx.save_for_backward(x, weight)
            else:
                ctx.save_for_backward(torch.from_numpy(ra), torch.from_numpy(rw))
            C = torch.from_numpy(out)
        else:
            with emu_threads(M * N * K):
                A, W = rounded_lean(ctx, (x2, weight), fmt, rounding)
                C = torch.from_numpy(host_matmul(host_view(A), host_view(W).T,
                                                 kfmt, acc, mp))
        y = C.reshape(*x.shape[:-1], N)
        return y if bias is None else y + bias.detach()

    @staticmethod
    def backward(ctx, dy):
        nm, (xshape, bshape) = ctx.nm, ctx.shapes
        fmt, kind, rounding = nm.fmt, nm.backward, nm.rounding
        kfmt, acc, mp = _mm_args(nm)
        a, w = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        N, K = w.shape
        g = as_float32(dy).reshape(-1, N)
        if ctx.one_call and kind == "approx":
            kc = kernel_consts(fmt, rounding)
            gn = host_view(g.contiguous())
            dA = np.empty((gn.shape[0], K), np.float32) if need[0] else EMPTY2
            dW = np.empty((N, K), np.float32) if need[1] else EMPTY2
            LINEAR[1](host_view(as_float32(a).reshape(-1, K).contiguous()),
                      host_view(as_float32(w).contiguous()), gn,
                      gn if kc.f32 else np.empty_like(gn), dA, dW, not kc.f32, kc.fc,
                      kc.mode, kfmt.consts, 0 if mp is None else mp.c32, need[0], need[1])
        else:
            g = round_lean(g, fmt, rounding)
            with emu_threads(a.numel() * N):
                dA, dB = host_matmul_grad(host_view(as_float32(a).reshape(-1, K)),
                                          host_view(as_float32(w)).T, host_view(g),
                                          kfmt, acc, kind, need, mp)
            dW = dB.T if need[1] else None
        dx = torch.from_numpy(dA).reshape(xshape) if need[0] else None
        dw = torch.from_numpy(dW) if need[1] else None
        db = fold_to(dy, bshape) if bshape is not None and ctx.needs_input_grad[2] else None
        return dx, dw, db, None

"""Fused composites: one kernel forward and one backward per activation, norm and loss.

A composite of torch_bridge (functional.py, elementwise.py, losses.py) is a graph of PA
primitives, each an autograd Function with its own kernel calls and Python; the fused
version is one autograd Function whose forward is one CPU kernel and whose backward is
one CPU kernel, computing the same nodes in the same order with emu's scalar
definitions (torch_bridge/_fused_scalar.py has the definitions and the rules), so its
outputs and gradients are the graph's bit for bit (tests/test_fused.py).  The graph
stays: it is the reference of the tests and the path for stochastic rounding, CUDA
tensors (docs/gpu.md), dtypes other than float32 and ``enabled(False)``.

Where the composite's input gets several gradient contributions in the graph (e.g.
layer norm's x, through x - μ and through Σx), the fused Function takes the input once
per contribution and returns them separately, so autograd adds them to whatever the
input received before in the graph's order.  Gradients of broadcast parameters (a
norm's weight and bias, a recurrent layer's bias) are reduced by
``_sums.fold_to`` (emu.fold_sum's order) in both.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch
from numba import prange
from numba.extending import register_jitable

import emu
from emu import sizes
from emu.grad import host_matmul_grad
from emu.lowlevel import as_f32, as_i32, drop_stale, fold, twins
from emu.lowlevel import scalar as S
from emu.lowlevel import scalar_approx as A
from emu.registry import log2e

from . import _fused_scalar as FS
from ._backend import cuda_backend_active
from ._lean import flat, kernel_consts, new, out_flat, round_lean, rounded_lean
from ._linear import LINEAR
from ._sums import fold_to
from ._tensors import as_float32, kernel_fmt
from .config import Numerics

__all__ = ["enabled", "use", "elementwise", "rows", "layer_norm", "rms_norm",
           "cross_entropy"]


drop_stale(__file__)


@register_jitable
def _F(p):
    return as_f32(np.int32(p & 0xFFFFFFFF))


@register_jitable
def _P(v):
    return np.int64(as_i32(v)) & 0xFFFFFFFF


@register_jitable
def _fadd(a, b):
    return a + b


@register_jitable
def _fsub(a, b):
    return a - b


#: the definitions for float32 (every rounding compiled out) and for any other format;
#: each kernel tests the format once, outside its loop
D32 = FS.define(_F, _P, _fadd, _fsub, True)
D = FS.define(_F, _P, _fadd, _fsub, False)

# --- switch -------------------------------------------------------------------------------

_ENABLED = True


def enabled() -> bool:
    """Whether the composites take their fused kernels where they can."""
    return _ENABLED


@contextmanager
def use(on: bool):
    """Run the composites fused (``True``, the default) or as their graphs (``False``)."""
    global _ENABLED
    old, _ENABLED = _ENABLED, bool(on)
    try:
        yield
    finally:
        _ENABLED = old


def fusable(rounding: str, *tensors) -> bool:
    """Whether the fast paths run: enabled, deterministic rounding, float32 CPU tensors
    (None entries are absent optional operands)."""
    if not _ENABLED or rounding == "stochastic" or cuda_backend_active():
        return False
    return all(t is None or (isinstance(t, torch.Tensor) and t.dtype == torch.float32
                             and t.device.type == "cpu") for t in tensors)


def composite(rounding: str, x, *tensors) -> bool:
    """Whether a composite of ``x`` (and further operands) runs fused: :func:`fusable`,
    and ``x`` has at most sizes.FUSED_MAX elements."""
    return fusable(rounding, x, *tensors) and x.numel() <= sizes.FUSED_MAX


def _kind(kind: str) -> int:
    return FS.EXACT if kind == "exact" else FS.APPROX


def _f32(t: torch.Tensor) -> np.ndarray:
    """A float32 CPU tensor's values as a flat contiguous float32 array (no autograd)."""
    return t.detach().reshape(-1).numpy()


def _par(n: int) -> bool:
    return n >= sizes.SERIAL


_CONSTS: dict = {}


def consts(key, fmt, rounding, *items) -> np.ndarray:
    """The constants array of a composite, as patterns: ``R(1.0)``, then each item: a
    number as float32 rounded into ``fmt`` (round_to of a constant operand), or
    ``("raw", v)``: ``v`` as float32 (a constant that is added, not a PA operand)."""
    k = (key, fmt, rounding, items)
    c = _CONSTS.get(k)
    if c is None:
        vals = [1.0] + [v[1] if isinstance(v, tuple) else float(v) for v in items]
        keep = np.array([False] + [isinstance(v, tuple) for v in items])
        t = torch.tensor(vals, dtype=torch.float32)
        r = round_lean(t, fmt, rounding).numpy()
        pats = np.where(keep, t.numpy(), r).astype(np.float32).view(np.uint32).astype(np.int64)
        if len(_CONSTS) > 4096:
            _CONSTS.clear()
        c = _CONSTS[k] = pats
    return c


# --- elementwise composites ----------------------------------------------------------------

#: name -> number of gradient contributions ("slots") of its input in the graph
SLOTS = {"sigmoid": 1, "tanh": 2, "silu": 2, "gelu_tanh": 5, "gelu_erf": 3, "softplus": 2}


def _elementwise_kernels(name):
    fwd, bwd = D[name + "_fwd"], D[name + "_bwd"]
    fwd32, bwd32 = D32[name + "_fwd"], D32[name + "_bwd"]

    def forward(x, y, c, fc, mode):
        if S.is_float32(fc):
            for i in prange(x.size):
                y[i] = _F(fwd32(_P(x[i]), c, fc, mode))
        else:
            for i in prange(x.size):
                y[i] = _F(fwd(_P(x[i]), c, fc, mode))

    def backward(x, g, dx, c, kind, ln2, fc, mode):
        if S.is_float32(fc):
            for i in prange(x.size):
                bwd32(_P(x[i]), _P(g[i]), c, kind, ln2, fc, mode, dx, i)
        else:
            for i in prange(x.size):
                bwd(_P(x[i]), _P(g[i]), c, kind, ln2, fc, mode, dx, i)
    return twins(f"fused {name} forward", forward), twins(f"fused {name} backward", backward)


ELEMENTWISE = {name: _elementwise_kernels(name) for name in SLOTS}


class Elementwise(torch.autograd.Function):
    """An elementwise composite (``SLOTS``) fused; its input passed once per slot."""

    @staticmethod
    def forward(ctx, name, c, fmt, rounding, kind, x, *_):
        nm = kernel_consts(fmt, rounding)
        y = torch.empty(x.shape)
        ELEMENTWISE[name][0][_par(x.numel())](_f32(x), out_flat(y).view(np.float32), c, nm.fc,
                                              nm.mode)
        ctx.save_for_backward(x)
        ctx.meta = name, c, nm, kind
        return y

    @staticmethod
    def backward(ctx, g):
        name, c, nm, kind = ctx.meta
        (x,) = ctx.saved_tensors
        n = SLOTS[name]
        dx = torch.empty((n,) + tuple(x.shape))
        ELEMENTWISE[name][1][_par(x.numel())](_f32(x), _f32(g.float()), dx.view(n, -1).numpy(),
                                              c, kind, nm.ln2, nm.fc, nm.mode)
        return (None,) * 5 + tuple(dx.unbind(0))


def elementwise(name: str, x: torch.Tensor, c: np.ndarray, nm: Numerics) -> torch.Tensor:
    """The composite ``name`` of ``x`` fused (the caller checked :func:`fusable`)."""
    return Elementwise.apply(name, c, nm.fmt, nm.rounding, _kind(nm.backward),
                             *(x,) * SLOTS[name])


# --- rows: softmax, log_softmax -------------------------------------------------------------

def _row_kernels(name):
    fwd, bwd = D[name + "_fwd"], D[name + "_bwd"]
    fwd32, bwd32 = D32[name + "_fwd"], D32[name + "_bwd"]

    def forward(x, out, rows, n, c, fc, mode):
        if S.is_float32(fc):
            for r in prange(rows):
                fwd32(x, r * n, n, out, c, fc, mode)
        else:
            for r in prange(rows):
                fwd(x, r * n, n, out, c, fc, mode)

    def backward(x, g, dx, tmp, rows, n, c, kind, ln2, fc, mode):
        if S.is_float32(fc):
            for r in prange(rows):
                bwd32(x, g, r * n, n, dx, tmp, c, kind, ln2, fc, mode)
        else:
            for r in prange(rows):
                bwd(x, g, r * n, n, dx, tmp, c, kind, ln2, fc, mode)
    return twins(f"fused {name} forward", forward), twins(f"fused {name} backward", backward)


ROWS = {name: _row_kernels(name) for name in ("softmax", "log_softmax")}


class Rows(torch.autograd.Function):
    """softmax or log_softmax over the last dimension, fused."""

    @staticmethod
    def forward(ctx, name, c, fmt, rounding, kind, x):
        nm = kernel_consts(fmt, rounding)
        n = x.shape[-1]
        out = torch.empty(x.shape)
        ROWS[name][0][_par(x.numel())](_f32(x), out_flat(out).view(np.float32),
                                       x.numel() // max(n, 1), n, c, nm.fc, nm.mode)
        ctx.save_for_backward(x)
        ctx.meta = name, c, nm, kind
        return out

    @staticmethod
    def backward(ctx, g):
        name, c, nm, kind = ctx.meta
        (x,) = ctx.saved_tensors
        n = x.shape[-1]
        dx = torch.empty(x.shape)
        tmp = np.empty(x.numel(), np.float32)
        ROWS[name][1][_par(x.numel())](_f32(x), _f32(g.float()), out_flat(dx).view(np.float32),
                                       tmp, x.numel() // max(n, 1), n, c, kind, nm.ln2, nm.fc,
                                       nm.mode)
        return None, None, None, None, None, dx


def rows(name: str, x: torch.Tensor, dim: int, nm: Numerics) -> torch.Tensor:
    """softmax / log_softmax of ``x`` along ``dim``, fused (the caller checked
    :func:`fusable` and that x is not empty)."""
    fmt = nm.fmt
    c = consts("rows", fmt, nm.rounding, log2e(fmt))
    last = dim % x.dim() == x.dim() - 1 if x.dim() else True
    xm = x if last else x.movedim(dim, -1)
    y = Rows.apply(name, c, fmt, nm.rounding, _kind(nm.backward), xm)
    return y if last else y.movedim(-1, dim)


# --- rows: layer norm, RMS norm -------------------------------------------------------------

_EMPTY = np.zeros(0, np.float32)


def _norm_kernels(name):
    fwd, fwd32 = D[name + "_fwd"], D32[name + "_fwd"]

    def forward(x, w, b, out, rows, n, c, fc, mode):
        if S.is_float32(fc):
            for r in prange(rows):
                fwd32(x, r * n, n, w, b, out, c, fc, mode)
        else:
            for r in prange(rows):
                fwd(x, r * n, n, w, b, out, c, fc, mode)
    return twins(f"fused {name} forward", forward), D[name + "_bwd"], D32[name + "_bwd"]


def _ln_backward(x, g, w, dx, dsum, dw, tmp, rows, n, c, kind, ln2, fc, mode):
    if S.is_float32(fc):
        for r in prange(rows):
            dsum[r] = LN_BWD32(x, g, r * n, n, w, dx, dw, tmp, c, kind, ln2, fc, mode)
    else:
        for r in prange(rows):
            dsum[r] = LN_BWD(x, g, r * n, n, w, dx, dw, tmp, c, kind, ln2, fc, mode)


def _rms_backward(x, g, w, dx, dx2, dx3, dw, tmp, rows, n, c, kind, ln2, fc, mode):
    if S.is_float32(fc):
        for r in prange(rows):
            RMS_BWD32(x, g, r * n, n, w, dx, dx2, dx3, dw, tmp, c, kind, ln2, fc, mode)
    else:
        for r in prange(rows):
            RMS_BWD(x, g, r * n, n, w, dx, dx2, dx3, dw, tmp, c, kind, ln2, fc, mode)


LN_FWD, LN_BWD, LN_BWD32 = _norm_kernels("layer_norm")
RMS_FWD, RMS_BWD, RMS_BWD32 = _norm_kernels("rms_norm")
LN_BACKWARD = twins("fused layer_norm backward", _ln_backward)
RMS_BACKWARD = twins("fused rms_norm backward", _rms_backward)


def _norm_forward(ctx, kernels, c, fmt, rounding, kind, x, weight, bias, n):
    nm = kernel_consts(fmt, rounding)
    out = torch.empty(x.shape)
    kernels[_par(x.numel())](_f32(x), _EMPTY if weight is None else _f32(weight),
                             _EMPTY if bias is None else _f32(bias),
                             out_flat(out).view(np.float32), x.numel() // n, n, c, nm.fc,
                             nm.mode)
    ctx.save_for_backward(x, weight)
    ctx.meta = c, nm, kind, n, None if bias is None else bias.shape
    return out


class LayerNorm(torch.autograd.Function):
    """pa_layer_norm over the trailing ``n`` elements, fused; x passed twice (its
    gradient through x - μ, then through Σx)."""

    @staticmethod
    def forward(ctx, c, fmt, rounding, kind, n, x, _x, weight, bias):
        return _norm_forward(ctx, LN_FWD, c, fmt, rounding, kind, x, weight, bias, n)

    @staticmethod
    def backward(ctx, g):
        c, nm, kind, n, bshape = ctx.meta
        x, weight = ctx.saved_tensors
        rows = x.numel() // n
        dx = torch.empty(x.shape)
        dsum = torch.empty(rows)
        dw = torch.empty(x.shape) if weight is not None else None
        g = g.float()
        LN_BACKWARD[_par(x.numel())](
            _f32(x), _f32(g), _EMPTY if weight is None else _f32(weight),
            out_flat(dx).view(np.float32), dsum.numpy(),
            _EMPTY if dw is None else out_flat(dw).view(np.float32),
            np.empty(x.numel(), np.float32), rows, n, c, kind, nm.ln2, nm.fc, nm.mode)
        dsum = dsum.view(-1, 1).expand(rows, n).reshape(x.shape)
        gw = None if dw is None else fold_to(dw, weight.shape)
        gb = None if bshape is None else fold_to(g, bshape)
        return None, None, None, None, None, dx, dsum, gw, gb


class RMSNorm(torch.autograd.Function):
    """pa_rms_norm over the trailing ``n`` elements, fused; x passed three times (the
    division's numerator, then x ·̂ x's two operands)."""

    @staticmethod
    def forward(ctx, c, fmt, rounding, kind, n, x, _x2, _x3, weight):
        return _norm_forward(ctx, RMS_FWD, c, fmt, rounding, kind, x, weight, None, n)

    @staticmethod
    def backward(ctx, g):
        c, nm, kind, n, _ = ctx.meta
        x, weight = ctx.saved_tensors
        rows = x.numel() // n
        dx, dx2, dx3 = (torch.empty(x.shape) for _ in range(3))
        dw = torch.empty(x.shape) if weight is not None else None
        RMS_BACKWARD[_par(x.numel())](
            _f32(x), _f32(g.float()), _EMPTY if weight is None else _f32(weight),
            *(out_flat(t).view(np.float32) for t in (dx, dx2, dx3)),
            _EMPTY if dw is None else out_flat(dw).view(np.float32),
            np.empty(x.numel(), np.float32), rows, n, c, kind, nm.ln2, nm.fc, nm.mode)
        gw = None if dw is None else fold_to(dw, weight.shape)
        return None, None, None, None, None, dx, dx2, dx3, gw


def layer_norm(x, n, weight, bias, eps, nm: Numerics):
    """pa_layer_norm fused over the trailing ``n`` elements (checked by the caller)."""
    fmt = nm.fmt
    c = consts("norm", fmt, nm.rounding, float(n), ("raw", eps))
    return LayerNorm.apply(c, fmt, nm.rounding, _kind(nm.backward), n, x, x,
                           weight, bias)


def rms_norm(x, n, weight, eps, nm: Numerics):
    """pa_rms_norm fused over the trailing ``n`` elements (checked by the caller)."""
    fmt = nm.fmt
    c = consts("norm", fmt, nm.rounding, float(n), ("raw", eps))
    return RMSNorm.apply(c, fmt, nm.rounding, _kind(nm.backward), n, x, x, x, weight)


# --- cross-entropy --------------------------------------------------------------------------

REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


C_ROWS = FS.C_A + 3        # the row count N, rounded: the 'mean' divisor of probability targets
CE_FWD, CE_FWD32, CE_BWD, CE_BWD32 = D["ce_fwd"], D32["ce_fwd"], D["ce_bwd"], D32["ce_bwd"]
RND, DIV_G, DIV_G32 = D["rnd"], D["div_g"], D32["div_g"]


def _ce_forward(x, t, valid, q, w, wy, loss, tmp, res, rows, n, c, smooth, red, fc, mode):
    """Per row the masked loss into ``loss``; then ``res`` = (Σ loss, Σ valid weights, the
    reduction) by defined-order folds."""
    f32 = S.is_float32(fc)
    for r in prange(rows):
        if f32:
            v = CE_FWD32(x, r * n, n, t[r], q, w, tmp, c, smooth, fc, mode)
        else:
            v = CE_FWD(x, r * n, n, t[r], q, w, tmp, c, smooth, fc, mode)
        loss[r] = _F(v) if valid[r] else np.float32(0.0)
    total = fold(loss, 0, rows, 1)
    res[0] = total
    if red == 2:
        if q.size:
            denom = _F(c[C_ROWS])
        else:
            for r in range(rows):
                tmp[r] = wy[r] if valid[r] else np.float32(0.0)
            denom = fold(tmp, 0, rows, 1)
        res[1] = denom
        if f32:
            res[2] = _F(S.pa_div(_P(total), _P(denom), fc))
        else:
            res[2] = _F(S.pa_div(RND(_P(total), fc, mode), RND(_P(denom), fc, mode), fc))


def _ce_backward(x, g, t, valid, q, w, dx, tmp, res, rows, n, c, smooth, red, kind, ln2, fc,
                 mode):
    f32 = S.is_float32(fc)
    gtot = _P(g[0])
    if red == 2:
        if f32:
            gtot = DIV_G32(_P(res[0]), _P(res[1]), gtot, kind, ln2, fc, mode)[0]
        else:
            gtot = DIV_G(RND(_P(res[0]), fc, mode), RND(_P(res[1]), fc, mode), gtot, kind,
                         ln2, fc, mode)[0]
    for r in prange(rows):
        gl = _P(g[r]) if red == 0 else gtot
        if not q.size:
            gl = gl if valid[r] else np.int64(0)
        if f32:
            CE_BWD32(x, gl, r * n, n, t[r], q, w, dx, tmp, c, smooth, kind, ln2, fc, mode)
        else:
            CE_BWD(x, gl, r * n, n, t[r], q, w, dx, tmp, c, smooth, kind, ln2, fc, mode)


CE = (twins("fused cross_entropy forward", _ce_forward),
      twins("fused cross_entropy backward", _ce_backward))


class CrossEntropy(torch.autograd.Function):
    """pa_cross_entropy of (rows, C) logits, fused (no gradient to targets or weights)."""

    @staticmethod
    def forward(ctx, c, fmt, rounding, kind, red, smooth, t, valid, q, w, wy, z):
        nm = kernel_consts(fmt, rounding)
        rows, n = z.shape
        loss = torch.empty(rows)
        res = np.zeros(3, np.float32)
        qa = _EMPTY if q is None else _f32(q)
        wa = _EMPTY if w is None else _f32(w)
        CE[0][_par(z.numel())](_f32(z), t, valid, qa, wa, wy, loss.numpy(),
                               np.empty(max(z.numel(), rows), np.float32), res, rows, n, c,
                               smooth, red, nm.fc, nm.mode)
        ctx.save_for_backward(z)
        ctx.meta = c, nm, kind, red, smooth, t, valid, qa, wa, res
        if red == 0:
            return loss
        return torch.tensor(res[0] if red == 1 else res[2])

    @staticmethod
    def backward(ctx, g):
        c, nm, kind, red, smooth, t, valid, qa, wa, res = ctx.meta
        (z,) = ctx.saved_tensors
        rows, n = z.shape
        dz = torch.empty(z.shape)
        CE[1][_par(z.numel())](_f32(z), _f32(g.float()), t, valid, qa, wa,
                               out_flat(dz).view(np.float32), np.empty(z.numel(), np.float32),
                               res, rows, n, c, smooth, red, kind, nm.ln2, nm.fc, nm.mode)
        return (None,) * 11 + (dz,)


def cross_entropy(z, t, valid, q, weight, wy, reduction, eps, eps_c, nm: Numerics):
    """pa_cross_entropy of the (rows, C) float32 logits ``z`` fused: class targets ``t``
    (int64, 0 where not ``valid``) or probability targets ``q`` (smoothed already);
    ``wy``: the targets' weights (float32, rows), for 'mean'."""
    fmt = nm.fmt
    c = consts("ce", fmt, nm.rounding, log2e(fmt), 1.0 - eps, eps_c, float(z.shape[0]))
    rows = z.shape[0]
    smooth = q is None and eps > 0
    ta = np.zeros(rows, np.int64) if t is None else t.numpy()
    va = np.ones(rows, np.bool_) if valid is None else valid.numpy()
    wya = np.ones(rows, np.float32) if wy is None else _f32(wy)
    return CrossEntropy.apply(c, fmt, nm.rounding, _kind(nm.backward),
                              REDUCTIONS[reduction], smooth, ta, va, q, weight, wya, z)



# --- recurrent cells ------------------------------------------------------------------------

GRU_FWD, GRU_FWD32, GRU_BWD, GRU_BWD32 = D["gru_fwd"], D32["gru_fwd"], D["gru_bwd"], D32["gru_bwd"]
LSTM_FWD, LSTM_FWD32 = D["lstm_fwd"], D32["lstm_fwd"]
LSTM_BWD, LSTM_BWD32 = D["lstm_bwd"], D32["lstm_bwd"]


def _gru_forward(gi, gh, h, out, rows, H, c, fc, mode):
    """gi, gh: (rows, 3H) flat; h, out: (rows, H) flat."""
    f32 = S.is_float32(fc)
    for r in prange(rows):
        a, o = r * 3 * H, r * H
        for j in range(H):
            args = (_P(gi[a + j]), _P(gi[a + H + j]), _P(gi[a + 2 * H + j]), _P(gh[a + j]),
                    _P(gh[a + H + j]), _P(gh[a + 2 * H + j]), _P(h[o + j]))
            if f32:
                out[o + j] = _F(GRU_FWD32(*args, c, fc, mode))
            else:
                out[o + j] = _F(GRU_FWD(*args, c, fc, mode))


def _gru_backward(gi, gh, h, g, dgi, dgh, dh, rows, H, c, kind, ln2, fc, mode):
    f32 = S.is_float32(fc)
    for r in prange(rows):
        a, o = r * 3 * H, r * H
        for j in range(H):
            args = (_P(gi[a + j]), _P(gi[a + H + j]), _P(gi[a + 2 * H + j]), _P(gh[a + j]),
                    _P(gh[a + H + j]), _P(gh[a + 2 * H + j]), _P(h[o + j]), _P(g[o + j]))
            if f32:
                gar, gaz, gan, ghn, gd = GRU_BWD32(*args, c, kind, ln2, fc, mode)
            else:
                gar, gaz, gan, ghn, gd = GRU_BWD(*args, c, kind, ln2, fc, mode)
            dgi[a + j] = dgh[a + j] = _F(gar)
            dgi[a + H + j] = dgh[a + H + j] = _F(gaz)
            dgi[a + 2 * H + j] = _F(gan)
            dgh[a + 2 * H + j] = _F(ghn)
            dh[o + j] = _F(gd)


def _lstm_forward(gi, gh, cp, h2, c2, rows, H, c, fc, mode):
    """gi, gh: (rows, 4H) flat; cp, h2, c2: (rows, H) flat."""
    f32 = S.is_float32(fc)
    for r in prange(rows):
        a, o = r * 4 * H, r * H
        for j in range(H):
            args = (_P(gi[a + j]), _P(gi[a + H + j]), _P(gi[a + 2 * H + j]),
                    _P(gi[a + 3 * H + j]), _P(gh[a + j]), _P(gh[a + H + j]),
                    _P(gh[a + 2 * H + j]), _P(gh[a + 3 * H + j]), _P(cp[o + j]))
            if f32:
                hv, cv = LSTM_FWD32(*args, c, fc, mode)
            else:
                hv, cv = LSTM_FWD(*args, c, fc, mode)
            h2[o + j] = _F(hv)
            c2[o + j] = _F(cv)


def _lstm_backward(gi, gh, cp, gh2, has_h, gc2, has_c, ds, dcp, rows, H, c, kind, ln2, fc,
                   mode):
    f32 = S.is_float32(fc)
    for r in prange(rows):
        a, o = r * 4 * H, r * H
        for j in range(H):
            args = (_P(gi[a + j]), _P(gi[a + H + j]), _P(gi[a + 2 * H + j]),
                    _P(gi[a + 3 * H + j]), _P(gh[a + j]), _P(gh[a + H + j]),
                    _P(gh[a + 2 * H + j]), _P(gh[a + 3 * H + j]), _P(cp[o + j]),
                    _P(gh2[o + j]) if has_h else np.int64(0), has_h,
                    _P(gc2[o + j]) if has_c else np.int64(0), has_c)
            if f32:
                gi_, gf, gg, go, gcp = LSTM_BWD32(*args, c, kind, ln2, fc, mode)
            else:
                gi_, gf, gg, go, gcp = LSTM_BWD(*args, c, kind, ln2, fc, mode)
            ds[a + j], ds[a + H + j] = _F(gi_), _F(gf)
            ds[a + 2 * H + j], ds[a + 3 * H + j] = _F(gg), _F(go)
            dcp[o + j] = _F(gcp)


GRU = (twins("fused gru forward", _gru_forward), twins("fused gru backward", _gru_backward))
LSTM = (twins("fused lstm forward", _lstm_forward), twins("fused lstm backward", _lstm_backward))


def _new(*shape):
    a = np.empty(shape, np.float32)
    return torch.from_numpy(a), a.reshape(-1)


class GRUStep(torch.autograd.Function):
    """One GRU step's gate arithmetic (recurrent._cell) fused: gi, gh (N, 3H), h (N, H)."""

    @staticmethod
    def forward(ctx, c, fmt, rounding, kind, gi, gh, h):
        nm = kernel_consts(fmt, rounding)
        rows, H = h.shape
        out, o = _new(rows, H)
        GRU[0][_par(gh.numel())](_f32(gi), _f32(gh), _f32(h), o, rows, H, c, nm.fc, nm.mode)
        ctx.save_for_backward(gi, gh, h)
        ctx.meta = c, nm, kind
        return out

    @staticmethod
    def backward(ctx, g):
        c, nm, kind = ctx.meta
        gi, gh, h = ctx.saved_tensors
        rows, H = h.shape
        (dgi, a), (dgh, b), (dh, d) = _new(rows, 3 * H), _new(rows, 3 * H), _new(rows, H)
        GRU[1][_par(gh.numel())](_f32(gi), _f32(gh), _f32(h), _f32(g.float()), a, b, d, rows,
                                 H, c, kind, nm.ln2, nm.fc, nm.mode)
        return None, None, None, None, dgi, dgh, dh


class LSTMStep(torch.autograd.Function):
    """One LSTM step's gate arithmetic (recurrent._cell) fused: gi, gh (N, 4H), c (N, H)
    -> (h', c')."""

    @staticmethod
    def forward(ctx, c, fmt, rounding, kind, gi, gh, cp):
        nm = kernel_consts(fmt, rounding)
        rows, H = cp.shape
        (h2, a), (c2, b) = _new(rows, H), _new(rows, H)
        LSTM[0][_par(gh.numel())](_f32(gi), _f32(gh), _f32(cp), a, b, rows, H, c, nm.fc,
                                  nm.mode)
        ctx.save_for_backward(gi, gh, cp)
        ctx.meta = c, nm, kind
        ctx.set_materialize_grads(False)        # an unused output: no gradient, as the graph
        return h2, c2

    @staticmethod
    def backward(ctx, gh2, gc2):
        c, nm, kind = ctx.meta
        gi, gh, cp = ctx.saved_tensors
        rows, H = cp.shape
        (ds, a), (dcp, b) = _new(rows, 4 * H), _new(rows, H)
        LSTM[1][_par(gh.numel())](_f32(gi), _f32(gh), _f32(cp),
                                  _EMPTY if gh2 is None else _f32(gh2.float()), gh2 is not None,
                                  _EMPTY if gc2 is None else _f32(gc2.float()), gc2 is not None,
                                  a, b, rows, H, c, kind, nm.ln2, nm.fc, nm.mode)
        return None, None, None, None, ds, ds, dcp


def gru_step(gi, gh, h, nm: Numerics):
    """GRUStep of the gates ``gi``, ``gh`` and the state ``h`` (checked by the caller)."""
    c = consts("cell", nm.fmt, nm.rounding)
    return GRUStep.apply(c, nm.fmt, nm.rounding, _kind(nm.backward), gi, gh, h)


def lstm_step(gi, gh, cp, nm: Numerics):
    """LSTMStep: ``(h', c')`` (checked by the caller)."""
    c = consts("cell", nm.fmt, nm.rounding)
    return LSTMStep.apply(c, nm.fmt, nm.rounding, _kind(nm.backward), gi, gh, cp)


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
    return twins(f"constant {op} forward", forward), twins(f"constant {op} backward", backward)


CONSTANT = {op: _constant_kernels(op) for op in ("pam_mul", "pa_div")}

_CONSTANT_PATTERNS: dict = {}


def constant_ok(rounding, x) -> bool:
    """Whether ``x op number`` takes :class:`Constant`: fusable and small."""
    return fusable(rounding, x) and x.numel() <= sizes.LEAN_ELEMENTWISE


def _constant(v, fmt, rounding) -> int:
    """The number ``v`` as functional._operand makes it beside a float32 tensor (float32),
    rounded into ``fmt`` as round_to rounds an operand: a pattern."""
    key = (v if v == v else "nan", fmt, rounding)      # (NaN != NaN as a key)
    c = _CONSTANT_PATTERNS.get(key)
    if c is None:
        r = round_lean(torch.tensor(float(v), dtype=torch.float32), fmt, rounding)
        c = int(r.numpy().reshape(1).view(np.uint32)[0])
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
        CONSTANT[op][0][_par(x.numel())](flat(X), o, c, swap, nm.fc)
        ctx.meta = op, c, swap, nm, kind, fmt, rounding
        return out

    @staticmethod
    def backward(ctx, dy):
        op, c, swap, nm, kind, fmt, rounding = ctx.meta
        (x,) = ctx.saved_tensors
        g = round_lean(as_float32(dy), fmt, rounding)
        out, o = new(g.shape)
        CONSTANT[op][1][_par(g.numel())](flat(as_float32(x)), flat(g), o, c,
                                         swap, kind == "exact", nm.ln2, nm.fc)
        return out, None, None, None, None, None, None


# --- recurrent layers: one Function per direction -------------------------------------------

def _sum_in_order(*terms):
    """Gradient contributions (numpy arrays or None) added left to right, as autograd
    adds them in its buffer; None if there is none."""
    acc = None
    for t in terms:
        if t is not None:
            acc = t if acc is None else acc + t
    return acc


class Recurrence(torch.autograd.Function):
    """One direction of a GRU or LSTM layer (recurrent.pa_recurrent's loop over steps) as
    one Function: per step the hidden projection (LinearFunction's kernels: R(h), R(W_hh),
    products, + b_hh) and the fused gate arithmetic, every gradient accumulated in the
    order the per-step graph accumulates it: a step's output h gets the output stack's
    slice (and h_T's, for the last step) first, then the next step's gate term (GRU) and
    projection term; W_hh and b_hh the steps' terms from the last step back; gi the
    steps' slices (zeros elsewhere: a -0 becomes +0 once two steps add up).  Outputs
    (ys, h_T[, c_T]); inputs gi (T, N, G·H), h0, c0, W_hh, b_hh."""

    @staticmethod
    def forward(ctx, spec, gi, h0, c0, w, b):
        mode, reverse, mm, ew = spec
        mfmt, mround, efmt, eround = mm.fmt, mm.rounding, ew.fmt, ew.rounding
        T, N, GH = gi.shape
        H = h0.shape[1]
        nmm, nme = kernel_consts(mfmt, mround), kernel_consts(efmt, eround)
        fcm = kernel_fmt(mfmt).consts
        gin = gi.detach().contiguous().numpy()
        wn = w.detach().contiguous().numpy()
        rw = wn if nmm.f32 else np.empty_like(wn)
        bias = None if b is None else b.detach()
        c = consts("cell", efmt, eround)
        steps = list(range(T - 1, -1, -1) if reverse else range(T))
        ys = np.empty((T, N, H), np.float32)
        hraw = np.empty((T, N, H), np.float32)             # each step's h, as it came
        hrnd = hraw if nmm.f32 else np.empty_like(hraw)     # and rounded for the product
        ghs = np.empty((T, N, GH), np.float32)
        craw = np.empty((T, N, H), np.float32) if mode == "lstm" else None
        h = h0.detach().contiguous().numpy()
        cc = None if c0 is None else c0.detach().contiguous().numpy()
        for t in steps:
            hraw[t] = h
            LINEAR[0](hraw[t], wn, hrnd[t], rw, ghs[t], not nmm.f32, nmm.fc, nmm.mode, fcm)
            if bias is not None:
                torch.from_numpy(ghs[t]).add_(bias)         # LinearFunction's y + bias
            if mode == "gru":
                GRU[0][False](gin[t].reshape(-1), ghs[t].reshape(-1), hraw[t].reshape(-1),
                              ys[t].reshape(-1), N, H, c, nme.fc, nme.mode)
            else:
                craw[t] = cc
                cc = np.empty((N, H), np.float32)
                LSTM[0][False](gin[t].reshape(-1), ghs[t].reshape(-1), craw[t].reshape(-1),
                               ys[t].reshape(-1), cc.reshape(-1), N, H, c, nme.fc, nme.mode)
            h = ys[t]
        ctx.save_for_backward(gi, h0, c0, w, b)
        ctx.meta = spec, steps, hraw, hrnd, ghs, craw, rw, c, nmm, nme, fcm
        ctx.set_materialize_grads(False)
        out = torch.from_numpy(ys), torch.from_numpy(ys[steps[-1]].copy())
        return out + (torch.from_numpy(cc),) if mode == "lstm" else out

    @staticmethod
    def backward(ctx, g_ys, g_hT, g_cT=None):
        spec, steps, hraw, hrnd, ghs, craw, rw, c, nmm, nme, fcm = ctx.meta
        mode, _, mm, ew = spec
        mfmt, macc, mkind, mround, ekind = mm.fmt, mm.acc, mm.backward, mm.rounding, ew.backward
        gi, _, _, _, b = ctx.saved_tensors
        T, N, GH = gi.shape
        H = hraw.shape[2]
        gin = gi.detach().contiguous().numpy()
        gy = None if g_ys is None else g_ys.float().contiguous().numpy()
        ek = _kind(ekind)
        dgi = np.empty((T, N, GH), np.float32)
        dghs = np.empty((T, N, GH), np.float32) if mode == "gru" else dgi   # δgh per step
        dw = dh_gate = dx = None
        dc = None if g_cT is None else g_cT.float().contiguous().numpy()
        for k in range(T - 1, -1, -1):
            t = steps[k]
            first = [] if k < T - 1 or g_hT is None else [g_hT.float().contiguous().numpy()]
            dh = _sum_in_order(*first, None if gy is None else gy[t], dh_gate, dx)
            if mode == "gru":
                dgh = dghs[t]
                dh_gate = np.empty((N, H), np.float32)
                GRU[1][False](gin[t].reshape(-1), ghs[t].reshape(-1), hraw[t].reshape(-1),
                              dh.reshape(-1), dgi[t].reshape(-1), dgh.reshape(-1),
                              dh_gate.reshape(-1), N, H, c, ek, nme.ln2, nme.fc, nme.mode)
            else:
                dgh = dgi[t]                                # g_gi = g_gh = δ(gi + gh)
                dcp = np.empty((N, H), np.float32)
                LSTM[1][False](gin[t].reshape(-1), ghs[t].reshape(-1), craw[t].reshape(-1),
                               _EMPTY if dh is None else dh.reshape(-1), dh is not None,
                               _EMPTY if dc is None else dc.reshape(-1), dc is not None,
                               dgh.reshape(-1), dcp.reshape(-1), N, H, c, ek, nme.ln2, nme.fc,
                               nme.mode)
                dc = dcp
            if mkind == "approx":                           # LinearFunction's backward
                dx = np.empty((N, H), np.float32)
                dwt = np.empty((GH, H), np.float32)
                LINEAR[1](hrnd[t], rw, dgh, dgh if nmm.f32 else np.empty_like(dgh), dx, dwt,
                          not nmm.f32, nmm.fc, nmm.mode, fcm, True, True)
            else:
                g = round_lean(torch.from_numpy(dgh), mfmt, mround).numpy()
                dx, dB = host_matmul_grad(hrnd[t], rw.T, g, kernel_fmt(mfmt), macc, mkind,
                                          (True, True))
                dwt = dB.T
            dw = dwt if dw is None else dw + dwt
        db = None
        if b is not None:       # each step's LinearFunction bias term (a fold over N), last first
            dbt = fold_to(torch.from_numpy(dghs), (T, 1, GH)).numpy().reshape(T, GH)
            db = dbt[steps[-1]]
            for k in range(T - 2, -1, -1):
                db = db + dbt[steps[k]]
            db = torch.from_numpy(np.ascontiguousarray(db)).reshape(b.shape)
        dh0 = _sum_in_order(dh_gate, dx)
        if T >= 2:              # the steps' select_backward zeros: -0 + +0 = +0
            dgi += np.float32(0.0)
        return (None, torch.from_numpy(dgi), None if dh0 is None else torch.from_numpy(dh0),
                None if mode != "lstm" or dc is None else torch.from_numpy(dc),
                torch.from_numpy(np.ascontiguousarray(dw)), db)


def recurrence(mode, gi, h0, c0, w, b, reverse, mm, ew):
    """Recurrence of one layer direction: ``(ys, h_T, c_T)`` (c_T None for the GRU);
    ``mm``, ``ew``: the checked :class:`~torch_bridge.config.Numerics` of the projection
    and of the gates."""
    out = Recurrence.apply((mode, reverse, mm, ew), gi, h0, c0, w, b)
    return out if mode == "lstm" else (out[0], out[1], None)

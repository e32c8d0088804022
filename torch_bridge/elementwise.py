"""Elementwise PA composites: powers, means, activations and RMS norm.

Each is written with the PA primitives of :mod:`torch_bridge.functional` (``pam_mul``,
``pa_div``, ``pa_exp``, ``pa_log``, ``pa_sqrt``, ``pa_exp2``, ``pa_log2``) and float32
additions, negations and selections, so — like ``pa_softmax`` — its backward pass
runs through the graph that defines it with the chosen derivative kind (approximate
or exact, Table 1) at every node (Kosson & Jaggi, section 2.5).  Constants that fold
several of the function's own constants (e.g. GELU's ``2·sqrt(2/pi)``) are host
arithmetic, as the optimizer's per-step scalars.  docs/torch_bridge.md ("Elementwise
composites") lists what each computes and in which order.
"""
from __future__ import annotations

import math

import torch

from . import _fused
from ._sums import expand, fold_sum
from ._tensors import broadcast_shape
from .config import check_numerics
from .functional import div, exp, exp2, log, log2, mul, sqrt

__all__ = ["pa_reciprocal", "pa_rsqrt", "pa_pow", "pa_mean", "pa_vector_norm", "pa_sigmoid",
           "pa_tanh", "pa_silu", "pa_gelu", "pa_softplus", "pa_rms_norm", "pa_cosine_similarity",
           "pa_pairwise_distance", "pa_abs"]

_GELU_K = 2.0 * math.sqrt(2.0 / math.pi)        # 2·sqrt(2/pi): GELU's tanh form via sigmoid
_GELU_C = 0.044715
#: Abramowitz & Stegun 7.1.26: erfc(u) = (a1 t + ... + a5 t^5) e^(-u^2), t = 1/(1 + p u),
#: u >= 0, |error| <= 1.5e-7; for GELU's Phi(x) = erfc(|x|/sqrt 2)/2 the 1/2 and the
#: 1/sqrt 2 are folded into the constants
_ERF_P = 0.3275911 / math.sqrt(2.0)
_ERF_A = tuple(a / 2 for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027,
                               1.061405429))
#: |x| is clamped here in the erfc branch: e^(-16^2/2) is below float32's smallest
#: subnormal, so nothing changes, and a·a cannot overflow to inf (NaN derivatives)
_ERF_XMAX = 16.0
#: paexp's argument is clamped here: float32 exp overflows beyond ~88.7, and 1/(1 + e^88)
#: is below float32's smallest normal, so the functions lose nothing and neither pass
#: sees an inf (whose derivative would be NaN)
_EXP_MAX = 88.0


def pa_reciprocal(x, fmt="float32", *, backward="approx", rounding="nearest_even"):
    """``1 ÷̂ x`` (eqs. 14-17)."""
    return div(1.0, x, check_numerics(fmt, backward, rounding))


def pa_rsqrt(x, fmt="float32", *, backward="approx", rounding="nearest_even"):
    """``1 ÷̂ pasqrt(x)`` (eqs. 14-17, 20)."""
    nm = check_numerics(fmt, backward, rounding)
    return div(1.0, sqrt(x, nm), nm)


def pa_pow(x, exponent, fmt="float32", *, backward="approx", rounding="nearest_even"):
    """``x ** exponent`` for a number ``exponent``: an integer power is a left fold of
    PAMs ``((x ·̂ x) ·̂ x) ...`` (a negative one its PA reciprocal), ``0.5`` is
    ``pasqrt``, ``-0.5`` ``1 ÷̂ pasqrt``, any other ``paexp2(e ·̂ palog2(x))``
    (NaN for x < 0, as torch for a non-integer exponent)."""
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise TypeError(f"exponent must be a number, got {type(exponent).__name__}")
    nm = check_numerics(fmt, backward, rounding)
    e = float(exponent)
    if e == 0.5:
        return sqrt(x, nm)
    if e == -0.5:
        return pa_rsqrt(x, fmt, backward=backward, rounding=rounding)
    if e == int(e) and abs(e) <= 64:
        n = abs(int(e))
        if n == 0:
            return torch.ones_like(x)
        y = x
        for _ in range(n - 1):
            y = mul(y, x, nm)
        return y if e > 0 else div(1.0, y, nm)
    return exp2(mul(log2(x, nm), e, nm), nm)


def pa_mean(x, dim=None, keepdim=False, fmt="float32", *, backward="approx",
            rounding="nearest_even"):
    """``Σx ÷̂ n`` over ``dim`` (all dimensions if None); the sum is float32 in
    emu.fold_sum's order."""
    nm = check_numerics(fmt, backward, rounding)
    if dim is None:
        return div(fold_sum(x, None, keepdim=False), float(x.numel()), nm)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    n = math.prod(x.shape[d] for d in dims)
    return div(fold_sum(x, dims, keepdim=keepdim), float(n), nm)


def _exp_neg(x, nm):
    """``paexp(-x)``, its argument clamped at _EXP_MAX."""
    return exp((-x).clamp(max=_EXP_MAX), nm)


def pa_vector_norm(x, dim=None, keepdim=False, fmt="float32", *, backward="approx",
                   rounding="nearest_even"):
    """The 2-norm ``pasqrt(Σ x ·̂ x)`` over ``dim`` (all dimensions if None); the sum
    in emu.fold_sum's order."""
    nm = check_numerics(fmt, backward, rounding)
    sq = mul(x, x, nm)
    return sqrt(fold_sum(sq, dim, keepdim=keepdim and dim is not None), nm)


def _fused_ok(nm, x):
    return _fused.composite(nm.rounding, x)


def _fuse(name, x, nm, *items):
    """The elementwise composite ``name`` of ``x`` by its fused kernels (same bits as
    the graph below each call; torch_bridge/_fused.py)."""
    return _fused.elementwise(name, x, _fused.consts(name, nm.fmt, nm.rounding, *items), nm)


def pa_sigmoid(x, fmt="float32", *, backward="approx", rounding="nearest_even"):
    """``1 ÷̂ (1 + paexp(-x))`` (-x clamped at 88)."""
    nm = check_numerics(fmt, backward, rounding)
    if _fused_ok(nm, x):
        return _fuse("sigmoid", x, nm)
    return div(1.0, 1.0 + _exp_neg(x, nm), nm)


def pa_tanh(x, fmt="float32", *, backward="approx", rounding="nearest_even"):
    """``2σ(2x) - 1`` as ``s + s - 1`` with ``s = pa_sigmoid(x + x)``: no multiply,
    and ±1 (not NaN) where paexp overflows."""
    nm = check_numerics(fmt, backward, rounding)
    if _fused_ok(nm, x):
        return _fuse("tanh", x, nm)
    s = pa_sigmoid(x + x, fmt, backward=backward, rounding=rounding)
    return s + s - 1.0


def pa_silu(x, fmt="float32", *, backward="approx", rounding="nearest_even"):
    """``x ÷̂ (1 + paexp(-x))`` (x·σ(x) with one PA division; -x clamped at 88)."""
    nm = check_numerics(fmt, backward, rounding)
    if _fused_ok(nm, x):
        return _fuse("silu", x, nm)
    return div(x, 1.0 + _exp_neg(x, nm), nm)


def pa_abs(x):
    """``|x|`` as a selection (its backward a selection too, where torch's multiplies
    by sgn(x)); no PA operation."""
    return torch.where(x < 0, -x, x)


def pa_gelu(x, approximate="none", fmt="float32", *, backward="approx",
            rounding="nearest_even"):
    """GELU ``x ·̂ Φ(x)``.

    ``approximate='none'`` (erf): ``Φ(x) = 1 - h`` for x >= 0, ``h`` for x < 0, with
    ``h = erfc(|x|/√2)/2 = (t ·̂ (b1 + t ·̂ (b2 + t ·̂ (b3 + t ·̂ (b4 + t ·̂ b5))))) ·̂
    paexp(-((a ·̂ a) ·̂ 0.5))``, ``t = 1 ÷̂ (1 + p' ·̂ a)``, ``a = min(|x|, 16)``
    (Abramowitz & Stegun 7.1.26, error <= 1.5e-7 before the PA error; ``b_i = a_i/2``,
    ``p' = p/√2``).  ``approximate='tanh'``: ``0.5·x·(1 + tanh(z)) = x·σ(2z)``,
    ``x ÷̂ (1 + paexp(-((x + 0.044715 ·̂ ((x ·̂ x) ·̂ x)) ·̂ 2·sqrt(2/pi))))``, the
    argument of paexp clamped at 88."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate={approximate!r}; expected 'none' or 'tanh'")
    nm = check_numerics(fmt, backward, rounding)
    if _fused_ok(nm, x):
        if approximate == "tanh":
            return _fuse("gelu_tanh", x, nm, _GELU_C, _GELU_K)
        return _fuse("gelu_erf", x, nm, _ERF_P, _ERF_A[-1], *(("raw", b) for b in _ERF_A[3::-1]),
                     0.5)
    if approximate == "tanh":
        cube = mul(mul(x, x, nm), x, nm)
        z2 = mul(x + mul(cube, _GELU_C, nm), _GELU_K, nm)
        return div(x, 1.0 + _exp_neg(z2, nm), nm)
    a = pa_abs(x).clamp(max=_ERF_XMAX)
    t = div(1.0, 1.0 + mul(a, _ERF_P, nm), nm)
    poly = _ERF_A[-1]
    for b in reversed(_ERF_A[:-1]):          # Horner: b_i + t ·̂ (...)
        poly = b + mul(t, poly, nm)
    h = mul(mul(t, poly, nm), exp(-mul(mul(a, a, nm), 0.5, nm), nm),
                nm)
    return mul(x, torch.where(x < 0, h, 1.0 - h), nm)


def pa_softplus(x, beta=1.0, threshold=20.0, fmt="float32", *, backward="approx",
                rounding="nearest_even"):
    """``palog(1 + paexp(β ·̂ x)) ÷̂ β``, and ``x`` where ``β·x > threshold`` (torch's
    definition; the PA branch sees the input clamped there, so no inf reaches it)."""
    nm = check_numerics(fmt, backward, rounding)
    if _fused_ok(nm, x):
        return _fuse("softplus", x, nm, ("raw", 1.0 if beta == 1 else 0.0), float(beta),
                     ("raw", float(threshold)))
    bx = x if beta == 1 else mul(x, float(beta), nm)
    y = log(1.0 + exp(bx.clamp(max=threshold), nm), nm)
    if beta != 1:
        y = div(y, float(beta), nm)
    return torch.where(bx > threshold, x, y)


def pa_rms_norm(x, normalized_shape, weight=None, eps=None, fmt="float32", *,
                backward="approx", rounding="nearest_even"):
    """RMS norm (F.rms_norm): ``x ÷̂ pasqrt(Σ (x ·̂ x) ÷̂ n + eps)`` over the trailing
    ``normalized_shape`` (the sum in emu.fold_sum's order), then a PAM gain;
    ``eps=None``: the dtype's machine epsilon, as torch."""
    nm = check_numerics(fmt, backward, rounding)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"rms_norm: normalized_shape={shape} does not match the trailing "
                         f"dimensions of input.shape={tuple(x.shape)}")
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    dims = tuple(range(-len(shape), 0))
    n = math.prod(shape)
    if (x.numel() and _fused.composite(nm.rounding, x, weight)
            and (weight is None or weight.shape == shape)):
        return _fused.rms_norm(x, n, weight, eps, nm)
    ms = div(fold_sum(mul(x, x, nm), dims), float(n), nm)
    y = div(x, sqrt(ms + eps, nm), nm)
    return y if weight is None else mul(y, weight, nm)


def pa_cosine_similarity(x1, x2, dim=1, eps=1e-8, fmt="float32", *, backward="approx",
                         rounding="nearest_even"):
    """F.cosine_similarity in torch's order: ``Σ (x1 ÷̂ n1) ·̂ (x2 ÷̂ n2)`` over ``dim``
    with ``n = max(pa_vector_norm(x, dim), eps)`` (operands broadcast first); sums, and
    a broadcast operand's gradient, in emu.fold_sum's order."""
    nm = check_numerics(fmt, backward, rounding)
    x1, x2 = _broadcast(x1, x2)
    n1, n2 = (pa_vector_norm(t, dim, True, fmt, backward=backward,
                             rounding=rounding).clamp_min(eps) for t in (x1, x2))
    return fold_sum(mul(div(x1, n1, nm), div(x2, n2, nm), nm), dim,
                    keepdim=False)


def _broadcast(a, b):
    """torch.broadcast_tensors(a, b) by :func:`~torch_bridge._sums.expand` (gradients
    summed in emu.fold_sum's order)."""
    shape = broadcast_shape(a.shape, b.shape)
    if shape is None:
        return torch.broadcast_tensors(a, b)        # torch's error
    return expand(a, shape), expand(b, shape)


def pa_pairwise_distance(x1, x2, eps=1e-6, keepdim=False, fmt="float32", *,
                         backward="approx", rounding="nearest_even"):
    """F.pairwise_distance with p=2: ``pa_vector_norm(x1 - x2 + eps)`` over the last
    dimension (operands broadcast as in :func:`pa_cosine_similarity`)."""
    x1, x2 = _broadcast(x1, x2)
    return pa_vector_norm(x1 - x2 + eps, -1, keepdim, fmt, backward=backward,
                          rounding=rounding)

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

import emu
from emu import sizes

from . import _compose
from . import composites as D
from ._sums import expand, fold_sum
from ._tensors import broadcast_shape
from .config import check_numerics
from .functional import PRIMS, div, exp2, log2, mul as times, sqrt

__all__ = ["pa_reciprocal", "pa_rsqrt", "pa_pow", "pa_mean", "pa_vector_norm", "pa_sigmoid",
           "pa_tanh", "pa_silu", "pa_gelu", "pa_softplus", "pa_rms_norm", "pa_cosine_similarity",
           "pa_pairwise_distance", "pa_abs"]

def pa_reciprocal(x, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """``1 ÷̂ x`` (eqs. 14-17)."""
    return div(1.0, x, check_numerics(fmt, backward, rounding, mul=mul))


def pa_rsqrt(x, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """``1 ÷̂ pasqrt(x)`` (eqs. 14-17, 20)."""
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    if _compose.composite(nm, x):
        return _compose.run(_compose.plan(D.rsqrt, (("x", "e"),)), [x], x.numel(), nm, {})
    return D.rsqrt(_compose.GraphOps(PRIMS, nm), x)


def pa_pow(x, exponent, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """``x ** exponent`` for a number ``exponent``: an integer power is a left fold of
    PAMs ``((x ·̂ x) ·̂ x) ...`` (a negative one its PA reciprocal), ``0.5`` is
    ``pasqrt``, ``-0.5`` ``1 ÷̂ pasqrt``, any other ``paexp2(e ·̂ palog2(x))``
    (NaN for x < 0, as torch for a non-integer exponent)."""
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise TypeError(f"exponent must be a number, got {type(exponent).__name__}")
    nm = check_numerics(fmt, backward, rounding, mul=mul)
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
            y = times(y, x, nm)
        return y if e > 0 else div(1.0, y, nm)
    return exp2(times(log2(x, nm), e, nm), nm)


def pa_mean(x, dim=None, keepdim=False, fmt="float32", *, backward="approx",
            rounding="nearest_even", mul="pam"):
    """``Σx ÷̂ n`` over ``dim`` (all dimensions if None); the sum is float32 in
    emu.fold_sum's order."""
    return mean(x, dim, keepdim, check_numerics(fmt, backward, rounding, mul=mul))


def mean(x, dim, keepdim, nm):
    """:func:`pa_mean` under checked numerics ``nm``: over the last dimension, or all of
    them (a row of every element in fold_sum's order), one fused node (composites.mean)
    for a small float32 tensor."""
    if dim is None:
        if x.numel() and _compose.composite(nm, x):
            return _row_mean(x.reshape(1, -1), nm).view(())
        return div(fold_sum(x, None, keepdim=False), float(x.numel()), nm)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    n = math.prod(x.shape[d] for d in dims)
    if (x.dim() and len(dims) == 1 and dims[0] % x.dim() == x.dim() - 1
            and _compose.composite(nm, x)):
        return _row_mean(x, nm).view(*x.shape[:-1], *((1,) if keepdim else ()))
    return div(fold_sum(x, dims, keepdim=keepdim), float(n), nm)


def _row_mean(x, nm):
    n = x.shape[-1]
    return _compose.run(_compose.plan(D.mean, (("x", "e"),), ("n",)), [x], n, nm,
                        {"n": float(n)})


def pa_vector_norm(x, dim=None, keepdim=False, fmt="float32", *, backward="approx",
                   rounding="nearest_even", mul="pam"):
    """The 2-norm ``pasqrt(Σ x ·̂ x)`` over ``dim`` (all dimensions if None); the sum
    in emu.fold_sum's order."""
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    sq = times(x, x, nm)
    return sqrt(fold_sum(sq, dim, keepdim=keepdim and dim is not None), nm)


def _elementwise(desc, x, nm, params=None, limit=None, **flags):
    """The elementwise composite ``desc`` (torch_bridge/composites.py) of ``x``: its fused
    kernels for a small float32 CPU tensor, else its graph (the same bits).  The graph's
    glue is float32 for every dtype: a bfloat16 or float16 ``x`` runs as float32 and the
    result is cast back (glue in bfloat16 rounded σ's exponent: 70 % off at x = -53.5)."""
    params = params or {}
    if _compose.composite(nm, x, limit=limit):
        p = _compose.plan(desc, (("x", "e"),), tuple(params), **flags)
        return _compose.run(p, [x], x.numel(), nm, params)
    if x.dtype in (torch.bfloat16, torch.float16):
        return desc(_compose.GraphOps(PRIMS, nm), x=x.float(), **params, **flags).to(x.dtype)
    return desc(_compose.GraphOps(PRIMS, nm), x=x, **params, **flags)


def pa_sigmoid(x, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """``1 ÷̂ (1 + e)`` for x >= 0, ``e ÷̂ (1 + e)`` below, ``e = e^-|x|`` (the accurate
    exponential, composites.exp_neg)."""
    return _elementwise(D.sigmoid, x, check_numerics(fmt, backward, rounding, mul=mul))


def pa_tanh(x, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """Odd bit for bit: ``sign(x)·t(|x|)``, t the Padé form ``(a ·̂ (a² + 15)) ÷̂ (6a² +
    15)`` below 1, ``1 - 2e ÷̂ (1 + e)``, ``e = e^-2|x|``, from 1 (composites.tanh)."""
    return _elementwise(D.tanh, x, check_numerics(fmt, backward, rounding, mul=mul))


def pa_silu(x, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """x·σ(x): ``x ÷̂ (1 + e)`` for x >= 0, ``(x ·̂ e) ÷̂ (1 + e)`` below, ``e = e^-|x|``
    (composites.silu)."""
    return _elementwise(D.silu, x, check_numerics(fmt, backward, rounding, mul=mul))


def pa_abs(x):
    """``|x|`` as a selection (its backward a selection too, where torch's multiplies
    by sgn(x)); no PA operation."""
    return torch.where(x < 0, -x, x)


def pa_gelu(x, approximate="none", fmt="float32", *, backward="approx",
            rounding="nearest_even", mul="pam"):
    """GELU ``x·Φ(x)``: ``approximate='none'`` the erf form (composites.gelu_erf),
    ``'tanh'`` the tanh form (composites.gelu_tanh)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate={approximate!r}; expected 'none' or 'tanh'")
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    return _elementwise(D.gelu_tanh if approximate == "tanh" else D.gelu_erf, x, nm,
                        limit=None if nm.fmt == emu.float32 else sizes.FUSED_MAX_GELU,
                        exact=nm.backward == "exact")


def pa_softplus(x, beta=1.0, threshold=20.0, fmt="float32", *, backward="approx",
                rounding="nearest_even", mul="pam"):
    """``(max(βx, 0) + (e ·̂ (e + 6)) ÷̂ (4e + 6)) ÷̂ β``, ``e = e^-|βx|`` (log(1 + e)'s
    Padé form), and ``x`` where ``β·x > threshold`` (torch's definition)."""
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    return _elementwise(D.softplus, x, nm, {"beta": float(beta), "threshold": float(threshold)},
                        unit=beta == 1)


def pa_rms_norm(x, normalized_shape, weight=None, eps=None, fmt="float32", *,
                backward="approx", rounding="nearest_even", mul="pam"):
    """RMS norm (F.rms_norm): ``x ÷̂ pasqrt(Σ (x ·̂ x) ÷̂ n + eps)`` over the trailing
    ``normalized_shape`` (the sum in emu.fold_sum's order), then a PAM gain;
    ``eps=None``: the dtype's machine epsilon, as torch."""
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"rms_norm: normalized_shape={shape} does not match the trailing "
                         f"dimensions of input.shape={tuple(x.shape)}")
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    n = math.prod(shape)
    params = {"n": float(n), "eps": float(eps)}
    if _compose.composite(nm, x, weight) and (weight is None or weight.shape == shape):
        inputs = (("x", "e"),) + ((("weight", "c"),) if weight is not None else ())
        p = _compose.plan(D.rms_norm, inputs, ("n", "eps"),
                          **({} if weight is not None else {"weight": None}))
        return _compose.run(p, [x] + ([weight] if weight is not None else []), n, nm, params)
    o = _compose.GraphOps(PRIMS, nm, tuple(range(-len(shape), 0)))
    return D.rms_norm(o, x=x, weight=weight, **params)


def pa_cosine_similarity(x1, x2, dim=1, eps=1e-8, fmt="float32", *, backward="approx",
                         rounding="nearest_even", mul="pam"):
    """F.cosine_similarity in torch's order: ``Σ (x1 ÷̂ n1) ·̂ (x2 ÷̂ n2)`` over ``dim``
    with ``n = max(pa_vector_norm(x, dim), eps)`` (operands broadcast first); sums, and
    a broadcast operand's gradient, in emu.fold_sum's order."""
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    x1, x2 = _broadcast(x1, x2)
    n1, n2 = (pa_vector_norm(t, dim, True, fmt, backward=backward, rounding=rounding,
                             mul=mul).clamp_min(eps) for t in (x1, x2))
    return fold_sum(times(div(x1, n1, nm), div(x2, n2, nm), nm), dim,
                    keepdim=False)


def _broadcast(a, b):
    """torch.broadcast_tensors(a, b) by :func:`~torch_bridge._sums.expand` (gradients
    summed in emu.fold_sum's order)."""
    shape = broadcast_shape(a.shape, b.shape)
    if shape is None:
        return torch.broadcast_tensors(a, b)        # torch's error
    return expand(a, shape), expand(b, shape)


def pa_pairwise_distance(x1, x2, eps=1e-6, keepdim=False, fmt="float32", *,
                         backward="approx", rounding="nearest_even", mul="pam"):
    """F.pairwise_distance with p=2: ``pa_vector_norm(x1 - x2 + eps)`` over the last
    dimension (operands broadcast as in :func:`pa_cosine_similarity`)."""
    x1, x2 = _broadcast(x1, x2)
    return pa_vector_norm(x1 - x2 + eps, -1, keepdim, fmt, backward=backward,
                          rounding=rounding, mul=mul)

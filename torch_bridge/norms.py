"""Batch, group and instance norm with PA operations (op group 'layernorm').

Built like :func:`torch_bridge.functional.pa_layer_norm` (section 2.3): mean
``Σx ÷̂ n``, variance ``Σ (x-μ) ·̂ (x-μ) ÷̂ n``, ``(x-μ) ÷̂ pasqrt(var + eps)``, PAM gain,
float32 bias; sums, and the gain's and bias's gradients, are float32 in emu.fold_sum's
order.  The backward runs through that graph with the chosen derivative kind at every
node (section 2.5).
"""
from __future__ import annotations

import torch

from . import _compose
from . import composites as D
from ._sums import add
from .config import check_numerics
from .functional import PRIMS, div, mul as times, pa_layer_norm, sqrt

__all__ = ["pa_batch_norm", "pa_group_norm"]


def _affine(y, weight, bias, shape, nm):
    if weight is not None:
        y = times(y, weight.reshape(shape), nm)
    return y if bias is None else add(y, bias.reshape(shape))


def pa_batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None,
                  training=False, momentum=0.1, eps=1e-5, fmt="float32", *,
                  backward="approx", rounding="nearest_even", mul="pam"):
    """F.batch_norm: statistics per channel (dim 1) over the batch and spatial dims in
    training (or without running statistics), else the running ones.  Training also
    updates the running statistics in place, in increment form as the PA optimizers
    (``r += m ·̂ (stat - r)``), the variance's unbiased ``Σ (x-μ)² ÷̂ (n-1)``."""
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    if x.dim() < 2:
        raise ValueError(f"batch_norm: input.shape={tuple(x.shape)} needs a channel dim 1")
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    if not training and running_mean is not None and running_var is not None:
        y = div(x - running_mean.reshape(shape),
                   sqrt(running_var.reshape(shape) + eps, nm), nm)
        return _affine(y, weight, bias, shape, nm)
    dims = [0] + list(range(2, x.dim()))
    n = x.numel() // x.shape[1]
    if training and n <= 1:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when "
                         f"training, got input.shape={tuple(x.shape)}")
    if _compose.composite(nm, x):
        # composites.normalise's fused kernels on each channel's (batch, spatial) entries
        # as a row: they are read in the order fold_sum over ``dims`` reads them
        rows = x.transpose(0, 1).reshape(x.shape[1], n)
        p = _compose.plan(D.normalise, (("x", "e"),), ("n", "eps"))
        y, mu, ss = _compose.run(p, [rows], n, nm, {"n": float(n), "eps": float(eps)})
        y = y.reshape(x.shape[1], x.shape[0], *x.shape[2:]).transpose(0, 1)
    else:
        y, mu, ss = D.normalise(_compose.GraphOps(PRIMS, nm, dims), x, float(n), float(eps))
    if training and running_mean is not None and running_var is not None:
        with torch.no_grad():
            unbiased = div(ss.reshape(-1), float(n - 1), nm)
            running_mean += times(mu.reshape(-1).to(running_mean.dtype) - running_mean,
                                    float(momentum), nm)
            running_var += times(unbiased.to(running_var.dtype) - running_var,
                                   float(momentum), nm)
    return _affine(y, weight, bias, shape, nm)


def pa_group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, fmt="float32", *,
                  backward="approx", rounding="nearest_even", mul="pam"):
    """F.group_norm: :func:`pa_layer_norm` over each group's (channels, spatial) entries,
    then a per-channel PAM gain and float32 bias.  Instance norm is ``num_groups = C``."""
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    if x.dim() < 2 or x.shape[1] % num_groups:
        raise ValueError(f"group_norm: input.shape={tuple(x.shape)} does not split into "
                         f"num_groups={num_groups}")
    g = x.reshape(x.shape[0], num_groups, -1)
    y = pa_layer_norm(g, (g.shape[-1],), None, None, eps, fmt, backward=backward,
                      rounding=rounding, mul=mul).reshape(x.shape)
    return _affine(y, weight, bias, [1, x.shape[1]] + [1] * (x.dim() - 2), nm)

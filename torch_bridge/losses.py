"""log_softmax, nll_loss and mse_loss with PA operations.

``pa_log_softmax`` is the first half of :func:`torch_bridge.functional.pa_cross_entropy`
(``(x - max) - palog(Σ paexp(x - max))``, the max shift as there); the losses use PAM
weights and a PA division for their mean, sums float32 (section 2.3).
"""
from __future__ import annotations

import torch

from .functional import _exp_shifted, _log2e, _numerics, pa_div, pa_log2, pam_mul

__all__ = ["pa_log_softmax", "pa_nll_loss", "pa_mse_loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _kw(fmt, backward, rounding):
    fmt, kind, rounding, _ = _numerics(fmt, backward, rounding)
    return dict(fmt=fmt, backward=kind, rounding=rounding)


def pa_log_softmax(x, dim=-1, fmt="float32", *, backward="approx", rounding="nearest_even"):
    """``(t - palog2(Σ paexp2(t))) ÷̂ log2e`` along ``dim``, with ``t = x ·̂ log2e - k`` and
    the constant shift ``k = floor(max(x ·̂ log2e))``, as :func:`pa_cross_entropy`
    (eqs. 10, 18, 19; docs/semantics.md section 7)."""
    kw = _kw(fmt, backward, rounding)
    e, t = _exp_shifted(x, dim, kw)
    return pa_div(t - pa_log2(e.sum(dim, keepdim=True), **kw), _log2e(kw["fmt"]), **kw)


def pa_nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean",
                fmt="float32", *, backward="approx", rounding="nearest_even"):
    """F.nll_loss: ``-w_t ·̂ input[t]`` per sample (no PAM without weights), 'mean'
    divided ÷̂ by the summed weights of the non-ignored targets."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}; expected one of {_REDUCTIONS}")
    kw = _kw(fmt, backward, rounding)
    z = input.unsqueeze(0) if input.dim() == 1 else input.movedim(1, -1)
    t = target.reshape(-1).long()
    z = z.reshape(-1, z.shape[-1])
    valid = t != ignore_index
    picked = -z.gather(-1, torch.where(valid, t, 0)[:, None]).squeeze(-1)
    w = None if weight is None else weight.to(z.dtype)[torch.where(valid, t, 0)]
    loss = picked if w is None else pam_mul(picked, w, **kw)
    loss = torch.where(valid, loss, 0.0)
    if reduction == "none":
        return loss.reshape(target.shape)
    total = loss.sum()
    if reduction == "sum":
        return total
    denom = valid.sum().to(z.dtype) if w is None else torch.where(valid, w, 0.0).sum()
    return pa_div(total, denom.detach(), **kw)


def pa_mse_loss(input, target, reduction="mean", fmt="float32", *, backward="approx",
                rounding="nearest_even"):
    """F.mse_loss: ``d ·̂ d`` with ``d = input - target``, 'mean' ``Σ ÷̂ n``."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}; expected one of {_REDUCTIONS}")
    kw = _kw(fmt, backward, rounding)
    d = input - target
    sq = pam_mul(d, d, **kw)
    if reduction == "none":
        return sq
    return sq.sum() if reduction == "sum" else pa_div(sq.sum(), float(sq.numel()), **kw)

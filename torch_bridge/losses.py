"""log_softmax and the common losses with PA operations.

``pa_log_softmax`` is the first half of :func:`torch_bridge.functional.pa_cross_entropy`
(``(x - max) - palog(Σ paexp(x - max))``, the max shift as there); the losses use PAM
weights and products, palog/paexp for their logarithms and exponentials, and a PA
division for their mean, sums float32 in emu.fold_sum's order (section 2.3).  ``|d|`` is a selection
(:func:`torch_bridge.elementwise.pa_abs`), so no backward multiplies by sgn(d).
"""
from __future__ import annotations

import torch

from . import _compose
from . import composites as D
from ._sums import fold_sum
from .elementwise import mean, pa_abs
from .config import check_numerics
from .functional import PRIMS, along, div, exp, mul as times

__all__ = ["pa_log_softmax", "pa_nll_loss", "pa_mse_loss", "pa_l1_loss", "pa_huber_loss",
           "pa_smooth_l1_loss", "pa_binary_cross_entropy", "pa_binary_cross_entropy_with_logits",
           "pa_kl_div"]

_REDUCTIONS = ("mean", "sum", "none")
#: torch clamps BCE's logarithms here, so a probability of 0 or 1 costs 100, not inf
_LOG_MIN = -100.0


def pa_log_softmax(x, dim=-1, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """``(t - palog2(Σ paexp2(t))) ÷̂ log2e`` along ``dim``, with ``t = x ·̂ log2e - k`` and
    the constant shift ``k = floor(max(x ·̂ log2e))``, as :func:`pa_cross_entropy`
    (eqs. 10, 18, 19; docs/semantics.md section 7; composites.log_softmax); the sum in
    emu.fold_sum's order."""
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    if x.numel() == 0:
        return x.clone()
    return along(D.log_softmax, x, dim, nm)


def pa_nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean",
                fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """F.nll_loss: ``-w_t ·̂ input[t]`` per sample (no PAM without weights), 'mean'
    divided ÷̂ by the summed weights of the non-ignored targets; sums in emu.fold_sum's
    order."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}; expected one of {_REDUCTIONS}")
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    z = input.unsqueeze(0) if input.dim() == 1 else input.movedim(1, -1)
    t = target.reshape(-1).long()
    z = z.reshape(-1, z.shape[-1])
    valid = t != ignore_index
    picked = -z.gather(-1, torch.where(valid, t, 0)[:, None]).squeeze(-1)
    w = None if weight is None else weight.to(z.dtype)[torch.where(valid, t, 0)]
    loss = picked if w is None else times(picked, w, nm)
    loss = torch.where(valid, loss, 0.0)
    if reduction == "none":
        return loss.reshape(target.shape)
    total = fold_sum(loss, 0, keepdim=False)
    if reduction == "sum":
        return total
    denom = valid.sum().to(z.dtype) if w is None else \
        fold_sum(torch.where(valid, w, 0.0), 0, keepdim=False)
    return div(total, denom.detach(), nm)


def _pointwise(desc, input, target, nm, **params):
    """The elementwise loss ``desc`` (torch_bridge/composites.py) of ``input`` and
    ``target``: its fused kernels for small float32 CPU tensors of one shape, else its
    graph; the same bits."""
    if input.shape == target.shape and _compose.composite(nm, input, target):
        p = _compose.plan(desc, (("x", "e"), ("t", "e")), tuple(params))
        return _compose.run(p, [input, target], max(1, input.numel()), nm, params)
    return desc(_compose.GraphOps(PRIMS, nm), x=input, t=target, **params)


def _check_reduction(reduction, allowed=_REDUCTIONS):
    if reduction not in allowed:
        raise ValueError(f"reduction={reduction!r}; expected one of {allowed}")


def _reduce(loss, reduction, nm, weight=None, by_weight=False):
    """``loss ·̂ weight`` (if given), then 'none', 'sum' or 'mean': ``Σ ÷̂ n``, or
    ``Σ ÷̂ Σ weight`` with ``by_weight`` (torch's weighted mse and l1)."""
    if weight is not None:
        loss = times(loss, weight, nm)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return fold_sum(loss, None, keepdim=False)
    if by_weight and weight is not None:
        return div(fold_sum(loss, None, keepdim=False), fold_sum(weight, None, keepdim=False),
                   nm)
    return mean(loss, None, False, nm)


def pa_mse_loss(input, target, reduction="mean", fmt="float32", *, backward="approx",
                rounding="nearest_even", weight=None, mul="pam"):
    """F.mse_loss: ``d ·̂ d`` with ``d = input - target`` (``·̂ weight``), 'mean'
    ``Σ ÷̂ n`` (with a weight ``Σ ÷̂ Σ weight``, as torch)."""
    _check_reduction(reduction)
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    d = input - target
    return _reduce(times(d, d, nm), reduction, nm, weight, by_weight=True)


def pa_l1_loss(input, target, reduction="mean", fmt="float32", *, backward="approx",
               rounding="nearest_even", weight=None, mul="pam"):
    """F.l1_loss: ``|input - target|`` (``·̂ weight``), 'mean' ``Σ ÷̂ n`` (with a
    weight ``Σ ÷̂ Σ weight``, as torch)."""
    _check_reduction(reduction)
    return _reduce(pa_abs(input - target), reduction, check_numerics(fmt, backward, rounding, mul=mul),
                   weight, by_weight=True)


def pa_huber_loss(input, target, reduction="mean", delta=1.0, fmt="float32", *,
                  backward="approx", rounding="nearest_even", weight=None, mul="pam"):
    """F.huber_loss in torch's order: ``(0.5 ·̂ z) ·̂ z`` where ``z = |input - target| <
    δ``, else ``δ ·̂ (z - δ/2)``; then ``·̂ weight``, 'mean' ``Σ ÷̂ n``."""
    _check_reduction(reduction)
    if not delta > 0:
        raise ValueError(f"huber_loss: delta={delta!r} must be positive")
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    loss = _pointwise(D.huber, input, target, nm, delta=float(delta), half_delta=0.5 * delta)
    return _reduce(loss, reduction, nm, weight)


def pa_smooth_l1_loss(input, target, reduction="mean", beta=1.0, fmt="float32", *,
                      backward="approx", rounding="nearest_even", mul="pam"):
    """F.smooth_l1_loss in torch's order: ``((0.5 ·̂ z) ·̂ z) ÷̂ β`` where ``z =
    |input - target| < β``, else ``z - β/2``; ``β = 0`` is the L1 loss, as torch."""
    _check_reduction(reduction)
    if not beta >= 0:
        raise ValueError(f"smooth_l1_loss: beta={beta!r} must be >= 0")
    if beta == 0:
        return pa_l1_loss(input, target, reduction, fmt, backward=backward, rounding=rounding)
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    loss = _pointwise(D.smooth_l1, input, target, nm, beta=float(beta), half_beta=0.5 * beta)
    return _reduce(loss, reduction, nm)


def pa_binary_cross_entropy(input, target, weight=None, reduction="mean", fmt="float32", *,
                            backward="approx", rounding="nearest_even", mul="pam"):
    """F.binary_cross_entropy: ``-(t ·̂ max(palog(x), -100) + (1 - t) ·̂ max(palog(1 - x),
    -100))``, then ``·̂ weight``, 'mean' ``Σ ÷̂ n``."""
    _check_reduction(reduction)
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    loss = _pointwise(D.binary_cross_entropy, input, target, nm, log_min=_LOG_MIN)
    return _reduce(loss, reduction, nm, weight)


def pa_binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean",
                                        pos_weight=None, fmt="float32", *, backward="approx",
                                        rounding="nearest_even", mul="pam"):
    """F.binary_cross_entropy_with_logits, stable as torch's: ``(1 - t) ·̂ x + l ·̂ sp``
    with ``sp = softplus(-x) = max(-x, 0) + palog(1 + paexp(-|x|))`` and ``l = 1 +
    (pos_weight - 1) ·̂ t`` (``l = 1``, no PAM, without pos_weight); then ``·̂ weight``,
    'mean' ``Σ ÷̂ n``."""
    _check_reduction(reduction)
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    if pos_weight is None:
        loss = _pointwise(D.binary_cross_entropy_with_logits, input, target, nm)
    else:           # a broadcast weight per class: the graph
        loss = D.binary_cross_entropy_with_logits(_compose.GraphOps(PRIMS, nm), input,
                                                  target, pos_weight)
    return _reduce(loss, reduction, nm, weight)


def pa_kl_div(input, target, reduction="mean", log_target=False, fmt="float32", *,
              backward="approx", rounding="nearest_even", mul="pam"):
    """F.kl_div (``input`` holds log-probabilities): ``t ·̂ palog(t) - t ·̂ input`` (0
    where t = 0, palog never seeing a zero), or with ``log_target``
    ``paexp(t) ·̂ (t - input)``; 'batchmean' ``Σ ÷̂ input.shape[0]``, 'mean' ``Σ ÷̂ n``."""
    _check_reduction(reduction, _REDUCTIONS + ("batchmean",))
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    if log_target:
        loss = times(exp(target, nm), target - input, nm)
    else:
        loss = _pointwise(D.kl_div, input, target, nm)
    if reduction == "batchmean" and input.dim() > 0:
        return div(fold_sum(loss, None, keepdim=False), float(input.shape[0]), nm)
    return _reduce(loss, "sum" if reduction == "batchmean" else reduction, nm)

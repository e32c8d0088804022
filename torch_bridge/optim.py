"""Optimizers whose every tensor multiply, divide and square root is piecewise affine.

Kosson & Jaggi, section 2.6 / Table 3 ("OPTIMIZER"): AdamW with PA operations.  The
update is torch's, written so that PAMs act on *increments* — ``m += (1-β1) ·̂ (g - m)``,
``p -= (lr·wd) ·̂ p`` — which is algebraically torch's AdamW and keeps a PAM's ≤ 11 %
error off the long-lived state (a PAM of a moment by β2 = 0.999 would change its decay
rate by up to 2x).  Per-step scalars (bias corrections, step size, lr·wd) are host
arithmetic in Python floats, as in torch; they are not datapath operations.
Elementwise operations use ``config.pa_fmt``, ``config.rounding`` and ``config.mul`` (the
fused CPU kernel is PAM's; another multiplier takes the sequence of emu calls); additions
are float32.  With ``config=None`` or 'optimizer' not enabled these *are* torch's AdamW /
SGD (their ``step`` runs unchanged).  State keys match torch's, so state dicts move
between the native and PA versions.
"""
from __future__ import annotations

import math
import numbers
import sys

import numpy as np
import torch
from torch.autograd.graph import increment_version

import emu
import emu.ops
import emu.optim

from ._backend import cuda_backend_active
from ._tensors import as_float32, emu_call, host_view, next_seed, round_scalar, round_to
from ._threads import emu_threads
from .config import PAMConfig, check_config

__all__ = ["PAAdamW", "PASGD", "make_optimizer"]


class _PAOps:
    """The config's multiplier (PAM: on any device; another: CPU tensors), PA division
    and PA sqrt on float32 tensors and numbers, operands rounded per the config."""

    def __init__(self, config: PAMConfig):
        self.fmt = config.pa_fmt
        self.rounding = config.rounding
        self.multiplier = config.mul
        self.pam = config.mul == emu.MULTIPLIERS["pam"]

    def _r(self, x):
        if isinstance(x, torch.Tensor):
            return round_to(x, self.fmt, self.rounding)
        return round_scalar(x, self.fmt, self.rounding)

    def mul(self, a, b):
        if self.pam:
            return emu_call(emu.pam_mul, self._r(a), self._r(b), self.fmt)
        return emu_call(emu.mul, self._r(a), self._r(b), self.fmt, self.multiplier)

    def div(self, a, b):
        return emu_call(emu.pa_div, self._r(a), self._r(b), self.fmt)

    def sqrt(self, a):
        return emu_call(emu.pa_sqrt, self._r(a), self.fmt)

    def fused_adamw(self, tensors, lr, wd, b1, b2, eps, t, maximize):
        """PAAdamW's update of one CPU parameter by emu's fused kernel (emu/optim.py),
        in place: ``(p, m, v)`` get the bits of the sequence of calls in
        :meth:`PAAdamW._pa_step`; the scalars are rounded and the stochastic streams
        drawn from torch's RNG in that sequence's order."""
        streams = self.fmt != emu.float32 and self.rounding == "stochastic"
        seeds = [0] * emu.optim.ROUNDINGS if streams else None

        def draw(*slots):           # the tensor roundings R of these slots, in order
            for j in slots if streams else ():
                seeds[j] = next_seed()
        draw(*((0,) if wd != 0 else ()))
        c0 = round_scalar(lr * wd, self.fmt, self.rounding) if wd != 0 else None
        draw(1)
        c1 = round_scalar(1 - b1, self.fmt, self.rounding)
        draw(2, 3, 4)
        c2 = round_scalar(1 - b2, self.fmt, self.rounding)
        draw(5, 6)
        c3 = round_scalar(math.sqrt(1 - b2 ** t), self.fmt, self.rounding)
        draw(7, 8, 9)
        c4 = round_scalar(lr / (1 - b1 ** t), self.fmt, self.rounding)
        p, g, m, v = (host_view(x.detach().view(-1)).view(np.uint32) for x in tensors)
        # elementwise, every element read before it is written: in place is safe
        emu.optim.step(p, g, m, v, p, m, v, (c0, c1, c2, c3, c4), np.float32(eps), self.fmt,
                       emu.ops.ROUNDING[self.rounding], seeds, maximize)
        for x in (tensors[0], tensors[2], tensors[3]):      # as copy_ would: for autograd
            increment_version(x)


def _number(name, v, lo=0.0, hi=math.inf, *, open_hi=False):
    """Check a hyper-parameter before torch sees it: a real number (or a one-element
    tensor, as torch allows for lr), finite, in [lo, hi] (``open_hi``: [lo, hi))."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.dtype.is_floating_point:
        x = float(v)
    elif isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)):
        x = float(v)
    else:
        raise TypeError(f"{name} must be a real number, got {v!r} ({type(v).__name__})")
    if not (math.isfinite(x) and lo <= x and (x < hi if open_hi else x <= hi)):
        span = f">= {lo:g}" if hi == math.inf else \
            f"in [{lo:g}, {hi:g}{')' if open_hi else ']'}"      # no "[0, inf]": finite
        raise ValueError(f"{name}={v!r}; expected a finite number {span}")


def _flags(**flags):
    for name, v in flags.items():
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {v!r}")


def _local(t):
    """The tensor an update works on: a DTensor's local shard (FSDP2's ``fully_shard``
    parameters, their gradients and the optimizer states made from them), else ``t``.
    The PA updates are elementwise, so updating each shard is updating the whole."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return t.to_local() if dtensor is not None and isinstance(t, dtensor.DTensor) else t


def _fusable(p, state) -> bool:
    """Whether emu's fused CPU kernel can run PAAdamW's update of ``p``: contiguous
    float32 CPU tensors (CUDA ones, and those of the simulator tests' CUDA backend, take
    the sequence of emu calls; a DTensor's: its local shards)."""
    ts = (_local(t) for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"]))
    return not cuda_backend_active() and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in ts)


def _write(t: torch.Tensor, values: torch.Tensor):
    t.copy_(values)


class _PAStep:
    """``step()`` of the PA optimizers: torch's own step unless ``config`` enables
    'optimizer', else the closure and the subclass's ``_pa_step`` with PA arithmetic."""

    @property
    def _pa(self) -> bool:
        return self.config is not None and self.config.enabled("optimizer")

    @torch.no_grad()
    def step(self, closure=None):
        if not self._pa:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._pa_step(_PAOps(self.config))
        return loss


class PAAdamW(_PAStep, torch.optim.AdamW):
    """torch.optim.AdamW with PA arithmetic when ``config`` enables 'optimizer'.

    PA update for a parameter p with gradient g at step t (⊙ = PAM, ⊘ = PA division):
    ``p -= (lr·wd) ⊙ p``; ``m += (1-β1) ⊙ (g - m)``; ``v += (1-β2) ⊙ (g ⊙ g - v)``;
    ``p -= (pasqrt(v) ⊘ sqrt(1-β2^t) + eps) ⊘`` applied to m, then ``⊙ lr/(1-β1^t)``.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 amsgrad=False, maximize=False, config: PAMConfig | None = None):
        for name, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            _number(name, v)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        for i, b in enumerate(betas):
            _number(f"betas[{i}]", b, 0.0, 1.0, open_hi=True)
        _flags(amsgrad=amsgrad, maximize=maximize)
        check_config(config)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize, foreach=False)
        self.config = config
        if self._pa and amsgrad:
            raise ValueError("amsgrad=True is not supported by the PA update")

    def _pa_step(self, ops):
        for group in self.param_groups:
            lr, wd, eps = float(group["lr"]), float(group["weight_decay"]), float(group["eps"])
            b1, b2 = (float(b) for b in group["betas"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("PAAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p,
                                                           memory_format=torch.preserve_format)
                state["step"] += 1
                t = float(state["step"])
                local = [_local(x) for x in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])]
                n = local[0].numel()
                if ops.pam and _fusable(p, state):
                    with emu_threads(n):
                        ops.fused_adamw(local, lr, wd, b1, b2, eps, t, group["maximize"])
                    continue
                g = as_float32(local[1])
                if group["maximize"]:
                    g = -g
                P, M, V = (as_float32(local[i]) for i in (0, 2, 3))
                with emu_threads(n):
                    if wd != 0:
                        P = P - ops.mul(P, lr * wd)
                    M = M + ops.mul(g - M, 1 - b1)
                    V = V + ops.mul(ops.mul(g, g) - V, 1 - b2)
                    denom = ops.div(ops.sqrt(V), math.sqrt(1 - b2 ** t)) + np.float32(eps)
                    P = P - ops.mul(ops.div(M, denom), lr / (1 - b1 ** t))
                _write(local[2], M)
                _write(local[3], V)
                _write(local[0], P)


class PASGD(_PAStep, torch.optim.SGD):
    """torch.optim.SGD (momentum, dampening, Nesterov, L2 weight decay) with PA
    arithmetic when ``config`` enables 'optimizer':
    ``d = g + wd ⊙ p``; ``buf = μ ⊙ buf + (1-τ) ⊙ d``; ``p -= lr ⊙ d`` (or the Nesterov
    ``d + μ ⊙ buf``)."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, maximize=False, config: PAMConfig | None = None):
        for name, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            _number(name, v)
        _number("dampening", dampening, -math.inf)
        _flags(nesterov=nesterov, maximize=maximize)
        check_config(config)
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                         foreach=False)
        self.config = config

    def _pa_step(self, ops):
        for group in self.param_groups:
            lr, wd = float(group["lr"]), float(group["weight_decay"])
            for p in group["params"]:
                if p.grad is not None:
                    with emu_threads(_local(p).numel()):
                        self._update(p, group, ops, lr, wd)

    def _update(self, p, group, ops, lr, wd):
        mu, damp = float(group["momentum"]), float(group["dampening"])
        d = as_float32(_local(p.grad))
        if group["maximize"]:
            d = -d
        P = as_float32(_local(p))
        if wd != 0:
            d = d + ops.mul(P, wd)
        if mu != 0:
            state = self.state[p]
            buf = state.get("momentum_buffer")
            if buf is None:
                new = d.clone()
                if _local(p) is p:
                    state["momentum_buffer"] = new.to(p.dtype)
                else:               # a DTensor parameter: a DTensor buffer, as torch's SGD
                    state["momentum_buffer"] = buf = torch.empty_like(p)
                    _write(_local(buf), new)
            else:
                step = ops.mul(d, 1 - damp) if damp != 0 else d
                new = ops.mul(as_float32(_local(buf)), mu) + step
                _write(_local(buf), new)
            d = d + ops.mul(new, mu) if group["nesterov"] else new
        _write(_local(p), P - ops.mul(d, lr))


def make_optimizer(name: str, params, config: PAMConfig | None = None, **hyper):
    """'adamw' -> PAAdamW, 'sgd' -> PASGD, with ``config`` and the hyperparameters."""
    kinds = {"adamw": PAAdamW, "sgd": PASGD}
    if name not in kinds:
        raise ValueError(f"optimizer={name!r}; expected one of {sorted(kinds)}")
    return kinds[name](params, config=config, **hyper)

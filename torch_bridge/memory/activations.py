"""The pointwise activations the memory-saving layers support, as data.

Each :class:`Activation` carries the native PyTorch forward (what every drop-in
returns, bit for bit) and float64 definitions of f and f' used by the solver, the
inverted activations and the tests.  Parameters (LeakyReLU's slope, ELU's alpha,
Softplus' beta) are keyword arguments; ``activation(name, **params)`` validates
them and returns a hashable spec.

The derivative conventions at kinks follow PyTorch's backward kernels: ReLU'(0) = 0,
LeakyReLU'(0) = slope, ELU'(0) and SELU'(0) take the x <= 0 branch.  Softplus'
threshold (the switch to the identity for beta*x > threshold) changes the
derivative by < 2e-9 at the default 20 and is ignored by the float64 definitions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import numpy as np
import torch
from torch.nn import functional as F

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gelu(x, p):
    return x * torch.special.ndtr(x)


def _gelu_d(x, p):
    return torch.special.ndtr(x) + x * torch.exp(-0.5 * x * x) * _INV_SQRT_2PI


def _gelu_tanh(x, p):
    return 0.5 * x * (1 + torch.tanh(_SQRT_2_PI * (x + 0.044715 * x ** 3)))


def _gelu_tanh_d(x, p):
    t = torch.tanh(_SQRT_2_PI * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_PI * (1 + 3 * 0.044715 * x * x)


def _silu(x, p):
    return x * torch.sigmoid(x)


def _silu_d(x, p):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def _softplus(x, p):
    b = p["beta"]
    return torch.logaddexp(torch.zeros_like(x), b * x) / b


def _softplus_d(x, p):
    return torch.sigmoid(p["beta"] * x)


def _mish(x, p):
    return x * torch.tanh(_softplus(x, {"beta": 1.0}))


def _mish_d(x, p):
    t = torch.tanh(_softplus(x, {"beta": 1.0}))
    return t + x * (1 - t * t) * torch.sigmoid(x)


def _elu(x, p):
    a = p["alpha"]
    return torch.where(x > 0, x, a * torch.expm1(torch.clamp(x, max=0)))


def _elu_d(x, p):
    return torch.where(x > 0, torch.ones_like(x), p["alpha"] * torch.exp(torch.clamp(x, max=0)))


def _selu(x, p):
    return _SELU_SCALE * _elu(x, {"alpha": _SELU_ALPHA})


def _selu_d(x, p):
    return _SELU_SCALE * _elu_d(x, {"alpha": _SELU_ALPHA})


@dataclass(frozen=True)
class Activation:
    """One activation: its name, parameters and definitions.

    ``native(x)`` is PyTorch's own forward; ``f``/``fprime`` are float64 tensor
    definitions of the function and its derivative.  ``even``: f' is an even function,
    so the few-bit index quantises |x| (paper, Fig. 3).  ``exact_bits``: f' is itself
    piecewise constant with 2**exact_bits values (ReLU, LeakyReLU), stored losslessly.
    ``two_branch``: f decreases then increases with a single minimum (GELU, SiLU,
    Mish), the shape the inverted activations handle.
    """
    name: str
    params: tuple = ()
    even: bool = False
    exact_bits: int | None = None
    two_branch: bool = False
    _native: Callable = field(default=None, repr=False, compare=False)
    _f: Callable = field(default=None, repr=False, compare=False)
    _fprime: Callable = field(default=None, repr=False, compare=False)

    @property
    def kwargs(self) -> dict:
        return dict(self.params)

    def native(self, x: torch.Tensor) -> torch.Tensor:
        return self._native(x, self.kwargs)

    def f(self, x: torch.Tensor) -> torch.Tensor:
        return self._f(x.double(), self.kwargs)

    def fprime(self, x: torch.Tensor) -> torch.Tensor:
        return self._fprime(x.double(), self.kwargs)

    @property
    def is_default(self) -> bool:
        """Default parameters: the tables shipped in torch_bridge/memory/data apply."""
        return self.params == _SPECS[self.name][1]

    @property
    def label(self) -> str:
        extra = [f"{k}={v:g}" for k, v in self.params
                 if dict(_SPECS[self.name][1])[k] != v]
        return self.name + (f"({', '.join(extra)})" if extra else "")


# name -> (definitions, default params, flags)
_SPECS = {
    "relu": ((lambda x, p: F.relu(x), lambda x, p: F.relu(x),
              lambda x, p: (x > 0).to(x.dtype)), (), dict(exact_bits=1)),
    "leaky_relu": ((lambda x, p: F.leaky_relu(x, p["negative_slope"]),
                    lambda x, p: F.leaky_relu(x, p["negative_slope"]),
                    lambda x, p: torch.where(x > 0, torch.ones_like(x),
                                             torch.full_like(x, p["negative_slope"]))),
                   (("negative_slope", 0.01),), dict(exact_bits=1)),
    "gelu": ((lambda x, p: F.gelu(x), _gelu, _gelu_d), (), dict(two_branch=True)),
    "gelu_tanh": ((lambda x, p: F.gelu(x, approximate="tanh"), _gelu_tanh, _gelu_tanh_d), (),
                  dict(two_branch=True)),
    "silu": ((lambda x, p: F.silu(x), _silu, _silu_d), (), dict(two_branch=True)),
    "sigmoid": ((lambda x, p: torch.sigmoid(x), lambda x, p: torch.sigmoid(x),
                 lambda x, p: torch.sigmoid(x) * torch.sigmoid(-x)), (), dict(even=True)),
    "tanh": ((lambda x, p: torch.tanh(x), lambda x, p: torch.tanh(x),
              lambda x, p: 1 - torch.tanh(x) ** 2), (), dict(even=True)),
    "selu": ((lambda x, p: F.selu(x), _selu, _selu_d), (), {}),
    "elu": ((lambda x, p: F.elu(x, p["alpha"]), _elu, _elu_d), (("alpha", 1.0),), {}),
    "softplus": ((lambda x, p: F.softplus(x, p["beta"], p["threshold"]), _softplus,
                  _softplus_d), (("beta", 1.0), ("threshold", 20.0)), {}),
    "mish": ((lambda x, p: F.mish(x), _mish, _mish_d), (), dict(two_branch=True)),
}

ACTIVATIONS = tuple(_SPECS)
_ALIASES = {"swish": "silu", "gelu_erf": "gelu", "leakyrelu": "leaky_relu"}


def activation(name, **params) -> Activation:
    """The :class:`Activation` called ``name`` (one of :data:`ACTIVATIONS`, or the
    aliases swish, gelu_erf) with ``params`` overriding its defaults."""
    if isinstance(name, Activation):
        if params:
            raise TypeError("pass parameters either in the Activation or as keywords, not both")
        return name
    if not isinstance(name, str) or _ALIASES.get(name.lower(), name.lower()) not in _SPECS:
        raise ValueError(f"activation={name!r} is not supported; expected one of "
                         f"{list(ACTIVATIONS)} (aliases {sorted(_ALIASES)})")
    key = _ALIASES.get(name.lower(), name.lower())
    for k, v in params.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{key} parameter {k}={v!r} must be a finite number")
    return _make(key, tuple(sorted(params.items())))


@lru_cache(maxsize=None)
def _make(key: str, given: tuple) -> Activation:
    (native, f, fprime), defaults, flags = _SPECS[key]
    merged = dict(defaults)
    for k, v in given:
        if k not in merged:
            raise ValueError(f"activation {key!r} has no parameter {k!r}; its parameters are "
                             f"{sorted(merged) or 'none'}")
        merged[k] = float(v)
    if key == "softplus" and merged["beta"] <= 0:
        raise ValueError(f"softplus parameter beta={merged['beta']!r} must be > 0")
    if key == "elu" and merged["alpha"] <= 0:
        raise ValueError(f"elu parameter alpha={merged['alpha']!r} must be > 0")
    return Activation(key, tuple(sorted(merged.items())), _native=native, _f=f,
                      _fprime=fprime, **flags)


def nan_positions(x: torch.Tensor) -> list[torch.Tensor]:
    """``[flat indices of the NaNs in x]`` to save for backward next to the packed codes
    (a code cannot say NaN, every one names an interval), or ``[]`` when there are none,
    so that nothing more is saved.  The sum, one fast pass, is NaN whenever x holds a
    NaN (and for +inf with -inf); numpy's on the CPU, a serial loop (torch's parallel
    region would wait for the threads Numba's kernels just used)."""
    x = x.detach()
    cpu = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
    if not (np.isnan(x.numpy().sum()) if cpu else torch.isnan(x.sum())):
        return []
    nans = torch.isnan(x).reshape(-1).nonzero().view(-1)
    return [nans] if nans.numel() else []


def grad_at_nans(act: Activation, grad: torch.Tensor, nans: list[torch.Tensor],
                 out: torch.Tensor) -> torch.Tensor:
    """``out`` with native torch's gradient at the NaN inputs (``nans``: what
    :func:`nan_positions` gave): NaN for the smooth activations, as the drop-ins must
    propagate it, and whatever torch's kernel gives for the others (ReLU: grad)."""
    if not nans:
        return out
    nans = nans[0]
    g = grad.reshape(-1)[nans]
    x = torch.full_like(g, math.nan, requires_grad=True)
    with torch.enable_grad():
        (d,) = torch.autograd.grad(act.native(x), x, g)
    out = out.contiguous()
    out.view(-1)[nans] = d
    return out

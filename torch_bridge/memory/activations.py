"""The pointwise activations the memory-saving layers support, as data.

Each :class:`Activation` carries the native PyTorch forward (what every drop-in
returns, bit for bit) and float64 definitions of f, f' and f'' used by the solver, the
inverted and PA activations and the tests.  The definitions give the same bits on
every host (scalar libm calls compiled by Numba); the native forward does not.  Parameters (LeakyReLU's slope, ELU's alpha,
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
from numba import njit
from numba.extending import register_jitable
from torch.nn import functional as F

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT1_2 = math.sqrt(0.5)


# --- float64 definitions: one scalar function per activation returns f (order 0), f'
# (order 1) or f'' (order 2) at x, ``a`` its parameter (LeakyReLU's slope, ELU's alpha,
# Softplus' beta).  They are compiled by Numba into one kernel each (_KERNELS): each value is a
# sequence of IEEE operations and calls of the C library's scalar libm, the same on
# every x86-64 host, not torch's or numpy's SIMD kernels, which pick a code path by CPU
# and differ in the last bits (docs/semantics.md, "Host independence").

@register_jitable
def _sigmoid(x):
    """1 / (1 + e^-x) without overflow or cancellation in either tail."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@register_jitable
def _sech2(x):
    """1 - tanh(x)^2, accurate in the tails (where 1 - t*t cancels)."""
    c = math.cosh(x)
    return 1.0 / (c * c)


@register_jitable
def _ndtr(x):
    """The standard normal CDF (Cephes' ndtr: erf near 0, erfc in the tails)."""
    z = x * _SQRT1_2
    if abs(z) < _SQRT1_2:
        return 0.5 + 0.5 * math.erf(z)
    y = 0.5 * math.erfc(abs(z))
    return 1.0 - y if z > 0 else y


@register_jitable
def _softplus(x, b):
    """log(1 + e^(b x)) / b, stable for every x."""
    bx = b * x
    return (max(bx, 0.0) + math.log1p(math.exp(-abs(bx)))) / b


@register_jitable
def _relu(x, a, order):
    if order == 0:
        return x if x > 0 or x != x else 0.0
    return 1.0 if order == 1 and x > 0 else 0.0


@register_jitable
def _leaky_relu(x, a, order):
    if order == 0:
        return x if x > 0 else a * x
    if order == 1:
        return 1.0 if x > 0 else a
    return 0.0


@register_jitable
def _gelu(x, a, order):
    phi = math.exp(-0.5 * x * x) * _INV_SQRT_2PI
    if order == 0:
        return x * _ndtr(x)
    if order == 1:
        return _ndtr(x) + x * phi
    return phi * (2.0 - x * x)


@register_jitable
def _gelu_tanh(x, a, order):
    u = _SQRT_2_PI * (x + 0.044715 * x * x * x)
    t = math.tanh(u)
    if order == 0:
        return 0.5 * x * (1.0 + t)
    du = _SQRT_2_PI * (1.0 + 3.0 * 0.044715 * x * x)
    if order == 1:
        return 0.5 * (1.0 + t) + 0.5 * x * _sech2(u) * du
    return _sech2(u) * (du + 0.5 * x * (6.0 * _SQRT_2_PI * 0.044715 * x - 2.0 * t * du * du))


@register_jitable
def _silu(x, a, order):
    s, r = _sigmoid(x), _sigmoid(-x)                # r = 1 - s without cancellation
    if order == 0:
        return x * s
    if order == 1:
        return s * (1.0 + x * r)
    return s * r * (2.0 + x * (r - s))


@register_jitable
def _sigmoid_act(x, a, order):
    s, r = _sigmoid(x), _sigmoid(-x)
    if order == 0:
        return s
    if order == 1:
        return s * r
    return s * r * (r - s)


@register_jitable
def _tanh(x, a, order):
    if order == 0:
        return math.tanh(x)
    if order == 1:
        return _sech2(x)
    return -2.0 * math.tanh(x) * _sech2(x)


@register_jitable
def _elu(x, a, order):
    if x > 0:
        return x if order == 0 else (1.0 if order == 1 else 0.0)
    return a * math.expm1(x) if order == 0 else a * math.exp(x)


@register_jitable
def _selu(x, a, order):
    return _SELU_SCALE * _elu(x, _SELU_ALPHA, order)


@register_jitable
def _softplus_act(x, a, order):
    if order == 0:
        return _softplus(x, a)
    s = _sigmoid(a * x)
    return s if order == 1 else a * s * _sigmoid(-a * x)


@register_jitable
def _mish(x, a, order):
    sp = _softplus(x, 1.0)
    t = math.tanh(sp)
    if order == 0:
        return x * t
    s, q = _sigmoid(x), _sech2(sp)
    if order == 1:
        return t + x * q * s
    return q * s * (2.0 + x * (_sigmoid(-x) - 2.0 * t * s))


def _kernel(definition):
    """The CPU kernel of one definition: out[i] = definition(x[i], a, order)."""
    @njit(cache=True)
    def kernel(order, a, x, out):
        for i in range(x.size):
            out[i] = definition(x[i], a, order)
    return kernel


@dataclass(frozen=True)
class Activation:
    """One activation: its name, parameters and definitions.

    ``native(x)`` is PyTorch's own forward; ``f``/``fprime``/``fsecond`` are the
    float64 definitions of the function and its first two derivatives (host-independent
    bits).  ``even``: f' is an even function,
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

    @property
    def kwargs(self) -> dict:
        return dict(self.params)

    def native(self, x: torch.Tensor) -> torch.Tensor:
        return self._native(x, self.kwargs)

    def f(self, x):
        """f(x) in float64: an array for array-like x, a float64 tensor on x's device
        for a tensor."""
        return self._evaluate(0, x)

    def fprime(self, x):
        return self._evaluate(1, x)

    def fsecond(self, x):
        return self._evaluate(2, x)

    def _evaluate(self, order, x):
        if isinstance(x, torch.Tensor):
            out = self._evaluate(order, x.detach().to("cpu", torch.float64).numpy())
            return torch.from_numpy(out).to(x.device)
        x = np.ascontiguousarray(x, np.float64)
        out = np.empty_like(x)
        # the one parameter the definitions take (SELU's are constants, Softplus'
        # threshold is ignored: module docstring)
        a = next((v for k, v in self.params if k != "threshold"), 0.0)
        _KERNELS[self.name](order, a, x.reshape(-1), out.reshape(-1))
        return out

    @property
    def is_default(self) -> bool:
        """Default parameters: the tables shipped in torch_bridge/memory/data apply."""
        return self.params == _SPECS[self.name][1]

    @property
    def label(self) -> str:
        extra = [f"{k}={v:g}" for k, v in self.params
                 if dict(_SPECS[self.name][1])[k] != v]
        return self.name + (f"({', '.join(extra)})" if extra else "")


# the registry: name -> (native forward, default params, flags, float64 definition)
_SPECS = {
    "relu": (lambda x, p: F.relu(x), (), dict(exact_bits=1), _relu),
    "leaky_relu": (lambda x, p: F.leaky_relu(x, p["negative_slope"]),
                   (("negative_slope", 0.01),), dict(exact_bits=1), _leaky_relu),
    "gelu": (lambda x, p: F.gelu(x), (), dict(two_branch=True), _gelu),
    "gelu_tanh": (lambda x, p: F.gelu(x, approximate="tanh"), (), dict(two_branch=True),
                  _gelu_tanh),
    "silu": (lambda x, p: F.silu(x), (), dict(two_branch=True), _silu),
    "sigmoid": (lambda x, p: torch.sigmoid(x), (), dict(even=True), _sigmoid_act),
    "tanh": (lambda x, p: torch.tanh(x), (), dict(even=True), _tanh),
    "selu": (lambda x, p: F.selu(x), (), {}, _selu),
    "elu": (lambda x, p: F.elu(x, p["alpha"]), (("alpha", 1.0),), {}, _elu),
    "softplus": (lambda x, p: F.softplus(x, p["beta"], p["threshold"]),
                 (("beta", 1.0), ("threshold", 20.0)), {}, _softplus_act),
    "mish": (lambda x, p: F.mish(x), (), dict(two_branch=True), _mish),
}
#: one CPU kernel per definition (compiled on first use)
_KERNELS = {name: _kernel(spec[3]) for name, spec in _SPECS.items()}

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
    native, defaults, flags, _ = _SPECS[key]
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
    return Activation(key, tuple(sorted(merged.items())), _native=native, **flags)



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

"""How far each PA activation is from the function it stands for, over a whole format.

:func:`activation_errors` runs every finite value of a 16-bit format (bfloat16,
float16) through each activation of :mod:`torch_bridge.elementwise` in that format and
compares with the float64 function: the worst relative error where ``|f(x)|`` is at
least the format's smallest normal.  A result that PA arithmetic flushes to 0 (its
operations produce no subnormals, docs/semantics.md §3) while ``|f(x)|`` lies just
above the smallest normal is counted apart (``flushed``, with the largest such
``|f(x)|`` in smallest normals), not as an error.  docs/semantics.md §8 quotes the
table ``python -m torch_bridge.accuracy`` prints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

import emu

from . import elementwise as PE

__all__ = ["ActivationError", "activation_errors", "BOUND", "REFERENCE"]

#: 2x PAM's own worst relative error (1/9): the bound issue 25 sets for the activations
BOUND = 2 / 9

_ERFC = np.vectorize(math.erfc)


def _sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


#: the float64 functions
REFERENCE = {
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "silu": lambda x: x * _sigmoid(x),
    # x·σ(2z) and erfc: 1 + tanh(z) and 1 + erf(x/√2) cancel to float64's last bits (or 0)
    # in the left tails (x < -7 and x < -8), where the functions are still normal
    "gelu tanh": lambda x: x * _sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)),
    "gelu erf": lambda x: 0.5 * x * _ERFC(-x / math.sqrt(2)),
    "softplus": lambda x: np.logaddexp(0.0, x),
}
_PA = {
    "sigmoid": PE.pa_sigmoid, "tanh": PE.pa_tanh, "silu": PE.pa_silu,
    "gelu tanh": lambda x, fmt: PE.pa_gelu(x, "tanh", fmt),
    "gelu erf": lambda x, fmt: PE.pa_gelu(x, "none", fmt),
    "softplus": lambda x, fmt: PE.pa_softplus(x, fmt=fmt),
}
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ActivationError:
    name: str
    fmt: str
    worst: float            # the worst relative error where |f(x)| >= smallest normal
    at: float               # the input where it occurs
    count: int              # inputs measured
    within_from: float      # the error is <= BOUND for every x >= this (-inf: everywhere)
    flushed: int            # results flushed to 0 where |f(x)| >= smallest normal
    flushed_max: float      # the largest such |f(x)|, in smallest normals (0: none)


def every_value(fmt: str) -> torch.Tensor:
    """Every finite value of a 16-bit format, as float32."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    x = bits.view(_DTYPES[fmt]).float()
    return x[torch.isfinite(x)]


def activation_errors(fmt: str, names=None) -> list[ActivationError]:
    """The worst relative error of each PA activation over every finite value of
    ``fmt`` ("bf16" or "fp16"); ``names``: a subset of :data:`REFERENCE`."""
    x = every_value(fmt)
    xs = x.double().numpy()
    tiny = emu.format(fmt).smallest_normal
    rows = []
    for name in names or REFERENCE:
        with torch.no_grad():
            y = _PA[name](x, fmt).double().numpy()
        with np.errstate(over="ignore"):
            r = REFERENCE[name](xs)
        big = np.abs(r) >= tiny
        flush = big & (y == 0)
        ok = big & ~flush
        rel = np.abs(y[ok] - r[ok]) / np.abs(r[ok])
        i = int(np.argmax(rel))
        bad = xs[ok][rel > BOUND]
        rows.append(ActivationError(
            name, fmt, float(rel[i]), float(xs[ok][i]), int(ok.sum()),
            float(bad.max()) if bad.size else -math.inf, int(flush.sum()),
            float(np.abs(r[flush]).max() / tiny) if flush.any() else 0.0))
    return rows


def main() -> None:
    print(f"{'activation':10} {'fmt':5} {'worst':>8} {'at x':>10} {'inputs':>7}  "
          f"{'<= 22 % for x >':>15}  flushed")
    for fmt in _DTYPES:
        for e in activation_errors(fmt):
            within = "all x" if e.within_from == -math.inf else f"{e.within_from:.4g}"
            flushed = f"{e.flushed} (|f| <= {e.flushed_max:.3f} min normal)" if e.flushed \
                else "0"
            print(f"{e.name:10} {e.fmt:5} {100 * e.worst:7.2f}% {e.at:10.5g} {e.count:7d}  "
                  f"{within:>15}  {flushed}")


if __name__ == "__main__":
    main()

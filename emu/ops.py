"""The front end of the elementwise operations: it validates the arguments, plans the
call once (emu/shapes.py: kernel, broadcast shape, format) and hands it to the backend
the operands pick (emu/backend.py): the CPU backend (emu/host.py, Numba kernels) or the
CUDA backend (emu/cuda_backend.py, numba-cuda kernels), both built from the registry's scalar
definitions.

Inputs: anything ``numpy.asarray`` accepts with a real floating dtype (float16,
float32, float64, ml_dtypes' bfloat16/float8 types) or an integer dtype.  They are
converted to float32 first: exactly for every dtype except float64 and wide
integers, which are rounded to float32 (RNE) — a double rounding if the value is
then rounded into a narrower format.  Results are float32 arrays (a numpy float32
scalar when every input was a scalar), broadcast like numpy ufuncs.

CUDA operands (torch CUDA tensors, CuPy arrays, Numba device arrays) run the same
scalar definitions as CUDA kernels on the caller's stream, or on ``stream``, and
return a device array of the same kind (emu/cuda_backend.py, docs/gpu.md).
"""
from __future__ import annotations

import secrets

import numpy as np

from . import _scalar as S
from . import mx as _mx
from .backend import backend_for
from .formats import Format, format, float32
from .registry import ops
from .shapes import elementwise

__all__ = ["quantize", "to_bits", "from_bits", "fp_mul"]      # + one per registry op, below

ROUNDING = {"nearest_even": S.RNE, "toward_zero": S.RTZ, "stochastic": S.SR}
ROUNDING_ALIASES = {"rne": "nearest_even", "nearest": "nearest_even",
                     "rtz": "toward_zero", "truncate": "toward_zero", "sr": "stochastic"}
def rounding_mode(rounding) -> int:
    """Kernel code of a rounding-mode name; ValueError naming the accepted names."""
    if isinstance(rounding, str):
        key = ROUNDING_ALIASES.get(rounding.lower(), rounding.lower())
        if key in ROUNDING:
            return ROUNDING[key]
    raise ValueError(f"rounding={rounding!r} is not a rounding mode; expected one of "
                     f"{sorted(ROUNDING)} (aliases {sorted(ROUNDING_ALIASES)})")


def stochastic_key(seed) -> int:
    """Pack the two 32-bit keys of the counter-based RNG (emu._scalar.rand32) from a seed."""
    if seed is None:
        seed = secrets.randbits(64)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= int(seed) < 2 ** 64:
        raise ValueError(f"seed must be an int in [0, 2**64) or None, got {seed!r}")
    seed = int(seed)
    ka = S.mix32((seed & S.M32) ^ 0x9E3779B9) & 0x7FFFFFFF
    kb = S.mix32(ka ^ (seed >> 32) ^ 0x85EBCA6B)
    return (ka << 32) | kb


def quantize(x, fmt, rounding="nearest_even", subnormals=True, overflow=None, seed=None, *,
             stream=None):
    """Round float32 values into ``fmt``; float32 out, every value exact in ``fmt``.

    rounding: ``"nearest_even"`` (IEEE RNE), ``"toward_zero"`` (truncation; beyond
    the range gives ±max as IEEE 754 does), ``"stochastic"`` (unbiased, E[q(x)] = x;
    ``seed`` selects the counter-based random stream, element i uses draw i).
    overflow: ``None`` -> ±inf for IEEE formats, NaN for fn formats (as ml_dtypes);
    ``"saturate"`` -> ±max.  ``subnormals=False`` flushes results below the smallest
    normal to ±0.  NaN -> canonical NaN.  docs/semantics.md has the full rules.
    A CUDA ``x`` runs on the device (same random stream), on ``stream`` if given.
    """
    fmt = format(fmt)
    if not fmt.signed:                          # the E8M0 scale type (emu/mx.py)
        _mx.e8m0_check(rounding, subnormals, overflow, seed)
        return _e8m0(x, False, stream)
    mode = rounding_mode(rounding)
    if overflow not in (None, "saturate"):
        raise ValueError(f"overflow={overflow!r}; expected None (format default: inf for "
                         "IEEE formats, NaN for fn formats) or 'saturate'")
    if not isinstance(subnormals, (bool, np.bool_)):
        raise ValueError(f"subnormals must be a bool, got {subnormals!r}")
    if seed is not None and mode != S.SR:
        raise ValueError("seed is only used with rounding='stochastic'")
    key = stochastic_key(seed) if mode == S.SR else 0
    backend, (xv,) = backend_for(stream, {"x": x})
    return backend.quantize(elementwise("quantize", fmt.consts, x=xv), xv, mode,
                            bool(subnormals), overflow == "saturate", key)


def to_bits(x, fmt, *, stream=None) -> np.ndarray:
    """Encoding of ``x`` in ``fmt`` (rounded RNE first) as uint32, in the low ``width`` bits."""
    fmt = format(fmt)
    if not fmt.signed:
        return _e8m0(x, True, stream)
    backend, (xv,) = backend_for(stream, {"x": x})
    return backend.to_bits(elementwise("to_bits", fmt.consts, x=xv), xv)


def from_bits(bits, fmt, *, stream=None):
    """Float32 values of ``fmt`` encodings (integers in [0, 2^width)); NaNs canonical.

    On CUDA the range check reads one flag back, so this call waits for ``stream``.
    """
    fmt = format(fmt)
    backend, (bv,) = backend_for(stream, {"bits": bits}, bits=True)
    fc = fmt.consts if fmt.signed else None     # E8M0: a kernel of its own (emu/mx.py)
    return backend.from_bits(elementwise("from_bits", fc, bits=bv), bv, fmt)


def _e8m0(x, bits, stream):
    """quantize (``bits`` False) or to_bits into the E8M0 scale type."""
    backend, (xv,) = backend_for(stream, {"x": x})
    return backend.e8m0(elementwise("to_bits" if bits else "quantize", None, x=xv), xv, bits)


def _unary(name, x, fmt, stream):
    fc = format(fmt).consts
    backend, (xv,) = backend_for(stream, {"x": x})
    return backend.unary(elementwise(name, fc, x=xv), xv)


def _binary(name, a, b, fmt, stream):
    fc = format(fmt).consts
    backend, (av, bv) = backend_for(stream, {"a": a, "b": b})
    return backend.binary(elementwise(name, fc, a=av, b=bv), av, bv)


def _front(op):
    """The numpy front end of a public registry op (emu/registry.py)."""
    if op.arity == 1:
        def f(x, fmt: Format | str = float32, *, stream=None):
            return _unary(op.name, x, fmt, stream)
    else:
        def f(a, b, fmt: Format | str = float32, *, stream=None):
            return _binary(op.name, a, b, fmt, stream)
    f.__name__ = f.__qualname__ = op.name
    f.__module__ = __name__
    f.__doc__ = f"{op.doc}\n\n    docs/semantics.md {op.section}."
    return f


# one front end per public op of the registry, except fp_mul (its ``subnormals`` flag
# picks one of two kernels)
for _op in ops(public=True):
    if _op.name != "fp_mul":
        globals()[_op.name] = _front(_op)
        __all__.append(_op.name)
del _op


def fp_mul(a, b, fmt: Format | str = float32, subnormals=True, *, stream=None):
    """IEEE 754 multiplication, correctly rounded (RNE) into ``fmt``: the baseline
    multiplier.  ``subnormals=False``: subnormal operands read as 0, results flushed."""
    if not isinstance(subnormals, (bool, np.bool_)):
        raise ValueError(f"subnormals must be a bool, got {subnormals!r}")
    return _binary("fp_mul" if subnormals else "fp_mul_daz", a, b, fmt, stream)

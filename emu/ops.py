"""The numpy-facing API of the elementwise operations: validation, dtype and shape
handling, and dispatch to the CPU kernels (emu/_kernels.py).

Inputs: anything ``numpy.asarray`` accepts with a real floating dtype (float16,
float32, float64, ml_dtypes' bfloat16/float8 types) or an integer dtype.  They are
converted to float32 first: exactly for every dtype except float64 and wide
integers, which are rounded to float32 (RNE) — a double rounding if the value is
then rounded into a narrower format.  Results are float32 arrays (a numpy float32
scalar when every input was a scalar), broadcast like numpy ufuncs.

CUDA operands (torch CUDA tensors, CuPy arrays, Numba device arrays) run the same
scalar definitions as CUDA kernels on the caller's stream, or on ``stream``, and
return a device array of the same kind (emu/device.py, docs/gpu.md).
"""
from __future__ import annotations

import secrets

import ml_dtypes
import numpy as np

from . import _kernels as K
from . import _scalar as S
from . import device
from . import mx as _mx
from .formats import Format, format, float32

__all__ = ["quantize", "to_bits", "from_bits", "pam_mul", "pa_div", "pa_exp2",
           "pa_log2", "pa_exp", "pa_log", "pa_sqrt", "fp_add", "fp_mul"]

ROUNDING = {"nearest_even": S.RNE, "toward_zero": S.RTZ, "stochastic": S.SR}
_ROUNDING_ALIASES = {"rne": "nearest_even", "nearest": "nearest_even",
                     "rtz": "toward_zero", "truncate": "toward_zero", "sr": "stochastic"}
_ML_FLOATS = {np.dtype(getattr(ml_dtypes, n)) for n in (
    "bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float8_e8m0fnu", "float6_e3m2fn",
    "float6_e2m3fn", "float4_e2m1fn") if hasattr(ml_dtypes, n)}


def as_float32(x, name: str) -> np.ndarray:
    """``x`` as a float32 ndarray (see the module docstring for the accepted dtypes)."""
    try:
        arr = np.asarray(x)
    except Exception as exc:  # e.g. a torch tensor that requires grad
        raise TypeError(f"{name} must be array-like with a real floating or integer dtype; "
                        f"numpy.asarray failed: {exc}") from None
    if arr.dtype.kind in "fiu" or arr.dtype in _ML_FLOATS:
        with np.errstate(over="ignore"):        # float64 beyond float32's range -> ±inf, as documented
            return arr.astype(np.float32, copy=False)
    raise TypeError(f"{name} must have a real floating dtype (float16, bfloat16, float32, "
                    f"float64, ml_dtypes float8) or an integer dtype, got dtype {arr.dtype}")


def rounding_mode(rounding) -> int:
    """Kernel code of a rounding-mode name; ValueError naming the accepted names."""
    if isinstance(rounding, str):
        key = _ROUNDING_ALIASES.get(rounding.lower(), rounding.lower())
        if key in ROUNDING:
            return ROUNDING[key]
    raise ValueError(f"rounding={rounding!r} is not a rounding mode; expected one of "
                     f"{sorted(ROUNDING)} (aliases {sorted(_ROUNDING_ALIASES)})")


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


def _finish(out: np.ndarray, shape, scalar: bool):
    res = out.view(np.float32).reshape(shape)
    return res[()] if scalar else res


def _flat_u32(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint32)


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
    if not fmt.signed:                          # the E8M0 scale type
        return _mx.e8m0_op("quantize", x, rounding, subnormals, overflow, seed)
    mode = rounding_mode(rounding)
    if overflow not in (None, "saturate"):
        raise ValueError(f"overflow={overflow!r}; expected None (format default: inf for "
                         "IEEE formats, NaN for fn formats) or 'saturate'")
    if not isinstance(subnormals, (bool, np.bool_)):
        raise ValueError(f"subnormals must be a bool, got {subnormals!r}")
    if seed is not None and mode != S.SR:
        raise ValueError("seed is only used with rounding='stochastic'")
    key = stochastic_key(seed) if mode == S.SR else 0
    gpu = device.prepare(stream, x=x)
    if gpu is not None:
        return gpu.quantize(x, fmt.consts, mode, bool(subnormals), overflow == "saturate", key)
    arr = as_float32(x, "x")
    out = np.empty(arr.size, np.uint32)
    K.quantize(_flat_u32(arr), out, fmt.consts, mode, bool(subnormals),
               overflow == "saturate", key)
    return _finish(out, arr.shape, np.ndim(x) == 0)


def to_bits(x, fmt, *, stream=None) -> np.ndarray:
    """Encoding of ``x`` in ``fmt`` (rounded RNE first) as uint32, in the low ``width`` bits."""
    fmt = format(fmt)
    if not fmt.signed:
        return _mx.e8m0_op("to_bits", x)
    gpu = device.prepare(stream, x=x)
    if gpu is not None:
        return gpu.to_bits(x, fmt.consts)
    arr = as_float32(x, "x")
    out = np.empty(arr.size, np.uint32)
    K.to_bits(_flat_u32(arr), out, fmt.consts)
    out = out.reshape(arr.shape)
    return out[()] if np.ndim(x) == 0 else out


def from_bits(bits, fmt, *, stream=None):
    """Float32 values of ``fmt`` encodings (integers in [0, 2^width)); NaNs canonical.

    On CUDA the range check reads one flag back, so this call waits for ``stream``.
    """
    fmt = format(fmt)
    if not fmt.signed:
        return _mx.e8m0_op("from_bits", bits)
    gpu = device.prepare(stream, bits=bits)
    if gpu is not None:
        return gpu.from_bits(bits, fmt)
    arr = np.asarray(bits)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"bits must have an integer dtype, got {arr.dtype}")
    if arr.size and (arr.min() < 0 or int(arr.max()) >= 1 << fmt.width):
        raise ValueError(f"bits must lie in [0, 2**{fmt.width}) for {fmt.name}; "
                         f"got values in [{arr.min()}, {arr.max()}]")
    out = np.empty(arr.size, np.uint32)
    K.from_bits(np.ascontiguousarray(arr, dtype=np.uint32).reshape(-1), out, fmt.consts)
    return _finish(out, arr.shape, np.ndim(bits) == 0)


def _unary(name, x, fmt, stream):
    fmt = format(fmt)
    gpu = device.prepare(stream, x=x)
    if gpu is not None:
        return gpu.unary(name, x, fmt.consts)
    kernel = K.UNARY[name]
    arr = as_float32(x, "x")
    out = np.empty(arr.size, np.uint32)
    kernel(_flat_u32(arr), out, fmt.consts)
    return _finish(out, arr.shape, np.ndim(x) == 0)


def _binary(name, a, b, fmt, stream):
    fmt = format(fmt)
    gpu = device.prepare(stream, a=a, b=b)
    if gpu is not None:
        return gpu.binary(name, a, b, fmt.consts)
    kernel = K.BINARY[name]
    x = as_float32(a, "a")
    y = as_float32(b, "b")
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise ValueError(f"operands could not be broadcast together: a.shape={x.shape}, "
                         f"b.shape={y.shape}") from None
    if x.shape != shape:
        x = np.broadcast_to(x, shape)
    if y.shape != shape:
        y = np.broadcast_to(y, shape)
    out = np.empty(int(np.prod(shape)), np.uint32)
    kernel(_flat_u32(x), _flat_u32(y), out, fmt.consts)
    return _finish(out, shape, np.ndim(a) == 0 and np.ndim(b) == 0)


def pam_mul(a, b, fmt: Format | str = float32, *, stream=None):
    """Piecewise affine multiplication a ·̂ b (eqs. 5-8) in ``fmt``."""
    return _binary("pam_mul", a, b, fmt, stream)


def pa_div(a, b, fmt: Format | str = float32, *, stream=None):
    """Piecewise affine division a ÷̂ b (eqs. 14-17) in ``fmt``."""
    return _binary("pa_div", a, b, fmt, stream)


def pa_exp2(x, fmt: Format | str = float32, *, stream=None):
    """paexp2(x) = 2^floor(x) (1 + x - floor(x)) (eq. 9), rounded once into ``fmt``."""
    return _unary("pa_exp2", x, fmt, stream)


def pa_log2(x, fmt: Format | str = float32, *, stream=None):
    """palog2(x) = E_x + M_x (eq. 10), rounded once into ``fmt``."""
    return _unary("pa_log2", x, fmt, stream)


def pa_exp(x, fmt: Format | str = float32, *, stream=None):
    """paexp(x) = paexp2(log2(e) ·̂ x) (eq. 18)."""
    return _unary("pa_exp", x, fmt, stream)


def pa_log(x, fmt: Format | str = float32, *, stream=None):
    """palog(x) = palog2(x) ÷̂ log2(e) (eq. 19)."""
    return _unary("pa_log", x, fmt, stream)


def pa_sqrt(x, fmt: Format | str = float32, *, stream=None):
    """pasqrt(x) = paexp2(palog2(x) / 2) (eq. 20), exact then rounded once into ``fmt``."""
    return _unary("pa_sqrt", x, fmt, stream)


def fp_add(a, b, fmt: Format | str = float32, *, stream=None):
    """IEEE 754 addition, correctly rounded (RNE) into ``fmt``: the accumulator's ⊕."""
    return _binary("fp_add", a, b, fmt, stream)


def fp_mul(a, b, fmt: Format | str = float32, subnormals=True, *, stream=None):
    """IEEE 754 multiplication, correctly rounded (RNE) into ``fmt``: the baseline
    multiplier.  ``subnormals=False``: subnormal operands read as 0, results flushed."""
    if not isinstance(subnormals, (bool, np.bool_)):
        raise ValueError(f"subnormals must be a bool, got {subnormals!r}")
    return _binary("fp_mul" if subnormals else "fp_mul_daz", a, b, fmt, stream)

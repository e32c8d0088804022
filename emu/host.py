"""Host (numpy) operands: conversion to float32 as every front end accepts them, and the
flat pattern views the CPU kernels take (emu/ops.py's module docstring has the rules)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

__all__ = ["as_float32", "flat_u32", "finish", "alloc"]

_ML_FLOATS = {np.dtype(getattr(ml_dtypes, n)) for n in (
    "bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float8_e8m0fnu", "float6_e3m2fn",
    "float6_e2m3fn", "float4_e2m1fn") if hasattr(ml_dtypes, n)}


def as_float32(x, name: str) -> np.ndarray:
    """``x`` as a float32 ndarray (emu/ops.py's module docstring lists the accepted dtypes)."""
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


def finish(out: np.ndarray, shape, scalar: bool):
    """A kernel's flat uint32 output as float32 of ``shape`` (a numpy scalar if ``scalar``)."""
    res = out.view(np.float32).reshape(shape)
    return res[()] if scalar else res


def flat_u32(arr: np.ndarray) -> np.ndarray:
    """The float32 array's patterns as a flat, C-contiguous uint32 array (a view if it can)."""
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint32)


def alloc(op: str, shape, dtype=np.uint32) -> np.ndarray:
    """An empty result array for ``op``, or a MemoryError naming the op and the shape
    (numpy's own says neither, or raises ValueError beyond the address space)."""
    shape = tuple(int(d) for d in shape)
    try:
        return np.empty(shape, dtype)
    except (MemoryError, ValueError):
        n = math.prod(shape)
        raise MemoryError(f"{op}: cannot allocate the result, shape {shape} ({n:,} values, "
                          f"{n * np.dtype(dtype).itemsize / 2**30:,.1f} GiB)") from None

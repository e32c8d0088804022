"""A float32 sum in a defined order: :func:`fold_sum` (docs/semantics.md §6).

numpy's and torch's sums associate as their code paths (pairwise blocks, vector
widths) make them, which differ between hosts.  ``fold_sum`` is the sequential left
fold in index order, so every host and the GPU give the same bits; torch_bridge's
composites (softmax, norms, losses) sum with it.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .backend import backend_for

__all__ = ["fold_sum", "FoldPlan", "fold_plan"]


class FoldPlan(NamedTuple):
    """The plan of a fold: ``perm`` (None, or the transposition that makes the reduced
    axes trailing), the (outer, n, inner) view of the (permuted) operand, the result's
    shape."""
    perm: tuple | None
    outer: int
    n: int
    inner: int
    out: tuple


def fold_plan(shape, axis=None, keepdims=False) -> FoldPlan:
    """Plan ``fold_sum`` over ``axis`` (an int, a tuple of ints or None: all) of an
    operand of ``shape``; ValueError/TypeError naming ``axis`` when it is out of range,
    repeated or not integers."""
    shape = tuple(int(d) for d in shape)
    nd = len(shape)
    if axis is None:
        axes = tuple(range(nd))
    else:
        raw = (axis,) if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) \
            else tuple(axis) if isinstance(axis, (tuple, list)) else None
        if raw is None or any(isinstance(a, bool) or not isinstance(a, (int, np.integer))
                              for a in raw):
            raise TypeError(f"axis must be an int, a tuple of ints or None, got {axis!r}")
        if any(not -nd <= a < nd for a in raw):
            raise ValueError(f"axis={axis!r} is out of range for an operand of {nd} dimensions")
        axes = tuple(sorted(int(a) % nd for a in raw)) if nd else ()
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis={axis!r} repeats an axis")
    out = tuple(1 if d in axes else s for d, s in enumerate(shape)) if keepdims else \
        tuple(s for d, s in enumerate(shape) if d not in axes)
    if axes and axes == tuple(range(axes[0], axes[-1] + 1)):     # one block: no copy
        return FoldPlan(None, math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]),
                        math.prod(shape[axes[-1] + 1:]), out)
    kept = tuple(d for d in range(nd) if d not in axes)
    return FoldPlan(kept + axes, math.prod(shape[d] for d in kept),
                    math.prod(shape[d] for d in axes), 1, out)


def fold_sum(x, axis=None, keepdims=False, *, stream=None):
    """The float32 sum of ``x`` over ``axis`` (int, tuple of ints, or None for all), as
    the left fold in index order: for each result, the reduced elements in C order of
    the reduced axes, ``s = x_0``, ``s = s + x_j`` (IEEE binary32, RNE, subnormals kept).
    An empty sum is +0.0; NaN results are canonical.  ``keepdims`` as numpy.  Inputs as
    the other emu front ends (converted to float32 first); a CUDA ``x`` runs on the
    device (the same fold), on ``stream`` if given.  Returns float32 (a numpy float32
    scalar for a 0-d result of host operands).
    """
    backend, (xv,) = backend_for(stream, {"x": x})
    return backend.fold_sum(fold_plan(xv.shape, axis, keepdims), xv)

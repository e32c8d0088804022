"""Matrix multiplication with a defined accumulation order and a multiplier as data
(docs/semantics.md §5 and "Multipliers").

``C[..., i, j]`` is the fold over k = 0, 1, ..., K-1 *in increasing order*, from
+0.0, of ``acc <- acc ⊕ mul(A[..., i, k], B[..., k, j])`` where ⊕ is IEEE
binary32 addition (``acc=float32``, numpy float32 ``+``) or the correctly rounded
sum in a narrower accumulator format; with ``mul="exact"`` each step is one fused
multiply-add, ``RN_acc(acc + a·b)``.  This is the order the RTL MAC implements,
so every implementation agrees bit for bit.  The front end checks the shapes once
(emu/shapes.py) and hands the plan to the CPU backend (emu/host.py) or, for CUDA
operands, the CUDA backend, whose tiled kernels (emu/_cuda.py) keep the same order
and return a device array (emu/cuda_backend.py).
"""
from __future__ import annotations

import math

import numpy as np

from . import _kernels_small as KS
from . import sizes
from .backend import backend_for
from .formats import Format, format, float32
from .host import HOST
from .multipliers import MULTIPLIERS, multiplier
from .shapes import batch_index, matmul_shapes

__all__ = ["matmul", "pam_matmul"]


def matmul(A, B, fmt: Format | str = float32, acc: Format | str = float32, *, mul="pam",
           mul_fmt=None, stream=None):
    """Matmul with ``np.matmul``'s shape and broadcasting rules (2-D, batched, 1-D) by
    the multiplier ``mul`` (a name of ``emu.MULTIPLIERS``, a parseable spelling such as
    ``"lmul+2"``, or an ``emu.Multiplier``).

    Operands are rounded to ``fmt`` (RNE); products are ``emu.mul(a, b, fmt, mul)``
    (``exact``: fused into the step); accumulation is sequential in k from +0.0 in
    ``acc``.  K = 0 gives zeros.  Returns a float32 array; every NaN in it is the
    canonical NaN.  CUDA operands (read in place, transposed views included) give a
    device array of the same kind, computed on the caller's stream or on ``stream``.
    ``mul_fmt``: the format whose rule of ``mul`` the products follow (default ``fmt``;
    emu.mx_matmul: the element format, on float32 values of MX blocks).
    """
    fmt = format(fmt, argname="fmt").arithmetic()
    acc = format(acc, argname="acc").accumulator("acc")
    mp = params_of(mul, fmt if mul_fmt is None else mul_fmt)
    backend, (a, b) = backend_for(stream, {"A": A, "B": B})
    return backend.matmul(matmul_shapes(a.shape, b.shape), a, b, fmt, acc, mp)


def params_of(mul, fmt):
    """``multiplier(mul).params(fmt)``, None for PAM (the backends' own PAM paths)."""
    m = multiplier(mul)
    return None if m == MULTIPLIERS["pam"] else m.params(fmt)


def pam_matmul(A, B, fmt: Format | str = float32, acc: Format | str = float32, *,
               stream=None):
    """:func:`matmul` with PAM, ``emu.pam_mul``'s products."""
    return matmul(A, B, fmt, acc, stream=stream)


def host_matmul(a, b, fmt: Format, acc: Format, mp=None):
    """:func:`matmul` of float32 numpy arrays with Format objects and the multiplier's
    ``params(fmt)`` (None: PAM), without the front end's conversions (for callers that
    checked their operands already, e.g. torch_bridge's per-call path); the shapes are
    still checked."""
    if (mp is None and fmt is float32 and acc is float32 and a.ndim == b.ndim >= 2
            and a.shape[:-2] == b.shape[:-2] and a.shape[-1] == b.shape[-2]):
        # small operands of one batch shape (2-D included) straight to the small
        # kernel: what HOST.matmul would run, without its planning
        (m, k), n = a.shape[-2:], b.shape[-1]
        nb = math.prod(a.shape[:-2])
        if 0 < nb * m * k * n <= sizes.SMALL:
            c = np.empty((nb, m, n), np.float32)
            own = batch_index(a.shape[:-2], a.shape[:-2])
            KS.matmul_small(np.ascontiguousarray(a).view(np.int32).reshape(nb, m, k),
                            np.ascontiguousarray(b).view(np.int32).reshape(nb, k, n),
                            own, own, c, float32.consts, 0)
            return c.reshape(a.shape[:-2] + (m, n))
    return HOST.matmul(matmul_shapes(a.shape, b.shape), a, b, fmt, acc, mp)

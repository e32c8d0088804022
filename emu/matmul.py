"""PAM matrix multiplication with a defined accumulation order (docs/semantics.md).

``C[..., i, j]`` is the fold over k = 0, 1, ..., K-1 *in increasing order*, from
+0.0, of ``acc <- acc ⊕ pam_mul(A[..., i, k], B[..., k, j])`` where ⊕ is IEEE
binary32 addition (``acc=float32``, numpy float32 ``+``) or the correctly rounded
sum in a narrower accumulator format.  This is the order the RTL MAC implements,
so every implementation agrees bit for bit.  The front end checks the shapes once
(emu/shapes.py) and hands the plan to the CPU backend (emu/host.py) or, for CUDA
operands, the CUDA backend, whose tiled kernels (emu/_cuda.py) keep the same order
and return a device array (emu/cuda_backend.py).
"""
from __future__ import annotations

from .formats import Format, format, float32
from .ops import backend_for
from .shapes import matmul_shapes

__all__ = ["pam_matmul"]


def pam_matmul(A, B, fmt: Format | str = float32, acc: Format | str = float32, *,
               stream=None):
    """PAM matmul with ``np.matmul``'s shape and broadcasting rules (2-D, batched, 1-D).

    Operands are rounded to ``fmt`` (RNE); products are ``pam_mul`` in ``fmt``;
    accumulation is sequential in k from +0.0 in ``acc``.  K = 0 gives zeros.
    Returns a float32 array; every NaN in it is the canonical NaN.  CUDA operands
    (read in place, transposed views included) give a device array of the same kind,
    computed on the caller's stream or on ``stream``.
    """
    fmt = format(fmt, argname="fmt").arithmetic()
    acc = format(acc, argname="acc").arithmetic("acc")
    backend, (a, b) = backend_for(stream, {"A": A, "B": B})
    return backend.matmul(matmul_shapes(a.shape, b.shape), a, b, fmt, acc)

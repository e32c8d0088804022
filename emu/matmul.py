"""PAM matrix multiplication with a defined accumulation order (docs/semantics.md).

``C[..., i, j]`` is the fold over k = 0, 1, ..., K-1 *in increasing order*, from
+0.0, of ``acc <- acc ⊕ pam_mul(A[..., i, k], B[..., k, j])`` where ⊕ is IEEE
binary32 addition (``acc=float32``, numpy float32 ``+``) or the correctly rounded
sum in a narrower accumulator format.  This is the order the RTL MAC implements,
so every implementation agrees bit for bit.  CUDA operands run the tiled kernels of
emu/_cuda.py, in the same order, and return a device array (emu/cuda_backend.py).
"""
from __future__ import annotations

import math

import numpy as np

from . import _kernels as K
from . import _kernels_acc as KA
from . import cuda_backend
from .formats import Format, format, float32
from .host import alloc, as_float32
from .ops import quantize
from .shapes import batch_index, matmul_shapes

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
    fmt = format(fmt, argname="fmt")
    acc = format(acc, argname="acc")
    gpu = cuda_backend.prepare(stream, A=A, B=B)
    if gpu is not None:
        return gpu.matmul(A, B, fmt, acc)
    a = as_float32(A, "A")
    b = as_float32(B, "B")
    plan = matmul_shapes(a.shape, b.shape)
    batch, (m, k, n) = plan.batch, plan.mkn
    if plan.squeeze_a:
        a = a[None, :]
    if plan.squeeze_b:
        b = b[:, None]
    nout = math.prod(batch)
    c = alloc("pam_matmul", plan.full, np.float32)     # first: it can be far larger than A, B
    if nout == 0 or m == 0 or n == 0 or k == 0:
        c[...] = 0
    else:
        if fmt == float32:
            # rounding to float32 is the identity up to NaN payloads, and the kernel
            # maps every NaN operand to the canonical NaN itself
            aq = np.ascontiguousarray(a).view(np.int32)
            bq = np.ascontiguousarray(b).view(np.int32)
        else:
            aq = quantize(a, fmt).view(np.int32)
            bq = quantize(b, fmt).view(np.int32)
        ia = batch_index(a.shape[:-2], batch)
        ib = batch_index(b.shape[:-2], batch)
        a3 = aq.reshape(-1, m, k)
        b3 = bq.reshape(-1, k, n)
        c = c.reshape(nout, m, n)
        if acc == float32 or KA.fast_path(acc):
            # narrow: the sticky test reads the unpadded operands
            sticky = acc != float32 and KA.needs_sticky(a3, b3, fmt.consts, acc.consts)
            if m % K.QR:        # whole row blocks for the micro-kernel; extra rows are dropped
                a3 = np.concatenate([a3, np.zeros((a3.shape[0], -m % K.QR, k), np.int32)], 1)
            am, sta = K.matmul_prepare_a(a3, fmt.consts)
            bp, bm, stb = K.matmul_prepare_b(b3, fmt.consts)
            if acc == float32:
                K.matmul_f32acc(a3, am, sta, bp, bm, stb, ia, ib, c, fmt.consts)
            else:
                KA.matmul_narrow(a3, am, sta, b3, bp, bm, stb, ia, ib, c.view(np.int32),
                                 fmt.consts, acc.consts, sticky)
        else:
            K.matmul_fmtacc(a3, b3, ia, ib, c.view(np.int32), fmt.consts, acc.consts)
    return c.reshape(plan.out)

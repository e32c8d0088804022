"""The CPU backend: emu's operations on host (numpy) operands, run by the Numba kernels
of emu/_kernels.py, emu/_kernels_acc.py and emu/_kernels_grad.py with the plans the
front ends make (emu/shapes.py); its interface is the CUDA backend's
(emu/cuda_backend.py).  Also the conversion of host operands to float32 as every front
end accepts them (emu/ops.py's module docstring has the rules)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from . import _kernels as K
from . import _kernels_acc as KA
from . import _kernels_grad as KG
from . import _kernels_mul as KMul
from . import _kernels_mx as KM
from . import _kernels_reduce as KR
from . import _kernels_small as KS
from . import _scalar as S
from . import _scalar_mul as SM
from . import sizes
from .formats import float32
from .shapes import batch_index, broadcast_base

__all__ = ["as_float32", "flat_u32", "finish", "alloc", "host_fold", "HostBackend", "HOST"]

_ML_FLOATS = {np.dtype(getattr(ml_dtypes, n)) for n in (
    "bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float8_e8m0fnu", "float6_e3m2fn",
    "float6_e2m3fn", "float4_e2m1fn") if hasattr(ml_dtypes, n)}


def as_float32(x, name: str) -> np.ndarray:
    """``x`` as a float32 ndarray (emu/ops.py's module docstring lists the accepted dtypes)."""
    if type(x) is np.ndarray and x.dtype == np.float32:     # the common case, at no cost
        return x
    if isinstance(x, np.ma.MaskedArray):        # np.asarray would drop the mask silently
        raise TypeError(f"{name} is a numpy masked array; masked arrays are not accepted "
                        f"(the mask would be dropped): pass {name}.filled(value) or "
                        f"{name}.data instead")
    try:
        arr = np.asarray(x)
    except Exception as exc:  # e.g. a torch tensor that requires grad
        raise TypeError(f"{name} must be array-like with a real floating or integer dtype; "
                        f"numpy.asarray failed: {exc}") from None
    if arr.dtype.kind in "fiu" or arr.dtype in _ML_FLOATS:
        with np.errstate(over="ignore"):        # float64 beyond float32's range -> ±inf, as documented
            # a broadcast view's stride-0 dimensions are converted once, not copied out
            one = broadcast_base(arr.shape, arr.strides)
            if one is not None:
                return np.broadcast_to(arr[one].astype(np.float32), arr.shape)
            return arr.astype(np.float32, copy=False)
    raise TypeError(f"{name} must have a real floating dtype (float16, bfloat16, float32, "
                    f"float64, ml_dtypes float8) or an integer dtype, got dtype {arr.dtype}")


def finish(out: np.ndarray, shape, scalar: bool):
    """A kernel's flat uint32 output as float32 of ``shape`` (a numpy scalar if ``scalar``)."""
    res = out.view(np.float32).reshape(shape)
    return res[()] if scalar else res


def flat_u32(arr: np.ndarray, shape=None) -> np.ndarray:
    """The float32 array's patterns (broadcast to ``shape`` if given) as a flat,
    C-contiguous uint32 array (a view if it can)."""
    if shape is not None and arr.shape != shape:
        arr = np.broadcast_to(arr, shape)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr.reshape(-1).view(np.uint32)


def alloc(op: str, shape, dtype=np.uint32) -> np.ndarray:
    """An empty result array for ``op``, or a MemoryError naming the op and the shape
    (numpy's own says neither, or raises ValueError beyond the address space)."""
    try:
        return np.empty(shape, dtype)
    except (MemoryError, ValueError):
        shape = tuple(int(d) for d in shape)
        n = math.prod(shape)
        raise MemoryError(f"{op}: cannot allocate the result, shape {shape} ({n:,} values, "
                          f"{n * np.dtype(dtype).itemsize / 2**30:,.1f} GiB)") from None


def _pick(parallel, serial, out):
    """The kernel table for a result of ``out.size`` elements: serial below sizes.SERIAL."""
    return parallel if out.size >= sizes.SERIAL else serial


class HostBackend:
    """emu's operations on host operands: each method takes the front end's plan
    (emu/shapes.py) and operands already made by :meth:`operand`."""

    @staticmethod
    def operand(x, name: str, bits: bool = False) -> np.ndarray:
        """A host operand as the kernels read it: float32 (``bits``: as it is)."""
        return np.asarray(x) if bits else as_float32(x, name)

    def quantize(self, plan, x, mode, subnormals, saturate, key):
        out = alloc(plan.op, plan.shape).reshape(-1)
        K.QUANTIZE[out.size >= sizes.SERIAL](flat_u32(x), out, plan.fc, mode, subnormals,
                                          saturate, key)
        return finish(out, plan.shape, plan.scalar)

    def to_bits(self, plan, x):
        out = alloc(plan.op, plan.shape).reshape(-1)
        K.to_bits(flat_u32(x), out, plan.fc)
        out = out.reshape(plan.shape)
        return out[()] if plan.scalar else out

    def from_bits(self, plan, bits, fmt):
        if bits.dtype == object and all(isinstance(v, int) for v in bits.flat):
            raise ValueError(f"bits must lie in [0, 2**{fmt.width}) for {fmt.name}; got "
                             f"Python ints beyond int64, in [{min(bits.flat)}, "
                             f"{max(bits.flat)}]")
        if bits.dtype.kind not in "iu":
            raise TypeError(f"bits must have an integer dtype, got {bits.dtype}")
        # the distinct elements only: a broadcast view repeats them (stride 0), maybe 1e12 times
        own = bits[tuple(slice(0, 1) if s == 0 else slice(None) for s in bits.strides)]
        if own.size and (own.min() < 0 or int(own.max()) >= 1 << fmt.width):
            raise ValueError(f"bits must lie in [0, 2**{fmt.width}) for {fmt.name}; "
                             f"got values in [{own.min()}, {own.max()}]")
        out = alloc(plan.op, plan.shape).reshape(-1)
        if not fmt.signed:                      # the E8M0 scale type (emu/mx.py)
            KM.e8m0_from_bits(np.ascontiguousarray(bits, dtype=np.uint32).reshape(-1), out)
        else:
            K.from_bits(np.ascontiguousarray(bits, dtype=np.uint32).reshape(-1), out, plan.fc)
        return finish(out, plan.shape, plan.scalar)

    def unary(self, plan, x):
        out = alloc(plan.op, plan.shape).reshape(-1)
        _pick(K.UNARY, K.UNARY_SERIAL, out)[plan.op](flat_u32(x, plan.shape), out, plan.fc)
        return finish(out, plan.shape, plan.scalar)

    def binary(self, plan, a, b):
        out = alloc(plan.op, plan.shape).reshape(-1)
        _pick(K.BINARY, K.BINARY_SERIAL, out)[plan.op](flat_u32(a, plan.shape),
                                                       flat_u32(b, plan.shape), out, plan.fc)
        return finish(out, plan.shape, plan.scalar)

    def mul(self, plan, a, b, mp):
        """emu.mul: any multiplier (MulParams ``mp``)."""
        out = alloc(plan.op, plan.shape).reshape(-1)
        from ._kernels_mul import MUL          # compiled on first use
        _pick(MUL[True], MUL[False], out)(flat_u32(a, plan.shape), flat_u32(b, plan.shape), out,
                                          plan.fc, mp)
        return finish(out, plan.shape, plan.scalar)

    def mul_grad(self, plan, a, b, dy, mp):
        """emu.grad.mul: its exact (δA, δB)."""
        outs = [alloc(plan.op, plan.shape).reshape(-1) for _ in range(2)]
        from ._kernels_mul import MUL_GRAD      # compiled on first use
        _pick(MUL_GRAD[True], MUL_GRAD[False], outs[0])(
            *(flat_u32(v, plan.shape) for v in (a, b, dy)), *outs, plan.fc, mp)
        return tuple(finish(o, plan.shape, plan.scalar) for o in outs)

    def grad_unary(self, plan, x, dy):
        out = alloc(plan.op, plan.shape).reshape(-1)
        _pick(KG.UNARY, KG.UNARY_SERIAL, out)[plan.op](flat_u32(x, plan.shape),
                                                       flat_u32(dy, plan.shape), out, plan.fc)
        return finish(out, plan.shape, plan.scalar)

    def grad_binary(self, plan, a, b, dy):
        outa = alloc(plan.op, plan.shape).reshape(-1)
        outb = alloc(plan.op, plan.shape).reshape(-1)
        _pick(KG.BINARY, KG.BINARY_SERIAL, outa)[plan.op](
            flat_u32(a, plan.shape), flat_u32(b, plan.shape), flat_u32(dy, plan.shape), outa,
            outb, plan.fc)
        return finish(outa, plan.shape, plan.scalar), finish(outb, plan.shape, plan.scalar)

    def fold_sum(self, plan, x):
        """emu.fold_sum (emu/reduce.py has the definition and the plan)."""
        res = host_fold(x, plan)
        return res[()] if plan.out == () else res

    def matmul(self, plan, a, b, fmt, acc, mp=None):
        """emu.matmul (emu/matmul.py has the definition) of float32 operands by the
        multiplier ``mp`` (emu/_scalar_mul.py's MulParams in fmt; None: PAM).  A pattern
        sum with one constant takes the fast kernels, any other the fold of SM.mac.

        Broadcast views are not copied (:func:`_compact`): a batch dimension of stride 0
        is read once, rows of A or columns of B of stride 0 are computed once and the
        result repeated, and operands that are both constant along k take
        K.matmul_repeated, which stops adding the same product once the sum stops
        changing (an 8 x 8 result of two (8, 10^10) views needs no 300 GiB)."""
        batch, (m, k, n) = plan.batch, plan.mkn
        if plan.squeeze_a:
            a = a[None, :]
        if plan.squeeze_b:
            b = b[:, None]
        nout = math.prod(batch)
        c = alloc("pam_matmul", plan.full, np.float32)  # first: it can be far larger than A, B
        if nout == 0 or m == 0 or n == 0 or k == 0:
            c[...] = 0
            return c.reshape(plan.out)
        a, b, repeated = _compact(a, b)
        a3 = self._patterns(a, fmt).reshape(-1, *a.shape[-2:])
        b3 = self._patterns(b, fmt).reshape(-1, *b.shape[-2:])
        ia = batch_index(a.shape[:-2], batch)
        ib = batch_index(b.shape[:-2], batch)
        whole = (a3.shape[1], b3.shape[2]) == (m, n)
        c3 = c.reshape(nout, m, n) if whole else \
            alloc("pam_matmul", (nout, a3.shape[1], b3.shape[2]), np.float32)
        if repeated:
            K.matmul_repeated(a3, b3, ia, ib, c3.view(np.int32), k, fmt.consts, acc.consts,
                              SM.MulParams(SM.SUM, 0, K.NO_TABLE, 0) if mp is None else mp)
        else:
            self._matmul3(a3, b3, ia, ib, c3, fmt, acc, mp)
        if not whole:
            c.reshape(nout, m, n)[...] = c3
        return c.reshape(plan.out)

    def _matmul3(self, a3, b3, ia, ib, c, fmt, acc, mp):
        """The matmul of (batches, m, k) and (batches, k, n) patterns into ``c``."""
        m, k = a3.shape[1:]
        n = b3.shape[2]
        nout = c.shape[0]
        if mp is not None and not (mp.kind == SM.SUM and mp.k == 0):
            self._matmul_other(a3, b3, ia, ib, c, fmt, acc, mp)
            return
        c32 = 0 if mp is None else int(mp.c32)
        if acc == float32 and nout * m * n * k <= sizes.SMALL:
            KS.matmul_small(a3, b3, ia, ib, c, fmt.consts, c32)
            return
        if acc == float32 or KA.fast_path(acc):
            # narrow: the sticky test reads the unpadded operands; the constant's low
            # bits enter every product's pattern
            sticky = acc != float32 and KA.needs_sticky(a3, b3, fmt.consts, acc.consts,
                                                        abs(c32) & 0x7FFFFF)
            if m % K.QR:        # whole row blocks for the micro-kernel; extra rows are dropped
                a3 = np.concatenate([a3, np.zeros((a3.shape[0], -m % K.QR, k), np.int32)], 1)
            am, sta = K.matmul_prepare_a(a3, fmt.consts)
            bp, bm, stb = K.matmul_prepare_b(b3, fmt.consts, c32, K.NO_TABLE, 0)
            if acc == float32:
                K.matmul_f32acc(a3, am, sta, bp, bm, stb, ia, ib, c, fmt.consts,
                                SM.MulParams(SM.SUM, c32, K.NO_TABLE, 0),
                                K.float_consts(fmt.consts), K.NO_OFFSETS)
            else:
                KA.matmul_narrow(a3, am, sta, b3, bp, bm, stb, ia, ib, c.view(np.int32),
                                 fmt.consts, acc.consts, sticky, c32=c32)
        else:
            K.matmul_fmtacc(a3, b3, ia, ib, c.view(np.int32), fmt.consts, acc.consts,
                            SM.MulParams(SM.SUM, c32, K.NO_TABLE, 0))

    @staticmethod
    def _matmul_other(a3, b3, ia, ib, c, fmt, acc, mp):
        """matmul's multipliers that are not one constant (corrected PAM, exact, float,
        tables): with a float32 accumulator the register-blocked kernel with their product
        (K.matmul_blocked: ``exact`` where every product is exact in float32, ``float``
        for M <= 11) or a table's lookups, else the fold of SM.mac."""
        if mp.kind == SM.TABLE and acc == float32:
            KMul.table_matmul_f32acc(a3, b3, ia, ib, c, fmt.consts, mp)
            return
        prod = {SM.EXACT: K.FMUL, SM.FLOAT: K.FMUL_ROUND}.get(mp.kind, K.ADD)
        # corrected PAM: the kernel reads c32 + T back as a 32-bit difference
        wide = prod == K.ADD and max(abs(int(mp.c32) + int(t)) for t in mp.table) >= 1 << 31
        if acc != float32 or wide or (prod == K.FMUL and not KMul.exact_ok(a3, b3, fmt)) or \
                (prod == K.FMUL_ROUND and fmt.man_bits > 11):
            K.matmul_fmtacc(a3, b3, ia, ib, c.view(np.int32), fmt.consts, acc.consts, mp)
            return
        m, k = a3.shape[1:]
        if m % K.QR:
            a3 = np.concatenate([a3, np.zeros((a3.shape[0], -m % K.QR, k), np.int32)], 1)
        am, sta = K.matmul_prepare_a(a3, fmt.consts)
        variants = prod == K.ADD        # corrected PAM: B packed once per table row
        if variants:
            bp, bm, stb = K.matmul_prepare_b(b3, fmt.consts, mp.c32, mp.table, mp.k)
            ao = K.matmul_variant_offsets(a3, mp.k, k)
        else:                           # the float32 product: B packed as b itself
            mp = SM.MulParams(mp.kind, S.ONE32, K.NO_TABLE, 0)
            bp, bm, stb = K.matmul_prepare_b(b3, fmt.consts, S.ONE32, K.NO_TABLE, 0)
            ao = K.NO_OFFSETS
        K.blocked(prod=prod, psh=23 - fmt.man_bits, variants=variants)(
            a3, am, sta, bp, bm, stb, ia, ib, c, fmt.consts, mp, K.float_consts(fmt.consts), ao)

    # -- the E8M0 scale type and MX blocks (emu/mx.py) --------------------------------
    def e8m0(self, plan, x, to_bits):
        """quantize (values) or to_bits (codes) into float8_e8m0fnu."""
        out = alloc(plan.op, plan.shape).reshape(-1)
        KM.e8m0(flat_u32(x, plan.shape), out, to_bits)
        if to_bits:
            out = out.reshape(plan.shape)
            return out[()] if plan.scalar else out
        return finish(out, plan.shape, plan.scalar)

    def mx_quantize(self, plan, x, values):
        """emu.mx_quantize (``values``: MXFormat.round) on the plan of emu/mx.py."""
        out = alloc("mx_quantize", plan.shape).reshape(-1)
        scales = alloc("mx_quantize", plan.scales if not values else (1,), np.uint8)
        KM.mx_quantize(flat_u32(x), out, scales.reshape(-1), plan.ntask, plan.nb, plan.n,
                       plan.inner, plan.block, plan.efc, plan.emax, plan.int8, values,
                       float32.consts)
        res = out.view(np.float32).reshape(plan.shape)
        return res if values else (res, scales)

    def mx_dequantize(self, plan, p, scales):
        out = alloc("mx_dequantize", plan.shape).reshape(-1)
        KM.mx_dequantize(flat_u32(p), np.ascontiguousarray(scales).reshape(-1), out, plan.nb,
                         plan.n, plan.inner, plan.block, float32.consts)
        return out.view(np.float32).reshape(plan.shape)

    @staticmethod
    def _patterns(x, fmt):
        """x rounded into fmt (RNE) as contiguous int32 patterns."""
        if fmt == float32:
            # rounding to float32 is the identity up to NaN payloads, and the kernels
            # map every NaN operand to the canonical NaN themselves
            return np.ascontiguousarray(x).view(np.int32)
        out = alloc("pam_matmul", x.shape)
        K.QUANTIZE[out.size >= sizes.SERIAL](flat_u32(x), out.reshape(-1), fmt.consts, S.RNE,
                                          True, False, 0)
        return out.view(np.int32)


def _compact(a, b):
    """``(a, b, repeated)``: the operands of a matmul with their broadcast (stride-0)
    dimensions read once: batch dimensions of size 1 (batch_index broadcasts them), one
    row of A or one column of B where all are one, and one k where both are constant
    along k (``repeated``)."""
    def batches(x):
        one = broadcast_base(x.shape[:-2], x.strides[:-2])
        return x if one is None else x[one]
    a, b = batches(a), batches(b)
    if a.strides[-2] == 0:
        a = a[..., :1, :]
    if b.strides[-1] == 0:
        b = b[..., :1]
    repeated = a.shape[-1] > 1 and a.strides[-1] == 0 and b.strides[-2] == 0
    if repeated:
        a, b = a[..., :1], b[..., :1, :]
    return a, b, repeated


def host_fold(x: np.ndarray, plan) -> np.ndarray:
    """emu.fold_sum of the float32 array ``x`` by its plan (emu/reduce.py): a float32
    array of shape ``plan.out``; serial kernels below sizes.SERIAL elements and where the
    threads would have one block of results to split (they split ``outer``)."""
    if plan.perm is not None:
        x = np.transpose(x, plan.perm)
    x3 = np.ascontiguousarray(x).reshape(plan.outer, plan.n, plan.inner)
    par = x3.size >= sizes.SERIAL
    if plan.inner == 1:
        out = np.empty(plan.outer, np.float32)
        KR.FOLD_ROWS[par and plan.outer > KR.RB](x3.reshape(plan.outer, plan.n), out)
    else:
        out = np.empty((plan.outer, plan.inner), np.float32)
        KR.FOLD_SUM[par and plan.outer > 1](x3, out)
    return out.reshape(plan.out)


#: the one CPU backend (it has no state)
HOST = HostBackend()

"""The CUDA backend: emu's operations on CUDA operands, run by the kernels of
emu/_cuda.py on the caller's stream, with the plans the front ends make
(emu/shapes.py) and the CPU backend's interface (emu/host.py); emu/device.py adapts
the operands (docs/gpu.md)."""
from __future__ import annotations

import math

import numpy as np

from . import _scalar_mul as SM
from .device import (DeviceCall, c_contiguous, flat_view, is_device_array, is_scalar, ravel,
                     swap)
from .formats import float32
from .shapes import batch_index, contract_layout, matmul_grad_shapes, matmul_shapes

__all__ = ["prepare", "CudaBackend"]


def prepare(stream=None, **operands):
    """The CUDA backend for a call, or None when every operand is on the host (the CPU
    backend's).

    Raises ValueError for host arrays mixed with CUDA operands, operands on two
    GPUs, or a ``stream`` given for host operands.
    """
    on_device = [n for n, v in operands.items()
                 if type(v) is not np.ndarray and is_device_array(v)]
    if not on_device:
        if stream is not None:
            raise ValueError("stream is only used with CUDA operands; every operand of "
                             "this call is in host memory")
        return None
    on_host = [n for n, v in operands.items()
               if n not in on_device and not is_scalar(v)]
    if on_host:
        raise ValueError(
            f"mixed devices: {', '.join(on_device)} on a CUDA device but "
            f"{', '.join(on_host)} in host memory; move every operand to the same device "
            "(torch: .cuda()/.cpu(), Numba: cuda.to_device()/.copy_to_host()); Python "
            "and NumPy scalars may be combined with CUDA operands")
    return CudaBackend({n: operands[n] for n in on_device}, stream)


class CudaBackend(DeviceCall):
    """emu's operations on the CUDA operands of one call: each method takes the front
    end's plan (emu/shapes.py) and operands made by :meth:`operand`."""

    def operand(self, x, name, bits=False):
        with self.device():
            return super().operand(x, name, bits)

    def quantize(self, plan, x, mode, subnormals, saturate, key):
        with self.device():
            res, out = self.empty(plan.shape, np.float32)
            n = math.prod(plan.shape)
            self.launch(self.K.quantize, n, self.flat(x, plan.shape), flat_view(out, n),
                        plan.fc, mode, subnormals, saturate, key)
            return res

    def to_bits(self, plan, x):
        with self.device():
            res, out = self.empty(plan.shape, np.uint32)
            n = math.prod(plan.shape)
            self.launch(self.K.to_bits, n, self.flat(x, plan.shape), flat_view(out, n), plan.fc)
            return res

    def from_bits(self, plan, bits, fmt):
        with self.device():
            res, out = self.empty(plan.shape, np.float32)
            n = math.prod(plan.shape)
            if n:
                flag = self.upload(np.zeros(1, np.int32))
                if not fmt.signed:              # the E8M0 scale type (emu/mx.py)
                    self.launch(self.K.e8m0_from_bits, n, self.flat(bits, plan.shape, np.int64),
                                flat_view(out, n), flag)
                else:
                    src = bits if c_contiguous(bits) else self.flat(bits, plan.shape, np.int64)
                    self.launch(self.K.from_bits, n, ravel(self.K.SIM, src), flat_view(out, n),
                                plan.fc, flag)
                bad = flag.copy_to_host(stream=self.stream)     # asynchronous on a stream
                if hasattr(self.stream, "synchronize"):
                    self.stream.synchronize()
                if bad[0]:
                    raise ValueError(f"bits must lie in [0, 2**{fmt.width}) for {fmt.name}; "
                                     "got values outside that range")
            return res

    def _elementwise(self, kernel, plan, operands, outputs=1, extra=()):
        """Launch an elementwise ``kernel(*operands, *outputs, fc, *extra)`` over the
        plan's shape: ``outputs`` float32 results (a tuple if more than one)."""
        with self.device():
            made = [self.empty(plan.shape, np.float32) for _ in range(outputs)]
            n = math.prod(plan.shape)
            self.launch(kernel, n, *(self.flat(v, plan.shape) for v in operands),
                        *(flat_view(out, n) for _, out in made), plan.fc,
                        *(e() if callable(e) else e for e in extra))
            return made[0][0] if outputs == 1 else tuple(res for res, _ in made)

    def unary(self, plan, x):
        return self._elementwise(self.K.UNARY[plan.op], plan, (x,))

    def binary(self, plan, a, b):
        return self._elementwise(self.K.BINARY[plan.op], plan, (a, b))

    def _mul_fields(self, mp):
        kind, c32, table, k = mp
        # the table is uploaded inside the device context, on the call's stream
        return (int(kind), int(c32), lambda: self.upload(np.ascontiguousarray(table, np.int64)),
                int(k))

    def mul(self, plan, a, b, mp):
        """emu.mul on the device: any multiplier (MulParams ``mp``)."""
        return self._elementwise(self.K.mul, plan, (a, b), extra=self._mul_fields(mp))

    def mul_grad(self, plan, a, b, dy, mp):
        """emu.grad.mul on the device: its exact (δA, δB)."""
        return self._elementwise(self.K.mul_grad, plan, (a, b, dy), outputs=2,
                                 extra=self._mul_fields(mp))

    def fold_sum(self, plan, x):
        """emu.fold_sum on the device (emu/reduce.py has the definition and the plan)."""
        with self.device():
            shape = tuple(x.shape)
            if math.prod(shape) == 0:      # nothing to read (n = 0 writes zeros): one type
                src = self.upload(np.zeros(1, np.uint32))
            elif plan.perm is None:
                src = self.flat(x, shape)
            else:
                src = flat_view(self.permuted(x, shape, plan.perm), math.prod(shape))
            res, out = self.empty(plan.out, np.float32)
            m = plan.outer * plan.inner
            self.launch(self.K.fold_sum, m, src, flat_view(out, m), plan.outer, plan.n,
                        plan.inner)
            return res

    def matmul(self, plan, a, b, fmt, acc, mp=None):
        """emu.matmul on the device (emu/matmul.py has the definition)."""
        K_ = self.K
        with self.device():
            if a.dtype != np.float32:
                a = self.contiguous_f32(a)
            if b.dtype != np.float32:
                b = self.contiguous_f32(b)
            ash, ast = list(a.shape), [s // 4 for s in a.strides]
            bsh, bst = list(b.shape), [s // 4 for s in b.strides]
            if plan.squeeze_a:
                ash, ast = [1] + ash, [0] + ast
            if plan.squeeze_b:
                bsh, bst = bsh + [1], bst + [0]
            batch, (m, k, n) = plan.batch, plan.mkn
            nout = math.prod(batch)
            res, out = self.empty(plan.out, np.float32)
            if nout == 0 or m == 0 or n == 0:
                return res
            at = _batch_terms(ash[:-2], ast[:-2], batch, K_.NT)
            bt = _batch_terms(bsh[:-2], bst[:-2], batch, K_.NT)
            aspan = self.span(a)
            bspan = self.span(b)
            fc = fmt.consts
            nkt = -(-k // K_.TK)
            nbi = -(-m // K_.TM)
            nbj = -(-n // K_.TN)
            # (at least one row: with K = 0 they are not read, but keep one array type)
            _, astat = self.empty((max(1, nout * nbi * nkt), 3), np.int32)
            _, bstat = self.empty((max(1, nout * nbj * nkt), 3), np.int32)
            self.launch(K_.operand_stats, nout * nbi * nkt, aspan, at, ast[-2], ast[-1], m, k,
                        nout, astat, fc)
            self.launch(K_.operand_stats, nout * nbj * nkt, bspan, bt, bst[-1], bst[-2], n, k,
                        nout, bstat, fc)
            mkind, c32, table, mk = (SM.SUM, 0, _NO_TABLE, 0) if mp is None else mp
            # a multiplier that is not one constant: the integer kernel, float32 being a
            # format like another
            kernel = K_.matmul_f32acc if acc == float32 and mkind == SM.SUM and mk == 0 \
                else K_.matmul_fmtacc
            self.launch(kernel, nout * nbi * nbj, aspan, at, ast[-2], ast[-1], bspan, bt,
                        bst[-2], bst[-1], flat_view(out, nout * m * n), m, n, k, nout, astat,
                        bstat, fc, acc.consts, int(mkind), int(c32),
                        self.upload(np.ascontiguousarray(table, np.int64)), int(mk),
                        block=(K_.TN // K_.R, K_.TM // K_.R))
            return res

    # -- the E8M0 scale type and MX blocks (emu/mx.py) ------------------------------------
    def e8m0(self, plan, x, to_bits):
        """quantize (values) or to_bits (codes) into float8_e8m0fnu."""
        with self.device():
            res, out = self.empty(plan.shape, np.uint32 if to_bits else np.float32)
            n = math.prod(plan.shape)
            self.launch(self.K.e8m0, n, self.flat(x, plan.shape), flat_view(out, n), to_bits)
            return res

    def mx_quantize(self, plan, x, values):
        """emu.mx_quantize (``values``: MXFormat.round) on the plan of emu/mx.py: one
        thread per block."""
        with self.device():
            res, out = self.empty(plan.shape, np.float32)
            sres, scales = self.empty(plan.scales if not values else (1,), np.uint8)
            n = math.prod(plan.shape)
            self.launch(self.K.mx_quantize, plan.ntask, self.flat(x, plan.shape),
                        flat_view(out, n), ravel(self.K.SIM, scales), plan.ntask, plan.nb, plan.n,
                        plan.inner, plan.block, plan.efc, plan.emax, plan.int8, values,
                        float32.consts)
            return res if values else (res, sres)

    def mx_dequantize(self, plan, p, scales):
        with self.device():
            res, out = self.empty(plan.shape, np.float32)
            n = math.prod(plan.shape)
            if n:
                self.launch(self.K.mx_dequantize, n, self.flat(p, plan.shape),
                            self.flat(scales, plan.scales, np.int64), flat_view(out, n),
                            plan.nb, plan.n, plan.inner, plan.block, float32.consts)
            return res

    # -- exact derivatives and PAM-matmul gradients (emu/grad.py) -----------------------
    def grad_unary(self, plan, x, dy):
        return self._elementwise(self.K.GRAD_UNARY[plan.op], plan, (x, dy))

    def grad_binary(self, plan, a, b, dy):
        return self._elementwise(self.K.GRAD_BINARY[plan.op], plan, (a, b, dy), outputs=2)

    def matmul_grad(self, A, B, dY, fmt, acc, kind, need, mp=None):
        """emu.grad.pam_matmul on the device: the same folds as the CPU path, with the
        same shape rules and contraction layout (emu/shapes.py)."""
        with self.device():
            a = self.operand(A, "A")
            b = self.operand(B, "B")
            g = self.operand(dY, "dY")
            a2s, b2s, batch, full = matmul_grad_shapes(a.shape, b.shape, g.shape)
            a2 = self.permuted(a, a2s)
            b2 = self.permuted(b, b2s)
            gf = self.permuted(g, full)
            da = db = None
            if need[0]:
                out = self._contract(gf, a2, swap(self.K.SIM, b2), kind, fmt, acc, mp)
                da = self.result(out, tuple(a.shape))
            if need[1]:
                out = self._contract(swap(self.K.SIM, gf), swap(self.K.SIM, b2), a2, kind,
                                     fmt, acc, mp, own_first=False)
                db = self.result(swap(self.K.SIM, out), tuple(b.shape))
            return da, db

    def _contract(self, g, x, w, kind, fmt, acc, mp=None, own_first=True):
        """emu/grad.py's _contract on contiguous/strided float32 Numba arrays; returns a
        contiguous Numba array shaped like x."""
        gperm, gshape, wperm, wshape, xshape = contract_layout(tuple(g.shape), tuple(x.shape))
        x = self.contiguous_f32(x)
        xs = tuple(x.shape)
        if gperm is not None:
            batch = tuple(g.shape)[:-2]
            g = self.permuted(g, tuple(g.shape), gperm).reshape(gshape)
            w = self.permuted(w, batch + tuple(w.shape)[-2:], wperm).reshape(wshape)
            x = x.reshape(xshape)
        if kind == "approx":
            out = self.operand(self.matmul(matmul_shapes(g.shape, w.shape), g, w, fmt, acc,
                                           mp), "out")
            return out.reshape(xs)
        batch = tuple(g.shape)[:-2]
        P, R = tuple(g.shape)[-2:]
        C = tuple(x.shape)[-1]
        n = math.prod(batch) * P * C
        if n == 0 or R == 0:
            return self.upload(np.zeros(xs, np.float32))
        fc = fmt.consts
        ix = self.upload(batch_index(tuple(x.shape)[:-2], batch))
        iw = self.upload(batch_index(tuple(w.shape)[:-2], batch))
        _, out = self.empty((n,), np.float32)
        kernel = self.K.matmul_grad_f32acc if acc == float32 else self.K.matmul_grad_fmtacc
        # PAM (mp None): Table 1's slope; another multiplier: its exact derivative
        kind_, c32, table, k = (SM.SUM, 0, _NO_TABLE, 0) if mp is None else mp
        self.launch(kernel, n, self._rounded(g, fc), self._rounded(x, fc),
                    self._rounded(w, fc), ix, iw, out.view(np.uint32), P, R, C, fc, acc.consts,
                    int(kind_), int(c32), self.upload(np.ascontiguousarray(table, np.int64)),
                    int(k), mp is not None, own_first)
        return out.reshape(xs)

    def _rounded(self, x, fc):
        """Flat uint32 patterns of a float32 array (any strides) rounded to fmt (RNE)."""
        n = math.prod(x.shape)
        _, out = self.empty((max(n, 1),), np.uint32)
        # x may be a transposed view: flat() gathers it (a reshape would misread it)
        self.launch(self.K.quantize, n, self.flat(x, tuple(x.shape)), out, fc, self.K.S.RNE,
                    True, False, 0)
        return out


_NO_TABLE = np.zeros(1, np.int64)




def _batch_terms(own_shape, own_strides, batch, nterms):
    """Terms (div, mod, stride) with offset(bo) = sum ((bo // div) % mod) * stride: the
    element offset of output batch ``bo`` (C order over ``batch``) in an operand."""
    nd = len(batch)
    own_shape = [1] * (nd - len(own_shape)) + list(own_shape)
    own_strides = [0] * (nd - len(own_strides)) + list(own_strides)
    terms = []          # innermost first
    div = 1
    for d in range(nd - 1, -1, -1):
        n = batch[d]
        s = own_strides[d] if own_shape[d] != 1 else 0
        if n != 1 and s != 0:
            if terms and terms[-1][0] * terms[-1][1] == div and terms[-1][2] * terms[-1][1] == s:
                pdiv, pmod, ps = terms[-1]
                terms[-1] = (pdiv, pmod * n, ps)
            else:
                terms.append((div, n, s))
        div *= n
    if len(terms) > nterms:
        raise ValueError(f"batch dimensions {tuple(own_shape)} broadcast against "
                         f"{tuple(batch)} need {len(terms)} index terms; CUDA pam_matmul "
                         f"supports {nterms}: reshape or make the operand contiguous")
    terms += [(1, 1, 0)] * (nterms - len(terms))
    return tuple(v for t in terms for v in t)

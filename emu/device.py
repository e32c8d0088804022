"""CUDA dispatch for emu's public functions (docs/gpu.md).

Every public function of emu (quantize, to_bits, from_bits, the PA operations,
fp_add, fp_mul, pam_matmul) takes CUDA operands — any object exposing
``__cuda_array_interface__``: torch CUDA tensors, CuPy arrays, Numba device arrays —
without copying them, runs the kernels of emu/_cuda.py on them and returns a device
array of the same kind (torch in -> torch out, CuPy in -> CuPy out, otherwise a
Numba device array).  Host operands keep the CPU kernels.

* **Mixed devices.** A host array (NumPy, list, CPU tensor) next to a CUDA operand
  is a ValueError; Python and NumPy *scalars* are allowed and broadcast (they are
  uploaded: one small host-to-device copy).  Operands on two different GPUs are a
  ValueError.
* **Streams.** ``stream=None`` runs on the caller's stream: torch's
  ``torch.cuda.current_stream()`` when a torch tensor is involved, else the stream
  named in the ``__cuda_array_interface__`` (CuPy's current stream), else the stream
  a Numba array is bound to, else Numba's default stream.  An explicit ``stream``
  may be a Numba stream, a ``torch.cuda.Stream``, a CuPy stream or a raw
  ``cudaStream_t`` handle (int).  Nothing synchronises the host, except
  ``from_bits``, which reads back one flag to reject out-of-range encodings.
* **Layouts and dtypes.** Contiguous float32 operands are used in place; strided,
  broadcast or other-dtype operands (float16, float64, integers; torch bfloat16 and
  float8 through torch's exact ``.float()``) are first gathered into a contiguous
  float32 buffer on the device, converting exactly as the CPU path's ``astype``.
  ``pam_matmul`` reads strided operands in place (a transposed view costs nothing).
  Negative strides are rejected.
"""
from __future__ import annotations

import contextlib
import math
import sys

import numpy as np

from .formats import float32

__all__ = ["is_device_array"]


def is_device_array(x) -> bool:
    """True for CUDA arrays: torch CUDA tensors, Numba device arrays (also the
    simulator's), and any object exposing ``__cuda_array_interface__``."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.is_cuda
    if getattr(x, "__cuda_ndarray__", False):
        return True
    try:
        return hasattr(x, "__cuda_array_interface__")
    except Exception:           # a property that raises something else is no interface
        return False


def _is_scalar(x) -> bool:
    return isinstance(x, (bool, int, float, np.generic))


def prepare(stream=None, **operands):
    """The device context for a call, or None when every operand is on the host.

    Raises ValueError for host arrays mixed with CUDA operands, operands on two
    GPUs, or a ``stream`` given for host operands.
    """
    on_device = [n for n, v in operands.items() if is_device_array(v)]
    if not on_device:
        if stream is not None:
            raise ValueError("stream is only used with CUDA operands; every operand of "
                             "this call is in host memory")
        return None
    on_host = [n for n, v in operands.items()
               if n not in on_device and not _is_scalar(v)]
    if on_host:
        raise ValueError(
            f"mixed devices: {', '.join(on_device)} on a CUDA device but "
            f"{', '.join(on_host)} in host memory; move every operand to the same device "
            "(torch: .cuda()/.cpu(), Numba: cuda.to_device()/.copy_to_host()); Python "
            "and NumPy scalars may be combined with CUDA operands")
    return _Call({n: operands[n] for n in on_device}, stream)


class _Call:
    """One emu call on CUDA operands: array family, device, stream, allocation."""

    def __init__(self, device_operands: dict, stream):
        from numba import cuda

        from . import _cuda
        self.cuda = cuda
        self.K = _cuda
        values = list(device_operands.values())
        torch = sys.modules.get("torch")
        if torch is not None and any(isinstance(v, torch.Tensor) for v in values):
            self.family = "torch"
        elif any(type(v).__module__.split(".")[0] == "cupy" for v in values):
            self.family = "cupy"
        else:
            self.family = "numba"
        devices = {n: _device_index(v) for n, v in device_operands.items()}
        known = {d for d in devices.values() if d is not None}
        if len(known) > 1:
            raise ValueError("operands are on different CUDA devices: " + ", ".join(
                f"{n} on cuda:{d}" for n, d in devices.items() if d is not None))
        self.index = known.pop() if known else None
        self.torch_stream = None
        with self.device():
            self.stream = self._resolve_stream(stream, values)

    # -- device, stream, allocation ------------------------------------------------
    def device(self):
        """Make the operands' GPU current (a no-op when it is unknown: the current one)."""
        if self.index is None or self.K.SIM:
            return contextlib.nullcontext()
        return self.cuda.gpus[self.index]

    def _resolve_stream(self, stream, values):
        cuda = self.cuda
        torch = sys.modules.get("torch")
        if self.K.SIM:
            from numba.cuda.simulator.api import stream as Stream
        else:
            from numba.cuda.cudadrv.driver import Stream
        handle = None
        if stream is None or isinstance(stream, Stream):
            pass
        elif torch is not None and isinstance(stream, torch.cuda.Stream):
            handle = stream.cuda_stream
            self.torch_stream = stream
        elif hasattr(stream, "__cuda_stream__"):      # the CUDA stream protocol (CuPy)
            handle = int(stream.__cuda_stream__()[1])
        elif isinstance(getattr(stream, "ptr", None), int):      # older CuPy
            handle = stream.ptr
        elif isinstance(stream, int) and not isinstance(stream, bool):
            handle = stream
        else:
            raise TypeError(f"stream must be None, a Numba stream, a torch.cuda.Stream, a "
                            f"CuPy stream or an int cudaStream_t handle, got {stream!r}")
        if self.K.SIM:                  # the simulator runs everything synchronously
            return stream if isinstance(stream, Stream) else 0
        if handle is not None:
            if self.family == "torch" and self.torch_stream is None:
                # torch's caching allocator must know where its buffers are used
                self.torch_stream = torch.cuda.ExternalStream(handle)
            return self._from_handle(handle)
        if stream is not None:          # a Numba stream
            if self.family == "torch":
                self.torch_stream = torch.cuda.ExternalStream(int(stream.handle))
            return stream
        if self.family == "torch":
            self.torch_stream = torch.cuda.current_stream(self.index)
            return self._from_handle(self.torch_stream.cuda_stream)
        for v in values:
            cai_stream = _cai(v).get("stream")
            if cai_stream is not None:
                return self._from_handle(cai_stream)
        for v in values:
            if isinstance(getattr(v, "stream", None), Stream):
                return v.stream
        return cuda.default_stream()

    def _from_handle(self, handle: int):
        cuda = self.cuda
        if handle in (0, 1):        # 0: cudaStreamLegacy by value; 1: the CAI's "legacy"
            return cuda.legacy_default_stream()
        if handle == 2:             # the CAI's "per-thread default stream"
            return cuda.per_thread_default_stream()
        return cuda.external_stream(handle)

    def empty(self, shape, dtype):
        """(result object of the caller's array family, Numba view of it)."""
        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        if self.family == "torch":
            torch = sys.modules["torch"]
            tdtype = getattr(torch, dtype.name)
            res = torch.empty(shape, dtype=tdtype, device=f"cuda:{self.index}")
            if self.torch_stream is not None and \
                    self.torch_stream != torch.cuda.current_stream(self.index):
                res.record_stream(self.torch_stream)
            return res, self.cuda.as_cuda_array(res, sync=False)
        if self.family == "cupy":
            import cupy
            with cupy.cuda.Device(self.index):
                res = cupy.empty(shape, dtype)
            return res, self.cuda.as_cuda_array(res, sync=False)
        res = self.cuda.device_array(shape, dtype, stream=self.stream)
        return res, res

    def upload(self, host: np.ndarray):
        """A device copy of a small host array (scalars, nothing large)."""
        _, view = self.empty(host.shape, host.dtype)
        view.copy_to_device(np.ascontiguousarray(host), stream=self.stream)
        return view

    def launch(self, kernel, nthreads, *args, block=None):
        if nthreads <= 0:
            return
        if block is None:
            block = self.K.THREADS
            grid = self.K.blocks_for(nthreads)
        else:
            grid = max(1, min(self.K.MAX_BLOCKS, nthreads))
        _launch(kernel, grid, block, self.stream, *args)

    # -- operands ----------------------------------------------------------------------
    def operand(self, x, name, bits=False):
        """A Numba view of operand ``x`` (no copy), dtype checked like the CPU path."""
        if _is_scalar(x):
            if bits:
                host = np.asarray(x)
                if host.dtype.kind not in "iu":
                    raise TypeError(f"{name} must have an integer dtype, got {host.dtype}")
                return self.upload(host.astype(np.int64))
            from .ops import as_float32
            return self.upload(as_float32(x, name))
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            x = _torch_cai_ready(torch, x, name, bits)
        if not getattr(x, "__cuda_ndarray__", False):
            x = self.cuda.as_cuda_array(x, sync=False)
        kind = x.dtype.kind
        if bits and kind not in "iu":
            raise TypeError(f"{name} must have an integer dtype, got {x.dtype}")
        if not bits and (kind not in "fiu" or (kind == "f" and x.dtype.itemsize > 8)):
            raise TypeError(f"{name} must have a real floating dtype (float16, bfloat16, "
                            f"float32, float64, float8) or an integer dtype, got dtype "
                            f"{x.dtype}")
        if any(s < 0 for s in x.strides):
            raise ValueError(f"{name} has negative strides {tuple(x.strides)}; pass a "
                             "copy with non-negative strides")
        return x

    def span(self, x, dtype=np.uint32):
        """A flat 1-D view of x's storage from element 0 (to index with strides)."""
        # (an empty x gets a 1-element span that no kernel reads: one argument type)
        n = 1 + sum(max(d - 1, 0) * (s // x.dtype.itemsize) for d, s in zip(x.shape, x.strides))
        return _restride(self.K.SIM, x, (n,), (x.dtype.itemsize,)).view(dtype)

    def flat(self, x, shape, dtype=np.float32):
        """Contiguous 1-D view of ``x`` broadcast to ``shape`` as ``dtype`` (uint32
        patterns for float32): in place when possible, else gathered on the device."""
        n = math.prod(shape)
        if x.dtype == dtype and tuple(x.shape) == tuple(shape) and _c_contiguous(x):
            v = x.reshape(n) if x.ndim != 1 else x
            return v.view(np.uint32) if dtype == np.float32 else v
        _, out = self.empty((n,), dtype)
        if n:
            dims, strides = _gather_layout(x, shape, self.K.MAXDIM)
            self.launch(self.K.gather, n, self.span(x, x.dtype), out, dims, strides)
        return out.view(np.uint32) if dtype == np.float32 else out

    # -- operations ----------------------------------------------------------------
    def quantize(self, x, fc, mode, subnormals, saturate, key):
        with self.device():
            xv = self.operand(x, "x")
            res, out = self.empty(xv.shape, np.float32)
            n = math.prod(xv.shape)
            self.launch(self.K.quantize, n, self.flat(xv, xv.shape), _flat_view(out, n),
                        fc, mode, subnormals, saturate, key)
            return res

    def to_bits(self, x, fc):
        with self.device():
            xv = self.operand(x, "x")
            res, out = self.empty(xv.shape, np.uint32)
            n = math.prod(xv.shape)
            self.launch(self.K.to_bits, n, self.flat(xv, xv.shape), _flat_view(out, n), fc)
            return res

    def from_bits(self, bits, fmt):
        with self.device():
            bv = self.operand(bits, "bits", bits=True)
            res, out = self.empty(bv.shape, np.float32)
            n = math.prod(bv.shape)
            if n:
                src = bv if _c_contiguous(bv) else self.flat(bv, bv.shape, np.int64)
                flag = self.upload(np.zeros(1, np.int32))
                self.launch(self.K.from_bits, n, src.reshape(n), _flat_view(out, n),
                            fmt.consts, flag)
                bad = flag.copy_to_host(stream=self.stream)     # asynchronous on a stream
                if hasattr(self.stream, "synchronize"):
                    self.stream.synchronize()
                if bad[0]:
                    raise ValueError(f"bits must lie in [0, 2**{fmt.width}) for {fmt.name}; "
                                     "got values outside that range")
            return res

    def unary(self, name, x, fc):
        with self.device():
            xv = self.operand(x, "x")
            res, out = self.empty(xv.shape, np.float32)
            n = math.prod(xv.shape)
            self.launch(self.K.UNARY[name], n, self.flat(xv, xv.shape), _flat_view(out, n),
                        fc)
            return res

    def binary(self, name, a, b, fc):
        with self.device():
            av = self.operand(a, "a")
            bv = self.operand(b, "b")
            shape = _broadcast(("a", av), ("b", bv))
            res, out = self.empty(shape, np.float32)
            n = math.prod(shape)
            self.launch(self.K.BINARY[name], n, self.flat(av, shape), self.flat(bv, shape),
                        _flat_view(out, n), fc)
            return res

    def matmul(self, A, B, fmt, acc):
        """emu.pam_matmul on the device; shapes and messages as the CPU path."""
        K_ = self.K
        with self.device():
            a = self.operand(A, "A")
            b = self.operand(B, "B")
            if a.ndim == 0 or b.ndim == 0:
                raise ValueError(f"pam_matmul operands must have at least one dimension, "
                                 f"got A.shape={tuple(a.shape)}, B.shape={tuple(b.shape)}")
            if a.dtype != np.float32:
                a = self._contiguous_f32(a)
            if b.dtype != np.float32:
                b = self._contiguous_f32(b)
            ash, ast = list(a.shape), [s // 4 for s in a.strides]
            bsh, bst = list(b.shape), [s // 4 for s in b.strides]
            squeeze_a = len(ash) == 1
            squeeze_b = len(bsh) == 1
            if squeeze_a:
                ash, ast = [1] + ash, [0] + ast
            if squeeze_b:
                bsh, bst = bsh + [1], bst + [0]
            m, k = ash[-2:]
            k2, n = bsh[-2:]
            if k != k2:
                raise ValueError(f"pam_matmul: contracted dimensions differ: A.shape="
                                 f"{tuple(a.shape)} has K={k}, B.shape={tuple(b.shape)} "
                                 f"has K={k2}")
            try:
                batch = np.broadcast_shapes(tuple(ash[:-2]), tuple(bsh[:-2]))
            except ValueError:
                raise ValueError(f"pam_matmul: batch dimensions do not broadcast: A.shape="
                                 f"{tuple(a.shape)}, B.shape={tuple(b.shape)}") from None
            nout = math.prod(batch)
            shape = batch + ((m,) if not squeeze_a else ()) + ((n,) if not squeeze_b else ())
            res, out = self.empty(shape, np.float32)
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
            kernel = K_.matmul_f32acc if acc == float32 else K_.matmul_fmtacc
            self.launch(kernel, nout * nbi * nbj, aspan, at, ast[-2], ast[-1], bspan, bt,
                        bst[-2], bst[-1], _flat_view(out, nout * m * n), m, n, k, nout, astat,
                        bstat, fc, acc.consts, block=(K_.TN // K_.R, K_.TM // K_.R))
            return res

    # -- exact derivatives and PAM-matmul gradients (emu/grad.py) -----------------------
    def grad_unary(self, name, x, dy, fc):
        with self.device():
            xv = self.operand(x, "x")
            dv = self.operand(dy, "dy")
            shape = _broadcast(("x", xv), ("dy", dv))
            res, out = self.empty(shape, np.float32)
            n = math.prod(shape)
            self.launch(self.K.GRAD_UNARY[name], n, self.flat(xv, shape), self.flat(dv, shape),
                        _flat_view(out, n), fc)
            return res

    def grad_binary(self, name, a, b, dy, fc):
        with self.device():
            av = self.operand(a, "a")
            bv = self.operand(b, "b")
            dv = self.operand(dy, "dy")
            shape = _broadcast(("a", av), ("b", bv), ("dy", dv))
            res_a, out_a = self.empty(shape, np.float32)
            res_b, out_b = self.empty(shape, np.float32)
            n = math.prod(shape)
            self.launch(self.K.GRAD_BINARY[name], n, self.flat(av, shape), self.flat(bv, shape),
                        self.flat(dv, shape), _flat_view(out_a, n), _flat_view(out_b, n), fc)
            return res_a, res_b

    def matmul_grad(self, A, B, dY, fmt, acc, kind, need, shapes, layout, batch_index):
        """emu.grad.pam_matmul on the device: the same folds as the CPU path, with its
        shape rules (``shapes``), contraction layout (``layout``) and batch indexing
        (``batch_index``) passed in from emu/grad.py so they have one definition."""
        with self.device():
            a = self.operand(A, "A")
            b = self.operand(B, "B")
            g = self.operand(dY, "dY")
            a2s, b2s, batch, full = shapes(tuple(a.shape), tuple(b.shape), tuple(g.shape))
            a2 = self._permuted(a, a2s)
            b2 = self._permuted(b, b2s)
            gf = self._permuted(g, full)
            da = db = None
            if need[0]:
                out = self._contract(gf, a2, _swap(self.K.SIM, b2), kind, fmt, acc, layout,
                                     batch_index)
                da = self._result(out, tuple(a.shape))
            if need[1]:
                out = self._contract(_swap(self.K.SIM, gf), _swap(self.K.SIM, b2), a2, kind,
                                     fmt, acc, layout, batch_index)
                db = self._result(_swap(self.K.SIM, out), tuple(b.shape))
            return da, db

    def _permuted(self, x, shape, perm=None):
        """x broadcast to ``shape`` (leading dimensions) or reshaped to it (same size),
        then permuted by ``perm``: a contiguous float32 Numba array."""
        nd = len(shape)
        if x.dtype != np.float32:
            x = self._contiguous_f32(x)
        if tuple(x.shape) != tuple(shape) and math.prod(x.shape) == math.prod(shape):
            x = self._contiguous_f32(x).reshape(shape)      # e.g. a 1-D operand as 2-D
        xs = (1,) * (nd - x.ndim) + tuple(x.shape)
        st = (0,) * (nd - x.ndim) + tuple(x.strides)
        st = tuple(0 if d == 1 else s for d, s in zip(xs, st))
        perm = tuple(range(nd)) if perm is None else perm
        view = _restride(self.K.SIM, x, tuple(shape[p] for p in perm),
                         tuple(st[p] for p in perm))
        return self._contiguous_f32(view)

    def _contract(self, g, x, w, kind, fmt, acc, layout, batch_index):
        """emu/grad.py's _contract on contiguous/strided float32 Numba arrays; returns a
        contiguous Numba array shaped like x."""
        gperm, gshape, wperm, wshape, xshape = layout(tuple(g.shape), tuple(x.shape))
        x = self._contiguous_f32(x)
        xs = tuple(x.shape)
        if gperm is not None:
            batch = tuple(g.shape)[:-2]
            g = self._permuted(g, tuple(g.shape), gperm).reshape(gshape)
            w = self._permuted(w, batch + tuple(w.shape)[-2:], wperm).reshape(wshape)
            x = x.reshape(xshape)
        if kind == "approx":
            out = self.operand(self.matmul(g, w, fmt, acc), "out")
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
        self.launch(kernel, n, self._rounded(g, fc), self._rounded(x, fc),
                    self._rounded(w, fc), ix, iw, out.view(np.uint32), P, R, C, fc, acc.consts)
        return out.reshape(xs)

    def _rounded(self, x, fc):
        """Flat uint32 patterns of a contiguous float32 array rounded to fmt (RNE)."""
        n = math.prod(x.shape)
        _, out = self.empty((max(n, 1),), np.uint32)
        self.launch(self.K.quantize, n, _flat_view(x, n), out, fc, self.K.S.RNE, True, False, 0)
        return out

    def _result(self, x, shape):
        """A result of the caller's array family with ``shape``: x (any strides, same
        size) gathered in C order."""
        res, out = self.empty(shape, np.float32)
        n = math.prod(shape)
        if n:
            dims, strides = _gather_layout(x, tuple(x.shape), self.K.MAXDIM)
            self.launch(self.K.gather, n, self.span(x, np.float32),
                        _flat_view(out, n).view(np.float32), dims, strides)
        return res

    def _contiguous_f32(self, x):
        """x converted to a contiguous float32 Numba array of the same shape."""
        shape = tuple(x.shape)
        flat = self.flat(x, shape).view(np.float32)
        return flat.reshape(shape) if len(shape) != 1 else flat


# --- helpers without state -------------------------------------------------------------

def _broadcast(*named):
    """Broadcast shape of (name, array) pairs; ValueError naming every shape."""
    try:
        return np.broadcast_shapes(*(tuple(v.shape) for _, v in named))
    except ValueError:
        shapes = ", ".join(f"{n}.shape={tuple(v.shape)}" for n, v in named)
        raise ValueError(f"operands could not be broadcast together: {shapes}") from None


def _swap(sim, x):
    """A view of x with its last two dimensions swapped."""
    shape, strides = list(x.shape), list(x.strides)
    shape[-2:], strides[-2:] = shape[-1:-3:-1], strides[-1:-3:-1]
    return _restride(sim, x, tuple(shape), tuple(strides))


def _launch(kernel, grid, block, stream, *args):
    """The one place kernels are launched (tests wrap it to record argument types)."""
    kernel[grid, block, stream](*args)


def _cai(x) -> dict:
    try:
        return x.__cuda_array_interface__
    except Exception:
        return {}


def _device_index(x):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.device.index
    dev = getattr(x, "device", None)
    if type(x).__module__.split(".")[0] == "cupy" and hasattr(dev, "id"):
        return dev.id
    return None


def _torch_cai_ready(torch, t, name, bits):
    """A torch CUDA tensor whose __cuda_array_interface__ Numba can read."""
    if t.requires_grad:
        raise TypeError(f"{name} is a CUDA tensor that requires grad; emu functions are not "
                        f"differentiable: pass {name}.detach() (torch_bridge provides "
                        "autograd)")
    if bits:
        return t
    if t.dtype in (torch.bool,) or t.is_complex():
        raise TypeError(f"{name} must have a real floating dtype (float16, bfloat16, "
                        f"float32, float64, float8) or an integer dtype, got dtype {t.dtype}")
    if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
        return t.to(torch.float32)     # bfloat16, float8: exact, on the current stream
    return t


def _c_contiguous(x) -> bool:
    expected = x.dtype.itemsize
    for d, s in zip(reversed(x.shape), reversed(x.strides)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def _flat_view(out, n):
    """A contiguous float32 (or uint32) output as flat uint32 patterns."""
    v = out.reshape(n) if out.ndim != 1 else out
    return v.view(np.uint32)


def _restride(sim, x, shape, strides):
    """A view of x's memory from element 0 with another shape and byte strides."""
    if sim:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray(np.lib.stride_tricks.as_strided(x._ary, shape, strides))
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    return DeviceNDArray(shape, strides, x.dtype, stream=x.stream, gpu_data=x.gpu_data)


def _gather_layout(x, shape, maxdim):
    """(dims, element strides) of x broadcast to ``shape``, merged and padded to maxdim."""
    nd = len(shape)
    xs = (1,) * (nd - x.ndim) + tuple(x.shape)
    st = (0,) * (nd - x.ndim) + tuple(s // x.dtype.itemsize for s in x.strides)
    dims = []
    for d, s, n in zip(xs, st, shape):
        s = 0 if d == 1 else s
        if n == 1:
            continue
        if dims and dims[-1][1] == s * n:          # merge with the dimension before
            dims[-1] = (dims[-1][0] * n, s)
        else:
            dims.append((n, s))
    if len(dims) > maxdim:
        raise ValueError(f"array of shape {tuple(x.shape)} and strides {tuple(x.strides)} "
                         f"broadcast to {tuple(shape)} needs {len(dims)} strided dimensions; "
                         f"CUDA inputs support {maxdim}: pass a contiguous array")
    dims = [(1, 0)] * (maxdim - len(dims)) + dims
    return tuple(d for d, _ in dims), tuple(s for _, s in dims)


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

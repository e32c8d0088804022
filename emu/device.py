"""CUDA operands for emu's CUDA backend (emu/cuda_backend.py, docs/gpu.md): arrays,
devices, streams and allocation.

Every public function of emu (quantize, to_bits, from_bits, the PA operations,
fp_add, fp_mul, pam_matmul, emu.grad) takes CUDA operands — any object exposing
``__cuda_array_interface__``: torch CUDA tensors, CuPy arrays, Numba device arrays —
without copying them, and returns a device array of the same kind (torch in -> torch
out, CuPy in -> CuPy out, otherwise a Numba device array).  This module adapts them:

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

from .host import as_float32

__all__ = ["is_device_array", "is_scalar", "DeviceCall", "c_contiguous", "flat_view",
           "restride", "gather_layout", "swap"]


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


def is_scalar(x) -> bool:
    return isinstance(x, (bool, int, float, np.generic))


class DeviceCall:
    """One emu call on CUDA operands: array family, device, stream, allocation, and
    the layouts of its operands."""

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
        if self.family == "torch":      # torch's current stream: GPU only (docs/gpu.md)
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
        if self.family == "torch":      # a torch CUDA result: GPU only (docs/gpu.md)
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
        if is_scalar(x):
            if bits:
                host = np.asarray(x)
                if host.dtype.kind not in "iu":
                    raise TypeError(f"{name} must have an integer dtype, got {host.dtype}")
                return self.upload(host.astype(np.int64))
            return self.upload(as_float32(x, name))
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):     # GPU only (docs/gpu.md)
            x = _torch_cai_ready(torch, x, name, bits)
        if not getattr(x, "__cuda_ndarray__", False):   # wrap it for Numba: GPU only
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
        return restride(self.K.SIM, x, (n,), (x.dtype.itemsize,)).view(dtype)

    def flat(self, x, shape, dtype=np.float32):
        """Contiguous 1-D view of ``x`` broadcast to ``shape`` as ``dtype`` (uint32
        patterns for float32): in place when possible, else gathered on the device."""
        n = math.prod(shape)
        if x.dtype == dtype and tuple(x.shape) == tuple(shape) and c_contiguous(x):
            v = ravel(self.K.SIM, x)
            return v.view(np.uint32) if dtype == np.float32 else v
        _, out = self.empty((n,), dtype)
        if n:
            dims, strides = gather_layout(x, shape, self.K.MAXDIM)
            self.launch(self.K.gather, n, self.span(x, x.dtype), out, dims, strides)
        return out.view(np.uint32) if dtype == np.float32 else out

    def permuted(self, x, shape, perm=None):
        """x broadcast to ``shape`` (leading dimensions) or reshaped to it (same size),
        then permuted by ``perm``: a contiguous float32 Numba array."""
        nd = len(shape)
        if x.dtype != np.float32:
            x = self.contiguous_f32(x)
        if tuple(x.shape) != tuple(shape) and math.prod(x.shape) == math.prod(shape):
            x = self.contiguous_f32(x).reshape(shape)      # e.g. a 1-D operand as 2-D
        xs = (1,) * (nd - x.ndim) + tuple(x.shape)
        st = (0,) * (nd - x.ndim) + tuple(x.strides)
        st = tuple(0 if d == 1 else s for d, s in zip(xs, st))
        perm = tuple(range(nd)) if perm is None else perm
        view = restride(self.K.SIM, x, tuple(shape[p] for p in perm),
                         tuple(st[p] for p in perm))
        return self.contiguous_f32(view)

    def result(self, x, shape):
        """A result of the caller's array family with ``shape``: x (any strides, same
        size) gathered in C order."""
        res, out = self.empty(shape, np.float32)
        n = math.prod(shape)
        if n:
            dims, strides = gather_layout(x, tuple(x.shape), self.K.MAXDIM)
            self.launch(self.K.gather, n, self.span(x, np.float32),
                        flat_view(out, n).view(np.float32), dims, strides)
        return res

    def contiguous_f32(self, x):
        """x converted to a contiguous float32 Numba array of the same shape."""
        shape = tuple(x.shape)
        flat = self.flat(x, shape).view(np.float32)
        return flat.reshape(shape) if len(shape) != 1 else flat


# --- helpers without state -------------------------------------------------------------

def swap(sim, x):
    """A view of x with its last two dimensions swapped."""
    shape, strides = list(x.shape), list(x.strides)
    shape[-2:], strides[-2:] = shape[-1:-3:-1], strides[-1:-3:-1]
    return restride(sim, x, tuple(shape), tuple(strides))


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


def c_contiguous(x) -> bool:
    expected = x.dtype.itemsize
    for d, s in zip(reversed(x.shape), reversed(x.strides)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


def flat_view(out, n):
    """A contiguous float32 (or uint32) output as flat uint32 patterns."""
    # NumPy's reshape (the simulator) copies a strided array; Numba's misreads or refuses it
    assert c_contiguous(out), f"flat_view of a strided array: {out.shape} {out.strides}"
    v = out.reshape(n) if out.ndim != 1 else out
    return v.view(np.uint32)


def ravel(sim, x):
    """A C-contiguous x as a 1-D view (not reshape: Numba's refuses the 0 strides that
    size-1 axes may have)."""
    return x if x.ndim == 1 else restride(sim, x, (math.prod(x.shape),), (x.dtype.itemsize,))


def restride(sim, x, shape, strides):
    """A view of x's memory from element 0 with another shape and byte strides."""
    if sim:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray(np.lib.stride_tricks.as_strided(x._ary, shape, strides))
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    return DeviceNDArray(shape, strides, x.dtype, stream=x.stream, gpu_data=x.gpu_data)


def gather_layout(x, shape, maxdim):
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

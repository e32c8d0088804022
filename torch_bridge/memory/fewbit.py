"""Few-bit backward activations (Few-Bit Backward, Sec. 3, Listing 1).

The forward pass returns the native activation, bit for bit, and saves only the
interval index of every input element — ``bits`` bits per element, bit-packed
(packing.py).  The backward pass multiplies the incoming gradient by the level of
that interval: grad_in = grad_out * q(x), q the optimal piecewise-constant
approximation of f' (solver.py, stored tables in tables.py).

Float32/float64 tensors take fused kernels (index + pack, unpack + scale): Numba's on
the CPU, their CUDA twins on CUDA tensors (_cuda.py, the same definitions); other
dtypes and devices a torch path with the same semantics: the index compares x
against float64 breakpoints, the product is ``grad * level`` in grad's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .._backend import on_cuda_backend
from .._tensors import same_device
from . import _kernels as K
from .activations import Activation, activation, grad_at_nans, nan_positions
from .packing import check_bits, packed_nbytes, pack_bits, unpack_bits
from .solver import StepTable, check_weight
from .tables import fewbit_table

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def check_input(x, name: str = "input") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must have dtype float32, float64, float16 or bfloat16, "
                        f"got {x.dtype}")
    return x


#: the dtypes of the fused kernels, as numpy dtypes
FUSED = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


def fused(t: torch.Tensor) -> bool:
    """Whether ``t`` takes the fused kernels: float32/float64 on the CPU (Numba) or on
    a CUDA backend (_cuda.py)."""
    return t.dtype in FUSED and (t.device.type == "cpu" or on_cuda_backend(t))


def scale_by_code(grad: torch.Tensor, packed: torch.Tensor, bits: int,
                  levels: torch.Tensor) -> torch.Tensor:
    """grad * levels[code] with the ``bits``-bit codes in ``packed`` (one rounding in
    grad's dtype): a fused kernel for float32/float64 tensors (CPU or CUDA), else torch."""
    same_device(grad=grad, packed=packed)
    levels = levels.to(device=grad.device, dtype=grad.dtype)
    if fused(grad):
        g = grad.contiguous()
        out = torch.empty_like(g)
        if on_cuda_backend(g):
            from . import _cuda as C
            C.launch(C.scale, C.groups(g.numel()), grad=g.view(-1), packed=packed, k=bits,
                     levels=levels, out=out.view(-1))
        else:
            K.level_scaler(levels.numpy(), bits)(g.view(-1).numpy(), packed.numpy(),
                                                 out.view(-1).numpy())
        return out
    idx = unpack_bits(packed, bits, grad.numel()).to(torch.int64)
    return grad * levels[idx].view(grad.shape)


@dataclass(frozen=True)
class _Quantizer:
    """A step table in the forms the kernels want."""
    act: Activation
    table: StepTable
    bp64: torch.Tensor          # breakpoints, float64, padded with +inf to 2**bits - 1
    levels: torch.Tensor        # float64 levels, padded (never indexed beyond the table)

    @classmethod
    def of(cls, act: Activation, bits: int, weight: str) -> "_Quantizer":
        t = fewbit_table(act, bits, weight)
        n = 1 << t.bits
        bp = torch.full((n - 1,), float("inf"), dtype=torch.float64)
        bp[:len(t.breakpoints)] = torch.tensor(t.breakpoints, dtype=torch.float64)
        lv = torch.zeros(n, dtype=torch.float64)
        lv[:len(t.values)] = torch.tensor(t.values, dtype=torch.float64)
        return cls(act, t, bp, lv)

    @property
    def bits(self) -> int:
        return self.table.bits

    def forward(self, x: torch.Tensor):
        """(the native activation, packed interval indices)."""
        return self.act.native(x), self.index_packed(x)

    def index_packed(self, x: torch.Tensor) -> torch.Tensor:
        if not fused(x):
            return pack_bits(self.index(x), self.bits)
        out = torch.empty(packed_nbytes(x.numel(), self.bits), dtype=torch.uint8,
                          device=x.device)
        xs = x.detach().contiguous().view(-1)
        bp = K.thresholds(self.bp64.numpy(), FUSED[x.dtype])
        if on_cuda_backend(xs):
            from . import _cuda as C
            C.launch(C.index_pack, C.groups(xs.numel()), x=xs,
                     bp=torch.from_numpy(bp).to(xs.device), k=self.bits, even=self.table.even,
                     out=out)
        else:
            K.index_packer(bp, self.bits, self.table.even)(xs.numpy(), out.numpy())
        return out

    def index(self, x: torch.Tensor) -> torch.Tensor:
        """Reference interval index (torch, any device): #{breakpoints < x}, NaN -> 0."""
        v = x.detach().reshape(-1).double()
        v = v.abs() if self.table.even else v
        idx = torch.searchsorted(self.bp64.to(v.device), v, side="left")
        return torch.where(torch.isnan(v), 0, idx)

    def scale(self, grad: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return scale_by_code(grad, packed, self.bits, self.levels)


class CodedBackward(torch.autograd.Function):
    """An activation whose backward keeps only a few-bit code per element (and the NaN
    positions): ``coder.forward(x)`` is (y, packed codes), ``coder.scale(grad, packed)``
    the input gradient and ``coder.act`` the activation (native gradient at NaNs).
    Few-bit derivatives (a _Quantizer) and PA activations (pa._Segments) share it."""

    @staticmethod
    def forward(ctx, x, coder):
        y, packed = coder.forward(x)
        ctx.save_for_backward(packed, *nan_positions(x))
        ctx.coder = coder
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        packed, *nans = ctx.saved_tensors
        return grad_at_nans(ctx.coder.act, grad, nans, ctx.coder.scale(grad, packed)), None


_QUANTIZERS: dict = {}


def _quantizer(act, bits, weight) -> _Quantizer:
    key = (act, check_bits(bits), check_weight(weight))
    if key not in _QUANTIZERS:
        _QUANTIZERS[key] = _Quantizer.of(*key)
    return _QUANTIZERS[key]


def fewbit(x: torch.Tensor, act="gelu", bits: int | None = 3, weight: str = "uniform",
           **params) -> torch.Tensor:
    """``act(x)`` whose backward uses the ``bits``-bit optimal step derivative.

    ``act``: an activation name (see ``ACTIVATIONS``) with ``params`` (e.g.
    ``negative_slope``, ``alpha``, ``beta``), or an Activation.  ``bits=None`` is the
    native activation.  ``weight``: the table's weight, "uniform" on [-10, 10] (the
    paper's Table 1) or "normal".  A NaN input gets native torch's gradient (NaN for
    the smooth activations).  Meta tensors (no values) take the native activation.
    """
    check_input(x)
    a = activation(act, **params)
    if bits is None:
        return a.native(x)
    q = _quantizer(a, bits, weight)
    if not (torch.is_grad_enabled() and x.requires_grad) or x.device.type == "meta":
        return a.native(x)
    return CodedBackward.apply(x, q)


class FewBitActivation(nn.Module):
    """nn.Module form of :func:`fewbit` (``bits=None``: the native activation)."""

    def __init__(self, act="gelu", bits: int | None = 3, weight: str = "uniform", **params):
        super().__init__()
        self.act = activation(act, **params)
        self.bits = None if bits is None else check_bits(bits)
        self.weight = check_weight(weight)
        if self.bits is not None:
            _quantizer(self.act, self.bits, self.weight)      # fail early, warm the cache

    def forward(self, x):
        return fewbit(x, self.act, self.bits, self.weight)

    def extra_repr(self) -> str:
        return f"{self.act.label}, bits={self.bits}, weight={self.weight!r}"


def _named(cls_name: str, act: str):
    """A FewBitActivation subclass fixed to one activation (parameters as keywords)."""
    def __init__(self, bits: int | None = 3, weight: str = "uniform", **params):
        FewBitActivation.__init__(self, act, bits, weight, **params)
    return type(cls_name, (FewBitActivation,), {
        "__init__": __init__, "__doc__": f"Few-bit backward {act}: FewBitActivation({act!r}, ...)."})


FewBitReLU = _named("FewBitReLU", "relu")
FewBitLeakyReLU = _named("FewBitLeakyReLU", "leaky_relu")
FewBitSiLU = _named("FewBitSiLU", "silu")
FewBitSigmoid = _named("FewBitSigmoid", "sigmoid")
FewBitTanh = _named("FewBitTanh", "tanh")
FewBitSELU = _named("FewBitSELU", "selu")
FewBitELU = _named("FewBitELU", "elu")
FewBitSoftplus = _named("FewBitSoftplus", "softplus")
FewBitMish = _named("FewBitMish", "mish")


def gelu_name(approximate: str) -> str:
    """The activation name of nn.GELU(approximate=...)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate={approximate!r}; expected 'none' or 'tanh'")
    return "gelu" if approximate == "none" else "gelu_tanh"


class FewBitGELU(FewBitActivation):
    """Few-bit backward GELU; ``approximate`` as in nn.GELU ('none' or 'tanh')."""

    def __init__(self, bits: int | None = 3, weight: str = "uniform", approximate: str = "none"):
        super().__init__(gelu_name(approximate), bits, weight)

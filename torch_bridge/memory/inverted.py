"""Inverted activations (Novikov & Oseledets, *Inverted Activations*, Sec. 2).

The forward pass saves the activation's *output* y = f(x) plus a bit-packed 1-bit
branch mask (x > T, T the minimum of f; the paper stores x < T, eq. 4), and the
backward pass computes f'(f⁻¹(y)) on that branch.  When the next layer saves its
input anyway (a Linear after the activation), y is the same tensor, so the
activation costs one bit per element instead of a full copy of x.

f'∘f⁻¹ — the paper's closed forms (eqs. 5–8) reach ~2e-2 for GELU — is computed
here from per-branch piecewise polynomials (Chebyshev fits in float64, as monomials):

* near the minimum, in t = sqrt(y − f(T)), where f'(f⁻¹(y)) is analytic in t
  (f' ≈ ±sqrt(2 f''(T)) t): equal pieces of t, right up to where f' = 1 to 1e-10, left
  down to |y| = 2**e_split (a binade boundary near f(T − 2));
* on the left tail (y → 0⁻), in the binade coordinate of |y| (exponent and leading
  mantissa bits: a piecewise-linear log2 that costs no transcendental call), 2**lpb
  pieces per binade down to |y| ~ 1e-14, below which f' = 0 to < 1e-10.

One table holds every piece; the kernels select a row by arithmetic on t and on y's bit
pattern, branch-free, and gather its coefficients.  The resolution depends on the
storage dtype (``_RESOLUTION``): float64 degree 3 (fit error 1.7e-10), float32
degree 2 (2.2e-8, below float32's rounding of f' and one gather fewer).

What remains is the information the stored y lacks.  Near the minimum every stored
value y is the rounding of a whole interval of inputs on each branch, and no
inversion can tell them apart: the best estimate given (y, branch) is the midpoint of
f' over that interval.  PyTorch's float32 GELU is up to 1.9 ulp off (AVX-512; 8 on
its AVX2 and default code paths) and not monotone near the minimum, which widens those
intervals so much that even the midpoint misses by 1.04e-4 (GELU), 1.14e-4 (tanh
GELU), 1.12e-4 (Mish).  Hence, for float32:

* the forward pass returns the native output except for x within 3e-3 of T, where it
  returns f(x) computed in float64 and rounded to float32 (the correctly rounded
  value on every host, where torch 2.13's native GELU is up to 2 ulp off on AVX-512
  and 8 on its AVX2 and default code paths; in ~0.2 % of a unit-normal input; a
  table over every float32 x of that window, applied by the same pass that packs the
  mask);
* the backward pass looks the y values of that window up in a table of midpoints
  (built once from the same definition), and uses the fits elsewhere.  Outside the
  window the native forward's error moves f'(f⁻¹(y)) by ~1e-7 / |x − T|.

bfloat16 / float16 keep the native forward; their table covers all 2^16 values of y,
built by running the native forward on every 16-bit input.  Near the minimum the
stored bf16 value determines f' only to ~1e-2 (measured: docs/memory.md) — a limit
of the storage, not of the method.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .._backend import on_cuda_backend
from .._tensors import same_device
from . import _kernels as K
from .activations import Activation, activation
from .fewbit import FUSED, check_input, fused, gelu_name
from .packing import pack_bits, packed_nbytes, unpack_bits

INVERTIBLE = ("gelu", "gelu_tanh", "silu", "mish")
#: resolution of the fits per storage dtype: (degree, pieces per t-range, log2 of the
#: pieces per binade of the left tail).  Max fit error over [-10, 10], GELU / SiLU:
#: float64 1.7e-10 / 1.1e-10 (tested <= 1e-9); float32 7.9e-9 / 2.2e-8, below float32's
#: own rounding of f' ~ 1 (3e-8) — and one coefficient (one gather) fewer in the kernel
_RESOLUTION = {np.dtype(np.float64): (3, 512, 3), np.dtype(np.float32): (2, 512, 4)}
_FLAT = 1e-10               # |f' - asymptote| beyond the fitted ranges
_TAIL_Y = 1e-14             # left tail: |y| below (the binade of) this -> f' = 0
#: float32: x-range around T whose forward is rounded from float64.  Outside it the
#: native forward's error (<= 2 ulp on AVX-512, <= 8 on torch's other CPU code paths)
#: moves f'(f⁻¹(y)) by up to ~5e-8 / |x - T| per ulp; the largest errors (4-6e-5, the
#: same on the default and AVX2 paths) lie within 6e-4 of T, far inside
_WINDOW_DX = 3e-3
#: y values within this many ulp of the window's edge values may also come from a
#: native x outside the window (<= 8 ulp off on every torch 2.13 CPU code path): the
#: fits handle them, not the table
_CUT_ULP = 8


@dataclass(frozen=True)
class _Fits:
    """Piecewise polynomials of one resolution, one table the kernels index.

    ``coef`` rows (monomials in s ∈ [-1, 1], highest power first): ``n`` pieces in t on
    [0, t_right] and the constant 1 beyond, ``n`` pieces in t on [0, t_left] and their
    end value (reached only at t = t_left), 2**lpb pieces per binade of the left tail,
    the constant 0.
    """
    degree: int
    n: int
    lpb: int
    coef: np.ndarray


class Inverter:
    """f'(f⁻¹(y)) on the two monotone branches of a two-branch activation."""

    def __init__(self, act: Activation):
        if act.name not in INVERTIBLE:
            raise ValueError(f"activation={act.name!r} has no inverted form; expected one of "
                             f"{list(INVERTIBLE)}")
        self.act = act
        from scipy.optimize import brentq
        self.T = brentq(lambda x: float(self._d(np.array([x]))[0]), -3.0, 0.0, xtol=1e-15)
        self.ymin = float(self._f(np.array([self.T]))[0])
        # right branch: t up to where f' = 1 to _FLAT; left: t down to a binade boundary
        # |y| = 2**e_split near f(T - 2), below it the binades of |y| down to _TAIL_Y
        xs = np.linspace(self.T, 80.0, 400_001)
        xr = xs[np.nonzero(np.abs(self._d(xs) - 1) > _FLAT)[0][-1] + 1]
        self.t_right = math.sqrt(self._f(np.array([xr]))[0] - self.ymin)
        self.e_split = math.floor(math.log2(-self._f(np.array([self.T - 2.0]))[0]))
        self.t_left = math.sqrt(-2.0 ** self.e_split - self.ymin)
        self.e_tail = math.floor(math.log2(_TAIL_Y))
        self.fits = {dt: self._fits(*res) for dt, res in _RESOLUTION.items()}

    def _fits(self, degree, n, lpb) -> _Fits:
        n_tail = (self.e_split - self.e_tail) << lpb

        def const(c):
            return np.r_[np.zeros(degree), c][None]

        def t_branch(t):
            return self.ymin + t * t
        near = self._fit(degree, self.t_left, n, t_branch, False)
        return _Fits(degree, n, lpb, np.concatenate([
            self._fit(degree, self.t_right, n, t_branch, True), const(1.0),
            near, const(near[-1].sum()),                  # the last piece at s = 1
            self._fit(degree, n_tail, n_tail, lambda u: self._tail_y(u, lpb), False),
            const(0.0)]))

    def _f(self, x):
        return self.act.f(torch.from_numpy(np.asarray(x, np.float64))).numpy()

    def _d(self, x):
        return self.act.fprime(torch.from_numpy(np.asarray(x, np.float64))).numpy()

    def _tail_y(self, u, lpb):
        """y at binade coordinate u of the left tail: |y| = (1 + frac) 2**e, with
        u = (e - e_tail + frac) * 2**lpb."""
        v = np.asarray(u, np.float64) / (1 << lpb)
        e = np.floor(v)
        return -(1.0 + v - e) * np.exp2(self.e_tail + e)

    def inverse(self, y, right) -> np.ndarray:
        """f⁻¹(y) on a branch (float64 bisection; y clamped to the branch's range)."""
        y = np.asarray(y, np.float64)
        right = np.broadcast_to(np.asarray(right, bool), y.shape)
        lo = np.where(right, self.T, -60.0)
        hi = np.where(right, np.maximum(y, 0) + 60.0, self.T)
        for _ in range(120):
            mid = 0.5 * (lo + hi)
            up = (self._f(mid) < y) == right        # f increasing right, decreasing left
            lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
        return 0.5 * (lo + hi)

    def _fit(self, degree, u1, pieces, y_of_u, right) -> np.ndarray:
        """Chebyshev fits of f'(f⁻¹(y(u))) on ``pieces`` equal pieces of [0, u1], as
        monomials in s ∈ [-1, 1]: (pieces, degree + 1), highest power first."""
        s = np.cos(np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1))[::-1]
        u = (np.arange(pieces)[:, None] + (s[None, :] + 1) / 2) * (u1 / pieces)
        g = self._d(self.inverse(y_of_u(u), right))
        return np.stack([np.polynomial.chebyshev.cheb2poly(
            np.polynomial.chebyshev.chebfit(s, gi, degree))[::-1] for gi in g])

    def __call__(self, y, right, dtype=np.float64) -> np.ndarray:
        """f'(f⁻¹(y)) from the fits for storage ``dtype`` (float64 evaluation: the
        reference of the kernels' piece selection)."""
        fits = self.fits[np.dtype(dtype)]
        n, coef = fits.n, fits.coef
        y = np.asarray(y, np.float64)
        right = np.broadcast_to(np.asarray(right, bool), y.shape)
        with np.errstate(invalid="ignore", over="ignore"):
            t = np.sqrt(np.maximum(y - self.ymin, 0.0))
            p = np.minimum(t * np.where(right, n / self.t_right, n / self.t_left), n)
        p = np.nan_to_num(p)
        jp = np.floor(p)
        ay = np.abs(y)
        m, e = np.frexp(np.where(np.isfinite(ay) & (ay > 0), ay, 1.0))
        u = ((e - 1 - self.e_tail) + (2 * m - 1)) * (1 << fits.lpb)
        ju = np.floor(u)
        tail = ~right & (ay < 2.0 ** self.e_split)
        j = np.where(tail, np.where(ay >= 2.0 ** self.e_tail, 2 * n + 2 + ju, len(coef) - 1),
                     np.where(right, jp, n + 1 + jp))
        s = np.where(tail, 2 * (u - ju) - 1, 2 * (p - jp) - 1)
        j = np.clip(j, 0, len(coef) - 1).astype(np.int64)
        out = np.zeros_like(s)
        for c in coef.T:
            out = out * s + c[j]
        return np.where(np.isnan(y), np.nan, out)

    # --- tables for the information-limited region -------------------------------------

    @cached_property
    def window(self) -> tuple[np.float32, np.float32]:
        """The float32 x range whose forward output is rounded from float64."""
        return np.float32(self.T - _WINDOW_DX), np.float32(self.T + _WINDOW_DX)

    @cached_property
    def _window_x(self) -> tuple[int, np.ndarray, np.ndarray]:
        """(first int32 pattern, x[count], y[count]): every float32 x in the window (x < 0:
        larger |x|, larger pattern) and its forward output, f(x) rounded from float64."""
        lo, hi = self.window
        x = np.arange(hi.view(np.int32), lo.view(np.int32) + 1, dtype=np.int32).view(np.float32)
        return int(x[:1].view(np.int32)[0]), x, self.act.f(torch.from_numpy(x)).float().numpy()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, packed branch bits x > T).  y is the native output, except that float32 x
        in :attr:`window` get f(x) computed in float64 and rounded to float32."""
        y = self.act.native(x).contiguous()       # C order, like x.contiguous()
        first, _, ytab = self._window_x
        if fused(x):
            xs = x.detach().contiguous().view(-1)
            mask = torch.empty(packed_nbytes(xs.numel(), 1), dtype=torch.uint8, device=x.device)
            f32 = x.dtype == torch.float32
            xbits = xs.view(torch.int32 if f32 else torch.int64)
            t = K.thresholds(np.array([self.T]), FUSED[x.dtype])[0]
            ytab = ytab if f32 else np.zeros(0, np.float64)     # float64: no window
            if on_cuda_backend(xs):
                from . import _cuda as C
                C.launch(C.inverted_forward, C.groups(xs.numel()), x=xs, xbits=xbits, t=t,
                         first=first, ytab=self._on(xs.device, ytab.dtype, lambda: ytab),
                         y=y.view(-1), out=mask)
            else:
                K.inverted_forward(xs.numpy(), xbits.numpy(), t, first, ytab,
                                   y.view(-1).numpy(), mask.numpy())
            return y, mask
        if x.dtype == torch.float32:
            lo, hi = self.window
            near = torch.nonzero((x >= float(lo)) & (x <= float(hi)), as_tuple=True)
            y[near] = self.act.f(x[near]).to(torch.float32)
        return y, pack_bits((x.detach().reshape(-1).double() > self.T).to(torch.uint8), 1)

    @cached_property
    def window32(self):
        """float32 y near the minimum: (first uint32 pattern, levels[2, count]).

        levels[b, i] is the midpoint of f' over every float32 x on branch b (1 =
        right) whose forward (:meth:`forward`) gives the y with pattern first + i;
        the fits' value where no float32 x does.
        """
        _, x, y = self._window_x                  # every float32 in [T - dx, T + dx]
        # only the y values whose every preimage lies inside the enumerated x range
        y_cut = min(y[0], y[-1]) - _CUT_ULP * np.spacing(np.abs(y[0]))
        keep = y < y_cut
        x, y = x[keep], y[keep]
        yb = y.view(np.uint32)                    # negative: larger |y|, larger pattern
        first = int(yb.min())
        count = int(yb.max()) - first + 1
        right = (x.astype(np.float64) > self.T).astype(np.int64)
        d = self._d(x.astype(np.float64))
        lo_d = np.full((2, count), np.inf)
        hi_d = np.full((2, count), -np.inf)
        np.minimum.at(lo_d, (right, yb - first), d)
        np.maximum.at(hi_d, (right, yb - first), d)
        yall = (first + np.arange(count, dtype=np.uint32)).view(np.float32).astype(np.float64)
        fit = np.stack([self(yall, False, np.float32), self(yall, True, np.float32)])
        levels = np.where(np.isfinite(lo_d), 0.5 * (np.nan_to_num(lo_d) + np.nan_to_num(hi_d)), fit)
        return first, levels

    def table16(self, dtype: torch.dtype) -> torch.Tensor:
        """bfloat16/float16: levels[2, 65536] for every y pattern and branch (midpoints
        over all 16-bit inputs; the fits where no input gives that y)."""
        cache = self.__dict__.setdefault("_tables16", {})
        if dtype not in cache:
            x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
            y = self.act.native(x)
            xd = x.double().numpy()
            ok = np.isfinite(xd) & np.isfinite(y.double().numpy())
            yb = y.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
            right = (xd > self.T).astype(np.int64)
            d = self._d(np.where(ok, xd, 0.0))
            lo_d = np.full((2, 1 << 16), np.inf)
            hi_d = np.full((2, 1 << 16), -np.inf)
            np.minimum.at(lo_d, (right[ok], yb[ok]), d[ok])
            np.maximum.at(hi_d, (right[ok], yb[ok]), d[ok])
            yall = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
            yall = yall.double().numpy()
            fit = np.stack([self(yall, False), self(yall, True)])
            fit[1, np.isposinf(yall)] = 1.0
            cache[dtype] = torch.from_numpy(
                np.where(np.isfinite(lo_d), 0.5 * (np.nan_to_num(lo_d) + np.nan_to_num(hi_d)), fit))
        return cache[dtype]

    # --- the fast path --------------------------------------------------------------

    def _on(self, device: torch.device, name, make):
        """The array ``make()`` as a tensor on ``device``, made once per (name, device)."""
        cache = self.__dict__.setdefault("_device_tables", {})
        key = (name, device)
        if key not in cache:
            cache[key] = torch.from_numpy(np.ascontiguousarray(make())).to(device)
        return cache[key]

    def _scale_tables(self, dtype: np.dtype):
        """(coefficient rows, cst, icst) of the backward kernels for y of ``dtype``
        (_kernels.inverted_constants says what they hold), made once."""
        cache = self.__dict__.setdefault("_tables", {})
        if dtype not in cache:
            cache[dtype] = self._make_scale_tables(dtype)
        return cache[dtype]

    def _make_scale_tables(self, dtype: np.dtype):
        ft = dtype.type
        f32 = dtype == np.float32
        fits = self.fits[dtype]
        hi = ft(self.ymin)
        cst = np.array([hi, self.ymin - float(hi), fits.n / self.t_right,
                        fits.n / self.t_left], dtype)
        mant, bias = (23, 127) if f32 else (52, 1023)
        first, levels = self.window32 if f32 else (0, np.zeros((2, 0)))
        # the window's levels as constant rows after the pieces
        rows = np.zeros((levels.size, fits.degree + 1))
        rows[:, -1] = levels.reshape(-1)
        icst = np.array([fits.n, self.e_tail + bias, self.e_split + bias, mant, fits.lpb,
                         first, levels.shape[1], len(fits.coef)], np.int64)
        return np.concatenate([fits.coef, rows]).astype(dtype), cst, icst

    def _scale_kernel(self, dtype: np.dtype):
        """The CPU backward kernel for y of ``dtype``, built on first use
        (_kernels.inverted_scale)."""
        cache = self.__dict__.setdefault("_kernels", {})
        if dtype not in cache:
            cache[dtype] = K.inverted_scale(*self._scale_tables(dtype))
        return cache[dtype]

    def scale(self, grad: torch.Tensor, y: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        """grad * f'(f⁻¹(y)) with the branch bits of ``packed``."""
        same_device(grad=grad, y=y, packed=packed)
        if fused(y) and grad.dtype == y.dtype:
            g = grad.contiguous().view(-1)
            yc = y.detach().contiguous().view(-1)
            out = torch.empty_like(grad, memory_format=torch.contiguous_format)
            ybits = yc.view(torch.int32 if yc.dtype == torch.float32 else torch.int64)
            dtype = FUSED[y.dtype]
            if on_cuda_backend(yc):
                from . import _cuda as C
                coef, cst, icst = self._scale_tables(dtype)
                fcst, icst = K.inverted_constants(dtype, cst, icst)
                table = self._on(yc.device, ("coef", dtype), lambda: coef)
                C.launch(C.INVERTED_SCALE[dtype], yc.numel(), grad=g, y=yc, ybits=ybits,
                         packed=packed, table=table, fcst=fcst, icst=icst, out=out.view(-1))
            else:
                self._scale_kernel(dtype)(g.numpy(), yc.numpy(), ybits.numpy(), packed.numpy(),
                                          out.view(-1).numpy())
            return out
        right = unpack_bits(packed, 1, y.numel()).to(torch.int64).to(y.device)
        if y.dtype in (torch.bfloat16, torch.float16):
            code = y.detach().reshape(-1).view(torch.int16).to(torch.int64) & 0xFFFF
            d = self.table16(y.dtype).to(y.device)[right, code]
        else:
            d = torch.from_numpy(self(y.detach().reshape(-1).double().cpu().numpy(),
                                      right.cpu().numpy().astype(bool),
                                      np.float32 if y.dtype == torch.float32 else np.float64))
            d = d.to(y.device)
        return grad * d.to(grad.dtype).view(grad.shape)


_INVERTERS: dict = {}


def inverter(act) -> Inverter:
    """The (cached) :class:`Inverter` of an activation name or Activation."""
    a = activation(act)
    if a not in _INVERTERS:
        _INVERTERS[a] = Inverter(a)
    return _INVERTERS[a]


class _Inverted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, inv: Inverter):
        y, mask = inv.forward(x)
        ctx.save_for_backward(y, mask)
        ctx.inv = inv
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, mask = ctx.saved_tensors
        return ctx.inv.scale(grad, y, mask), None


def inverted(x: torch.Tensor, act="gelu") -> torch.Tensor:
    """``act(x)`` saving its output and a 1-bit branch mask for backward.  Meta tensors
    (no values) take the native activation."""
    check_input(x)
    inv = inverter(act)
    if not (torch.is_grad_enabled() and x.requires_grad) or x.device.type == "meta":
        return inv.act.native(x)
    return _Inverted.apply(x, inv)


class InvertedActivation(nn.Module):
    """nn.Module form of :func:`inverted`."""

    def __init__(self, act="gelu"):
        super().__init__()
        self.act = activation(act)
        inverter(self.act)                         # fail early, build the fits now

    def forward(self, x):
        return inverted(x, self.act)

    def extra_repr(self) -> str:
        return self.act.label


class InvGELU(InvertedActivation):
    """Inverted GELU; ``approximate`` as in nn.GELU."""

    def __init__(self, approximate: str = "none"):
        super().__init__(gelu_name(approximate))


class InvSiLU(InvertedActivation):
    """Inverted SiLU (Swish)."""

    def __init__(self):
        super().__init__("silu")


class InvMish(InvertedActivation):
    """Inverted Mish."""

    def __init__(self):
        super().__init__("mish")

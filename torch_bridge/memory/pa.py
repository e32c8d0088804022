"""Piecewise-affine activations whose few-bit backward is exact.

A PA activation with P pieces is a continuous piecewise-linear function whose outer
pieces have the activation's asymptotic slopes (0 on the left, 1 on the right, as
GELU and SiLU have).  Its derivative is piecewise constant with P values, so saving
the segment index in ceil(log2 P) bits and multiplying the gradient by that
segment's slope is the *exact* backward of the forward function — the lossless
counterpart of the few-bit activations, and what PA hardware computes anyway.

Fit (minimax, |PA − f| over the real line): P − 1 knots at the quantiles of
|f''|^(1/2) (the asymptotically optimal knot density for linear interpolation)
between two end points chosen by Nelder-Mead; for given knots the values at the
knots that minimise the maximum error are a linear programme (HiGHS), solved by
cutting planes on a grid of [−16, 16] plus the two asymptotic errors.

Forward: y = x * slope[i] + intercept[i] in the input's dtype, slope and
intercept rounded from float64; backward: grad * slope[i].
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from .._backend import on_cuda_backend
from . import _kernels as K
from .activations import activation
from .fewbit import CodedBackward, check_input, fused, scale_by_code
from .packing import packed_nbytes, pack_bits
from .tables import DATA_DIR, PA_FILE, VERSION, read

PA_ACTIVATIONS = ("gelu", "silu")
PIECES = (2, 4, 8, 16, 32)
_SPAN = 16.0                       # fit grid [-_SPAN, _SPAN]; beyond, f = asymptote to 1e-12
_GRID = np.linspace(-_SPAN, _SPAN, 16_001)


@dataclass(frozen=True)
class PATable:
    """A continuous PA approximation: value ``values[j]`` at ``knots[j]``, slope 0 left
    of the first knot and 1 right of the last.  ``max_error``: sup |PA − f| over ℝ
    (float64), ``rms_error``: sqrt(mean (PA − f)²) over [−10, 10]."""
    activation: str
    pieces: int
    knots: tuple
    values: tuple
    max_error: float
    rms_error: float

    @property
    def bits(self) -> int:
        return max(1, int(np.ceil(np.log2(self.pieces))))

    @property
    def slopes(self) -> np.ndarray:
        b, v = np.asarray(self.knots), np.asarray(self.values)
        return np.r_[0.0, np.diff(v) / np.diff(b), 1.0]

    @property
    def intercepts(self) -> np.ndarray:
        b, v = np.asarray(self.knots), np.asarray(self.values)
        return np.r_[v, v[-1]] - self.slopes * np.r_[b, b[-1]]

    def __call__(self, x) -> np.ndarray:
        """The PA function in float64."""
        x = np.asarray(x, np.float64)
        i = np.searchsorted(np.asarray(self.knots), x, side="left")
        return x * self.slopes[i] + self.intercepts[i]


def _design(b, x):
    """Rows: PA(x) = A @ values + c for knots b (sparse, <= 2 nonzeros per row)."""
    import scipy.sparse as sp
    m = len(b)
    j = np.searchsorted(b, x, side="right") - 1
    left, right = j < 0, j >= m - 1
    mid = np.nonzero(~left & ~right)[0]
    jm = j[mid]
    t = (x[mid] - b[jm]) / (b[jm + 1] - b[jm])
    rows = np.r_[np.nonzero(left)[0], np.nonzero(right)[0], mid, mid]
    cols = np.r_[np.zeros(left.sum(), int), np.full(right.sum(), m - 1), jm, jm + 1]
    vals = np.r_[np.ones(left.sum() + right.sum()), 1 - t, t]
    c = np.where(right, x - b[-1], 0.0)
    return sp.csr_matrix((vals, (rows, cols)), shape=(len(x), m)), c


def _minimax_values(b, fgrid, f_at):
    """The knot values minimising max |PA − f| (grid + asymptotes), by cutting planes."""
    import scipy.sparse as sp
    from scipy.optimize import linprog
    m = len(b)
    active = np.linspace(0, len(_GRID) - 1, 401).astype(int)
    fb = f_at(b)
    for _ in range(50):
        x, f = np.r_[_GRID[active], b], np.r_[fgrid[active], fb]
        A, c = _design(b, x)
        # asymptotic errors: PA - f -> values[0] (left), values[-1] - b[-1] (right)
        A = sp.vstack([A, sp.csr_matrix(([1.0, 1.0], ([0, 1], [0, m - 1])), shape=(2, m))])
        c, f = np.r_[c, 0.0, -b[-1]], np.r_[f, 0.0, 0.0]
        one = sp.csr_matrix(np.ones((len(f), 1)))
        res = linprog(np.r_[np.zeros(m), 1.0],
                      A_ub=sp.vstack([sp.hstack([A, -one]), sp.hstack([-A, -one])]),
                      b_ub=np.r_[f - c, c - f], bounds=[(None, None)] * m + [(0, None)],
                      method="highs")
        v, t = res.x[:m], res.x[-1]
        A_all, c_all = _design(b, _GRID)
        e = np.abs(A_all @ v + c_all - fgrid)
        new = np.nonzero((e[1:-1] >= e[:-2]) & (e[1:-1] >= e[2:]) & (e[1:-1] > t * (1 + 1e-9)))[0] + 1
        if len(new) == 0:
            return v, max(t, e.max())
        active = np.union1d(active, new)
    return v, max(t, e.max())


def _check(act, pieces):
    act = activation(act)
    if act.name not in PA_ACTIVATIONS:
        raise ValueError(f"activation={act.name!r}: PA activations exist for "
                         f"{list(PA_ACTIVATIONS)}")
    if isinstance(pieces, bool) or not isinstance(pieces, (int, np.integer)) \
            or not 2 <= pieces <= 256:
        raise ValueError(f"pieces={pieces!r} must be an integer in 2..256")
    return act, int(pieces)


def fit_pa(act, pieces: int) -> PATable:
    """Fit the minimax PA approximation of ``act`` with ``pieces`` pieces (>= 2)."""
    act, pieces = _check(act, pieces)
    from scipy.optimize import minimize
    f_at = lambda x: act.f(torch.from_numpy(np.asarray(x, np.float64))).numpy()  # noqa: E731
    fgrid = f_at(_GRID)
    dense = np.linspace(-_SPAN, _SPAN, 640_001)
    root = np.sqrt(np.abs(np.gradient(np.gradient(f_at(dense), dense), dense)))
    m = pieces - 1

    def knots(z):
        keep = (dense >= -np.exp(z[0])) & (dense <= np.exp(z[1]))
        cdf = np.cumsum(root[keep])
        cdf = (cdf - cdf[0]) / (cdf[-1] - cdf[0])
        return np.interp((np.arange(m) + 0.5) / m, cdf, dense[keep])

    res = minimize(lambda z: _minimax_values(knots(z), fgrid, f_at)[1], np.log([3.0, 3.0]),
                   method="Nelder-Mead", options=dict(xatol=1e-3, fatol=1e-12, maxiter=120))
    b = knots(res.x)
    v, _ = _minimax_values(b, fgrid, f_at)
    table = PATable(act.name, int(pieces), tuple(map(float, b)), tuple(map(float, v)), 0.0, 0.0)
    # the errors on a 10x finer grid, the asymptotic ones included
    x = np.linspace(-_SPAN, _SPAN, 1_600_001)
    e = table(x) - f_at(x)
    inner = np.abs(x) <= 10
    err = max(np.abs(e).max(), abs(v[0]), abs(v[-1] - b[-1]))
    return PATable(table.activation, table.pieces, table.knots, table.values, float(err),
                   float(np.sqrt(np.mean(e[inner] ** 2))))


def generate_pa(names=PA_ACTIVATIONS, pieces=PIECES, progress=None) -> dict:
    """Fit every (activation, pieces); the JSON document to store."""
    tables = []
    for name in names:
        for p in pieces:
            t = fit_pa(name, p)
            tables.append(dict(activation=t.activation, pieces=t.pieces, knots=list(t.knots),
                               values=list(t.values), max_error=t.max_error,
                               rms_error=t.rms_error))
            if progress:
                progress(f"{name} {p} pieces")
    return {"format": "pamsim PA activation tables", "version": VERSION,
            "fit": "minimax, knots at |f''|^(1/2) quantiles, HiGHS LP values", "tables": tables}


@lru_cache(maxsize=None)
def stored_pa(path=None) -> dict:
    """{(activation, pieces): PATable} of the shipped (or given) file."""
    doc = read(path or DATA_DIR / PA_FILE, "PA activation")
    return {(t["activation"], t["pieces"]): PATable(
        t["activation"], t["pieces"], tuple(t["knots"]), tuple(t["values"]), t["max_error"],
        t["rms_error"]) for t in doc["tables"]}


def pa_table(act, pieces: int) -> PATable:
    """The stored table (the shipped piece counts) or a fit made on first use."""
    a, pieces = _check(act, pieces)
    key = (a.name, pieces)
    return stored_pa()[key] if key in stored_pa() else _fitted(a.name, pieces)


@lru_cache(maxsize=None)
def _fitted(name, pieces):
    return fit_pa(name, pieces)


@dataclass(frozen=True)
class _Segments:
    table: PATable
    bp64: torch.Tensor           # knots padded with +inf to 2**bits - 1
    slope: torch.Tensor          # float64, padded
    intercept: torch.Tensor

    @classmethod
    def of(cls, table: PATable) -> "_Segments":
        n = 1 << table.bits
        bp = torch.full((n - 1,), float("inf"), dtype=torch.float64)
        bp[:len(table.knots)] = torch.tensor(table.knots, dtype=torch.float64)
        s = torch.zeros(n, dtype=torch.float64)
        c = torch.zeros(n, dtype=torch.float64)
        s[:table.pieces] = torch.from_numpy(table.slopes)
        c[:table.pieces] = torch.from_numpy(table.intercepts)
        return cls(table, bp, s, c)

    @property
    def act(self):
        return activation(self.table.activation)

    def index(self, x: torch.Tensor) -> torch.Tensor:
        """Segment of each x: #{knots < x} (NaN -> 0)."""
        v = x.detach().reshape(-1).double()
        idx = torch.searchsorted(self.bp64.to(v.device), v, side="left")
        return torch.where(torch.isnan(v), 0, idx)

    def forward(self, x: torch.Tensor):
        """(y, packed segment indices)."""
        s, c = (t.to(device=x.device, dtype=x.dtype) for t in (self.slope, self.intercept))
        k = self.table.bits
        if fused(x):
            xc = x.detach().contiguous()
            y = torch.empty_like(xc)
            packed = torch.empty(packed_nbytes(x.numel(), k), dtype=torch.uint8, device=x.device)
            if on_cuda_backend(xc):
                from . import _cuda as C
                C.launch(C.affine_index_pack, C.groups(xc.numel()), x=xc.view(-1),
                         bp=self.bp64.to(xc.device), k=k, slope=s, intercept=c, y=y.view(-1),
                         out=packed)
            else:
                K.affine_index_pack(xc.view(-1).numpy(), self.bp64.numpy(), k, s.numpy(),
                                    c.numpy(), y.view(-1).numpy(), packed.numpy())
            return y, packed
        idx = self.index(x)
        y = x.detach() * s[idx].view(x.shape) + c[idx].view(x.shape)
        return y, pack_bits(idx, k)

    def scale(self, grad: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return scale_by_code(grad, packed, self.table.bits, self.slope)


_SEGMENTS: dict = {}


def _segments(act, pieces) -> _Segments:
    key = (activation(act).name, pieces)
    if key not in _SEGMENTS:
        _SEGMENTS[key] = _Segments.of(pa_table(*key))
    return _SEGMENTS[key]


def pa_activation(x: torch.Tensor, act="gelu", pieces: int = 16) -> torch.Tensor:
    """The ``pieces``-piece PA approximation of ``act`` (gelu or silu), exact backward
    from a ceil(log2(pieces))-bit segment index."""
    check_input(x)
    seg = _segments(act, pieces)
    if x.device.type == "meta":         # no values: the shape of the result is all there is
        return activation(act).native(x)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return seg.forward(x)[0]
    return CodedBackward.apply(x, seg)


class PAActivation(nn.Module):
    """nn.Module form of :func:`pa_activation`."""

    def __init__(self, act="gelu", pieces: int = 16):
        super().__init__()
        self.act = activation(act)
        self.pieces = pieces
        _segments(self.act, pieces)            # validate and load now

    def forward(self, x):
        return pa_activation(x, self.act, self.pieces)

    def extra_repr(self) -> str:
        return f"{self.act.name}, pieces={self.pieces}"


class PAGELU(PAActivation):
    """Piecewise-affine GELU with exact few-bit backward."""

    def __init__(self, pieces: int = 16):
        super().__init__("gelu", pieces)


class PASiLU(PAActivation):
    """Piecewise-affine SiLU with exact few-bit backward."""

    def __init__(self, pieces: int = 16):
        super().__init__("silu", pieces)


def report(path=None) -> str:
    """Forward error of the stored PA activations per piece count."""
    stored = stored_pa(path)
    lines = ["PA activations: forward error vs the activation (max over ℝ, RMS over [-10, 10]); "
             "backward exact",
             f"{'activation':10} {'pieces':>6} {'bits':>4} {'max |PA − f|':>14} {'RMS':>12}"]
    for (name, p), t in sorted(stored.items()):
        lines.append(f"{name:10} {p:6d} {t.bits:4d} {t.max_error:14.3e} {t.rms_error:12.3e}")
    return "\n".join(lines)

"""Optimal piecewise-constant approximation of an activation's derivative.

Few-Bit Backward (Novikov et al., ICML 2023), Sec. 3: find breakpoints s and levels y
minimising the weighted L2 error

    L(s, y) = ∫ (f'(x) − q(x | s, y))² w(x) dx                                   (eq. 3)

where q is y_i on [s_i, s_{i+1}).  For fixed s the optimal levels are the weighted
means of f' on each interval (eq. 4).  The global problem is solved on a grid
A = t_0 < … < t_n = B by dynamic programming (eqs. 6–7) in O(n² K) time, with the
interval costs T(j, i) evaluated in O(1) from three prefix integrals W, FW, F2
(eqs. 8–9, O(n) memory; the back-pointers take O(nK)).  The grid solution then seeds
a gradient refinement of the breakpoints with the analytic gradient of eq. 5.

Weights: ``"uniform"`` (w = 1 on [−limit, limit], the paper's Table 1) and
``"normal"`` (the standard normal density, truncated at ±limit where its mass is
< 1e-22 for the default limit 10).  For even derivatives (sigmoid, tanh) the
breakpoints live on |x| ∈ [0, limit]: the same number of bits buys twice the levels
(paper, Fig. 3); the error reported is still the integral over [−limit, limit].

Every step gives the same bits on every host (docs/semantics.md, "Host
independence"): f', f'' and the weight come from the scalar-libm definitions of
:mod:`.activations`, sums have a fixed order (or are exact: ``math.fsum``), and the
Gauss-Legendre rule and the Newton steps avoid LAPACK/BLAS, whose kernels are chosen
by CPU.  The stored tables are therefore what any host regenerates, bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from .activations import Activation, activation
from .packing import check_bits

WEIGHTS = ("uniform", "normal")
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of the n-point Gauss-Legendre rule by Newton's method on P_n
    (three-term recurrence) from the Chebyshev-like guesses: scalar arithmetic, where
    numpy's leggauss goes through LAPACK (CPU-dispatched kernels)."""
    nodes, weights = [], []
    for i in range(n):
        x = math.cos(math.pi * (i + 0.75) / (n + 0.5))
        for _ in range(100):
            p0, p1 = 1.0, x
            for k in range(2, n + 1):
                p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
            dp = n * (x * p1 - p0) / (x * x - 1)
            step = p1 / dp
            x -= step
            if abs(step) <= 1e-17:
                break
        nodes.append(x)
        weights.append(2 / ((1 - x * x) * dp * dp))
    return np.array(nodes[::-1]), np.array(weights[::-1])


_GL_NODES, _GL_WEIGHTS = _gauss_legendre(8)


@njit(cache=True)
def _pow(x, p):
    """x**p elementwise by libm's scalar pow (numpy's power is CPU-dispatched)."""
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = x[i] ** p
    return out


@njit(cache=True)
def _normal_pdf(x):
    """The standard normal density by libm's scalar exp (numpy's exp is CPU-dispatched)."""
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = math.exp(-0.5 * x[i] * x[i]) * _INV_SQRT_2PI
    return out


def _row_sums(a: np.ndarray) -> np.ndarray:
    """Sums along the last axis, left to right (a fixed order of elementwise adds)."""
    out = a[..., 0].copy()
    for k in range(1, a.shape[-1]):
        out += a[..., k]
    return out


@dataclass(frozen=True)
class StepTable:
    """A piecewise-constant derivative: ``values[i]`` on the i-th interval.

    ``breakpoints`` (length 2**bits - 1, increasing) split the real line — or the
    half-line of |x| when ``even`` — into 2**bits intervals; an input x falls into
    interval ``#{j : breakpoints[j] < x}`` (|x| when even).  ``error`` is L of eq. 3
    over [−limit, limit] with the weight it was solved for; ``dp_error`` the same for
    the grid solution before refinement.
    """
    activation: str
    bits: int
    weight: str
    even: bool
    breakpoints: tuple
    values: tuple
    error: float
    dp_error: float

    def index(self, x: np.ndarray) -> np.ndarray:
        """Interval index of each x, NaN -> 0 (float64 reference for the kernels)."""
        x = np.abs(x) if self.even else np.asarray(x)
        idx = np.searchsorted(np.asarray(self.breakpoints), x, side="left")
        return np.where(np.isnan(x), 0, idx)

    def __call__(self, x) -> np.ndarray:
        """q(x): the approximated derivative."""
        return np.asarray(self.values)[self.index(np.asarray(x, np.float64))]


def check_weight(weight):
    if weight not in WEIGHTS:
        raise ValueError(f"weight={weight!r}; expected one of {list(WEIGHTS)}")
    return weight


class _Problem:
    """Derivative, weight and grid of one instance of eq. 3, with its prefix integrals."""

    def __init__(self, act: Activation, weight: str, limit: float, cells: int, even: bool):
        if not (isinstance(cells, (int, np.integer)) and cells >= 16):
            raise ValueError(f"cells={cells!r} must be an integer >= 16")
        if not (isinstance(limit, (int, float)) and 0 < limit < 1e3):
            raise ValueError(f"limit={limit!r} must be a number in (0, 1000)")
        self.act, self.weight, self.limit = act, weight, float(limit)
        self.even = even
        self.lo = 0.0 if self.even else -self.limit
        self.grid = self._grid(cells)
        a, b = self.grid[:-1], self.grid[1:]
        self.W, self.FW, self.F2 = (np.r_[0.0, np.cumsum(c)] for c in self._prefix_at(b, a))

    def _grid(self, cells):
        """Grid nodes at the quantiles of the asymptotically optimal breakpoint density
        (w f''²)^(1/3) (plus a uniform floor of 1/3 of the nodes), so that the grid is
        fine where the breakpoints crowd.  0 is always a node (the kinks of ReLU, SELU
        and ELU sit there)."""
        x = np.linspace(self.lo, self.limit, 200_001)
        rho = _pow(self.w(x) * self.fsecond(x) ** 2, 1.0 / 3.0)
        rho = rho / max(math.fsum(rho) / rho.size, 1e-300) + 0.5
        cdf = np.r_[0.0, np.cumsum(0.5 * (rho[1:] + rho[:-1]))]
        cdf /= cdf[-1]
        zero = np.interp(0.0, x, cdf)
        left = round(cells * zero)
        q = np.r_[np.linspace(0, zero, left + 1), np.linspace(zero, 1, cells - left + 1)[1:]]
        grid = np.interp(q, cdf, x)
        grid[left], grid[0], grid[-1] = 0.0, self.lo, self.limit
        return grid

    def fprime(self, x):
        return self.act.fprime(x)

    def fsecond(self, x):
        return self.act.fsecond(x)

    def w(self, x):
        x = np.ascontiguousarray(x, np.float64)
        if self.weight == "uniform":
            return np.ones_like(x)
        return _normal_pdf(x.reshape(-1)).reshape(x.shape)

    def _prefix_at(self, x, start):
        """∫_start^x of (w, f'w, f'²w) by 8-point Gauss-Legendre (start, x in one cell)."""
        half = 0.5 * (x - start)
        nodes = (start + half)[:, None] + half[:, None] * _GL_NODES[None, :]
        w = self.w(nodes) * (half[:, None] * _GL_WEIGHTS[None, :])
        d = self.fprime(nodes)
        return _row_sums(w), _row_sums(w * d), _row_sums(w * d * d)

    def prefix(self, s):
        """(W, FW, F2)(s) of eq. 8 at arbitrary points of [lo, limit]."""
        s = np.clip(np.asarray(s, np.float64), self.lo, self.limit)
        j = np.clip(np.searchsorted(self.grid, s, side="right") - 1, 0, len(self.grid) - 2)
        dw, dfw, df2 = self._prefix_at(s, self.grid[j])
        return self.W[j] + dw, self.FW[j] + dfw, self.F2[j] + df2

    def loss(self, inner, hessian=False):
        """L(s, y(s)) (eq. 3 with the levels of eq. 4), the levels and dL/ds (eq. 5).

        With ``hessian``, also the tridiagonal d²L/ds² (diagonal, off-diagonal),
        obtained by differentiating eq. 5 once more through the levels of eq. 4.
        """
        s = np.r_[self.lo, inner, self.limit]
        W, FW, F2 = self.prefix(s)
        dw, dfw, df2 = np.diff(W), np.diff(FW), np.diff(F2)
        dw = np.where(dw > 0, dw, np.finfo(float).tiny)
        y = dfw / dw
        loss = math.fsum(df2 - y * dfw)
        d, w = self.fprime(inner), self.w(inner)
        u, v = y[1:] - y[:-1], 2 * d - y[1:] - y[:-1]
        scale = 2.0 if self.even else 1.0       # the mirrored half contributes the same
        if not hessian:
            return scale * loss, y, scale * w * u * v
        dwdx = np.zeros_like(w) if self.weight == "uniform" else -inner * w
        diag = (dwdx * u * v + 2 * w * u * self.fsecond(inner)
                - 2 * w * w * ((d - y[1:]) ** 2 / dw[1:] + (d - y[:-1]) ** 2 / dw[:-1]))
        off = 2 * w[:-1] * w[1:] * (d[:-1] - y[1:-1]) * (d[1:] - y[1:-1]) / dw[1:-1]
        return scale * loss, y, scale * w * u * v, scale * diag, scale * off


@njit(cache=True, inline="always")
def _cost(W, FW, F2, j, i):
    """T(j, i) of eq. 9: the error of the best constant on [t_j, t_i]."""
    dw = W[i] - W[j]
    dfw = FW[i] - FW[j]
    return F2[i] - F2[j] - dfw * dfw / dw if dw > 0 else 0.0


@njit(parallel=True, cache=True)
def _dp(W, FW, F2, K):
    """DP(i, k) = min_j DP(j, k−1) + T(j, i) (eq. 7) for k = 1..K.

    Returns DP(n, k) for every k and the argmin back-pointers (K+1, n+1).  Rows of
    DP are kept two at a time (O(n) memory); i is strided over chunks so that both
    threads get the same share of the triangular work.
    """
    n = W.size - 1
    prev = np.empty(n + 1)
    for i in range(n + 1):
        prev[i] = _cost(W, FW, F2, 0, i)
    best = np.full(K + 1, np.inf)
    best[1] = prev[n]
    arg = np.zeros((K + 1, n + 1), np.int32)
    chunks = 64
    for k in range(2, K + 1):
        cur = np.full(n + 1, np.inf)
        for c in prange(chunks):
            for i in range(k + c, n + 1, chunks):
                b = np.inf
                bj = k - 1
                for j in range(k - 1, i):
                    v = prev[j] + _cost(W, FW, F2, j, i)
                    if v < b:
                        b = v
                        bj = j
                cur[i] = b
                arg[k, i] = bj
        prev = cur
        best[k] = cur[n]
    return best, arg


def _backtrack(arg, n, K):
    cuts = []
    i = n
    for k in range(K, 1, -1):
        i = int(arg[k, i])
        cuts.append(i)
    return np.array(cuts[::-1], np.int64)


def _solve_spd_tridiagonal(diag, off, rhs):
    """x with T x = rhs, T symmetric tridiagonal (``diag``, ``off``), by LDLᵀ in scalar
    float64 arithmetic (LAPACK's banded solver runs CPU-dispatched BLAS); None when T
    is not positive definite (a pivot <= 0)."""
    n = len(diag)
    d, z, m = [0.0] * n, [0.0] * n, [0.0] * n
    for i in range(n):
        m[i] = off[i - 1] / d[i - 1] if i else 0.0          # L's subdiagonal
        d[i] = float(diag[i]) - (m[i] * off[i - 1] if i else 0.0)
        if not d[i] > 0:
            return None
        z[i] = float(rhs[i]) - (m[i] * z[i - 1] if i else 0.0)
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = z[i] / d[i] - (m[i + 1] * x[i + 1] if i < n - 1 else 0.0)
    return np.array(x)


def _refine(prob: _Problem, s: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """Gradient refinement of the breakpoints: damped Newton on L(s) with the exact
    gradient of eq. 5 and its tridiagonal Hessian, Armijo backtracking, breakpoints
    kept strictly increasing inside [lo, limit].  L never increases.  A breakpoint
    on a jump of f' (SELU's and ELU's kink at 0) stays there: L has a corner."""
    eps = 1e-9 * (1 + np.abs(s))
    free = np.abs(prob.fprime(s + eps) - prob.fprime(s - eps)) < 1e-6
    if not free.any():
        return s
    idx = np.nonzero(free)[0]
    L, _, g, diag, off = prob.loss(s, hessian=True)
    lam = 0.0
    for _ in range(max_iter):
        # the Hessian restricted to the free breakpoints is still tridiagonal
        gf, df = g[idx], diag[idx]
        of = np.where(np.diff(idx) == 1, off[idx[:-1]], 0.0)
        # Levenberg-Marquardt damping until H + lam*I is positive definite
        while (pf := _solve_spd_tridiagonal(df + lam, of, -gf)) is None:
            lam = max(4 * lam, 1e-12 * np.abs(df).max() + 1e-300)
        p = np.zeros_like(s)
        p[free] = pf
        decrement = -math.fsum(gf * pf)
        if decrement <= 1e-14 * L:
            break
        t = 1.0
        while t > 1e-10:
            trial = s + t * p
            if np.all(np.diff(np.r_[prob.lo, trial, prob.limit]) > 0):
                L_new = prob.loss(trial)[0]
                if L_new <= L - 1e-4 * t * decrement:
                    break
            t *= 0.5
        else:
            break
        s = trial
        lam = lam / 4 if t == 1.0 else max(4 * lam, 1e-12 * np.abs(df).max())
        L, _, g, diag, off = prob.loss(s, hessian=True)
    return s


def exact_table(act, weight: str = "uniform") -> StepTable:
    """The lossless table of an activation whose derivative is itself a step function
    (ReLU, LeakyReLU): breakpoint 0, the derivative on each side (x = 0 goes left,
    like PyTorch's backward)."""
    act = activation(act)
    if act.exact_bits != 1:
        raise ValueError(f"activation {act.name!r} has no exact step-function derivative")
    values = act.fprime([-1.0, 1.0]).tolist()
    return StepTable(act.label, 1, check_weight(weight), False, (0.0,), tuple(values), 0.0, 0.0)


def solve(act, bits, weight: str = "uniform", *, limit: float = 10.0, cells: int = 4096,
          refine: bool = True, even: bool | None = None) -> dict[int, StepTable]:
    """Optimal tables of ``act``'s derivative for each bit width in ``bits``.

    One DP run up to 2**max(bits) intervals yields every smaller count too.  ``act``
    is an :class:`Activation` or a name; ``bits`` an int or an iterable of ints in
    1..8.  For ReLU and LeakyReLU every width maps to their exact 1-bit table.
    ``even`` overrides whether |x| is quantised (default: when f' is even).
    """
    act = activation(act)
    bits = [check_bits(b) for b in ([bits] if np.isscalar(bits) else bits)]
    if not bits:
        raise ValueError("bits must name at least one bit width")
    if act.exact_bits:
        return {b: exact_table(act, weight) for b in bits}
    even = act.even if even is None else bool(even)
    if even and not act.even:
        raise ValueError(f"even=True needs an even derivative; {act.name}' is not even")
    prob = _Problem(act, check_weight(weight), limit, cells, even)
    K = 1 << max(bits)
    best, arg = _dp(prob.W, prob.FW, prob.F2, K)
    n = len(prob.grid) - 1
    out = {}
    for b in sorted(set(bits)):
        k = 1 << b
        s = prob.grid[_backtrack(arg, n, k)]
        dp_loss = prob.loss(s)[0]
        if refine:
            s = _refine(prob, s)
        loss, y, _ = prob.loss(s)
        out[b] = StepTable(act.label, b, weight, even, tuple(map(float, s)),
                           tuple(map(float, y)), float(loss), float(dp_loss))
    return out


def table_error(table: StepTable, act, weight: str = "uniform", limit: float = 10.0) -> float:
    """Independent check of eq. 3: ∫_{-limit}^{limit} (f' − q)² w, composite 10-point
    Gauss-Legendre on every interval of q (split at 0, where f' may jump)."""
    act = activation(act)
    bp = np.asarray(table.breakpoints)
    if table.even:
        bp = np.r_[-bp[::-1], bp]
    edges = np.unique(np.clip(np.r_[-limit, bp, 0.0, limit], -limit, limit))
    sub = np.linspace(0, 1, 33)
    a = (edges[:-1, None] + np.diff(edges)[:, None] * sub[None, :-1]).ravel()
    b = (edges[:-1, None] + np.diff(edges)[:, None] * sub[None, 1:]).ravel()
    nodes, weights = np.polynomial.legendre.leggauss(10)
    x = 0.5 * (a + b)[:, None] + 0.5 * (b - a)[:, None] * nodes[None, :]
    d = act.fprime(x)
    w = np.ones_like(x) if weight == "uniform" else np.exp(-0.5 * x * x) * _INV_SQRT_2PI
    # q on each sub-interval from its midpoint (no sub-interval straddles a breakpoint)
    q = table(0.5 * (a + b))[:, None]
    return float(np.sum((d - q) ** 2 * w * 0.5 * (b - a)[:, None] * weights[None, :]))

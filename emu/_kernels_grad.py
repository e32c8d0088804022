"""CPU kernels (``@njit(parallel=True)``) for the exact derivatives of emu/_scalar_grad.py.

Elementwise kernels round every operand to the format first (``_scalar.operand``:
RNE, the same rule as the forward operations) and call the scalar definition.  The
exact PAM-matmul gradient kernel computes

    out[b, p, c] = fold over r = 0..R-1 (increasing) of
                   acc <- acc ⊕ apply_slope(g[b, p, r], slope_mul(x[b, p, c], w[b, r, c]))

from +0.0: with ``(g, x, w) = (δY, A, Bᵀ)`` this is δA and with ``(δYᵀ, Bᵀ, A)`` it is
δBᵀ (emu/grad.py).  Fast path: for
a normal gradient ``d`` and a normal, finite ``w`` the term is the integer sum

    d + (w & 0xFF800000) - ONE32 + ((m_x + m_w) & 0x800000)
      = d + ((m_x + (w - ONE32)) & 0xFF800000)          (mod 2^32; one array, w - ONE32)

(``w``'s sign and exponent added to ``d``, plus the mantissa carry of Table 1, with
``m`` the mantissa fields, 0 for a DAZ/zero/inf ``x``) whenever the result stays in
the normal range, which per (p, r) two comparisons against the exponent range of
row r of ``w`` decide; zero/subnormal ``w`` give ±0 terms (masked), and a ±0
gradient gives ±0 terms only (skipped).  Both are exact because the accumulator is
never -0.0 (see emu/_kernels.py).  Anything else takes the scalar definition.

With a float32 accumulator the fold runs on the forward matmul's register-blocked
micro-kernel (product CARRY, _make_grad_blocked): the term is g·y with y = (m_x + w) &
0xFF800000 = ±2^(E_w + carry), exact in the fast path's range, so one fused
multiply-add per term is the float32 add; blocks are chosen by the forward's tile
statistics (CLEAN, MASKED: the ±0 terms skipped, else the scalar definition).

A narrow accumulator (p_acc <= 22) runs column loops with the float32-add-and-round
steps of emu/_kernels_acc.py and adds the ±0 terms (_make_grad): each task folds two
output rows, and four rows r at a time where all eight terms take the fast path without
zeros (two independent chains of steps per column in registers; the fold's order per
output is unchanged); wider ones fold with S.fp_add.
"""
import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from . import _kernels as K
from . import _kernels_acc as KA
from . import _scalar as S
from . import _scalar_grad as G
from . import _scalar_mul as SM
from . import _scalar_approx as A
from ._kernels import as_f32
from ._numba_cache import drop_stale, njit_variant
from ._tiles import CLEAN, GENERAL, MASKED, task_index, tile_mode_range
from .registry import ops


drop_stale(__file__)


# --- elementwise ------------------------------------------------------------------

def _unary(op, parallel):
    return K.pairwise(op.grads[0], f"grad {op.name} parallel={parallel}", parallel)


def binary_step(op_a, op_b):
    """Element i of a binary op's two exact derivatives, operands rounded first (not
    when ``raw``: float32's rounding is the identity): the body of the CPU kernel below
    and of the CUDA kernel (emu/_cuda.py)."""
    @register_jitable
    def step(a, b, d, outa, outb, i, fc, raw):
        if raw:
            x, y, g = np.int64(a[i]), np.int64(b[i]), np.int64(d[i])
        else:
            x, y, g = S.operand(a[i], fc), S.operand(b[i], fc), S.operand(d[i], fc)
        outa[i] = op_a(x, y, g, fc)
        outb[i] = op_b(x, y, g, fc)
    return step


def _binary(op, parallel):
    op_a, op_b = op.grads

    def kernel(a, b, d, outa, outb, fc):
        # (not binary_step: its operand rounding, a runtime branch there, would keep
        # quantize in the float32 loop, which LLVM then neither inlines nor vectorises)
        if S.is_float32(fc):
            for i in prange(a.size):
                x, y, g = np.int64(a[i]), np.int64(b[i]), np.int64(d[i])
                outa[i] = op_a(x, y, g, fc)
                outb[i] = op_b(x, y, g, fc)
        else:
            for i in prange(a.size):
                x, y, g = S.operand(a[i], fc), S.operand(b[i], fc), S.operand(d[i], fc)
                outa[i] = op_a(x, y, g, fc)
                outb[i] = op_b(x, y, g, fc)
    return njit_variant(f"grad {op.name} parallel={parallel}", parallel=parallel)(kernel)


#: one CPU kernel per differentiable op of the registry (emu/registry.py), by name, and
#: its serial twin (emu/_kernels.py); the CUDA kernels (emu/_cuda.py) are built from the
#: same exact-derivative definitions
UNARY = {op.name: _unary(op, True) for op in ops(1, differentiable=True)}
BINARY = {op.name: _binary(op, True) for op in ops(2, differentiable=True)}
UNARY_SERIAL = {op.name: _unary(op, False) for op in ops(1, differentiable=True)}
BINARY_SERIAL = {op.name: _binary(op, False) for op in ops(2, differentiable=True)}


def _approx_unary(op, parallel):
    rule, rule32 = op.approx_scalar, A.FLOAT32[op.approx_scalar.__name__]

    def kernel(x, d, out, ln2, fc):
        if S.is_float32(fc):        # the rule specialised for float32 (no operand rounding)
            for i in prange(x.size):
                out[i] = rule32(np.int64(x[i]), np.int64(d[i]), ln2, fc)
        else:
            for i in prange(x.size):
                out[i] = rule(np.int64(x[i]), np.int64(d[i]), ln2, fc)
    return njit_variant(f"approx {op.name} parallel={parallel}", parallel=parallel)(kernel)


def _approx_binary(op, parallel):
    rule, rule32 = op.approx_scalar, A.FLOAT32[op.approx_scalar.__name__]

    def kernel(a, b, d, outa, outb, ln2, fc):
        if S.is_float32(fc):        # the rule specialised for float32 (no operand rounding)
            for i in prange(a.size):
                outa[i], outb[i] = rule32(np.int64(a[i]), np.int64(b[i]), np.int64(d[i]),
                                          ln2, fc)
        else:
            for i in prange(a.size):
                outa[i], outb[i] = rule(np.int64(a[i]), np.int64(b[i]), np.int64(d[i]), ln2,
                                        fc)
    return njit_variant(f"approx {op.name} parallel={parallel}", parallel=parallel)(kernel)


#: the approximate derivatives (Table 1) as one kernel per op, from their scalar form
#: (emu/_scalar_approx.py; emu.grad runs the registry's sequence of calls, same bits):
#: ``APPROX[parallel][name]``
APPROX = {par: {**{op.name: _approx_unary(op, par) for op in ops(1, differentiable=True)},
                **{op.name: _approx_binary(op, par) for op in ops(2, differentiable=True)}}
          for par in (True, False)}


# --- exact PAM-matmul gradient ------------------------------------------------------

@njit(parallel=True, cache=True)
def _w_stats(w, fc):
    """Per (batch, row r) of w: exponent range of its normal entries (empty for an
    all-zero row), whether it holds zeros/subnormals, and whether it holds inf/NaN."""
    nb, R, C = w.shape
    lo = np.empty((nb, R), np.int64)
    hi = np.empty((nb, R), np.int64)
    hz = np.zeros((nb, R), np.bool_)
    hs = np.zeros((nb, R), np.bool_)
    for t in prange(nb * R):
        b = t // R
        r = t % R
        mn = np.int64(S.INF32)
        mx = np.int64(0)
        zero = False
        for c in range(C):
            u = np.int64(w[b, r, c]) & S.ABS32
            if u < fc.minnorm32:
                zero = True
            else:
                mn = min(mn, u & 0x7F800000)
                mx = max(mx, u & 0x7F800000)
        lo[b, r] = mn
        hi[b, r] = mx
        hz[b, r] = zero
        hs[b, r] = mx >= S.INF32
    return lo, hi, hz, hs


@njit(parallel=True, cache=True)
def _x_mantissas(x, fc):
    """Mantissa fields of x (0 for zero/DAZ/inf) and per-row NaN flags."""
    nb, P, C = x.shape
    xm = np.empty((nb, P, C), np.int32)
    xnan = np.zeros((nb, P), np.bool_)
    for t in prange(nb * P):
        b = t // P
        p = t % P
        for c in range(C):
            u = np.int64(x[b, p, c]) & S.ABS32
            if u > S.INF32:
                xnan[b, p] = True
            xm[b, p, c] = np.int32(G._man(u, fc))
    return xm, xnan


@njit(parallel=True, cache=True)
def _w_less_one(w):
    """w - ONE32 (mod 2^32) per entry: the fast path's term is d + ((m_x + w - ONE32) &
    HI): the mantissa sum's carry lands in w's exponent (w - ONE32 has w's mantissa
    field and, above it, its sign and exponent minus ONE32), and HI clears the rest."""
    w1 = np.empty(w.shape, np.int32)
    flat, out = w.reshape(-1), w1.reshape(-1)
    for i in prange(flat.size):
        out[i] = np.int32(np.uint32((np.int64(flat[i]) - S.ONE32) & S.M32))
    return w1


@register_jitable
def _fast_row(d, clean, lo, hi, fc):
    """Whether row r's terms take the integer fast path: a clean row (no NaN in x's
    row, no inf/NaN in w's), a normal finite d, and every term normal and finite
    (w's exponent range, the carry included)."""
    ud = d & S.ABS32
    return (clean and fc.minnorm32 <= ud < S.INF32 and ud + lo - S.ONE32 >= fc.minnorm32
            and ud + hi - S.ONE32 + 0x800000 <= fc.max32)


@register_jitable
def _output_row(t, P, ix, iw):
    """``(batch, row, x's batch, w's batch)`` of task t of a fold's loop over rows."""
    bo = t // P
    return bo, t % P, ix[bo], iw[bo]


@njit(parallel=True, cache=True)
def _matmul_grad_fmtacc(g, x, w, ix, iw, fc, fca):
    """The same fold accumulating in the format ``fca`` (each step one fp_add)."""
    nout, P, R = g.shape
    C = x.shape[2]
    out = np.empty((nout, P, C), np.int32)
    for t in prange(nout * P):
        bo, p, bx, bw = _output_row(t, P, ix, iw)
        acc = np.zeros(C, np.int64)
        for r in range(R):
            d = g[bo, p, r]
            for c in range(C):
                acc[c] = S.fp_add(acc[c], G.pam_mul_da(x[bx, p, c], w[bw, r, c], d, fc), fca)
        for c in range(C):
            out[bo, p, c] = np.int32(np.uint32(acc[c]))
    return out.view(np.float32)


@njit(parallel=True, cache=True)
def matmul_grad_mul(g, x, w, ix, iw, fc, fca, mp, own_first):
    """The exact fold for a multiplier other than PAM (``mp``, kind SUM): each term the
    slope of the product with respect to x applied to g (SM.product_da, or product_db
    where x is the product's second operand: ``own_first`` False), each step one
    fp_add into ``fca`` (float32's consts for the float32 accumulator)."""
    nout, P, R = g.shape
    C = x.shape[2]
    out = np.empty((nout, P, C), np.int32)
    for t in prange(nout * P):
        bo, p, bx, bw = _output_row(t, P, ix, iw)
        acc = np.zeros(C, np.int64)
        for r in range(R):
            d = np.int64(g[bo, p, r]) & 0xFFFFFFFF
            for c in range(C):
                xv = np.int64(x[bx, p, c]) & 0xFFFFFFFF
                wv = np.int64(w[bw, r, c]) & 0xFFFFFFFF
                y = SM.product_da(xv, wv, d, fc, mp) if own_first else \
                    SM.product_db(wv, xv, d, fc, mp)
                acc[c] = S.fp_add(acc[c], y, fca)
        for c in range(C):
            out[bo, p, c] = np.int32(np.uint32(acc[c]))
    return out.view(np.float32)


HI_BITS = np.int32(-0x800000)       # 0xFF800000: a pattern's sign and exponent


def _make_grad(narrow):
    """The fold of the module docstring with a narrow accumulator, vectorised over c,
    with the integer fast path for the terms: g (nout, P, R), x (nx, P, C), w (nw, R, C)
    int32 patterns of format values, ix/iw mapping each output batch to its x/w batch,
    ``ac`` the accumulator's KA.AccConsts; returns float32 (nout, P, C).

    ``narrow``, a KA.StepKind (sticky, e8, f16): the accumulator (p_acc <= 22) and its
    float32-add-and-round steps of emu/_kernels_acc.py (STICKY or PLAIN, chosen by the
    caller; E = 8 or narrower; F16).  A ±0 term is added, not skipped (a narrow
    accumulator can hold -0, and -0 + +0 = +0): it is ((d XOR w) & sign) — +0 in
    formats without -0 — wherever the row is clean (no NaN in x's row, no inf/NaN in
    w's) and d or w is zero-class, exactly what G.pam_mul_da gives there (a ZERO slope,
    or a POW2 slope times a zero-class d).  The float32 accumulator has its own
    register-blocked kernel (_make_grad_blocked)."""
    step, step_finite = KA.steps(*narrow)

    @register_jitable
    def row_term(acc, g, x, w, w1, xm, nan_row, lo, hi, hz, hs, bo, p, bx, bw, r, fc, ac):
        """One r of output row p: acc[c] += its term, c = 0..C-1 (the ±0 terms, the
        integer fast path, with or without zeros in w's row, or the scalar definition)."""
        C = acc.size
        sgn = np.int32(-0x80000000)
        nz = np.int32(np.uint32(fc.negzero32))
        d = np.int64(g[bo, p, r])
        ud = d & S.ABS32
        clean = not (nan_row or hs[bw, r])
        wr = w[bw, r]
        xmr = xm[bx, p]
        if clean and ud < fc.minnorm32:       # ±0 terms only
            sd = np.int32(np.uint32(d & S.SIGN32))
            for c in range(C):
                acc[c] = step_finite(acc[c], (sd ^ wr[c]) & sgn & nz, ac)
        elif _fast_row(d, clean, lo[bw, r], hi[bw, r], fc):
            di = np.int32(d)
            wl = w1[bw, r]
            if hz[bw, r]:
                sd = np.int32(np.uint32(d & S.SIGN32))
                for c in range(C):
                    y = np.int32(di + ((xmr[c] + wl[c]) & HI_BITS))
                    if (wr[c] & np.int32(S.ABS32)) < np.int32(fc.minnorm32):
                        y = (sd ^ wr[c]) & sgn & nz
                    acc[c] = step_finite(acc[c], y, ac)
            else:
                for c in range(C):
                    acc[c] = step_finite(acc[c], np.int32(di + ((xmr[c] + wl[c]) & HI_BITS)), ac)
        else:
            xr = x[bx, p]
            for c in range(C):
                acc[c] = step(acc[c], np.int32(np.uint32(G.pam_mul_da(xr[c], wr[c], d, fc))), ac)

    @register_jitable
    def group_fast(g, nan_row, lo, hi, hz, hs, bo, p, bw, r, fc):
        """Whether rows r..r+3 all take the fast path without zeros in w."""
        ok = True
        for q in range(r, r + 4):
            ok = ok and not hz[bw, q] and _fast_row(np.int64(g[bo, p, q]), not (
                nan_row or hs[bw, q]), lo[bw, q], hi[bw, q], fc)
        return ok

    @njit_variant(f"narrow={tuple(narrow)}", parallel=True)
    def kernel(g, x, w, ix, iw, fc, ac):
        nout, P, R = g.shape
        C = x.shape[2]
        lo, hi, hz, hs = _w_stats(w, fc)
        xm, xnan = _x_mantissas(x, fc)
        w1 = _w_less_one(w)
        out = np.empty((nout, P, C), np.int32)
        sgn = np.int32(-0x80000000)
        PB = (P + 1) // 2
        # two output rows per task: two independent chains of adds per column hide the
        # adds' latency, and the four rows of w loaded serve both
        for t in prange(nout * PB):
            bo = t // PB
            p0 = (t % PB) * 2
            two = p0 + 1 < P
            p1 = p0 + 1 if two else p0
            bx, bw = ix[bo], iw[bo]
            acc0 = np.zeros(C, np.int32)
            acc1 = np.zeros(C, np.int32)
            x0, x1 = xm[bx, p0], xm[bx, p1]
            n0, n1 = xnan[bx, p0], xnan[bx, p1]
            r = 0
            while r < R:
                # four fast rows of w: each accumulator stays in a register for four steps
                # (still in increasing r)
                if r + 4 <= R and group_fast(g, n0, lo, hi, hz, hs, bo, p0, bw, r, fc) \
                        and group_fast(g, n1, lo, hi, hz, hs, bo, p1, bw, r, fc):
                    d0, d1 = np.int32(g[bo, p0, r]), np.int32(g[bo, p0, r + 1])
                    d2, d3 = np.int32(g[bo, p0, r + 2]), np.int32(g[bo, p0, r + 3])
                    e0, e1 = np.int32(g[bo, p1, r]), np.int32(g[bo, p1, r + 1])
                    e2, e3 = np.int32(g[bo, p1, r + 2]), np.int32(g[bo, p1, r + 3])
                    w0, wa, wb, wc = w1[bw, r], w1[bw, r + 1], w1[bw, r + 2], w1[bw, r + 3]
                    for c in range(C):
                        m, n = x0[c], x1[c]
                        u0, ua, ub, uc = w0[c], wa[c], wb[c], wc[c]
                        a = step_finite(acc0[c], np.int32(d0 + ((m + u0) & HI_BITS)), ac)
                        b = step_finite(acc1[c], np.int32(e0 + ((n + u0) & HI_BITS)), ac)
                        a = step_finite(a, np.int32(d1 + ((m + ua) & HI_BITS)), ac)
                        b = step_finite(b, np.int32(e1 + ((n + ua) & HI_BITS)), ac)
                        a = step_finite(a, np.int32(d2 + ((m + ub) & HI_BITS)), ac)
                        b = step_finite(b, np.int32(e2 + ((n + ub) & HI_BITS)), ac)
                        acc0[c] = step_finite(a, np.int32(d3 + ((m + uc) & HI_BITS)), ac)
                        acc1[c] = step_finite(b, np.int32(e3 + ((n + uc) & HI_BITS)), ac)
                    r += 4
                    continue
                row_term(acc0, g, x, w, w1, xm, n0, lo, hi, hz, hs, bo, p0, bx, bw, r, fc, ac)
                if two:
                    row_term(acc1, g, x, w, w1, xm, n1, lo, hi, hz, hs, bo, p1, bx, bw, r, fc,
                             ac)
                r += 1
            for k in range(2 if two else 1):
                acc = acc0 if k == 0 else acc1
                for c in range(C):          # as the forward kernel writes C
                    v = acc[c]
                    v = ac.negzero if v == sgn else v
                    out[bo, p0 + k, c] = np.int32(S.QNAN32) \
                        if (v & np.int32(S.ABS32)) > np.int32(S.INF32) else v
        return out.view(np.float32)

    return kernel


@njit(parallel=True, cache=True)
def _x_tiles(xm, Pq, npan):
    """x's mantissa fields as QR x PW tiles, (nx, Pq/QR, npan, QR, PW), zero padded:
    the tile of (row block q, panel p) is contiguous for the micro-kernel."""
    nx, P, C = xm.shape
    out = np.zeros((nx, Pq // K.QR, npan, K.QR, K.PW), np.int32)
    for t in prange(nx * P):
        bx = t // P
        i = t % P
        for c in range(C):
            out[bx, i // K.QR, c // K.PW, i % K.QR, c % K.PW] = xm[bx, i, c]
    return out


@njit(parallel=True, cache=True)
def _rows_padded(g, Pq):
    """g (n, P, R), any strides (δYᵀ is a transposed view), copied C-contiguous with
    zero rows up to Pq, in 64 x 64 tiles (a transposed read stays in cache)."""
    n, P, R = g.shape
    out = np.zeros((n, Pq, R), np.int32)
    nti, ntj = (P + 63) // 64, (R + 63) // 64
    for t in prange(n * nti * ntj):
        b, ti, tj = task_index(t, nti, ntj)
        for i in range(ti * 64, min(P, ti * 64 + 64)):
            for r in range(tj * 64, min(R, tj * 64 + 64)):
                out[b, i, r] = g[b, i, r]
    return out


def _make_grad_blocked():
    """The float32-accumulator fold on the forward matmul's register-blocked micro-kernel
    (emu/_kernels.py, product CARRY): A = g (rows p, k = r), B = w (matmul_prepare_b
    with c32 = ONE32), x's mantissas as a tile per (row block, panel); each term is
    g·±2^(E_w + carry), exact, fused into the add.
    A (row block, k group) block is CLEAN where g and w are normal and every term is
    normal and finite (the pattern sum between w's sign and exponent and w + 2^23, and
    2^(E_w + 1) finite),
    MASKED where zeros occur (their ±0 terms are skipped: the float32 accumulator is
    never -0), SKIP without normal operands; where x's rows hold a NaN, or a term may
    leave the normal range, each term takes the scalar definition, except (FLUSH and
    FLUSH_OVF, emu/_kernels.py) where every operand is finite and every term g·2^(E_w +
    carry) is a normal float32: then it is formed exactly, flushed to ±0 (not added)
    below fmt's min normal, and overflowed above its max, as apply_slope does."""
    # half tiles: the mantissa tile and the accumulators together fill the registers
    H = K.QR // 2
    (mk_clean, mk_a, mk_b, mk_ab, mk_fl, mk_fl_a, mk_fl_b, mk_fl_ab, mk_ov, mk_ov_a, mk_ov_b,
     mk_ov_ab) = (K._micro_kernel(ma, mb, prod=K.CARRY, rows=H, flush=fl)
                  for fl in (0, K.FLUSH, K.FLUSH_OVF)
                  for ma, mb in ((False, False), (True, False), (False, True), (True, True)))
    QR, PW, NV, KG, KC = K.QR, K.PW, K.NV, K.KG, K.KC
    qt, pt = K.MB // QR, K.NB // PW

    @njit_variant(f"grad blocked lanes={K.W}", parallel=True)
    def kernel(gp, Am, sta, Bp, Bm, stb, x, xnan, xt, ix, iw, fc, P):
        nout, Pq, R = gp.shape
        C = x.shape[2]
        npan = Bp.shape[1]
        nq = Pq // QR
        ng = (R + KG - 1) // KG
        flc = K.flush_consts(fc)
        nti = (nq + qt - 1) // qt
        ntj = (npan + pt - 1) // pt
        out = np.empty((nout, P, C), np.float32)
        for t in prange(nout * nti * ntj):
            bo, bi, bj = task_index(t, nti, ntj)
            bx, bw = ix[bo], iw[bo]
            q0 = bi * qt
            nql = min(nq, q0 + qt) - q0
            p0 = bj * pt
            npl = min(npan, p0 + pt) - p0
            modes = np.empty((nql, ng), np.int8)
            for q in range(nql):
                nan = False
                for i in range((q0 + q) * QR, min(P, (q0 + q + 1) * QR)):
                    nan = nan or xnan[bx, i]
                for gi in range(ng):
                    sa = sta[bo, q0 + q, gi]
                    sb = stb[bw, bj, gi]
                    # (2^(E_w + carry) must be finite too)
                    m = GENERAL if nan or sb[1] + 0x800000 >= S.INF32 else tile_mode_range(
                        sa[0], sa[1], sa[2], sb[0], sb[1], sb[2], fc, -0x7FFFFF, 0x800000)
                    if m == MASKED:
                        m = K._MASK_AB if sa[2] and sb[2] else (K._MASK_A if sa[2] else K._MASK_B)
                    elif m == GENERAL and not nan and sb[1] + 0x800000 < S.INF32:
                        # every term a normal float32
                        m = K.flush_mode(sa, sb, -0x7FFFFF, 0x800000, 0x800000, S.INF32, fc)
                    modes[q, gi] = m
            acc = np.zeros((npl, nql * QR, PW), np.float32)
            accf = acc.reshape(-1)
            af = gp[bo].reshape(-1)
            amf = Am[bo].reshape(-1)
            xf = xt[bx].reshape(-1)
            for kc0 in range(0, R, KC):
                kc1 = min(R, kc0 + KC)
                for p in range(npl):
                    bpf = Bp[bw, p0 + p].reshape(-1)
                    bmf = Bm[bw, p0 + p].reshape(-1)
                    for q in range(nql):
                        off = (p * nql + q) * QR * PW
                        xo = ((q0 + q) * npan + p0 + p) * QR * PW
                        gi = kc0 // KG
                        while gi * KG < kc1:
                            m = modes[q, gi]
                            g1 = gi + 1
                            while g1 * KG < kc1 and modes[q, g1] == m:
                                g1 += 1
                            ka = gi * KG
                            nk = min(kc1, g1 * KG) - ka
                            ao = (q0 + q) * QR * R + ka
                            if m != GENERAL:
                                for h in range(0, QR, H):
                                    ho, ha = off + h * PW, ao + h * R
                                    hx = xo + h * PW
                                    if m == CLEAN:
                                        mk_clean(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._MASK_A:
                                        mk_a(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._MASK_B:
                                        mk_b(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._MASK_AB:
                                        mk_ab(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._FLUSH:
                                        mk_fl(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._FLUSH + 1:
                                        mk_fl_a(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._FLUSH + 2:
                                        mk_fl_b(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._FLUSH + 3:
                                        mk_fl_ab(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._FLUSH_OVF:
                                        mk_ov(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._FLUSH_OVF + 1:
                                        mk_ov_a(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._FLUSH_OVF + 2:
                                        mk_ov_b(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                                    elif m == K._FLUSH_OVF + 3:
                                        mk_ov_ab(accf, ho, bpf, ka * PW, bmf, ka * NV, af, amf,
                                             amf, ha, R, nk, xf, hx, flc)
                            else:
                                for r in range(QR):
                                    i = (q0 + q) * QR + r
                                    if i >= P:
                                        continue
                                    acc_row = acc[p, q * QR + r]
                                    c0 = (p0 + p) * PW
                                    for k in range(ka, ka + nk):
                                        d = gp[bo, i, k]
                                        w_row = Bp[bw, p0 + p, 0, k]       # w itself
                                        for j in range(min(PW, C - c0)):
                                            acc_row[j] += as_f32(np.int32(np.uint32(G.pam_mul_da(
                                                x[bx, i, c0 + j], w_row[j], d, fc))))
                            gi = g1
            for p in range(npl):
                for q in range(nql):
                    for r in range(QR):
                        i = (q0 + q) * QR + r
                        if i < P:
                            c0 = (p0 + p) * PW
                            for j in range(min(PW, C - c0)):
                                v = acc[p, q * QR + r, j]
                                out[bo, i, c0 + j] = np.float32(np.nan) if v != v else v
        return out

    def run(g, x, w, ix, iw, fc):
        """The operands prepared here, in whatever layout they come (δYᵀ and Bᵀ are
        transposed views), so that the kernel below compiles once, for C arrays."""
        P = g.shape[1]
        gp = g if g.flags.c_contiguous and P % QR == 0 else _rows_padded(g, -(-P // QR) * QR)
        Am, sta = K.matmul_prepare_a(gp, fc)
        # (packing reads w's rows: a transposed w is copied in tiles first, 7 -> 4 ms)
        w = w if w.flags.c_contiguous else _rows_padded(w, w.shape[1])
        Bp, Bm, stb = K.matmul_prepare_b(w, fc, S.ONE32, K.NO_TABLE, 0)    # w itself
        x = x if x.flags.c_contiguous else _rows_padded(x, P)     # tiled: faster than numpy
        xm, xnan = _x_mantissas(x, fc)
        return kernel(gp, Am, sta, Bp, Bm, stb, x, xnan, _x_tiles(xm, gp.shape[1], Bp.shape[1]),
                      ix, iw, fc, P)

    return run


_GRAD = {}          # the gradient kernels by accumulator kind, built on first use


def matmul_grad(g, x, w, ix, iw, fc, fca):
    """Dispatch: float32 accumulation (fast paths), a narrow accumulator with p_acc <=
    22 (the float32-add-and-round steps, PLAIN where every term has at most p_acc
    significant bits: those of g, or of fmt's max where a term saturates), or a wider
    one (fp_add per step)."""
    if fca is None:
        if None not in _GRAD:
            _GRAD[None] = _make_grad_blocked()
        return _GRAD[None](g, x, w, ix, iw, fc)
    g, x, w = (np.ascontiguousarray(v) for v in (g, x, w))     # views of transposes
    if not KA.fast_path(fca):
        return _matmul_grad_fmtacc(g, x, w, ix, iw, fc, fca)
    sticky = KA.needs_sticky(g, None, fc, fca, 0 if fc.has_inf else fc.max32 & G.MAN32)
    f16 = not sticky and KA.HAS_F16C and KA.is_binary16(fca)
    e8 = KA.is_e8(fca) and not f16
    key = KA.StepKind(sticky, e8, f16)
    if key not in _GRAD:
        _GRAD[key] = _make_grad(key)
    return _GRAD[key](g, x, w, ix, iw, fc, KA.acc_consts(fca))

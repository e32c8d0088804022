"""The fused composites' definitions: each composite's forward and backward, element by
element (or row by row), as ``register_jitable`` functions.

A composite of torch_bridge (softmax, layer norm, cross-entropy, GELU, ...) is a graph of
PA primitives (emu's operations, each with its operands rounded into the format by
``round_to``) and float32 additions, negations, selections and defined-order sums
(emu.fold_sum).  Its backward is the chain of the nodes' derivatives (Table 1, exact or
approximate, each node rounding its incoming gradient), accumulated by autograd.  The
functions here compute the same nodes in the same order on one element or one row:

* every PA node is emu's scalar definition (emu/_scalar.py) of its operands after
  ``rnd`` (round_to's rounding; its result is a value of the format, which the kernels'
  own RNE operand rounding leaves alone), every derivative node emu's exact derivative
  (emu/_scalar_grad.py) or approximate rule (emu/_scalar_approx.py) of its saved
  operands and its rounded incoming gradient;
* float32 additions are float32 additions, negation flips the sign bit, ``where`` and
  ``clamp`` select as torch does (their backward passes the gradient or a +0);
* sums are emu.fold_sum's left fold (emu/_kernels_reduce.fold);
* a tensor that several nodes read gets its gradient contributions added in the order
  autograd adds them (the order its consumers' backward nodes run: the reverse of their
  creation where they are ready together); where the composite's *input* receives
  several contributions, they are returned separately ("slots") for autograd to add
  in that order after whatever the input received before.

tests/test_fused.py proves each against its graph bit for bit.  ``define`` builds the
functions on one target's float32 primitives (the CPU's here; the structure is not
repeated per target).  Patterns are float32 bit patterns held in int64, as in emu.
"""
import numpy as np
from numba.extending import register_jitable

from emu.lowlevel import fold
from emu.lowlevel import scalar as S
from emu.lowlevel import scalar_approx as A
from emu.lowlevel import scalar_grad as G

EXACT, APPROX = 0, 1
SIGN32 = S.SIGN32
ONE32 = S.ONE32
EXP_MAX = np.float32(88.0)     # elementwise._EXP_MAX: paexp's argument is clamped there
ERF_XMAX = np.float32(16.0)    # elementwise._ERF_XMAX: |x| is clamped there in GELU's erf

# layout of the constants array ``c`` handed to each composite (patterns; "R" entries are
# rounded into the format by the caller, as round_to rounds a constant operand)
C_ONE = 0          # R(1.0): the numerator of 1 ÷̂ d
C_A = 1            # composite-specific constants from here


def define(F, P, fadd, fsub, f32):
    """The composites on a target whose float32 <-> pattern moves are ``F`` (pattern to
    float32) and ``P`` (float32 to pattern) and whose float32 addition and subtraction
    are ``fadd``, ``fsub``; ``f32``: for the float32 format alone (every rounding is the
    identity, compiled out: emu/_scalar_approx.rules says why), else for any other.
    Returns them as a dict of register_jitable functions."""
    AR = A.FLOAT32 if f32 else A.GENERAL
    approx_mul, approx_div = AR["pam_mul_approx"], AR["pa_div_approx"]
    approx_exp, approx_exp2 = AR["pa_exp_approx"], AR["pa_exp2_approx"]
    approx_log, approx_log2 = AR["pa_log_approx"], AR["pa_log2_approx"]
    approx_sqrt = AR["pa_sqrt_approx"]

    # --- the nodes ----------------------------------------------------------------------

    @register_jitable
    def rnd(p, fc, mode):
        """round_to: ``p`` rounded into the format with ``mode`` (float32: as it is)."""
        if f32:
            return p
        return S.quantize(p, fc, mode, True, False, 0, 0)

    @register_jitable
    def add(a, b):
        return P(fadd(F(a), F(b)))

    @register_jitable
    def sub(a, b):
        return P(fsub(F(a), F(b)))

    @register_jitable
    def neg(a):
        return a ^ SIGN32

    @register_jitable
    def clamp_max(a, c):
        """torch's clamp(max=c): c above it, a NaN stays."""
        return P(c) if F(a) > c else a

    @register_jitable
    def pass_if(cond, g):
        """The backward of a selection: the gradient where it was selected, else +0."""
        return g if cond else np.int64(0)

    @register_jitable
    def mul_g(a, b, g, kind, ln2, fc, mode):
        """(δA, δB) of a PAM node with saved operands a, b; g its incoming gradient."""
        g = rnd(g, fc, mode)
        if kind == EXACT:
            return G.pam_mul_da(a, b, g, fc), G.pam_mul_db(a, b, g, fc)
        return approx_mul(a, b, g, ln2, fc)

    @register_jitable
    def div_g(a, b, g, kind, ln2, fc, mode):
        g = rnd(g, fc, mode)
        if kind == EXACT:
            return G.pa_div_da(a, b, g, fc), G.pa_div_db(a, b, g, fc)
        return approx_div(a, b, g, ln2, fc)

    @register_jitable
    def exp_g(x, g, kind, ln2, fc, mode):
        g = rnd(g, fc, mode)
        if kind == EXACT:
            return G.pa_exp_dx(x, g, fc)
        return approx_exp(x, g, ln2, fc)

    @register_jitable
    def exp2_g(x, g, kind, ln2, fc, mode):
        g = rnd(g, fc, mode)
        if kind == EXACT:
            return G.pa_exp2_dx(x, g, fc)
        return approx_exp2(x, g, ln2, fc)

    @register_jitable
    def log_g(x, g, kind, ln2, fc, mode):
        g = rnd(g, fc, mode)
        if kind == EXACT:
            return G.pa_log_dx(x, g, fc)
        return approx_log(x, g, ln2, fc)

    @register_jitable
    def log2_g(x, g, kind, ln2, fc, mode):
        g = rnd(g, fc, mode)
        if kind == EXACT:
            return G.pa_log2_dx(x, g, fc)
        return approx_log2(x, g, ln2, fc)

    @register_jitable
    def sqrt_g(x, g, kind, ln2, fc, mode):
        g = rnd(g, fc, mode)
        if kind == EXACT:
            return G.pa_sqrt_dx(x, g, fc)
        return approx_sqrt(x, g, ln2, fc)

    # --- sigmoid, tanh, SiLU (elementwise.py) -------------------------------------------

    @register_jitable
    def exp_neg(x, fc, mode):
        """``d = 1.0 + paexp(min(-x, 88))`` rounded for the division, and the clamped
        argument ``c`` (rounded: paexp's saved operand): elementwise._exp_neg."""
        c = rnd(clamp_max(neg(x), EXP_MAX), fc, mode)
        return rnd(add(S.pa_exp(c, fc), ONE32), fc, mode), c

    @register_jitable
    def exp_neg_g(x, c, gd, kind, ln2, fc, mode):
        """δx of ``exp_neg`` given δd: through the add, paexp, the clamp, the negation."""
        gc = exp_g(c, gd, kind, ln2, fc, mode)
        return neg(pass_if(F(neg(x)) <= EXP_MAX, gc))

    @register_jitable
    def sigmoid(x, c, fc, mode):
        """``1 ÷̂ (1 + paexp(min(-x, 88)))``."""
        d, _ = exp_neg(x, fc, mode)
        return S.pa_div(c[C_ONE], d, fc)

    @register_jitable
    def sigmoid_g(x, g, c, kind, ln2, fc, mode):
        d, ce = exp_neg(x, fc, mode)
        gd = div_g(c[C_ONE], d, g, kind, ln2, fc, mode)[1]
        return exp_neg_g(x, ce, gd, kind, ln2, fc, mode)

    @register_jitable
    def tanh_fwd(x, c, fc, mode):
        """``s + s - 1``, ``s = sigmoid(x + x)``."""
        s = sigmoid(add(x, x), c, fc, mode)
        return sub(add(s, s), ONE32)

    @register_jitable
    def tanh_bwd(x, g, c, kind, ln2, fc, mode, dx, i):
        """Slots: x + x gives x two contributions, the same δ."""
        gxx = sigmoid_g(add(x, x), add(g, g), c, kind, ln2, fc, mode)
        dx[0, i] = F(gxx)
        dx[1, i] = F(gxx)

    @register_jitable
    def sigmoid_fwd(x, c, fc, mode):
        return sigmoid(x, c, fc, mode)

    @register_jitable
    def sigmoid_bwd(x, g, c, kind, ln2, fc, mode, dx, i):
        dx[0, i] = F(sigmoid_g(x, g, c, kind, ln2, fc, mode))

    @register_jitable
    def silu_fwd(x, c, fc, mode):
        """``x ÷̂ (1 + paexp(min(-x, 88)))``."""
        d, _ = exp_neg(x, fc, mode)
        return S.pa_div(rnd(x, fc, mode), d, fc)

    @register_jitable
    def silu_bwd(x, g, c, kind, ln2, fc, mode, dx, i):
        """Slots: the division's numerator, then the exponential's argument."""
        d, ce = exp_neg(x, fc, mode)
        gx, gd = div_g(rnd(x, fc, mode), d, g, kind, ln2, fc, mode)
        dx[0, i] = F(gx)
        dx[1, i] = F(exp_neg_g(x, ce, gd, kind, ln2, fc, mode))

    # --- GELU, tanh form ------------------------------------------------------------------

    @register_jitable
    def gelu_tanh_nodes(x, c, fc, mode):
        rx = rnd(x, fc, mode)
        xx = rnd(S.pam_mul(rx, rx, fc), fc, mode)
        cube = rnd(S.pam_mul(xx, rx, fc), fc, mode)
        u = rnd(add(x, S.pam_mul(cube, c[C_A], fc)), fc, mode)
        z2 = S.pam_mul(u, c[C_A + 1], fc)
        d, ce = exp_neg(z2, fc, mode)
        return rx, xx, cube, u, z2, d, ce

    @register_jitable
    def gelu_tanh_fwd(x, c, fc, mode):
        """``x ÷̂ (1 + paexp(min(-((x + C ·̂ ((x ·̂ x) ·̂ x)) ·̂ K), 88)))``."""
        rx, _, _, _, _, d, _ = gelu_tanh_nodes(x, c, fc, mode)
        return S.pa_div(rx, d, fc)

    @register_jitable
    def gelu_tanh_bwd(x, g, c, kind, ln2, fc, mode, dx, i):
        """Slots: the division, the addition, the cube's PAM, x ·̂ x's two operands."""
        rx, xx, cube, u, z2, d, ce = gelu_tanh_nodes(x, c, fc, mode)
        g_div, gd = div_g(rx, d, g, kind, ln2, fc, mode)
        gu = mul_g(u, c[C_A + 1], exp_neg_g(z2, ce, gd, kind, ln2, fc, mode), kind, ln2,
                   fc, mode)[0]
        gcube = mul_g(cube, c[C_A], gu, kind, ln2, fc, mode)[0]
        gxx, g_cube_x = mul_g(xx, rx, gcube, kind, ln2, fc, mode)
        g_a, g_b = mul_g(rx, rx, gxx, kind, ln2, fc, mode)
        dx[0, i] = F(g_div)
        dx[1, i] = F(gu)
        dx[2, i] = F(g_cube_x)
        dx[3, i] = F(g_a)
        dx[4, i] = F(g_b)

    # --- GELU, erf form (Abramowitz & Stegun 7.1.26) -------------------------------------
    # c: [R(1), R(p'), R(b5), b4, b3, b2, b1 (float32, added), R(0.5)]

    @register_jitable
    def gelu_erf_nodes(x, c, fc, mode):
        """The forward's nodes; p1..p4 are the rounded Horner partial sums."""
        ax = neg(x) if F(x) < 0 else x
        ra = rnd(clamp_max(ax, ERF_XMAX), fc, mode)
        d = rnd(add(S.pam_mul(ra, c[C_A], fc), ONE32), fc, mode)
        rt = rnd(S.pa_div(c[C_ONE], d, fc), fc, mode)
        p1 = rnd(add(S.pam_mul(rt, c[C_A + 1], fc), c[C_A + 2]), fc, mode)
        p2 = rnd(add(S.pam_mul(rt, p1, fc), c[C_A + 3]), fc, mode)
        p3 = rnd(add(S.pam_mul(rt, p2, fc), c[C_A + 4]), fc, mode)
        p4 = rnd(add(S.pam_mul(rt, p3, fc), c[C_A + 5]), fc, mode)
        tp = rnd(S.pam_mul(rt, p4, fc), fc, mode)
        aa = rnd(S.pam_mul(ra, ra, fc), fc, mode)
        nq = rnd(neg(S.pam_mul(aa, c[C_A + 6], fc)), fc, mode)
        ex = rnd(S.pa_exp(nq, fc), fc, mode)
        h = S.pam_mul(tp, ex, fc)
        phi = rnd(h if F(x) < 0 else sub(ONE32, h), fc, mode)
        return ax, ra, d, rt, p1, p2, p3, p4, tp, aa, nq, ex, phi

    @register_jitable
    def gelu_erf_fwd(x, c, fc, mode):
        """``x ·̂ Φ(x)`` (elementwise.pa_gelu, approximate='none')."""
        phi = gelu_erf_nodes(x, c, fc, mode)[12]
        return S.pam_mul(rnd(x, fc, mode), phi, fc)

    @register_jitable
    def gelu_erf_bwd(x, g, c, kind, ln2, fc, mode, dx, i):
        """Slots: x ·̂ Φ, then |x| = where(x < 0, -x, x)'s x and -x."""
        ax, ra, d, rt, p1, p2, p3, p4, tp, aa, nq, ex, phi = gelu_erf_nodes(x, c, fc, mode)
        g_mul, gphi = mul_g(rnd(x, fc, mode), phi, g, kind, ln2, fc, mode)
        lt = F(x) < 0
        gh = add(pass_if(lt, gphi), neg(pass_if(not lt, gphi)))    # where, then 1 - h
        gtp, gex = mul_g(tp, ex, gh, kind, ln2, fc, mode)
        # paexp's branch runs first (created last), then the polynomial's, t ·̂ p4 first
        gaa = mul_g(aa, c[C_A + 6], neg(exp_g(nq, gex, kind, ln2, fc, mode)), kind, ln2,
                    fc, mode)[0]
        ga1, ga2 = mul_g(ra, ra, gaa, kind, ln2, fc, mode)
        gt, gp = mul_g(rt, p4, gtp, kind, ln2, fc, mode)
        gt4, gp = mul_g(rt, p3, gp, kind, ln2, fc, mode)
        gt3, gp = mul_g(rt, p2, gp, kind, ln2, fc, mode)
        gt2, gp = mul_g(rt, p1, gp, kind, ln2, fc, mode)
        gt1 = mul_g(rt, c[C_A + 1], gp, kind, ln2, fc, mode)[0]
        gt = add(add(add(add(gt, gt4), gt3), gt2), gt1)
        gd = div_g(c[C_ONE], d, gt, kind, ln2, fc, mode)[1]
        ga3 = mul_g(ra, c[C_A], gd, kind, ln2, fc, mode)[0]
        gax = pass_if(F(ax) <= ERF_XMAX, add(add(ga1, ga2), ga3))
        dx[0, i] = F(g_mul)
        dx[1, i] = F(pass_if(not lt, gax))
        dx[2, i] = F(neg(pass_if(lt, gax)))

    # --- softplus --------------------------------------------------------------------------
    # c: [R(1), 1 if beta == 1 else 0, R(beta), threshold (float32)]

    @register_jitable
    def softplus_nodes(x, c, fc, mode):
        unit = c[C_A] != 0
        bx = x if unit else S.pam_mul(rnd(x, fc, mode), c[C_A + 1], fc)
        cl = rnd(clamp_max(bx, F(c[C_A + 2])), fc, mode)
        d = rnd(add(S.pa_exp(cl, fc), ONE32), fc, mode)
        yl = S.pa_log(d, fc)
        return unit, bx, cl, d, yl

    @register_jitable
    def softplus_fwd(x, c, fc, mode):
        """``palog(1 + paexp(β ·̂ x)) ÷̂ β``, ``x`` where ``β x > threshold``."""
        unit, bx, _, _, yl = softplus_nodes(x, c, fc, mode)
        if not unit:
            yl = S.pa_div(rnd(yl, fc, mode), c[C_A + 1], fc)
        return x if F(bx) > F(c[C_A + 2]) else yl

    @register_jitable
    def softplus_bwd(x, g, c, kind, ln2, fc, mode, dx, i):
        """Slots: the selection's x, then the logarithm's branch."""
        unit, bx, cl, d, yl = softplus_nodes(x, c, fc, mode)
        above = F(bx) > F(c[C_A + 2])
        gy = pass_if(not above, g)
        if not unit:
            gy = div_g(rnd(yl, fc, mode), c[C_A + 1], gy, kind, ln2, fc, mode)[0]
        gcl = exp_g(cl, log_g(d, gy, kind, ln2, fc, mode), kind, ln2, fc, mode)
        gbx = pass_if(F(bx) <= F(c[C_A + 2]), gcl)
        if not unit:
            gbx = mul_g(rnd(x, fc, mode), c[C_A + 1], gbx, kind, ln2, fc, mode)[0]
        dx[0, i] = F(pass_if(above, g))
        dx[1, i] = F(gbx)

    # --- rows: softmax, log_softmax ---------------------------------------------------------
    # c: [R(1), R(log2e)]; rows of n at x[base:base + n]

    @register_jitable
    def shift(x, base, n, y, c, fc, mode):
        """``y ·̂ log2e`` into y[base:], and ``k = floor(max)`` (NaN if a NaN): the constant
        shift of functional._exp_shifted."""
        mx = np.float32(-np.inf)
        nan = False
        for j in range(n):
            v = F(S.pam_mul(rnd(P(x[base + j]), fc, mode), c[C_A], fc))
            y[base + j] = v
            if v != v:
                nan = True
            elif v > mx:
                mx = v
        return P(np.float32(np.nan) if nan else np.float32(np.floor(mx)))

    @register_jitable
    def exps(x, base, n, e, c, fc, mode):
        """e[base + j] = paexp2(t_j), t = x ·̂ log2e - k; returns k."""
        k = shift(x, base, n, e, c, fc, mode)
        for j in range(n):
            e[base + j] = F(S.pa_exp2(rnd(sub(P(e[base + j]), k), fc, mode), fc))
        return k

    @register_jitable
    def t_of(x, j, k, c, fc, mode):
        return sub(S.pam_mul(rnd(P(x[j]), fc, mode), c[C_A], fc), k)

    @register_jitable
    def softmax_fwd(x, base, n, out, c, fc, mode):
        """``e ÷̂ Σ e``."""
        exps(x, base, n, out, c, fc, mode)
        s = rnd(P(fold(out, base, n, 1)), fc, mode)
        for j in range(n):
            out[base + j] = F(S.pa_div(rnd(P(out[base + j]), fc, mode), s, fc))

    @register_jitable
    def softmax_bwd(x, g, base, n, dx, tmp, c, kind, ln2, fc, mode):
        k = exps(x, base, n, tmp, c, fc, mode)
        s = rnd(P(fold(tmp, base, n, 1)), fc, mode)
        for j in range(n):
            ge, gs = div_g(rnd(P(tmp[base + j]), fc, mode), s, P(g[base + j]), kind, ln2,
                           fc, mode)
            dx[base + j] = F(ge)
            tmp[base + j] = F(gs)
        gsum = P(fold(tmp, base, n, 1))             # the broadcast's backward
        for j in range(n):
            ge = add(P(dx[base + j]), gsum)         # the division's, then the sum's
            gt = exp2_g(rnd(t_of(x, base + j, k, c, fc, mode), fc, mode), ge, kind, ln2,
                        fc, mode)
            dx[base + j] = F(mul_g(rnd(P(x[base + j]), fc, mode), c[C_A], gt, kind, ln2, fc,
                                   mode)[0])

    @register_jitable
    def log_softmax_fwd(x, base, n, out, c, fc, mode):
        """``(t - palog2(Σ paexp2(t))) ÷̂ log2e``."""
        k = exps(x, base, n, out, c, fc, mode)
        lse = S.pa_log2(rnd(P(fold(out, base, n, 1)), fc, mode), fc)
        for j in range(n):
            num = rnd(sub(t_of(x, base + j, k, c, fc, mode), lse), fc, mode)
            out[base + j] = F(S.pa_div(num, c[C_A], fc))

    @register_jitable
    def log_softmax_bwd(x, g, base, n, dx, tmp, c, kind, ln2, fc, mode):
        k = exps(x, base, n, tmp, c, fc, mode)
        ssum = rnd(P(fold(tmp, base, n, 1)), fc, mode)
        lse = S.pa_log2(ssum, fc)
        for j in range(n):
            num = rnd(sub(t_of(x, base + j, k, c, fc, mode), lse), fc, mode)
            gnum = div_g(num, c[C_A], P(g[base + j]), kind, ln2, fc, mode)[0]
            dx[base + j] = F(gnum)
            tmp[base + j] = F(neg(gnum))
        gl = P(fold(tmp, base, n, 1))
        ge = log2_g(ssum, gl, kind, ln2, fc, mode)
        for j in range(n):
            t = rnd(t_of(x, base + j, k, c, fc, mode), fc, mode)
            gt = add(P(dx[base + j]), exp2_g(t, ge, kind, ln2, fc, mode))
            dx[base + j] = F(mul_g(rnd(P(x[base + j]), fc, mode), c[C_A], gt, kind, ln2, fc,
                                   mode)[0])

    # --- rows: layer norm, RMS norm -----------------------------------------------------
    # c: [R(1), R(n), eps (float32)]; w, b: the weight and bias (length n) or empty

    @register_jitable
    def ln_stats(x, base, n, tmp, c, fc, mode):
        """(s, mean, R(ss), R(var + eps), R(pasqrt)) of a row; tmp receives (x-μ)·̂(x-μ)."""
        s = rnd(P(fold(x, base, n, 1)), fc, mode)
        mean = S.pa_div(s, c[C_A], fc)
        for j in range(n):
            xc = rnd(sub(P(x[base + j]), mean), fc, mode)
            tmp[base + j] = F(S.pam_mul(xc, xc, fc))
        ss = rnd(P(fold(tmp, base, n, 1)), fc, mode)
        v = rnd(add(S.pa_div(ss, c[C_A], fc), c[C_A + 1]), fc, mode)
        return s, mean, ss, v, rnd(S.pa_sqrt(v, fc), fc, mode)

    @register_jitable
    def layer_norm_fwd(x, base, n, w, b, out, c, fc, mode):
        """``(x-μ) ÷̂ pasqrt(Σ(x-μ)·̂(x-μ) ÷̂ n + eps)``, ``·̂ w``, ``+ b``."""
        _, mean, _, _, r = ln_stats(x, base, n, out, c, fc, mode)
        for j in range(n):
            y = S.pa_div(rnd(sub(P(x[base + j]), mean), fc, mode), r, fc)
            if w.size:
                y = S.pam_mul(rnd(y, fc, mode), rnd(P(w[j]), fc, mode), fc)
            if b.size:
                y = add(y, P(b[j]))
            out[base + j] = F(y)

    @register_jitable
    def layer_norm_bwd(x, g, base, n, w, dx, dw, tmp, c, kind, ln2, fc, mode):
        """Slots: δx through x - μ (dx) and through Σx (returned: one per row); δw per
        element (into dw)."""
        s, mean, ss, v, r = ln_stats(x, base, n, tmp, c, fc, mode)
        for j in range(n):
            xc = rnd(sub(P(x[base + j]), mean), fc, mode)
            gy = P(g[base + j])
            if w.size:
                y = rnd(S.pa_div(xc, r, fc), fc, mode)
                gy, gw = mul_g(y, rnd(P(w[j]), fc, mode), gy, kind, ln2, fc, mode)
                dw[base + j] = F(gw)
            gxc, gr = div_g(xc, r, gy, kind, ln2, fc, mode)
            dx[base + j] = F(gxc)
            tmp[base + j] = F(gr)
        gv = sqrt_g(v, P(fold(tmp, base, n, 1)), kind, ln2, fc, mode)
        gsq = div_g(ss, c[C_A], gv, kind, ln2, fc, mode)[0]
        for j in range(n):
            xc = rnd(sub(P(x[base + j]), mean), fc, mode)
            ga, gb = mul_g(xc, xc, gsq, kind, ln2, fc, mode)
            gxc = add(add(P(dx[base + j]), ga), gb)     # the division's, then (x-μ)·̂(x-μ)'s
            dx[base + j] = F(gxc)
            tmp[base + j] = F(neg(gxc))
        gmean = P(fold(tmp, base, n, 1))
        return F(div_g(s, c[C_A], gmean, kind, ln2, fc, mode)[0])

    @register_jitable
    def rms_stats(x, base, n, tmp, c, fc, mode):
        for j in range(n):
            rx = rnd(P(x[base + j]), fc, mode)
            tmp[base + j] = F(S.pam_mul(rx, rx, fc))
        ss = rnd(P(fold(tmp, base, n, 1)), fc, mode)
        v = rnd(add(S.pa_div(ss, c[C_A], fc), c[C_A + 1]), fc, mode)
        return ss, v, rnd(S.pa_sqrt(v, fc), fc, mode)

    @register_jitable
    def rms_norm_fwd(x, base, n, w, b, out, c, fc, mode):
        """``x ÷̂ pasqrt(Σ x ·̂ x ÷̂ n + eps)``, ``·̂ w``."""
        _, _, r = rms_stats(x, base, n, out, c, fc, mode)
        for j in range(n):
            y = S.pa_div(rnd(P(x[base + j]), fc, mode), r, fc)
            if w.size:
                y = S.pam_mul(rnd(y, fc, mode), rnd(P(w[j]), fc, mode), fc)
            out[base + j] = F(y)

    @register_jitable
    def rms_norm_bwd(x, g, base, n, w, dx, dx2, dx3, dw, tmp, c, kind, ln2, fc, mode):
        """Slots: δx through the division, then x ·̂ x's two operands."""
        ss, v, r = rms_stats(x, base, n, tmp, c, fc, mode)
        for j in range(n):
            rx = rnd(P(x[base + j]), fc, mode)
            gy = P(g[base + j])
            if w.size:
                y = rnd(S.pa_div(rx, r, fc), fc, mode)
                gy, gw = mul_g(y, rnd(P(w[j]), fc, mode), gy, kind, ln2, fc, mode)
                dw[base + j] = F(gw)
            gx, gr = div_g(rx, r, gy, kind, ln2, fc, mode)
            dx[base + j] = F(gx)
            tmp[base + j] = F(gr)
        gv = sqrt_g(v, P(fold(tmp, base, n, 1)), kind, ln2, fc, mode)
        gsq = div_g(ss, c[C_A], gv, kind, ln2, fc, mode)[0]
        for j in range(n):
            rx = rnd(P(x[base + j]), fc, mode)
            ga, gb = mul_g(rx, rx, gsq, kind, ln2, fc, mode)
            dx2[base + j] = F(ga)
            dx3[base + j] = F(gb)

    # --- rows: cross-entropy ------------------------------------------------------------
    # c: [R(1), R(log2e), R(1 - ε), R(ε ÷̂ C)]; w: class weights (length C) or empty;
    # q: probability targets (rows x C) or empty; ti: the row's class (0 if ignored);
    # smooth: label smoothing (ε > 0) with class targets

    @register_jitable
    def ce_nlogp(x, base, n, j, k, lse, w, c, fc, mode):
        """(R(num), -log p_j, R(-log p_j), -log p_j ·̂ w_j) of class j."""
        num = rnd(sub(lse, t_of(x, base + j, k, c, fc, mode)), fc, mode)
        nlogp = S.pa_div(num, c[C_A], fc)
        rn = rnd(nlogp, fc, mode)
        nw = S.pam_mul(rn, rnd(P(w[j]), fc, mode), fc) if w.size else nlogp
        return num, rn, nw

    @register_jitable
    def ce_fwd(x, base, n, ti, q, w, tmp, c, smooth, fc, mode):
        """The row's loss (before the valid mask): ``(1-ε) ·̂ nw_t + (ε ÷̂ C) ·̂ Σ nw`` with
        ``nw = -log p ·̂ w``, or with probability targets ``Σ q ·̂ nw``."""
        k = exps(x, base, n, tmp, c, fc, mode)
        lse = S.pa_log2(rnd(P(fold(tmp, base, n, 1)), fc, mode), fc)
        for j in range(n):
            tmp[base + j] = F(ce_nlogp(x, base, n, j, k, lse, w, c, fc, mode)[2])
        if q.size:
            for j in range(n):
                tmp[base + j] = F(S.pam_mul(rnd(P(q[base + j]), fc, mode),
                                            rnd(P(tmp[base + j]), fc, mode), fc))
            return P(fold(tmp, base, n, 1))
        loss = P(tmp[base + ti])
        if smooth:
            sw = rnd(P(fold(tmp, base, n, 1)), fc, mode)
            loss = add(S.pam_mul(rnd(loss, fc, mode), c[C_A + 1], fc),
                       S.pam_mul(sw, c[C_A + 2], fc))
        return loss

    @register_jitable
    def ce_bwd(x, gl, base, n, ti, q, w, dx, tmp, c, smooth, kind, ln2, fc, mode):
        """δx of the row given the gradient ``gl`` of its (masked) loss."""
        k = exps(x, base, n, tmp, c, fc, mode)
        ssum = rnd(P(fold(tmp, base, n, 1)), fc, mode)
        lse = S.pa_log2(ssum, fc)
        if q.size:
            for j in range(n):
                nw = ce_nlogp(x, base, n, j, k, lse, w, c, fc, mode)[2]
                dx[base + j] = F(mul_g(rnd(P(q[base + j]), fc, mode), rnd(nw, fc, mode), gl,
                                       kind, ln2, fc, mode)[1])
        else:
            g_pick = gl
            g_sum = np.int64(0)
            if smooth:
                for j in range(n):
                    tmp[base + j] = F(ce_nlogp(x, base, n, j, k, lse, w, c, fc, mode)[2])
                pick = rnd(P(tmp[base + ti]), fc, mode)
                g_pick = mul_g(pick, c[C_A + 1], gl, kind, ln2, fc, mode)[0]
                g_sum = mul_g(rnd(P(fold(tmp, base, n, 1)), fc, mode), c[C_A + 2], gl, kind,
                              ln2, fc, mode)[0]
            for j in range(n):
                # gather's backward is scatter_add into zeros: +0 + δ at the target
                gg = add(np.int64(0), g_pick) if j == ti else np.int64(0)
                dx[base + j] = F(add(g_sum, gg) if smooth else gg)
        for j in range(n):
            num, rn, _ = ce_nlogp(x, base, n, j, k, lse, w, c, fc, mode)
            gnw = P(dx[base + j])
            if w.size:
                gnw = mul_g(rn, rnd(P(w[j]), fc, mode), gnw, kind, ln2, fc, mode)[0]
            gnum = div_g(num, c[C_A], gnw, kind, ln2, fc, mode)[0]
            dx[base + j] = F(gnum)
            tmp[base + j] = F(gnum)
        ge = log2_g(ssum, P(fold(tmp, base, n, 1)), kind, ln2, fc, mode)
        for j in range(n):
            t = rnd(t_of(x, base + j, k, c, fc, mode), fc, mode)
            gt = add(neg(P(dx[base + j])), exp2_g(t, ge, kind, ln2, fc, mode))
            dx[base + j] = F(mul_g(rnd(P(x[base + j]), fc, mode), c[C_A], gt, kind, ln2, fc,
                                   mode)[0])

    # --- recurrent cells (recurrent.py), element j of a batch row ----------------------
    # the gates' pre-activations as recurrent._cell chunks them; c: [R(1)]

    @register_jitable
    def gru_nodes(ir, iz, in_, hr, hz, hn, h, c, fc, mode):
        ar = add(ir, hr)
        az = add(iz, hz)
        r = rnd(sigmoid(ar, c, fc, mode), fc, mode)
        an = add(in_, S.pam_mul(r, rnd(hn, fc, mode), fc))
        n = tanh_fwd(an, c, fc, mode)
        z = rnd(sigmoid(az, c, fc, mode), fc, mode)
        d = sub(h, n)
        return ar, az, r, an, n, z, d

    @register_jitable
    def gru_fwd(ir, iz, in_, hr, hz, hn, h, c, fc, mode):
        """``r, z = σ(gi_r + gh_r), σ(gi_z + gh_z)``, ``n = tanh(gi_n + r ·̂ gh_n)``,
        ``h' = n + z ·̂ (h - n)``."""
        _, _, _, _, n, z, d = gru_nodes(ir, iz, in_, hr, hz, hn, h, c, fc, mode)
        return add(n, S.pam_mul(z, rnd(d, fc, mode), fc))

    @register_jitable
    def gru_bwd(ir, iz, in_, hr, hz, hn, h, g, c, kind, ln2, fc, mode):
        """(δ(gi_r + gh_r), δ(gi_z + gh_z), δgi_n, δgh_n, δh) from δh'."""
        ar, az, r, an, n, z, d = gru_nodes(ir, iz, in_, hr, hz, hn, h, c, fc, mode)
        gz, gd = mul_g(z, rnd(d, fc, mode), g, kind, ln2, fc, mode)
        gn = add(g, neg(gd))                        # n + ...'s, then h - n's
        gxx = sigmoid_g(add(an, an), add(gn, gn), c, kind, ln2, fc, mode)
        gan = add(gxx, gxx)                         # tanh's x + x
        gr, ghn = mul_g(r, rnd(hn, fc, mode), gan, kind, ln2, fc, mode)
        return (sigmoid_g(ar, gr, c, kind, ln2, fc, mode),
                sigmoid_g(az, gz, c, kind, ln2, fc, mode), gan, ghn, gd)

    @register_jitable
    def lstm_nodes(gi, gf, gg, go, hi, hf, hg, ho, cp, c, fc, mode):
        i, f, gc, o = add(gi, hi), add(gf, hf), add(gg, hg), add(go, ho)
        sf = rnd(sigmoid(f, c, fc, mode), fc, mode)
        si = rnd(sigmoid(i, c, fc, mode), fc, mode)
        tg = rnd(tanh_fwd(gc, c, fc, mode), fc, mode)
        c2 = add(S.pam_mul(sf, rnd(cp, fc, mode), fc), S.pam_mul(si, tg, fc))
        so = rnd(sigmoid(o, c, fc, mode), fc, mode)
        tc = rnd(tanh_fwd(c2, c, fc, mode), fc, mode)
        return i, f, gc, o, sf, si, tg, c2, so, tc

    @register_jitable
    def lstm_fwd(gi, gf, gg, go, hi, hf, hg, ho, cp, c, fc, mode):
        """``i, f, g, o`` of ``gi + gh``; ``c' = σ(f) ·̂ c + σ(i) ·̂ tanh(g)``,
        ``h' = σ(o) ·̂ tanh(c')``: (h', c')."""
        nodes = lstm_nodes(gi, gf, gg, go, hi, hf, hg, ho, cp, c, fc, mode)
        return S.pam_mul(nodes[8], nodes[9], fc), nodes[7]

    @register_jitable
    def lstm_bwd(gi, gf, gg, go, hi, hf, hg, ho, cp, gh2, has_h, gc2, has_c, c, kind, ln2,
                 fc, mode):
        """(δi, δf, δg, δo, δc) from δh' and δc' (``has_*``: whether each reached the
        step; without δh' nothing flows through tanh(c') and σ(o))."""
        i, f, gc, o, sf, si, tg, c2, so, tc = lstm_nodes(gi, gf, gg, go, hi, hf, hg, ho, cp,
                                                         c, fc, mode)
        dc = gc2
        dgo = np.int64(0)
        if has_h:
            gso, gtc = mul_g(so, tc, gh2, kind, ln2, fc, mode)
            gxc = sigmoid_g(add(c2, c2), add(gtc, gtc), c, kind, ln2, fc, mode)
            # c' gets the next step's gradient first, then tanh(c')'s x + x
            dc = add(add(gc2, gxc), gxc) if has_c else add(gxc, gxc)
            dgo = sigmoid_g(o, gso, c, kind, ln2, fc, mode)
        gsi, gtg = mul_g(si, tg, dc, kind, ln2, fc, mode)
        gsf, gcp = mul_g(sf, rnd(cp, fc, mode), dc, kind, ln2, fc, mode)
        gxg = sigmoid_g(add(gc, gc), add(gtg, gtg), c, kind, ln2, fc, mode)
        return (sigmoid_g(i, gsi, c, kind, ln2, fc, mode),
                sigmoid_g(f, gsf, c, kind, ln2, fc, mode), add(gxg, gxg), dgo, gcp)

    return {name: f for name, f in locals().items() if callable(f)}

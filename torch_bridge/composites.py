"""torch_bridge's composites, each described once.

A description is a function of ``o``, the primitives, and its inputs: PA operations
(``o.mul`` = PAM, ``o.div``, ``o.exp``, ``o.exp2``, ``o.log``, ``o.log2``, ``o.sqrt``,
each rounding its operands into the format), float32 glue (``o.add``, ``o.sub``,
``o.neg``, ``o.clamp_max``, ``o.floor`` (a constant: no gradient), ``o.lt``/``o.gt`` with
``o.where``) and row statistics
(``o.sum``: a sum over the row in emu.fold_sum's order; ``o.floor_max``: the constant
shift ``floor(max)``, no gradient).  A number as a PA operand is a constant rounded
into the format; as an addend, bound or comparison it is float32.  Keyword
arguments are numbers given per call (``n``, ``eps``, ``beta``), or structural flags.

torch_bridge/_compose.py runs each one as a graph of autograd Functions and
generates from it the fused CPU kernels (forward and backward), so a composite is
changed here and nowhere else.  The order of the operations is part of the
semantics: it fixes every rounding and the order in which autograd adds gradients.
docs/torch_bridge.md ("Elementwise composites") lists what each computes.
"""
from __future__ import annotations

import math

#: the composites torch_bridge runs (the other functions here are parts of them)
__all__ = ["sigmoid", "tanh", "silu", "gelu_tanh", "gelu_erf", "softplus", "softmax",
           "log_softmax", "layer_norm", "rms_norm", "cross_entropy", "gru_cell", "lstm_cell"]

#: the exponential's argument is clamped here: e^-104 is below float32's smallest subnormal
#: and x·e^x at x = -104 below its smallest normal, so nothing is lost; no pass sees an inf
EXP_MAX = 104.0
#: log2(e) = 1 + 2^-1 - 2^-4 + 2^-8 + LOG2E_R: a PAM by a power of two is exact, so
#: x·log2(e) carries PAM's error (<= 11 %) on LOG2E_R·x alone, <= 0.013 at x = 88
#: (x ·̂ log2e errs by up to 10 there: a factor 2^10 in paexp)
LOG2E_R = math.log2(math.e) - (1 + 2.0 ** -1 - 2.0 ** -4 + 2.0 ** -8)
#: tanh's rational branch holds below this |x|, the exponential one above (both within
#: 13 % there; docs/semantics.md §8)
TANH_T = 1.0
#: 2·sqrt(2/pi): GELU's tanh form via sigmoid
GELU_K = 2.0 * math.sqrt(2.0 / math.pi)
GELU_C = 0.044715
#: Abramowitz & Stegun 7.1.26: erfc(u) = (a1 t + ... + a5 t^5) e^(-u^2), t = 1/(1 + p u),
#: u >= 0, |error| <= 1.5e-7; for GELU's Phi(x) = erfc(|x|/sqrt 2)/2 the 1/2 and the
#: 1/sqrt 2 are folded into the constants
ERF_P = 0.3275911 / math.sqrt(2.0)
ERF_A = tuple(a / 2 for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027,
                              1.061405429))
#: |x| is clamped here in the erfc branch: e^(-16^2/2) is below float32's smallest
#: subnormal, so nothing changes, and a·a cannot overflow to inf (NaN derivatives)
ERF_XMAX = 16.0


# --- elementwise ------------------------------------------------------------------------

def exp_neg_parts(o, a):
    """``(k, m)``: ``e^-a = 2^k ·̂ m`` for ``a >= 0`` (clamped at 88), ``m = paexp2(y - k)``
    in [1, 2), ``k = floor(y)`` a constant (no gradient), ``y = -(a + a ·̂ 2^-1 - a ·̂ 2^-4
    + a ·̂ 2^-8 + a ·̂ r)`` = ``-a·log2(e)`` in float32 with PAM's error on ``r·a`` alone."""
    a = o.clamp_max(a, EXP_MAX)
    y = o.add(o.add(o.sub(o.add(a, o.mul(a, 0.5)), o.mul(a, 0.0625)), o.mul(a, 2.0 ** -8)),
              o.mul(a, LOG2E_R))
    y = o.neg(y)
    k = o.floor(y)
    return k, o.exp2(o.sub(y, k))


def exp_neg(o, a):
    """``e^-a`` for ``a >= 0``: ``paexp2(k) ·̂ m`` of :func:`exp_neg_parts`, paexp2 of the
    float32 ``-a·log2(e)``, its relative error that of paexp2 alone (<= 6.1 %; a PAM by
    a power of two is exact).  ``paexp(-a) = paexp2(-a ·̂ log2e)`` instead errs by up to
    2^(0.16·a): PAM's error on the product, and the product's rounding into the format."""
    k, m = exp_neg_parts(o, a)
    return o.mul(o.exp2(k), m)


def _abs(o, x):
    """``(x < 0, |x|)``, |x| a selection."""
    neg = o.lt(x, 0.0)
    return neg, o.where(neg, o.neg(x), x)


def _logistic(o, num, neg, a, split=True):
    """num·σ(x) for ``a = |x|``, ``e = e^-a`` (:func:`exp_neg`): ``num ÷̂ (1 + e)`` where
    x >= 0, ``(num ·̂ e) ÷̂ (1 + e)`` where x < 0 (``num`` 1.0: ``e``); e is never above 1,
    so nothing overflows.  With ``split``, ``num ·̂ e`` is ``((num ·̂ m) ·̂ 2^h) ·̂ 2^(k-h)``,
    ``h = floor(k ·̂ 0.5)``: exact scalings, so it stays normal where e alone would flush
    (x·e^x near x = -88 in bfloat16, -12 in float16).  The product's operand is 0 where
    x >= 0, so an unselected branch holds no inf (whose derivative is NaN)."""
    k, m = exp_neg_parts(o, a)
    e = o.mul(o.exp2(k), m)
    if isinstance(num, float):
        top = o.where(neg, e, num)
    elif split:
        h = o.floor(o.mul(k, 0.5))
        p = o.mul(o.mul(o.mul(o.where(neg, num, 0.0), m), o.exp2(h)), o.exp2(o.sub(k, h)))
        top = o.where(neg, p, num)
    else:
        top = o.where(neg, o.mul(o.where(neg, num, 0.0), e), num)
    return o.div(top, o.add(e, 1.0))


def sigmoid(o, x):
    """``1 ÷̂ (1 + e)`` for x >= 0, ``e ÷̂ (1 + e)`` for x < 0, ``e = e^-|x|``
    (:func:`exp_neg`): no overflow in any format."""
    neg, a = _abs(o, x)
    return _logistic(o, 1.0, neg, a)


def tanh(o, x):
    """Odd by construction, ``sign(x)·t(|x|)``: for ``a = |x| < TANH_T`` the Padé form
    ``(a ·̂ (a² + 15)) ÷̂ (6a² + 15)`` (``a² = a ·̂ a``, ``6a²`` float32 additions; a
    product and a quotient, no cancellation near 0, where ``2σ(2x) - 1`` errs by 44 %),
    above ``1 - (e + e) ÷̂ (e + 1)``, ``e = e^-2a`` (:func:`exp_neg`)."""
    neg, a = _abs(o, x)
    s = o.clamp_max(a, TANH_T)                     # the unselected branch stays finite
    s2 = o.mul(s, s)
    d2 = o.add(s2, s2)
    small = o.div(o.mul(s, o.add(s2, 15.0)), o.add(o.add(o.add(d2, d2), d2), 15.0))
    e = exp_neg(o, o.add(a, a))
    big = o.sub(1.0, o.div(o.add(e, e), o.add(e, 1.0)))
    t = o.where(o.lt(a, TANH_T), small, big)
    return o.where(neg, o.neg(t), t)


def silu(o, x):
    """x·σ(x): ``x ÷̂ (1 + e)`` for x >= 0, ``(x ·̂ e) ÷̂ (1 + e)`` for x < 0,
    ``e = e^-|x|``."""
    neg, a = _abs(o, x)
    return _logistic(o, x, neg, a)


def gelu_tanh(o, x):
    """GELU's tanh form ``0.5·x·(1 + tanh(z)) = x·σ(2z)``, ``2z = (x + C ·̂ ((x ·̂ x) ·̂ x))
    ·̂ K``: ``x ÷̂ (1 + e)`` for 2z >= 0, ``(x ·̂ e) ÷̂ (1 + e)`` below, ``e = e^-|2z|``
    (no split of ``x ·̂ e``: where e flushes, the cube's PAM error already dominates)."""
    cube = o.mul(o.mul(x, x), x)
    z2 = o.mul(o.add(x, o.mul(cube, GELU_C)), GELU_K)
    neg, a = _abs(o, z2)
    return _logistic(o, x, neg, a, split=False)


def gelu_erf(o, x):
    """GELU ``x ·̂ Φ(x)``: ``Φ = 1 - h`` for x >= 0, ``h`` for x < 0, ``h = erfc(|x|/√2)/2
    = (t ·̂ (b1 + t ·̂ (b2 + t ·̂ (b3 + t ·̂ (b4 + t ·̂ b5))))) ·̂ paexp(-((a ·̂ a) ·̂ 0.5))``,
    ``t = 1 ÷̂ (1 + p' ·̂ a)``, ``a = min(|x|, 16)``, ``|x|`` a selection."""
    neg = o.lt(x, 0.0)
    a = o.clamp_max(o.where(neg, o.neg(x), x), ERF_XMAX)
    t = o.div(1.0, o.add(o.mul(a, ERF_P), 1.0))
    poly = ERF_A[-1]
    for b in reversed(ERF_A[:-1]):                 # Horner: b_i + t ·̂ (...)
        poly = o.add(o.mul(t, poly), b)
    h = o.mul(o.mul(t, poly), exp_neg(o, o.mul(o.mul(a, a), 0.5)))
    return o.mul(x, o.where(neg, h, o.sub(1.0, h)))


def softplus(o, x, beta, threshold, unit):
    """``(max(βx, 0) + L(e)) ÷̂ β``, ``e = e^-|βx|`` (:func:`exp_neg`), ``L(e) = (e ·̂ (e +
    6)) ÷̂ (4e + 6)`` (log(1 + e)'s Padé form, within 1 % on [0, 1]; palog(1 + e) errs by
    31 % as e -> 0), and ``x`` where ``βx > threshold`` (torch's definition); ``βx = x ·̂
    β``; ``unit``: β = 1, no multiply or divide."""
    bx = x if unit else o.mul(x, beta)
    neg, a = _abs(o, bx)
    e = exp_neg(o, a)
    e2 = o.add(e, e)
    y = o.add(o.where(neg, 0.0, bx),
              o.div(o.mul(e, o.add(e, 6.0)), o.add(o.add(e2, e2), 6.0)))
    if not unit:
        y = o.div(y, beta)
    return o.where(o.gt(bx, threshold), x, y)


# --- rows -------------------------------------------------------------------------------

def exp_shifted(o, x, log2e, ymax):
    """``(paexp2(t), t)``, ``t = y - k``, ``k = floor(max(y))``, ``y = x ·̂ log2e`` with
    a finite x's overflow saturated at ``-ymax`` (the largest finite value of the
    tensors' dtype): paexp(x) scaled by the power of two 2^-k, which keeps it from
    overflowing.

    The saturation is for masks of ``finfo.min`` (transformers' eager attention): their
    ``y`` would be -inf, and a row of them ``-inf - -inf`` = NaN where torch gives a
    uniform row; saturated, masked entries give paexp2 of a huge negative ``t``, 0, and
    a fully masked row ``t = 0`` everywhere.  An x of -inf keeps ``y = -inf`` (a row of
    -inf is NaN, as torch's).  Every other y passes unchanged (two negations and a
    bound it does not reach), so its bits and gradients are those without the rule.

    The shift ``k`` is a constant of the PA function (docs/semantics.md, "Derivatives
    of composites"), as in Kosson & Jaggi's implementation.  Being an integer in the
    log2 domain, it scales every paexp2 by the same power of two and leaves the largest
    logit at a generic point of paexp2's segment [0, 1), not on its kink at 0 where
    ``x - max(x)`` would put it."""
    y = o.neg(o.clamp_max(o.neg(o.mul(x, log2e)), ymax))
    y = o.where(o.gt(o.neg(x), ymax), -math.inf, y)
    t = o.sub(y, o.floor_max(y))
    return o.exp2(t), t


def softmax(o, x, log2e, ymax):
    """``e ÷̂ Σ e`` with ``e`` of :func:`exp_shifted` (section 2.3, eq. 18).  Rows
    that are entirely -inf give NaN, as torch.softmax."""
    e, _ = exp_shifted(o, x, log2e, ymax)
    return o.div(e, o.sum(e))


def log_softmax(o, x, log2e, ymax):
    """``(t - palog2(Σ paexp2(t))) ÷̂ log2e`` (eqs. 10, 18, 19)."""
    e, t = exp_shifted(o, x, log2e, ymax)
    return o.div(o.sub(t, o.log2(o.sum(e))), log2e)


def layer_norm(o, x, weight, bias, n, eps):
    """``(x-μ) ÷̂ pasqrt(Σ (x-μ) ·̂ (x-μ) ÷̂ n + eps)`` with ``μ = Σx ÷̂ n``, then a PAM gain
    and a float32 bias (either may be None)."""
    xc = o.sub(x, o.div(o.sum(x), n))
    y = o.div(xc, o.sqrt(o.add(o.div(o.sum(o.mul(xc, xc)), n), eps)))
    if weight is not None:
        y = o.mul(y, weight)
    return y if bias is None else o.add(y, bias)


def rms_norm(o, x, weight, n, eps):
    """``x ÷̂ pasqrt(Σ (x ·̂ x) ÷̂ n + eps)``, then a PAM gain (or None)."""
    y = o.div(x, o.sqrt(o.add(o.div(o.sum(o.mul(x, x)), n), eps)))
    return y if weight is None else o.mul(y, weight)


def cross_entropy(o, z, log2e, ymax, weight=None, q=None, target=None, valid=None, keep=None,
                  smooth_c=None, smooth=False):
    """A row's cross-entropy: ``-log p = (palog2(Σ e) - t) ÷̂ log2e`` with ``e, t`` of
    :func:`exp_shifted` (eqs. 10, 18, 19), times the class weights ``weight`` (or None);
    with probability targets ``q``: ``Σ q ·̂ (-log p ·̂ w)``; with class targets: ``-log
    p_t ·̂ w_t`` at ``target``, with label smoothing ``keep ·̂ (that) + smooth_c ·̂ Σ
    (-log p ·̂ w)`` (``keep = 1 - ε``, ``smooth_c = ε ÷̂ C``), and 0 where not ``valid``."""
    e, t = exp_shifted(o, z, log2e, ymax)
    nw = o.div(o.sub(o.log2(o.sum(e)), t), log2e)
    if weight is not None:
        nw = o.mul(nw, weight)
    if q is not None:
        return o.sum(o.mul(q, nw))
    loss = o.pick(nw, target)
    if smooth:
        loss = o.add(o.mul(loss, keep), o.mul(o.sum(nw), smooth_c))
    return o.where(valid, loss, 0.0)


# --- recurrent cells (recurrent.py): the gate arithmetic of one step ----------------------

def gru_cell(o, ir, iz, in_, hr, hz, hn, h):
    """``r, z = σ(gi_r + gh_r), σ(gi_z + gh_z)``, ``n = tanh(gi_n + r ·̂ gh_n)``,
    ``h' = n + z ·̂ (h - n)`` (torch's ``(1-z)·n + z·h`` in increment form, one PAM)."""
    r = sigmoid(o, o.add(ir, hr))
    z = sigmoid(o, o.add(iz, hz))
    n = tanh(o, o.add(in_, o.mul(r, hn)))
    return o.add(n, o.mul(z, o.sub(h, n)))


def lstm_cell(o, xi, xf, xg, xo, hi, hf, hg, ho, c):
    """``i, f, g, o`` of ``gi + gh``; ``c' = σ(f) ·̂ c + σ(i) ·̂ tanh(g)``,
    ``h' = σ(o) ·̂ tanh(c')``: (h', c')."""
    i, f, g, out = o.add(xi, hi), o.add(xf, hf), o.add(xg, hg), o.add(xo, ho)
    c2 = o.add(o.mul(sigmoid(o, f), c), o.mul(sigmoid(o, i), tanh(o, g)))
    return o.mul(sigmoid(o, out), tanh(o, c2)), c2

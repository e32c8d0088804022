"""torch_bridge's composites, each described once.

A description is a function of ``o``, the primitives, and its inputs: PA operations
(``o.mul`` = PAM, ``o.div``, ``o.exp``, ``o.exp2``, ``o.log``, ``o.log2``, ``o.sqrt``,
each rounding its operands into the format), float32 glue (``o.add``, ``o.sub``,
``o.neg``, ``o.clamp_max``, ``o.clamp_min``, ``o.floor``, ``o.lead`` (the leading power of two, the
mantissa bits cleared) and ``o.detach`` (the value itself; these three are constants:
no gradient), ``o.lt``/``o.gt`` with ``o.where``)
and row statistics
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
from typing import NamedTuple

#: the composites torch_bridge runs (the other functions here are parts of them)
__all__ = ["sigmoid", "tanh", "silu", "gelu_tanh", "gelu_erf", "softplus", "rsqrt", "softmax",
           "log_softmax", "mean", "normalise", "layer_norm", "rms_norm", "cross_entropy",
           "huber", "smooth_l1", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div", "gru_cell", "lstm_cell"]

#: the exponential's argument is clamped here: e^-104 is below float32's smallest subnormal
#: and x·e^x at x = -104 below its smallest normal, so nothing is lost; no pass sees an inf
EXP_MAX = 104.0


class Dyadic(NamedTuple):
    """A constant as signed powers of two (``pieces``) and the ``rest``: ``x ·̂ c`` is
    then taken as exact PAMs by the pieces plus ``x ·̂ rest``, whose error (PAM's,
    <= 11 % of the rest) is all that is left (:func:`times`)."""
    pieces: tuple
    rest: float


def dyadic(c: float, n: int) -> Dyadic:
    """``c`` as ``n`` powers of two, each the one nearest to what is left, and the rest."""
    pieces, r = [], c
    for _ in range(n):
        lo = 2.0 ** math.floor(math.log2(abs(r)))
        pieces.append(math.copysign(lo if abs(r) - lo <= 2 * lo - abs(r) else 2 * lo, r))
        r -= pieces[-1]
    return Dyadic(tuple(pieces), r)


LOG2E = math.log2(math.e)
#: log2(e) = 1 + 2^-1 - 2^-4 + 2^-8 + rest: x·log2(e) carries PAM's error (<= 11 %) on
#: rest·x alone, <= 0.013 at x = 88 (x ·̂ log2e errs by up to 10 there: a factor 2^10 in
#: paexp)
LOG2E_D = dyadic(LOG2E, 4)
LOG2E_R = LOG2E_D.rest
#: tanh's rational branch holds below this |x|, the exponential one above (both within
#: 13 % there; docs/semantics.md §8)
TANH_T = 1.0
#: GELU's tanh form: 2z = K·(x + C·x³); in log2 units |2z|·log2e = a·(A + B·a²), a = |x|
GELU_K = 2.0 * math.sqrt(2.0 / math.pi)
GELU_C = 0.044715
GELU_A = GELU_K * LOG2E
GELU_B = dyadic(GELU_K * GELU_C * LOG2E, 5)
#: |x| is clamped here in GELU's tanh form: e^-|2z| = e^-142 is below every format's
#: range, and a³ stays finite
GELU_XMAX = 12.0
#: GELU's erf form: Φ(-a) = Q(a)·e^(-a²/2) (a >= 0, Q the Mills ratio over sqrt(2π)),
#: Q(a) ≈ (1/2 + P·a) / (1 + Q1·a + Q2·a²), within 0.68 % on [0, 16]: the minimax fit
#: with two powers of two per coefficient (PAMs by them are exact).  A&S 7.1.26's
#: erfc = poly(t)·e^(-u²) has a bounded absolute error but tends to 1.38 times the
#: true tail, and its alternating polynomial compounds PAM's errors.
ERF_P = dyadic(2.0 ** -2 + 2.0 ** -10, 2)
ERF_Q1 = dyadic(1.25, 2)
ERF_Q2 = dyadic(0.625, 2)
#: log2(e)/2: the exponent of e^(-a²/2) in log2 units
LOG2E_HALF = dyadic(LOG2E / 2, 5)
#: |x| is clamped here in the erfc branch: e^(-16^2/2) is below float32's smallest
#: subnormal, so nothing changes, and a·a cannot overflow to inf (NaN derivatives)
ERF_XMAX = 16.0
#: Babić steps of the products inside GELU's exponents: each divides PAM's error by 9,
#: so a² and a·w are within 9^-4 (1.5e-4): 0.02 in an exponent of 125 (bfloat16's tail)
PRODUCT_STEPS = 3


# --- exact pieces and accurate products -----------------------------------------------

def times(o, x, c: Dyadic):
    """``x·c`` for a format value ``x``: the exact PAMs ``x ·̂ 2^k`` (``x`` itself for
    2^0) added in order, then ``x ·̂ rest``."""
    acc = None
    for p in c.pieces:
        t = x if abs(p) == 1.0 else o.mul(x, abs(p))
        acc = (o.neg(t) if p < 0 else t) if acc is None else \
            o.add(acc, t) if p > 0 else o.sub(acc, t)
    return o.add(acc, o.mul(x, c.rest)) if c.rest else acc


def split(o, v):
    """``(h, l)``: a float32 ``v`` as its value in the format (``v ·̂ 1``) and the float32
    rest ``v - h``, so that PAMs round neither away."""
    h = o.mul(v, 1.0)
    return h, o.sub(v, h)


def times_wide(o, v, c: Dyadic):
    """``v·c`` for a float32 ``v``: :func:`times` on its format part, ``rest ·̂ c`` on
    the rest (:func:`split`)."""
    h, rest = split(o, v)
    return o.add(times(o, h, c), o.mul(rest, sum(c.pieces) + c.rest))


def product(o, x, y, steps, exact=True):
    """``x·y`` for format values ``x, y >= 0`` from PAMs alone, within ``x·y/9^(steps+1)``
    (Babić's iteration, docs/semantics.md §8): ``x ·̂ y`` errs by exactly ``dx·dy``, with
    ``(dx, dy) = (x - 2^ex, y - 2^ey)`` where the mantissas' sum did not carry
    (``x ·̂ y < 2^(ex+ey+1)``) and ``(2^(ex+1) - x, 2^(ey+1) - y)`` where it did; both are
    exact format values, each at most a third of its operand, and ``dx·dy`` is the same
    problem again.  ``2^e`` is ``o.lead`` (mantissa bits cleared); ``x is y``: a square.

    Derivatives: ``exact``, those of every PAM (the function computed); else the
    corrections are constants (``o.detach``), so the approximate derivative is
    ``x ·̂ y``'s, ``(y, x)``, the product's own (theirs would add ``±dx, ±dy``)."""
    p = o.mul(x, y)
    if steps == 0:
        return p
    px = o.lead(x)
    py = px if y is x else o.lead(y)
    q = o.mul(px, py)                              # exact: powers of two
    low = o.lt(p, o.add(q, q))
    dx = o.where(low, o.sub(x, px), o.sub(o.add(px, px), x))
    dy = dx if y is x else o.where(low, o.sub(y, py), o.sub(o.add(py, py), y))
    rest = product(o, dx, dy, steps - 1)
    return o.add(p, rest if exact else o.detach(rest))


# --- elementwise ------------------------------------------------------------------------

def exp2_parts(o, y):
    """``(k, m)``: ``2^y = 2^k ·̂ m`` (PA), ``k = floor(y)`` a constant (no gradient),
    ``m = paexp2(y - k)`` in [1, 2)."""
    k = o.floor(y)
    return k, o.exp2(o.sub(y, k))


def exp_neg_parts(o, a):
    """``(k, m)``: ``e^-a = 2^k ·̂ m`` for ``a >= 0`` (clamped at 104) of
    :func:`exp2_parts`, ``y = -(a + a ·̂ 2^-1 - a ·̂ 2^-4 + a ·̂ 2^-8 + a ·̂ r)`` =
    ``-a·log2(e)`` in float32 with PAM's error on ``r·a`` alone (:func:`times`)."""
    return exp2_parts(o, o.neg(times(o, o.clamp_max(a, EXP_MAX), LOG2E_D)))


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


def _logistic(o, num, neg, parts):
    """num·σ(x) from ``e = e^-|x| = 2^k ·̂ m`` (``parts``: :func:`exp_neg_parts`):
    ``num ÷̂ (1 + e)`` where x >= 0, ``(num ·̂ e) ÷̂ (1 + e)`` where x < 0 (``num`` 1.0:
    ``e``); e is never above 1, so nothing overflows.  ``num ·̂ e`` is ``((num ·̂ m) ·̂ 2^h)
    ·̂ 2^(k-h)``, ``h = floor(k ·̂ 0.5)``: exact scalings, so it stays normal where e alone
    would flush (x·e^x near x = -88 in bfloat16, -12 in float16).  The product's operand
    is 0 where x >= 0 and at least -104 (EXP_MAX; the result is 0 below), so an
    unselected branch holds no inf (whose derivative is NaN) and ``num ·̂ m`` cannot
    overflow (float16 x = -65504)."""
    k, m = parts
    e = o.mul(o.exp2(k), m)
    if isinstance(num, float):
        top = o.where(neg, e, num)
    else:
        h = o.floor(o.mul(k, 0.5))
        low = o.where(neg, o.neg(o.clamp_max(o.neg(num), EXP_MAX)), 0.0)
        p = o.mul(o.mul(o.mul(low, m), o.exp2(h)), o.exp2(o.sub(k, h)))
        top = o.where(neg, p, num)
    return o.div(top, o.add(e, 1.0))


def sigmoid(o, x):
    """``1 ÷̂ (1 + e)`` for x >= 0, ``e ÷̂ (1 + e)`` for x < 0, ``e = e^-|x|``
    (:func:`exp_neg`): no overflow in any format."""
    neg, a = _abs(o, x)
    return _logistic(o, 1.0, neg, exp_neg_parts(o, a))


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
    return _logistic(o, x, neg, exp_neg_parts(o, a))


def gelu_tanh(o, x, exact):
    """GELU's tanh form ``0.5·x·(1 + tanh(z)) = x·σ(2z)``, ``2z = K·(x + C·x³)``, in
    SiLU's form (:func:`_logistic`) from ``e^-|2z| = 2^y``, ``-y = a·(A + B·a²)`` with
    ``a = min(|x|, 12)`` in the format: ``a²`` and ``a·w`` (``w = A + B·a²``, as
    :func:`split` parts) are Babić products (:func:`product`; ``exact``: the derivative
    kind) and ``B·a²`` exact PAMs (:func:`times_wide`), so ``y`` errs by about 2e-4
    relative, where ``a ·̂ a ·̂ a`` erred by 22 % (a factor e^(0.22·|2z|) in the tail)."""
    neg, a = _abs(o, x)
    a = o.mul(o.clamp_max(a, GELU_XMAX), 1.0)
    w = o.add(times_wide(o, product(o, a, a, PRODUCT_STEPS, exact), GELU_B), GELU_A)
    wh, wl = split(o, w)
    y = o.neg(o.add(product(o, a, wh, PRODUCT_STEPS, exact), o.mul(a, wl)))
    return _logistic(o, x, neg, exp2_parts(o, y))


def gelu_erf(o, x, exact):
    """GELU ``x·Φ(x)``: with ``a = min(|x|, 16)`` in the format, ``s = a²`` a Babić
    product (:func:`product`) and ``e = e^(-s/2) = 2^k ·̂ m`` (``s·log2(e)/2`` exact
    PAMs, :func:`times_wide`), ``h = (n ÷̂ (1 + Q1·a + Q2·s)) ·̂ e`` with ``n = a/2 + P·s``
    for x < 0 (``h = a·Φ(-a)``, the result ``-h``) and ``n = 1/2 + P·a`` for x >= 0
    (``h = Φ(-a)``, the result ``x ·̂ (1 - h)``); the coefficients' PAMs are exact;
    ``exact``: the derivative kind (:func:`product`)."""
    neg, a = _abs(o, x)
    a = o.mul(o.clamp_max(a, ERF_XMAX), 1.0)
    s = product(o, a, a, PRODUCT_STEPS, exact)
    den = o.add(o.add(times(o, a, ERF_Q1), 1.0), times_wide(o, s, ERF_Q2))
    num = o.add(o.mul(o.where(neg, a, 1.0), 0.5), times_wide(o, o.where(neg, s, a), ERF_P))
    k, m = exp2_parts(o, o.neg(times_wide(o, s, LOG2E_HALF)))
    h = o.mul(o.div(num, den), o.mul(o.exp2(k), m))
    return o.where(neg, o.neg(h), o.mul(x, o.sub(1.0, h)))


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


def rsqrt(o, x):
    """``1 ÷̂ pasqrt(x)``: torch.rsqrt as two PA operations in one node (RMS norms as
    transformers write them call it once per layer)."""
    return o.div(1.0, o.sqrt(x))


# --- rows -------------------------------------------------------------------------------

def mean(o, x, n):
    """``Σx ÷̂ n``: a row's mean, the sum in emu.fold_sum's order."""
    return o.div(o.sum(x), n)


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


def softmax(o, x, log2e, ymax, scale=None):
    """``e ÷̂ Σ e`` with ``e`` of :func:`exp_shifted` (section 2.3, eq. 18) of ``x``, or
    of ``x ·̂ scale`` (attention's logit scale, in the same node).  Rows that are
    entirely -inf give NaN, as torch.softmax."""
    if scale is not None:
        x = o.mul(x, scale)
    e, _ = exp_shifted(o, x, log2e, ymax)
    return o.div(e, o.sum(e))


def log_softmax(o, x, log2e, ymax):
    """``(t - palog2(Σ paexp2(t))) ÷̂ log2e`` (eqs. 10, 18, 19)."""
    e, t = exp_shifted(o, x, log2e, ymax)
    return o.div(o.sub(t, o.log2(o.sum(e))), log2e)


def normalise(o, x, n, eps):
    """``(y, μ, s)``: ``y = (x-μ) ÷̂ pasqrt(s ÷̂ n + eps)`` with ``μ = Σx ÷̂ n`` and ``s =
    Σ (x-μ) ·̂ (x-μ)`` (batch norm's running statistics take μ and s)."""
    mu = o.div(o.sum(x), n)
    xc = o.sub(x, mu)
    ss = o.sum(o.mul(xc, xc))
    return o.div(xc, o.sqrt(o.add(o.div(ss, n), eps))), mu, ss


def layer_norm(o, x, weight, bias, n, eps):
    """:func:`normalise`'s ``(x-μ) ÷̂ pasqrt(Σ (x-μ) ·̂ (x-μ) ÷̂ n + eps)``, then a PAM
    gain and a float32 bias (either may be None)."""
    y, _, _ = normalise(o, x, n, eps)
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


# --- losses (losses.py): the elementwise loss of input x and target t (the reduction is
# mean's or a fold_sum) ----------------------------------------------------------------

def huber(o, x, t, delta, half_delta):
    """``(0.5 ·̂ z) ·̂ z`` where ``z = |x - t| < δ``, else ``δ ·̂ (z - δ/2)``."""
    _, z = _abs(o, o.sub(x, t))
    return o.where(o.lt(z, delta), o.mul(o.mul(z, 0.5), z), o.mul(o.sub(z, half_delta), delta))


def smooth_l1(o, x, t, beta, half_beta):
    """``((0.5 ·̂ z) ·̂ z) ÷̂ β`` where ``z = |x - t| < β``, else ``z - β/2``."""
    _, z = _abs(o, o.sub(x, t))
    return o.where(o.lt(z, beta), o.div(o.mul(o.mul(z, 0.5), z), beta), o.sub(z, half_beta))


def binary_cross_entropy(o, x, t, log_min):
    """``-(t ·̂ max(palog x, m) + (1 - t) ·̂ max(palog(1 - x), m))``, m = torch's -100."""
    lx = o.clamp_min(o.log(x), log_min)
    l1 = o.clamp_min(o.log(o.sub(1.0, x)), log_min)
    return o.neg(o.add(o.mul(t, lx), o.mul(o.sub(1.0, t), l1)))


def binary_cross_entropy_with_logits(o, x, t, pos_weight=None):
    """``(1 - t) ·̂ x + l ·̂ sp``, ``sp = max(-x, 0) + palog(1 + paexp(-|x|))`` (torch's
    stable form), ``l = 1 + (pos_weight - 1) ·̂ t`` (no ``l`` without pos_weight)."""
    sp = o.add(o.clamp_min(o.neg(x), 0.0), o.log(o.add(1.0, o.exp(o.neg(_abs(o, x)[1])))))
    if pos_weight is not None:
        sp = o.mul(o.add(1.0, o.mul(o.sub(pos_weight, 1.0), t)), sp)
    return o.add(o.mul(o.sub(1.0, t), x), sp)


def kl_div(o, x, t):
    """``t ·̂ palog(t) - t ·̂ x``, 0 where t <= 0 (palog never sees it)."""
    pos = o.gt(t, 0.0)
    xlogx = o.mul(t, o.log(o.where(pos, t, 1.0)))
    return o.sub(o.where(pos, xlogx, 0.0), o.mul(t, x))


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

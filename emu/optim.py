"""The PA AdamW update fused into one CPU kernel (torch_bridge.PAAdamW's, Kosson &
Jaggi section 2.6 / Table 3 "OPTIMIZER").

One step, elementwise, with ⊙ = PAM (eqs. 5-8), ⊘ = PA division (eqs. 14-17),
pasqrt (eq. 20), and float32 ``+``/``-``::

    p -= R(p) ⊙ c0                                   (only with weight decay: c0 = lr·wd)
    m += R(g - m) ⊙ c1                               (c1 = 1-β1)
    v += R(R(g) ⊙ R(g) - v) ⊙ c2                     (c2 = 1-β2)
    d  = R(pasqrt(R(v))) ⊘ c3 + eps                  (c3 = sqrt(1-β2^t))
    p -= R(R(m) ⊘ R(d)) ⊙ c4                         (c4 = lr/(1-β1^t))

``R`` rounds a tensor into the format (the identity for float32), each ``R`` with its
own stochastic stream; the constants come rounded by the caller.  This is the
sequence of emu calls torch_bridge.PAAdamW makes per parameter, element by element in
one pass: the same scalar definitions (emu/_scalar.py) in the same order, so the same
bits (tests/test_torch_models.py::test_fused_adamw_is_the_sequence), without a
kernel call, a temporary and a Python round trip per operation.
"""
from __future__ import annotations

import numpy as np
from numba import prange
from numba.extending import register_jitable

from . import _scalar as S
from . import sizes
from ._kernels import _in_place, as_f32, as_i32, twins
from ._numba_cache import drop_stale
from .formats import Format, float32, format
from .ops import rounding_mode, stochastic_key

__all__ = ["ROUNDINGS", "pa_adamw"]

#: how many tensors the update rounds (the ``R`` above, in order): the stochastic seeds
ROUNDINGS = 10


drop_stale(__file__)


@register_jitable
def _f(x):
    return as_f32(np.int32(x & 0xFFFFFFFF))


@register_jitable
def _p(x):
    return np.int64(as_i32(x)) & 0xFFFFFFFF


#: how R rounds (the kernel variants): not at all (float32, where every R is the
#: identity), in place on the pattern (the formats of _kernels._in_place: branch-free
#: with pa_sqrt_e8, so LLVM vectorises the loop), or by S.quantize (every other case)
NONE, IN_PLACE, GENERAL = 0, 1, 2


def _kernel(kind):
    """The fused kernel for one way of rounding (compiled in, so that the float32 and
    in-place kernels have no rounding code to branch around)."""
    @register_jitable
    def r(x, fc, mode, keys, j, i, k):
        """R(x) as the ops then see it: rounded into the format with stream ``keys[j]``
        (element i uses draw i), then the operand rounding every op applies (the
        identity on a rounded value of an in-place format)."""
        if kind == IN_PLACE:
            return np.int64(S.round_in_place(np.uint32(x), k))
        if kind == GENERAL:
            return S.operand(S.quantize(x, fc, mode, True, False, keys[j], i), fc)
        return x

    # the PA ops: their branch-free 32-bit twins where R needs no quantize
    @register_jitable
    def sqrt(x, fc):
        return S.pa_sqrt(x, fc) if kind == GENERAL else S.pa_sqrt_e8(x, fc)

    @register_jitable
    def mul(a, b, fc):
        if kind == GENERAL:
            return S.pam_mul(a, b, fc)
        return np.int64(S.pam_mul32(np.uint32(a), np.uint32(b), fc))

    @register_jitable
    def div(a, b, fc):
        if kind == GENERAL:
            return S.pa_div(a, b, fc)
        return np.int64(S.pa_div32(np.uint32(a), np.uint32(b), fc))

    def kernel(P, G, M, V, outp, outm, outv, fc, mode, keys, c, eps, decay, negate):
        k = S.in_place_consts(fc, mode) if kind == IN_PLACE else S.in_place_consts(fc, S.RNE)
        c0, c1, c2, c3, c4 = (S.operand(c[0], fc), S.operand(c[1], fc), S.operand(c[2], fc),
                              S.operand(c[3], fc), S.operand(c[4], fc))
        flip = S.SIGN32 if negate else 0
        for i in prange(P.size):
            p = np.int64(P[i])
            g = np.int64(G[i]) ^ flip
            m = np.int64(M[i])
            v = np.int64(V[i])
            # (a select, not a branch: the loop stays one basic block for LLVM)
            t = mul(r(p, fc, mode, keys, 0, i, k), c0, fc)
            p = _p(_f(p) - _f(t)) if decay else p
            t = mul(r(_p(_f(g) - _f(m)), fc, mode, keys, 1, i, k), c1, fc)
            m = _p(_f(m) + _f(t))
            gg = mul(r(g, fc, mode, keys, 2, i, k), r(g, fc, mode, keys, 3, i, k), fc)
            t = mul(r(_p(_f(gg) - _f(v)), fc, mode, keys, 4, i, k), c2, fc)
            v = _p(_f(v) + _f(t))
            sq = sqrt(r(v, fc, mode, keys, 5, i, k), fc)
            d = _p(_f(div(r(sq, fc, mode, keys, 6, i, k), c3, fc)) + eps)
            q = div(r(m, fc, mode, keys, 7, i, k), r(d, fc, mode, keys, 8, i, k), fc)
            t = mul(r(q, fc, mode, keys, 9, i, k), c4, fc)
            p = _p(_f(p) - _f(t))
            outp[i] = p
            outm[i] = m
            outv[i] = v
    return twins(f"adamw kind={kind}", kernel)


#: the kernel, by how R rounds, and parallel or serial (emu/_kernels.py's twins)
_ADAMW = {kind: _kernel(kind) for kind in (NONE, IN_PLACE, GENERAL)}


def pa_adamw(p, g, m, v, consts, eps, fmt: Format | str = float32,
             rounding: str = "nearest_even", seeds=None, *, maximize: bool = False):
    """One fused PA AdamW step (module docstring) on contiguous float32 arrays of one
    shape: returns the new ``(p, m, v)`` (new arrays; the inputs are not changed).

    ``consts``: ``(c0, c1, c2, c3, c4)`` as float32 values of ``fmt`` (``c0=None``: no
    weight decay); ``eps``: the float32 added to the denominator; ``seeds``: with
    ``rounding="stochastic"``, the :data:`ROUNDINGS` seeds of the tensor roundings in
    order (slot 0 unused without weight decay; None for float32, which draws none).  ``maximize``: ascend (``g`` negated).
    """
    fmt = format(fmt)
    mode = rounding_mode(rounding)
    arrays = [np.asarray(a) for a in (p, g, m, v)]
    for name, a in zip("pgmv", arrays):
        if a.dtype != np.float32 or not a.flags.c_contiguous or a.shape != arrays[0].shape:
            raise ValueError(f"{name} must be a C-contiguous float32 array of p's shape "
                             f"{arrays[0].shape}, got {a.dtype} {a.shape}")
    if len(consts) != 5:
        raise ValueError(f"consts must be the five constants (c0..c4), got {consts!r}")
    sr = fmt != float32 and mode == S.SR
    if sr != (seeds is not None) or (sr and len(seeds) != ROUNDINGS):
        raise ValueError(f"seeds: {ROUNDINGS} seeds with rounding='stochastic' into a format "
                         f"other than float32, else None; got {seeds!r}")
    flat = [a.reshape(-1).view(np.uint32) for a in arrays]
    out = [np.empty_like(flat[0]) for _ in range(3)]
    step(*flat, *out, consts, eps, fmt, mode, seeds, maximize)
    return tuple(o.view(np.float32).reshape(arrays[0].shape) for o in out)


def step(p, g, m, v, outp, outm, outv, consts, eps, fmt: Format, mode: int, seeds,
         maximize: bool):
    """:func:`pa_adamw` on flat uint32 views of checked float32 arrays, writing ``outp``,
    ``outm``, ``outv`` (for callers that checked everything already, e.g. torch_bridge);
    ``mode`` is the kernel's rounding code (emu.ops.ROUNDING)."""
    rnd = fmt != float32            # rounding into float32 is the identity: no streams
    sr = rnd and mode == S.SR
    kind = GENERAL if rnd else NONE
    if rnd and _in_place(fmt.consts, mode, True, False):
        kind = IN_PLACE
    keys = np.array([stochastic_key(s) if sr else 0 for s in (seeds or [0] * ROUNDINGS)],
                    np.int64)
    c = np.array([0.0 if x is None else x for x in consts], np.float32).view(np.uint32)
    # LLVM runs the vectorised loop only where no output overlaps an input (a runtime
    # check): an update in place (torch_bridge's) writes fresh arrays, then copies back
    outs = (outp, outm, outv)
    to = [np.empty_like(o) if any(np.may_share_memory(o, x) for x in (p, g, m, v)) else o
          for o in outs]
    _ADAMW[kind][p.size >= sizes.SERIAL](p, g, m, v, *to, fmt.consts, mode, keys,
                                         c.astype(np.int64), np.float32(eps),
                                         consts[0] is not None, bool(maximize))
    for o, t in zip(outs, to):
        if t is not o:
            o[...] = t

"""Derivatives of the PA operations and of PAM matmul, both kinds of Table 1.

Kosson & Jaggi, section 2.5 and Table 1:

* ``kind="exact"``: the true, piecewise-constant derivative of the PA function.  It
  is always a signed power of two times δ_Y and is computed exactly, as a PAM by
  that power of two (emu/_scalar_grad.py; flush/overflow as PAM).
* ``kind="approx"`` (the paper's "approximate"/"mimic" derivative): the analytical
  derivative of the function being approximated, evaluated with PA operations,
  e.g. ``δ_A = B ·̂ δ_Y`` for ``Y = A ·̂ B``.

The derived operations paexp, palog and pasqrt are differentiated through the graph
that defines them (eqs. 18-20), with the chosen kind at every node.  All inputs are
rounded to ``fmt`` (RNE) first, like the forward operations, so the derivative is
taken at the operand values the forward pass used; δ_Y is an operand too.  Elementwise
results have the broadcast shape of the inputs (reducing a broadcast operand's
gradient is the caller's business); :func:`pam_matmul` returns gradients shaped like
its operands.  The exact rules, including specials and kinks, are in
docs/torch_bridge.md ("Exact derivatives").
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from . import _kernels_grad as KG
from . import device
from .formats import Format, float32, format
from .matmul import _batch_index, pam_matmul as _pam_matmul
from .ops import _flat_u32, as_float32, pa_div as _pa_div, pa_exp2 as _pa_exp2, \
    pa_sqrt as _pa_sqrt, pam_mul as _pam_mul, quantize

__all__ = ["KINDS", "ln2", "pam_mul", "pa_div", "pa_exp2", "pa_log2", "pa_exp", "pa_log",
           "pa_sqrt", "pam_matmul"]

#: the two kinds of derivative of Table 1
KINDS = ("exact", "approx")

# ln(2) to 40 significant digits: far more than any rounding to <= 24 bits needs
_LN2 = Fraction("0.6931471805599453094172321214581765680755")


def ln2(fmt: Format | str = float32) -> np.float32:
    """ln(2) rounded (RNE) to ``fmt``: the constant of the approximate derivatives of
    paexp2 and palog2 (Table 1)."""
    fmt = format(fmt)
    quantum = Fraction(2) ** (max(-1, fmt.emin) - fmt.man_bits)   # ln2 = 2^-1 (1.386...)
    return np.float32(round(_LN2 / quantum) * quantum)             # Fraction: ties to even


def _kind(kind) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {KINDS}")
    return kind


def _broadcast(names, *arrays):
    """The broadcast shape (device._broadcast's error names every operand) and views."""
    shape = device._broadcast(*zip(names, arrays))
    return shape, [np.broadcast_to(a, shape) for a in arrays]


def _scalar_out(out, *inputs):
    return out[()] if all(np.ndim(x) == 0 for x in inputs) else out


def _exact_binary(name, a, b, dy, fmt):
    """Exact (δ_A, δ_B) of the binary op ``name`` by its kernel (CPU or CUDA)."""
    gpu = device.prepare(None, a=a, b=b, dy=dy)
    if gpu is not None:
        return gpu.grad_binary(name, a, b, dy, fmt.consts)
    kernel = KG.BINARY[name]
    shape, (x, y, d) = _broadcast(("a", "b", "dy"), as_float32(a, "a"), as_float32(b, "b"),
                                  as_float32(dy, "dy"))
    outa = np.empty(int(np.prod(shape)), np.uint32)
    outb = np.empty_like(outa)
    kernel(_flat_u32(x), _flat_u32(y), _flat_u32(d), outa, outb, fmt.consts)
    return (_scalar_out(outa.view(np.float32).reshape(shape), a, b, dy),
            _scalar_out(outb.view(np.float32).reshape(shape), a, b, dy))


def _exact_unary(name, x, dy, fmt):
    """Exact δ_A of the unary op ``name`` by its kernel (CPU or CUDA)."""
    gpu = device.prepare(None, x=x, dy=dy)
    if gpu is not None:
        return gpu.grad_unary(name, x, dy, fmt.consts)
    kernel = KG.UNARY[name]
    shape, (v, d) = _broadcast(("x", "dy"), as_float32(x, "x"), as_float32(dy, "dy"))
    out = np.empty(int(np.prod(shape)), np.uint32)
    kernel(_flat_u32(v), _flat_u32(d), out, fmt.consts)
    return _scalar_out(out.view(np.float32).reshape(shape), x, dy)


def _full(x, shape):
    return np.broadcast_to(as_float32(x, "x"), shape)


def pam_mul(a, b, dy, fmt: Format | str = float32, kind: str = "exact"):
    """(δ_A, δ_B) of ``Y = A ·̂ B`` (eqs. 5-8).  Table 1:
    exact ``δ_A = sign(B) 2^(E_B + 1{M_A + M_B >= 1}) δ_Y``, approx ``δ_A = B ·̂ δ_Y``."""
    fmt = format(fmt)
    if _kind(kind) == "exact":
        return _exact_binary("pam_mul", a, b, dy, fmt)
    return _pam_mul(b, dy, fmt), _pam_mul(a, dy, fmt)


def pa_div(a, b, dy, fmt: Format | str = float32, kind: str = "exact"):
    """(δ_A, δ_B) of ``Y = A ÷̂ B`` (eqs. 14-17).  Table 1: exact
    ``δ_A = sign(B) 2^(-E_B - 1{M_A < M_B}) δ_Y``, ``δ_B = -sign(A) 2^(E_A - 2E_B -
    1{M_A < M_B}) δ_Y``; approx ``δ_A = δ_Y ÷̂ B``, ``δ_B = -(A ·̂ δ_Y) ÷̂ (B ·̂ B)``."""
    fmt = format(fmt)
    if _kind(kind) == "exact":
        return _exact_binary("pa_div", a, b, dy, fmt)
    # -(A ·̂ δ) = (A ·̂ δ) ·̂ -1 exactly (PAM by ±1 only sets the sign; NaNs stay
    # canonical), which needs no negation of a possibly CUDA operand
    minus = _pam_mul(_pam_mul(a, dy, fmt), np.float32(-1), fmt)
    return _pa_div(dy, b, fmt), _pa_div(minus, _pam_mul(b, b, fmt), fmt)


def _exp2_approx(y, dy, fmt):
    """Table 1, approx paexp2: δ_A = paexp2(A) ·̂ ln2 ·̂ δ_Y."""
    return _pam_mul(_pam_mul(y, ln2(fmt), fmt), dy, fmt)


def _log2_approx(x, dy, fmt):
    """Table 1, approx palog2: δ_A = δ_Y ÷̂ (A ·̂ ln2)."""
    return _pa_div(dy, _pam_mul(x, ln2(fmt), fmt), fmt)


def _log2e(fmt):
    return np.uint32(fmt.consts.log2e32).view(np.float32)


def pa_exp2(x, dy, fmt: Format | str = float32, kind: str = "exact"):
    """δ_A of ``Y = paexp2(A)`` (eq. 9): exact ``2^floor(A) δ_Y``, approx
    ``paexp2(A) ·̂ ln2 ·̂ δ_Y`` (Table 1)."""
    fmt = format(fmt)
    if _kind(kind) == "exact":
        return _exact_unary("pa_exp2", x, dy, fmt)
    return _exp2_approx(_pa_exp2(x, fmt), dy, fmt)


def pa_log2(x, dy, fmt: Format | str = float32, kind: str = "exact"):
    """δ_A of ``Y = palog2(A)`` (eq. 10): exact ``2^-E_A δ_Y``, approx
    ``δ_Y ÷̂ (A ·̂ ln2)`` (Table 1)."""
    fmt = format(fmt)
    if _kind(kind) == "exact":
        return _exact_unary("pa_log2", x, dy, fmt)
    return _log2_approx(quantize(x, fmt), dy, fmt)


def pa_exp(x, dy, fmt: Format | str = float32, kind: str = "exact"):
    """δ_A of ``Y = paexp(A) = paexp2(A ·̂ log2e)`` (eq. 18), through its graph:
    ``δ_T`` of paexp2 at ``T = A ·̂ log2e``, then ``δ_A`` of the PAM by log2e."""
    fmt = format(fmt)
    if _kind(kind) == "exact":
        return _exact_unary("pa_exp", x, dy, fmt)
    t = _pam_mul(x, _log2e(fmt), fmt)
    return _pam_mul(_exp2_approx(_pa_exp2(t, fmt), dy, fmt), _log2e(fmt), fmt)


def pa_log(x, dy, fmt: Format | str = float32, kind: str = "exact"):
    """δ_A of ``Y = palog(A) = palog2(A) ÷̂ log2e`` (eq. 19), through its graph:
    ``δ_L = δ_Y ÷̂ log2e``, then palog2's derivative."""
    fmt = format(fmt)
    if _kind(kind) == "exact":
        return _exact_unary("pa_log", x, dy, fmt)
    return _log2_approx(quantize(x, fmt), _pa_div(dy, _log2e(fmt), fmt), fmt)


def pa_sqrt(x, dy, fmt: Format | str = float32, kind: str = "exact"):
    """δ_A of ``Y = pasqrt(A) = paexp2(palog2(A) ÷̂ 2)`` (eq. 20), through its graph:
    paexp2's derivative at the result, ``÷̂ 2``, palog2's derivative."""
    fmt = format(fmt)
    if _kind(kind) == "exact":
        return _exact_unary("pa_sqrt", x, dy, fmt)
    xq = quantize(x, fmt)
    dh = _exp2_approx(_pa_sqrt(xq, fmt), dy, fmt)
    return _log2_approx(xq, _pa_div(dh, np.float32(2), fmt), fmt)


# --- PAM matmul ----------------------------------------------------------------------

def _contract(g, x, w, kind, fmt, acc):
    """out[kept..., p, c] = fold over (reduced batch indices in C order, then r) of
    acc ⊕ term(g[..., p, r], x[..., p, c], w[..., r, c]), shaped like x.

    ``g``: (batch..., P, R) with the full broadcast batch; ``x``: (xbatch..., P, C),
    the operand whose gradient this is; ``w``: (wbatch..., R, C), the other operand
    (transposed as needed).  Batch dimensions x was broadcast over are reduced by
    folding them into the contraction, in C order before r.  term = ``w ·̂ g``
    (approx) or the exact slope of ``x ·̂ w`` with respect to x applied to g.
    """
    gperm, gshape, wperm, wshape, xshape = _contract_layout(g.shape, x.shape)
    if gperm is not None:
        w = np.broadcast_to(w, g.shape[:-2] + w.shape[-2:]).transpose(wperm).reshape(wshape)
        g = g.transpose(gperm).reshape(gshape)
        x = x.reshape(xshape)
    if kind == "approx":
        out = _pam_matmul(g, w, fmt, acc)
    else:
        out = _exact_contract(g, x, w, fmt, acc)
    return out.reshape(x.shape)


def _contract_layout(gshape, xshape):
    """The layout of :func:`_contract`: ``(gperm, gshape, wperm, wshape, xshape)`` with
    ``g.transpose(gperm).reshape(gshape)``, ``broadcast_to(w, batch + (R, C))
    .transpose(wperm).reshape(wshape)`` and ``x.reshape(xshape)`` (perms None when no
    batch dimension is reduced).  The reduced batch dimensions move next to r and
    merge into it, in C order before r."""
    batch = tuple(gshape[:-2])
    P, R = gshape[-2:]
    C = xshape[-1]
    xb = (1,) * (len(batch) - (len(xshape) - 2)) + tuple(xshape[:-2])
    red = [d for d in range(len(batch)) if xb[d] == 1 and batch[d] != 1]
    kept = [d for d in range(len(batch)) if d not in red]
    if not red:
        return None, None, None, None, None
    nd = len(batch)
    kshape = tuple(batch[d] for d in kept)
    folded = R * int(np.prod([batch[d] for d in red]))     # explicit: sizes may be 0
    return ((*kept, nd, *red, nd + 1), kshape + (P, folded), (*kept, *red, nd, nd + 1),
            kshape + (folded, C), tuple(xb[d] for d in kept) + (P, C))


def _exact_contract(g, x, w, fmt, acc):
    batch = g.shape[:-2]
    P, R = g.shape[-2:]
    C = x.shape[-1]
    if g.size == 0 or x.size == 0:
        return np.zeros(batch + (P, C), np.float32)

    def flat(v, rows, cols):
        return quantize(v, fmt).view(np.int32).reshape(int(np.prod(v.shape[:-2])), rows, cols)
    ix = _batch_index(x.shape[:-2], batch)
    iw = _batch_index(w.shape[:-2], batch)
    out = KG.matmul_grad(flat(g, P, R), flat(x, P, C), flat(w, R, C), ix, iw, fmt.consts,
                         None if acc == float32 else acc.consts)
    return out.reshape(batch + (P, C))


def _matmul_shapes(ashape, bshape, gshape):
    """(A as >= 2-D, B as >= 2-D, broadcast batch, full dY shape) of a PAM matmul
    gradient; ValueError for shapes np.matmul would reject or a dY of another shape."""
    ashape, bshape, gshape = tuple(ashape), tuple(bshape), tuple(gshape)
    if not ashape or not bshape:
        raise ValueError(f"pam_matmul operands must have at least one dimension, got "
                         f"A.shape={ashape}, B.shape={bshape}")
    a2 = (1,) + ashape if len(ashape) == 1 else ashape
    b2 = bshape + (1,) if len(bshape) == 1 else bshape
    if a2[-1] != b2[-2]:
        raise ValueError(f"pam_matmul: contracted dimensions differ: A.shape={ashape}, "
                         f"B.shape={bshape}")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ValueError(f"pam_matmul: batch dimensions do not broadcast: A.shape={ashape}, "
                         f"B.shape={bshape}") from None
    want = batch + a2[-2:-1] * (len(ashape) > 1) + b2[-1:] * (len(bshape) > 1)
    if gshape != want:
        raise ValueError(f"dY.shape={gshape} must be the shape of pam_matmul(A, B), {want}")
    return a2, b2, batch, batch + (a2[-2], b2[-1])


def pam_matmul(A, B, dY, fmt: Format | str = float32, acc: Format | str = float32,
               kind: str = "approx", need=(True, True)):
    """(δA, δB) of ``Y = pam_matmul(A, B, fmt, acc)`` (emu.pam_matmul, np.matmul shapes).

    ``approx`` (section 3.2: the same PAM matmul on the backward pass):
    ``δA = pam_matmul(δY, Bᵀ)``, ``δB = pam_matmul(Aᵀ, δY)``.  ``exact`` (Table 1):
    ``δA[i, k] = fold over j of acc ⊕ sign(B[k,j]) 2^(E_B[k,j] + 1{M_A[i,k] + M_B[k,j]
    >= 1}) δY[i, j]`` and symmetrically for δB.  Either way every fold runs in
    increasing order from +0.0 in ``acc``; an operand broadcast over batch dimensions
    gets one fold over (those batch indices in C order, then the contracted index).
    ``need``: which of (δA, δB) to compute; the other is None.
    """
    fmt = format(fmt, argname="fmt")
    acc = format(acc, argname="acc")
    kind = _kind(kind)
    gpu = device.prepare(None, A=A, B=B, dY=dY)
    if gpu is not None:
        return gpu.matmul_grad(A, B, dY, fmt, acc, kind, need, _matmul_shapes,
                               _contract_layout, _batch_index)
    a = as_float32(A, "A")
    b = as_float32(B, "B")
    g = as_float32(dY, "dY")
    a2shape, b2shape, batch, full = _matmul_shapes(a.shape, b.shape, g.shape)
    a2 = a.reshape(a2shape)
    b2 = b.reshape(b2shape)
    g = g.reshape(full)
    da = db = None
    if need[0]:
        da = _contract(g, a2, np.swapaxes(b2, -1, -2), kind, fmt, acc).reshape(a.shape)
    if need[1]:
        if kind == "approx" and b2.ndim == 2 and a2.shape[:-2] == batch:
            # a 2-D B (a weight): one fold over (batch, i); both products below give
            # the same bits (PAM commutes), so transpose the smaller operand
            rows = int(np.prod(a2.shape[:-1]))         # explicit: K may be 0
            a_2d = a2.reshape(rows, a2.shape[-1])
            g_2d = g.reshape(rows, g.shape[-1])
            if a_2d.size <= g_2d.size:
                db = _pam_matmul(a_2d.T, g_2d, fmt, acc)
            else:
                db = _pam_matmul(g_2d.T, a_2d, fmt, acc).T
        else:
            db = np.swapaxes(_contract(np.swapaxes(g, -1, -2), np.swapaxes(b2, -1, -2), a2,
                                       kind, fmt, acc), -1, -2)
        db = db.reshape(b.shape)
    return da, db

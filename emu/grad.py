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

import numpy as np

from . import _kernels_grad as KG
from . import _scalar_mul as SM
from . import cuda_backend
from . import ops as ops_module
from .backend import backend_for
from .formats import Format, float32, format
from .host import as_float32
from .matmul import host_matmul as _pam_matmul
from .matmul import params_of
from .multipliers import MULTIPLIERS, _product, _product_grad, multiplier
from .ops import quantize
from .registry import ln2, ops
from .shapes import batch_index, contract_layout, elementwise, matmul_grad_shapes

__all__ = ["KINDS", "ln2", "matmul", "pam_matmul"]     # + one function per differentiable registry op

#: the two kinds of derivative of Table 1
KINDS = ("exact", "approx")


def _commutes(mp) -> bool:
    """Whether the multiplier's product is symmetric in its operands (a corrected-PAM
    table given as data need not be)."""
    k = int(mp.k)
    if k == 0:
        return True
    t = np.asarray(mp.table).reshape(1 << k, 1 << k)
    return bool((t == t.T).all())


def _kind(kind) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {KINDS}")
    return kind


def _exact_binary(name, a, b, dy, fmt):
    """Exact (δ_A, δ_B) of the binary op ``name`` by its kernel (CPU or CUDA)."""
    backend, (av, bv, dv) = backend_for(None, {"a": a, "b": b, "dy": dy})
    return backend.grad_binary(elementwise(name, fmt.consts, a=av, b=bv, dy=dv), av, bv, dv)


def _exact_unary(name, x, dy, fmt):
    """Exact δ_A of the unary op ``name`` by its kernel (CPU or CUDA)."""
    backend, (xv, dv) = backend_for(None, {"x": x, "dy": dy})
    return backend.grad_unary(elementwise(name, fmt.consts, x=xv, dy=dv), xv, dv)


def _derivative(op):
    """The derivative front end of a differentiable registry op (emu/registry.py)."""
    E = ops_module
    if op.arity == 1:
        def f(x, dy, fmt: Format | str = float32, kind: str = "exact"):
            fmt = format(fmt)
            if _kind(kind) == "exact":
                return _exact_unary(op.name, x, dy, fmt)
            return op.approx(E, x, dy, fmt)
        what = "δ_A of ``Y = {}(A)``"
    else:
        def f(a, b, dy, fmt: Format | str = float32, kind: str = "exact"):
            fmt = format(fmt)
            if _kind(kind) == "exact":
                return _exact_binary(op.name, a, b, dy, fmt)
            return op.approx(E, a, b, dy, fmt)
        what = "(δ_A, δ_B) of ``Y = {}(A, B)``"
    f.__name__ = f.__qualname__ = op.name
    f.__module__ = __name__
    f.__doc__ = (what.format(op.name) + f": {op.doc}\n\n    ``kind='exact'``: Table 1's exact "
                 f"derivative (emu/_scalar_grad.py); ``'approx'``: {op.approx.__doc__ or ''}")
    return f


for _op in ops(differentiable=True):
    globals()[_op.name] = _derivative(_op)
    __all__.append(_op.name)
del _op


def mul(a, b, dy, fmt: Format | str = float32, kind: str = "exact", mul="pam"):
    """(δA, δB) of ``Y = emu.mul(A, B, fmt, mul=mul)``, operands (host or CUDA) broadcast
    together.

    ``kind='exact'``: the multiplier's own derivative (emu/_scalar_mul.product_da): for a
    pattern sum a signed power of two with the constant in the mantissa carry, for
    ``exact`` and ``float`` the real product's (``RN(B δY)``), for a table the secant
    to the operand's neighbouring encoding.  ``'approx'``: the multiplier itself,
    ``δA = mul(δY, B)``, ``δB = mul(δY, A)`` (δY first, as in :func:`matmul`; a table's
    is the ``exact`` multiplier's).  ``mul="pam"`` is :func:`pam_mul`."""
    m = multiplier(mul)
    kind = _kind(kind)
    if m == MULTIPLIERS["pam"]:
        return pam_mul(a, b, dy, fmt, kind)     # noqa: F821 (made from the registry above)
    fmt = format(fmt)
    if kind == "exact":
        return _product_grad(a, b, dy, fmt, m)
    if m.kind == "table":
        m = MULTIPLIERS["exact"]
    return _product(dy, b, fmt, m), _product(dy, a, fmt, m)


__all__.append("mul")


# --- PAM matmul ----------------------------------------------------------------------

def _contract(g, x, w, kind, fmt, acc, mp=None, own_first=True):
    """out[kept..., p, c] = fold over (reduced batch indices in C order, then r) of
    acc ⊕ term(g[..., p, r], x[..., p, c], w[..., r, c]), shaped like x.

    ``g``: (batch..., P, R) with the full broadcast batch; ``x``: (xbatch..., P, C),
    the operand whose gradient this is; ``w``: (wbatch..., R, C), the other operand
    (transposed as needed).  Batch dimensions x was broadcast over are reduced by
    folding them into the contraction, in C order before r.  term = ``w ·̂ g``
    (approx) or the exact slope of ``x ·̂ w`` (``own_first`` False: ``w ·̂ x``) with
    respect to x applied to g.
    """
    gperm, gshape, wperm, wshape, xshape = contract_layout(g.shape, x.shape)
    if gperm is not None:
        w = np.broadcast_to(w, g.shape[:-2] + w.shape[-2:]).transpose(wperm).reshape(wshape)
        g = g.transpose(gperm).reshape(gshape)
        x = x.reshape(xshape)
    if kind == "approx":
        out = _pam_matmul(g, w, fmt, acc, mp)
    else:
        out = _exact_contract(g, x, w, fmt, acc, mp, own_first)
    return out.reshape(x.shape)


def _exact_contract(g, x, w, fmt, acc, mp=None, own_first=True):
    batch = g.shape[:-2]
    P, R = g.shape[-2:]
    C = x.shape[-1]
    if g.size == 0 or x.size == 0:
        return np.zeros(batch + (P, C), np.float32)

    def flat(v, rows, cols):        # (host_matmul_grad rounded the operands to fmt)
        return v.view(np.int32).reshape(int(np.prod(v.shape[:-2])), rows, cols)
    ix = batch_index(x.shape[:-2], batch)
    iw = batch_index(w.shape[:-2], batch)
    if mp is None:
        out = KG.matmul_grad(flat(g, P, R), flat(x, P, C), flat(w, R, C), ix, iw, fmt.consts,
                             None if acc == float32 else acc.consts)
    else:
        out = KG.matmul_grad_mul(flat(g, P, R), flat(x, P, C), flat(w, R, C), ix, iw,
                                 fmt.consts, acc.consts, mp, own_first)
    return out.reshape(batch + (P, C))


def matmul(A, B, dY, fmt: Format | str = float32, acc: Format | str = float32,
           kind: str = "approx", need=(True, True), *, mul="pam", mul_fmt=None):
    """(δA, δB) of ``Y = emu.matmul(A, B, fmt, acc, mul=mul)``: :func:`pam_matmul`'s rules
    with the multiplier ``mul`` in every product of the approximate derivative
    (``δA = matmul(δY, Bᵀ)``, ``δBᵀ = matmul(δYᵀ, A)``: δY is the first operand of
    every product, which matters for a multiplier that does not commute).
    ``kind='exact'``: each term is the multiplier's exact derivative (:func:`mul`)
    times δY, folded as PAM's; for ``exact`` and ``float`` that term is ``B δY``
    unrounded, so the fold is the approximate one with the ``exact`` multiplier (one
    fused step per term).  The exact fold of a pattern sum other than PAM takes one
    scalar step per term (a slow path on the CPU: no fast kernel yet).  ``mul_fmt``:
    as for emu.matmul."""
    m = multiplier(mul)
    kind = _kind(kind)
    fmt = format(fmt, argname="fmt").arithmetic()
    acc = format(acc, argname="acc").accumulator("acc")
    mp = params_of(m, fmt if mul_fmt is None else mul_fmt)     # None: the backends' PAM
    if mp is not None and mp.kind == SM.TABLE and kind == "approx":
        mp = MULTIPLIERS["exact"].params(fmt)       # a table's approximate rule: the product's
    elif kind == "exact" and mp is not None and mp.kind in (SM.EXACT, SM.FLOAT):
        kind, mp = "approx", MULTIPLIERS["exact"].params(fmt)
    gpu = cuda_backend.prepare(None, A=A, B=B, dY=dY)
    if gpu is not None:
        return gpu.matmul_grad(A, B, dY, fmt, acc, kind, need, mp)
    return host_matmul_grad(as_float32(A, "A"), as_float32(B, "B"), as_float32(dY, "dY"),
                            fmt, acc, kind, need, mp)


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
    return matmul(A, B, dY, fmt, acc, kind, need)


def host_matmul_grad(a, b, g, fmt: Format, acc: Format, kind: str, need=(True, True),
                     mp=None):
    """:func:`pam_matmul` (with ``mp``, a multiplier's ``params(fmt)``: :func:`matmul`'s
    approximate derivative) of float32 numpy arrays with Format objects and a checked
    ``kind``, without the front end's conversions (for callers that checked their
    operands already, e.g. torch_bridge's per-call path); the shapes are still checked."""
    # δB's products are g ·̂ a; a ·̂ g gives the same bits where the multiplier commutes
    swap_ok = mp is None or _commutes(mp)
    if (kind == "approx" and a.ndim == 2 and b.ndim == 2 and g.shape == (a.shape[0], b.shape[1])
            and a.shape[1] == b.shape[0]):
        # plain 2-D: what the general code below computes, without its layout work
        da = _pam_matmul(g, b.T, fmt, acc, mp) if need[0] else None
        db = None
        if need[1]:
            db = _pam_matmul(a.T, g, fmt, acc, mp) if a.size <= g.size and swap_ok else \
                _pam_matmul(g.T, a, fmt, acc, mp).T
        return da, db
    a2shape, b2shape, batch, full = matmul_grad_shapes(a.shape, b.shape, g.shape)
    if kind == "exact":     # rounded once here, before any transposed view of them
        a, b, g = (quantize(v, fmt) for v in (a, b, g))
    a2 = a.reshape(a2shape)
    b2 = b.reshape(b2shape)
    g = g.reshape(full)
    da = db = None
    if need[0]:
        da = _contract(g, a2, np.swapaxes(b2, -1, -2), kind, fmt, acc, mp).reshape(a.shape)
    if need[1]:
        if kind == "approx" and b2.ndim == 2 and a2.shape[:-2] == batch:
            # a 2-D B (a weight): one fold over (batch, i); both products below give
            # the same bits (PAM commutes), so transpose the smaller operand
            rows = int(np.prod(a2.shape[:-1]))         # explicit: K may be 0
            a_2d = a2.reshape(rows, a2.shape[-1])
            g_2d = g.reshape(rows, g.shape[-1])
            if a_2d.size <= g_2d.size and swap_ok:
                db = _pam_matmul(a_2d.T, g_2d, fmt, acc, mp)
            else:
                db = _pam_matmul(g_2d.T, a_2d, fmt, acc, mp).T
        else:
            db = np.swapaxes(_contract(np.swapaxes(g, -1, -2), np.swapaxes(b2, -1, -2), a2,
                                       kind, fmt, acc, mp, own_first=False), -1, -2)
        db = db.reshape(b.shape)
    return da, db

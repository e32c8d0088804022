"""The registry of elementwise operations: one :class:`Op` entry per operation.

An entry names everything that defines the operation once: its arity, its scalar
definition on bit patterns (emu/_scalar.py), the scalar definitions of its exact
derivatives (emu/_scalar_grad.py, Table 1), its approximate derivative (Table 1's
"approx" column, composed of other operations), its oracle and oracle derivative
(emu/reference.py, emu/reference_grad.py) and the section of docs/semantics.md it
follows.  Everything else is derived from :data:`OPS`: the CPU kernels
(emu/_kernels.py, emu/_kernels_grad.py), the CUDA kernels (emu/_cuda.py), the numpy
front ends (emu/ops.py, emu/grad.py), torch_bridge's autograd Functions and
functional API, and the parametrised tests.  Adding an operation is its scalar
definition, its oracle and one entry here (CONTRIBUTING.md has the checklist).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba.extending import register_jitable

from . import _scalar as S
from . import _scalar_approx as A
from . import _scalar_grad as G
from . import reference as R
from . import reference_grad as RG
from .formats import Format, float32, format

__all__ = ["Op", "OPS", "ops", "ln2", "log2e"]


@dataclass(frozen=True)
class Op:
    """One elementwise operation.

    ``scalar(x[, y], fc)``: the ``register_jitable`` definition on float32 patterns of
    values of the format (int64 in, pattern out).  ``grads``: the exact derivative
    with respect to each operand, ``(x[, y], dy, fc)`` -> pattern, or None for an op
    without derivatives.  ``approx(E, x[, y], dy, fmt)``: the approximate derivative
    built from the front ends of module ``E`` (emu.ops); a tuple for binary ops.
    ``oracle(x[, y], fmt)`` / ``oracle_grad(x[, y], dy, fmt, kind)``: the exact
    rational definitions.  ``public``: whether emu exports a front end of this name
    (``fp_mul_daz`` is ``fp_mul(..., subnormals=False)``).  ``approx_scalar``: ``approx``
    on one element (emu/_scalar_approx.py), ``(x[, y], dy, ln2, fc)``, for fused kernels.
    ``scalar32``: a twin of ``scalar`` on uint32 patterns, equal for every input, that
    the CPU kernels run where operands need no rounding (emu/_kernels.py).
    """
    name: str
    arity: int
    scalar: Callable
    oracle: Callable
    section: str
    doc: str
    grads: tuple | None = None
    approx: Callable | None = None
    oracle_grad: Callable | None = None
    public: bool = True
    approx_scalar: Callable | None = None
    scalar32: Callable | None = None

    @property
    def differentiable(self) -> bool:
        return self.grads is not None


def ops(arity: int | None = None, *, public: bool | None = None,
        differentiable: bool | None = None) -> list[Op]:
    """The entries of :data:`OPS` (in registry order) with the given properties."""
    return [op for op in OPS.values()
            if (arity is None or op.arity == arity)
            and (public is None or op.public == public)
            and (differentiable is None or op.differentiable == differentiable)]


# --- constants of the approximate derivatives ------------------------------------------

def ln2(fmt: Format | str = float32) -> np.float32:
    """ln(2) rounded (RNE) to ``fmt``: the constant of the approximate derivatives of
    paexp2 and palog2 (Table 1)."""
    return np.uint32(format(fmt).consts.ln2_32).view(np.float32)


def log2e(fmt: Format) -> np.float32:
    """log2(e) in ``fmt``: the constant of paexp and palog (eqs. 18, 19)."""
    return np.uint32(fmt.consts.log2e32).view(np.float32)


# --- approximate derivatives (Table 1, "approx"): the analytical derivative of the
# function being approximated, evaluated with PA operations ------------------------------

def _exp2_approx(E, y, dy, fmt):
    """paexp2's: δ_A = paexp2(A) ·̂ ln2 ·̂ δ_Y, from the result y = paexp2(A)."""
    return E.pam_mul(E.pam_mul(y, ln2(fmt), fmt), dy, fmt)


def _log2_approx(E, x, dy, fmt):
    """palog2's: δ_A = δ_Y ÷̂ (A ·̂ ln2)."""
    return E.pa_div(dy, E.pam_mul(x, ln2(fmt), fmt), fmt)


def _pam_mul_approx(E, a, b, dy, fmt):
    """δ_A = B ·̂ δ_Y, δ_B = A ·̂ δ_Y."""
    return E.pam_mul(b, dy, fmt), E.pam_mul(a, dy, fmt)


def _pa_div_approx(E, a, b, dy, fmt):
    """δ_A = δ_Y ÷̂ B, δ_B = -(A ·̂ δ_Y) ÷̂ (B ·̂ B)."""
    # -(A ·̂ δ) = (A ·̂ δ) ·̂ -1 exactly (PAM by ±1 only sets the sign; NaNs stay
    # canonical), which needs no negation of a possibly CUDA operand
    minus = E.pam_mul(E.pam_mul(a, dy, fmt), np.float32(-1), fmt)
    return E.pa_div(dy, b, fmt), E.pa_div(minus, E.pam_mul(b, b, fmt), fmt)


def _pa_exp2_approx(E, x, dy, fmt):
    """δ_A = paexp2(A) ·̂ ln2 ·̂ δ_Y."""
    return _exp2_approx(E, E.pa_exp2(x, fmt), dy, fmt)


def _pa_log2_approx(E, x, dy, fmt):
    """δ_A = δ_Y ÷̂ (A ·̂ ln2)."""
    return _log2_approx(E, E.quantize(x, fmt), dy, fmt)


def _pa_exp_approx(E, x, dy, fmt):
    """Through the graph of eq. 18: δ_T of paexp2 at T = A ·̂ log2e, then the PAM's."""
    t = E.pam_mul(x, log2e(fmt), fmt)
    return E.pam_mul(_exp2_approx(E, E.pa_exp2(t, fmt), dy, fmt), log2e(fmt), fmt)


def _pa_log_approx(E, x, dy, fmt):
    """Through the graph of eq. 19: δ_L = δ_Y ÷̂ log2e, then palog2's."""
    return _log2_approx(E, E.quantize(x, fmt), E.pa_div(dy, log2e(fmt), fmt), fmt)


def _pa_sqrt_approx(E, x, dy, fmt):
    """Through the graph of eq. 20: paexp2's at the result, ÷̂ 2, palog2's."""
    xq = E.quantize(x, fmt)
    dh = _exp2_approx(E, E.pa_sqrt(xq, fmt), dy, fmt)
    return _log2_approx(E, xq, E.pa_div(dh, np.float32(2), fmt), fmt)


# --- scalar variants ----------------------------------------------------------------------

@register_jitable
def _fp_mul_keep(a, b, fc):
    return S.fp_mul(a, b, fc, True)


@register_jitable
def _fp_mul_daz(a, b, fc):
    return S.fp_mul(a, b, fc, False)


_PA = "§3 Piecewise affine operations"
_IEEE = "§4 IEEE addition and multiplication"

def _pa(name: str, arity: int, what: str, doc: str) -> Op:
    """The entry of a PA operation: its scalar definition, oracle, exact derivatives
    (``name_da``/``name_db``, or ``name_dx``), approximate derivative (and its scalar
    form ``name_approx``) and oracle derivative are the functions of that name in their
    modules."""
    grads = tuple(getattr(G, f"{name}_{d}") for d in (("da", "db") if arity == 2 else ("dx",)))
    return Op(name, arity, getattr(S, name), getattr(R, name), f"{_PA}, {what}", doc, grads,
              globals()[f"_{name}_approx"], getattr(RG, name),
              approx_scalar=getattr(A, f"{name}_approx"), scalar32=getattr(S, f"{name}32", None))


#: every elementwise operation, by name
OPS: dict[str, Op] = {op.name: op for op in [
    _pa("pam_mul", 2, "PAM multiply", "Piecewise affine multiplication a ·̂ b (eqs. 5-8)."),
    _pa("pa_div", 2, "PA division", "Piecewise affine division a ÷̂ b (eqs. 14-17)."),
    _pa("pa_exp2", 1, "pa_exp2", "paexp2(x) = 2^floor(x) (1 + x - floor(x)) (eq. 9), rounded "
        "once into ``fmt``."),
    _pa("pa_log2", 1, "pa_log2", "palog2(x) = E_x + M_x (eq. 10), rounded once into ``fmt``."),
    _pa("pa_exp", 1, "pa_exp", "paexp(x) = paexp2(log2(e) ·̂ x) (eq. 18)."),
    _pa("pa_log", 1, "pa_log", "palog(x) = palog2(x) ÷̂ log2(e) (eq. 19)."),
    _pa("pa_sqrt", 1, "pa_sqrt", "pasqrt(x) = paexp2(palog2(x) / 2) (eq. 20), exact then "
        "rounded once into ``fmt``."),
    Op("fp_add", 2, S.fp_add, R.fp_add, _IEEE,
       "IEEE 754 addition, correctly rounded (RNE) into ``fmt``: the accumulator's ⊕."),
    Op("fp_mul", 2, _fp_mul_keep, R.fp_mul, _IEEE,
       "IEEE 754 multiplication, correctly rounded (RNE) into ``fmt``: the baseline "
       "multiplier."),
    Op("fp_mul_daz", 2, _fp_mul_daz, functools.partial(R.fp_mul, subnormals=False), _IEEE,
       "IEEE 754 multiplication with subnormal operands read as 0 and results flushed.",
       public=False),
]}

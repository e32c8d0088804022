"""The nodes of a composite on one element, as ``register_jitable`` functions: what the
kernels generated from torch_bridge/composites.py (torch_bridge/_compose.py) call.

A composite is a graph of PA primitives (emu's operations, each with its operands
rounded into the format by ``round_to``) and float32 additions, negations, selections
and defined-order sums.  Per node kind this module has the forward glue (``rnd``: the
operand rounding, ``add``, ``sub``, ``neg``, ``clamp_max``) and the backward of each
node: emu's exact derivative (emu/_scalar_grad.py, Table 1) or approximate rule
(emu/_scalar_approx.py) of its saved operands and its incoming gradient rounded as the
graph's Function rounds it (``mul_g``, ``div_g``, ``exp_g``, ...), and ``pass_if`` for
a selection.  ``define`` builds them on one target's float32 primitives; patterns are
float32 bit patterns held in int64, as in emu.
"""
import numpy as np
from numba.extending import register_jitable

from emu.lowlevel import scalar as S
from emu.lowlevel import scalar_approx as A
from emu.lowlevel import scalar_grad as G

EXACT, APPROX = 0, 1
SIGN32 = S.SIGN32
ONE32 = S.ONE32


def define(F, P, fadd, fsub, f32, kind):
    """The nodes on a target whose float32 <-> pattern moves are ``F`` (pattern to
    float32) and ``P`` (float32 to pattern) and whose float32 addition and subtraction
    are ``fadd``, ``fsub``; ``f32``: for the float32 format alone (every rounding is the
    identity, compiled out: emu/_scalar_approx.rules says why), else for any other;
    ``kind``: None, the backward nodes' derivatives chosen by their ``kind`` argument, or
    APPROX compiled in (the argument then unused), so that a float32 kernel's loop has
    no exact derivative in it and vectorises (exact derivatives do not vectorise).
    Returns them as a dict of register_jitable functions."""
    rules = A.FLOAT32 if f32 else A.GENERAL

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
    def clamp_min(a, c):
        """torch's clamp(min=c): c below it, a NaN stays."""
        return P(c) if F(a) < c else a

    @register_jitable
    def pass_if(cond, g):
        """The backward of a selection: the gradient where it was selected, else +0."""
        return g if cond else np.int64(0)

    def binary_g(op):
        """(δA, δB) of a PA node ``op`` with saved operands a, b; g its incoming gradient,
        rounded as the graph's Function rounds it."""
        da, db = getattr(G, op + "_da"), getattr(G, op + "_db")
        approx = rules[op + "_approx"]

        if kind is None:
            @register_jitable
            def node_g(a, b, g, kind, ln2, fc, mode):
                g = rnd(g, fc, mode)
                if kind == EXACT:
                    return da(a, b, g, fc), db(a, b, g, fc)
                return approx(a, b, g, ln2, fc)
        else:   # inlined by Numba: LLVM would not, and the loop would not vectorise
            @register_jitable(inline="always")
            def node_g(a, b, g, kind, ln2, fc, mode):
                return approx(a, b, rnd(g, fc, mode), ln2, fc)
        return node_g

    def unary_g(op):
        dx, approx = getattr(G, op + "_dx"), rules[op + "_approx"]

        if kind is None:
            @register_jitable
            def node_g(x, g, kind, ln2, fc, mode):
                g = rnd(g, fc, mode)
                if kind == EXACT:
                    return dx(x, g, fc)
                return approx(x, g, ln2, fc)
        else:   # inlined by Numba: LLVM would not, and the loop would not vectorise
            @register_jitable(inline="always")
            def node_g(x, g, kind, ln2, fc, mode):
                return approx(x, rnd(g, fc, mode), ln2, fc)
        return node_g

    nodes = dict(rnd=rnd, add=add, sub=sub, neg=neg, clamp_max=clamp_max, clamp_min=clamp_min, pass_if=pass_if,
                 mul_g=binary_g("pam_mul"), div_g=binary_g("pa_div"))
    # emu's unary PA functions; for float32 the branch-free twins of paexp2 and pasqrt
    # (the same bits), so that a kernel's element loop vectorises
    nodes.update(S.unary_ops(f32))
    for op in ("exp", "exp2", "log", "log2", "sqrt"):
        nodes[op + "_g"] = unary_g("pa_" + op)
    return nodes

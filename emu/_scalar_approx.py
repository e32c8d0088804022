"""The approximate derivatives of Table 1 as scalar definitions, element by element.

Kosson & Jaggi, section 2.5, Table 1 ("approx"): the analytical derivative of the
function being approximated, evaluated with PA operations.  emu/registry.py writes
each rule as a sequence of emu front-end calls (``_pam_mul_approx``, ...), the form
emu.grad runs on numpy and CUDA arrays.  Here is the same sequence on one element:
every step is the scalar definition (emu/_scalar.py) of the front end it stands for,
with that front end's operand rounding (``S.operand``: RNE into the format) and
``E.quantize``'s rounding where the rule calls it, so each function gives the bits of
its registry rule (tests/test_fused.py proves it on every value of the 8-bit formats
and on random float32 and bfloat16 values).  The fused CPU kernels of torch_bridge
(and its lean per-call path) are built from these.

Unary rules are ``op_approx(x, dy, ln2, fc) -> dx``, binary ones ``op_approx(a, b, dy,
ln2, fc) -> (da, db)``, on float32 patterns (int64); ``ln2`` is ``fmt.consts.ln2_32``
(emu.registry.ln2(fmt)), the constant of paexp2's and palog2's rules.  Each exists for
any format and, specialised, for float32 (:func:`rules`).
"""
import numpy as np
from numba.extending import register_jitable

from . import _scalar as S
from .formats import format

MINUS_ONE32 = 0xBF800000       # -1.0: -(A ·̂ δ) is (A ·̂ δ) ·̂ -1 in pa_div's rule
TWO32 = 0x40000000             # 2.0: the halving in pa_sqrt's rule


def rules(f32: bool) -> dict:
    """The rules, by name, with the operand rounding compiled in: ``f32`` for float32,
    where rounding an operand is the identity (and E.quantize only makes NaNs
    canonical), else RNE into the format.  Compiled in, not tested per element: a call
    of ``S.operand`` keeps the whole of ``quantize`` in the loop, which LLVM then neither
    inlines nor vectorises (float32 kernels run 6x slower).  For float32 the rules are
    inlined by Numba: left to LLVM, which finds a kernel's loop too large to inline them
    into, a loop that calls them does not vectorise."""
    inline = "always" if f32 else "never"
    unary = S.unary_ops(f32)        # float32: paexp2's and pasqrt's branch-free twins
    exp2, sqrt = unary["pa_exp2"], unary["pa_sqrt"]

    @register_jitable
    def operand(x, fc):
        if f32:
            return np.int64(x)
        return S.operand(x, fc)

    @register_jitable
    def rne(x, fc):
        """E.quantize(x, fmt) on one element (RNE, subnormals kept, no saturation)."""
        if f32:
            x = np.int64(x)
            return np.int64(S.QNAN32) if (x & S.ABS32) > S.INF32 else x
        return S.quantize(x, fc, S.RNE, True, False, 0, 0)

    @register_jitable
    def mul(a, b, fc):
        """E.pam_mul(a, b, fmt) on one element: operands rounded (RNE), then PAM."""
        return S.pam_mul(operand(a, fc), operand(b, fc), fc)

    @register_jitable
    def div(a, b, fc):
        """E.pa_div(a, b, fmt) on one element."""
        return S.pa_div(operand(a, fc), operand(b, fc), fc)

    @register_jitable
    def exp2_at_result(y, dy, ln2, fc):
        """registry._exp2_approx: paexp2(A) ·̂ ln2 ·̂ δ_Y from the result y = paexp2(A)."""
        return mul(mul(y, ln2, fc), dy, fc)

    @register_jitable
    def log2_at(xq, dy, ln2, fc):
        """registry._log2_approx: δ_Y ÷̂ (A ·̂ ln2)."""
        return div(dy, mul(xq, ln2, fc), fc)

    @register_jitable(inline=inline)
    def pam_mul_approx(a, b, dy, ln2, fc):
        """δ_A = B ·̂ δ_Y, δ_B = A ·̂ δ_Y."""
        return mul(b, dy, fc), mul(a, dy, fc)

    @register_jitable(inline=inline)
    def pa_div_approx(a, b, dy, ln2, fc):
        """δ_A = δ_Y ÷̂ B, δ_B = -(A ·̂ δ_Y) ÷̂ (B ·̂ B)."""
        minus = mul(mul(a, dy, fc), MINUS_ONE32, fc)
        return div(dy, b, fc), div(minus, mul(b, b, fc), fc)

    @register_jitable(inline=inline)
    def pa_exp2_approx(x, dy, ln2, fc):
        """δ_A = paexp2(A) ·̂ ln2 ·̂ δ_Y."""
        return exp2_at_result(exp2(operand(x, fc), fc), dy, ln2, fc)

    @register_jitable(inline=inline)
    def pa_log2_approx(x, dy, ln2, fc):
        """δ_A = δ_Y ÷̂ (A ·̂ ln2)."""
        return log2_at(rne(x, fc), dy, ln2, fc)

    @register_jitable(inline=inline)
    def pa_exp_approx(x, dy, ln2, fc):
        """Through eq. 18: paexp2's rule at T = A ·̂ log2e, then the PAM's."""
        t = mul(x, fc.log2e32, fc)
        e = exp2(operand(t, fc), fc)
        return mul(exp2_at_result(e, dy, ln2, fc), fc.log2e32, fc)

    @register_jitable(inline=inline)
    def pa_log_approx(x, dy, ln2, fc):
        """Through eq. 19: δ_L = δ_Y ÷̂ log2e, then palog2's rule."""
        return log2_at(rne(x, fc), div(dy, fc.log2e32, fc), ln2, fc)

    @register_jitable(inline=inline)
    def pa_sqrt_approx(x, dy, ln2, fc):
        """Through eq. 20: paexp2's rule at the result, ÷̂ 2, palog2's rule."""
        xq = rne(x, fc)
        dh = exp2_at_result(sqrt(operand(xq, fc), fc), dy, ln2, fc)
        return log2_at(xq, div(dh, TWO32, fc), ln2, fc)

    return {name: f for name, f in locals().items() if name.endswith("_approx")}


#: the rules for any format (the registry's ``approx_scalar``) and for float32 alone
GENERAL = rules(False)
FLOAT32 = rules(True)
globals().update(GENERAL)


def ln2_pattern(fmt) -> int:
    """The ``ln2`` argument of the rules above for ``fmt`` (``fmt.consts.ln2_32``)."""
    return format(fmt).consts.ln2_32

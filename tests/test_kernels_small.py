"""emu's fast paths for small and E=8 operands give the general kernels' bits.

* the small-matmul kernel (emu/_kernels_small.py) against the register-blocked one;
* quantize into an IEEE format with 8 exponent bits, rounded in place (the branch-free
  loop of emu/_kernels.py) against the scalar definition, every class of input;
* the branch-free pasqrt for those formats (emu/optim.py) against pa_sqrt, the
  branch-free paexp2 (the float32 composites' and rules') against pa_exp2, and the
  32-bit branch-free PAM of the float32 kernels against pam_mul.
"""
import numpy as np
import pytest
from numba import njit, prange

import emu
from conftest import assert_bits_equal
from emu import _kernels as K
from emu import _scalar as S
from emu import sizes
from emu.matmul import host_matmul


def _blocked(a, b, fmt, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(sizes, "SMALL", -1)
        return host_matmul(a, b, fmt, emu.float32)


@pytest.mark.parametrize("fmt", ["float32", "bf16", "e5m2", "float8_e4m3fn"])
def test_small_matmul_is_the_blocked_matmul(fmt, rng, monkeypatch):
    f = emu.format(fmt)
    shapes = [((5, 7), (7, 6)), ((3, 5, 7), (7, 6)), ((2, 1, 5, 7), (1, 4, 7, 6)), ((7,), (7, 6)),
              ((5, 7), (7,)), ((4, 9, 3), (4, 3, 2)), ((2, 3, 5, 7), (2, 3, 7, 6))]
    for trial in range(40):
        sa, sb = shapes[trial % len(shapes)]
        a = (rng.standard_normal(sa) * np.exp2(rng.integers(-70, 70, sa))).astype(np.float32)
        b = (rng.standard_normal(sb) * np.exp2(rng.integers(-70, 70, sb))).astype(np.float32)
        if trial % 3 == 0:
            a[..., 0] = 0                       # MASKED: zero operands
        if trial % 5 == 0:
            b.reshape(-1)[1] = np.inf           # GENERAL
        if trial % 7 == 0:
            b.reshape(-1)[2] = 1e-40            # a subnormal
        if trial % 11 == 0:
            a.reshape(-1)[0] = np.nan
        if trial % 13 == 0:
            a[...] = 0                          # SKIP
        if trial % 4 == 1:                      # CLEAN: every product in range
            a = np.clip(np.abs(a), 0.5, 2) * np.sign(a + 0.5)
            b = np.clip(np.abs(b), 0.5, 2) * np.sign(b - 0.5)
        a, b = emu.quantize(a, f), emu.quantize(b, f)
        assert_bits_equal(host_matmul(a, b, f, emu.float32), _blocked(a, b, f, monkeypatch),
                          what=f"{sa} @ {sb}")


@pytest.mark.parametrize("fmt", ["bf16", "e8m3", "e8m1", "e8m22"])
@pytest.mark.parametrize("mode", [S.RNE, S.RTZ])
def test_quantize_in_place_is_the_scalar_definition(fmt, mode, rng):
    fc = emu.format(fmt).consts
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x7F7F8000,
                        0x7F7F7FFF, 0x00008000, 0x00018000, 0x7FC00001, 1, 0x807FFFFF,
                        0x00800000, 0x007FFFFF, 0xFF7FFFFF], np.uint32)
    x = np.concatenate([special, rng.integers(0, 2 ** 32, 20000, dtype=np.uint64)
                        .astype(np.uint32)])
    assert K._in_place(fc, mode, True, False)
    want = np.array([S.quantize(int(v), fc, mode, True, False, 0, 0) for v in x], np.uint32)
    for parallel in (True, False):
        out = np.empty_like(x)
        K.QUANTIZE[parallel](x, out, fc, mode, True, False, 0)
        assert_bits_equal(out.view(np.float32), want.view(np.float32), x.view(np.float32),
                          what=f"parallel={parallel}")
    assert not K._in_place(fc, S.SR, True, False) and not K._in_place(fc, mode, False, False)
    assert not K._in_place(emu.float16.consts, mode, True, False)


def _unary_both(definition, twin):
    """A compiled loop (threaded): (definition, twin) of every x[i] (format constants fc)."""
    @njit(parallel=True)
    def run(x, fc):
        want, got = np.empty_like(x), np.empty_like(x)
        for i in prange(x.size):
            want[i] = definition(x[i], fc)
            got[i] = twin(x[i], fc)
        return want, got
    return run


_sqrt_both = _unary_both(S.pa_sqrt, S.pa_sqrt_e8)
_exp2_both = _unary_both(S.pa_exp2, S.pa_exp2_e8)


@pytest.mark.parametrize("fmt", ["float32", "bf16", "e8m3", "e8m1"])
def test_pa_sqrt_e8_is_the_scalar_definition(fmt, rng):
    """The branch-free pasqrt (the PA AdamW kernel's, emu/optim.py) against the exact
    definition: every pattern of two binades (both exponent parities, so every rounding
    case of the halved logarithm), every class of special, and random patterns."""
    fc = emu.format(fmt).consts
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFFFFFFF, 1,
                        0x807FFFFF, 0x007FFFFF, 0x00800000, 0x00800001, 0x7F7FFFFF,
                        0x3F800000, 0xBF800000, 0x3F7FFFFF], np.uint32)
    binades = np.arange(0x3F000000, 0x40000000, dtype=np.uint32)
    x = np.concatenate([special, binades, rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64)
                        .astype(np.uint32)])
    want, got = _sqrt_both(x, fc)
    assert_bits_equal(got.view(np.float32), want.view(np.float32), x.view(np.float32), what=fmt)


@pytest.mark.parametrize("fmt", ["float32", "bf16", "e8m3", "e8m1"])
def test_pa_exp2_e8_is_the_scalar_definition(fmt, rng):
    """The branch-free paexp2 (the float32 composites' and rules', so that their loops
    vectorise) against the exact definition: every pattern of both signs in the binades
    where its cases change (1/4 of a quantum at float32's and bf16's 2^-(M+2); 1 to 2;
    the 2^-127 and 2^-126 results and the overflow of 64 <= |x| < 256), every upper half
    with the lower halves that round differently, every class of special, and random
    patterns.  (Over all 2^32 patterns it was checked once for float32 and bf16 by the
    same loop: no difference.)"""
    fc = emu.format(fmt).consts
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFFFFFFF, 1,
                        0x807FFFFF, 0x00800000, 0x43800000, 0xC3800000, 0x437FFFFF,
                        0xC37FFFFF, 0x42FE0000, 0xC2FE0000, 0xC2FC0000], np.uint32)
    binades = np.concatenate([np.arange(e << 23, (e + 1) << 23, dtype=np.uint32)
                              for e in (102, 118, 127, 133, 134)])
    halves = (np.arange(1 << 16, dtype=np.uint32)[:, None] << 16 | np.array(
        [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)).ravel()
    x = np.concatenate([special, binades, binades | 0x80000000, halves,
                        rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32)])
    want, got = _exp2_both(x, fc)
    assert_bits_equal(got.view(np.float32), want.view(np.float32), x.view(np.float32), what=fmt)


def _both(definition, twin):
    """A compiled loop: (definition, twin) of every pair (a[i], b[i]), with the
    arguments ``rest`` after them."""
    @njit
    def run(a, b, *rest):
        want, got = np.empty_like(a), np.empty_like(a)
        for i in range(a.size):
            want[i] = definition(a[i], b[i], *rest)
            got[i] = twin(a[i], b[i], *rest)
        return want, got
    return run


_pam_both = _both(S.pam_sum, S.pam_sum32)
_div_both = _both(S.pa_div, S.pa_div32)


@pytest.mark.parametrize("c", [0, 0x80000, 0x400000, -3, 5])
@pytest.mark.parametrize("fmt", ["float32", "bf16", "float16", "float8_e4m3fn", "float8_e5m2",
                                 "float8_e4m3fnuz", "float4_e2m1fn"])
def test_pam_sum32_is_the_scalar_definition(fmt, c, rng):
    """The 32-bit branch-free PAM with a constant (pam_mul32 is its c = 0; the float32
    kernels' and the recipe epilogue's, emu/_kernels.py, emu/_kernels_recipes.py)
    against the definition, for any patterns (format values or not) and the constants
    of PAM, L-Mul (e4m3: 2^19; bf16 ...: 2^22) and offsets of either sign: every pair of
    64 corner patterns around each threshold (zero, min normal, one, max, inf, NaN, both
    signs), every bf16 pattern against random partners, and random pairs."""
    a, b, fc = _pairs(fmt, rng)
    want, got = _pam_both(a, b, fc, c)
    assert_bits_equal(got.view(np.float32), want.view(np.float32), a.view(np.float32),
                      b.view(np.float32), what=f"{fmt} c={c}")


def _pairs(fmt, rng):
    """Pattern pairs (a, b) and the format's constants: every pair of 64 corner
    patterns around each threshold (both signs), every bf16 pattern against random
    partners, and random pairs."""
    fc = emu.format(fmt).consts
    edges = [0, 1, fc.minnorm32 - 1, fc.minnorm32, fc.minnorm32 + 1, S.ONE32 - 1, S.ONE32,
             S.ONE32 + 1, fc.max32 - 1, fc.max32, fc.max32 + 1, S.INF32 - 1, S.INF32,
             S.INF32 + 1, S.QNAN32, S.ABS32, 0x40000000, 0x3F000000, 0x1F800000, 0x5F800000,
             0x00400000, 0x20000000, 0x60000000, 0x7F000000, 0x01000000, 0x7E800000,
             0x3FFFFFFF, 0x00FFFFFF, 0x3E800000, 0x41000000, 0x7F7FFFFF, 0x00800000]
    corner = np.array(edges + [e | S.SIGN32 for e in edges], np.uint32)
    a, b = (v.reshape(-1) for v in np.meshgrid(corner, corner))
    bf = np.arange(1 << 16, dtype=np.uint32) << 16
    a = np.concatenate([a, bf, rng.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32)])
    b = np.concatenate([b, rng.permutation(bf) | rng.integers(0, 1 << 16, bf.size, dtype=np.uint32),
                        rng.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32)])
    return a, b, fc


@pytest.mark.parametrize("fmt", ["float32", "bf16", "float16", "float8_e4m3fn", "float8_e5m2",
                                 "float8_e4m3fnuz", "float4_e2m1fn"])
def test_pa_div32_is_the_scalar_definition(fmt, rng):
    """The 32-bit branch-free PA division (the PA AdamW kernel's, emu/optim.py) against
    the definition, for any patterns: the corner pairs, bf16 patterns and random pairs
    of test_pam_sum32_is_the_scalar_definition."""
    a, b, fc = _pairs(fmt, rng)
    want, got = _div_both(a, b, fc)
    assert_bits_equal(got.view(np.float32), want.view(np.float32), a.view(np.float32),
                      b.view(np.float32), what=fmt)

"""Derivatives of every multiplier (emu.grad.mul, emu.grad.matmul with ``kind="exact"``,
docs/semantics.md "Multipliers"): kernel == oracle (emu/reference_mul.grad) bit for bit,
exhaustive over the pairs of a small format with a gradient per pair drawn from every
value, random and corner operands for bf16; the pattern-sum code with PAM's constant
is PAM's Table 1 derivative; the exact matmul fold == the oracle's fold."""
import numpy as np
import pytest

import emu
import emu.grad
import emu.multipliers as EM
import emu.reference as R
import emu.reference_mul as RM
from conftest import all_values, assert_bits_equal, corner_values

MEMBERS = ["lmul", "pam-2", "lmul+3", "exact", "float", "cpam1-unbiased", "cpam1:3,-2,1,0"]


def oracle(mul, fmt, a, b, d, kind="exact"):
    got = [RM.grad(float(x), float(y), float(g), fmt, mul, kind) for x, y, g in zip(a, b, d)]
    return tuple(np.array(c, np.float32) for c in zip(*got))


def pairs(fmt, rng):
    """Every pair of the format's values, each with a gradient drawn from every value."""
    v = all_values(fmt)
    a, b = (x.ravel() for x in np.meshgrid(v, v, indexing="ij"))
    return a, b, rng.choice(v, a.size)


@pytest.mark.parametrize("kind", ["exact", "approx"])
@pytest.mark.parametrize("mul", MEMBERS)
def test_exhaustive_small_format(mul, kind, rng):
    a, b, d = pairs("e3m2", rng)
    got = emu.grad.mul(a, b, d, "e3m2", kind, mul)
    for g, e, which in zip(got, oracle(mul, "e3m2", a, b, d, kind), "AB"):
        assert_bits_equal(g, e, a, b, d, what=f"{kind} δ{which} {mul}")


@pytest.mark.parametrize("mul", ["lmul", "cpam2-unbiased", "exact"])
def test_bf16_random_and_corners(mul, rng):
    c = corner_values("bfloat16")
    ca, cb = (x.ravel() for x in np.meshgrid(c, c, indexing="ij"))
    x = emu.quantize(np.exp2(rng.uniform(-30, 30, (2, 600))) * rng.choice([-1, 1], (2, 600)),
                     "bfloat16")
    a = np.concatenate([x[0], ca]).astype(np.float32)
    b = np.concatenate([x[1], cb]).astype(np.float32)
    d = emu.quantize(rng.standard_normal(a.size) * 1e-3, "bfloat16").astype(np.float32)
    got = emu.grad.mul(a, b, d, "bfloat16", "exact", mul)
    for g, e, which in zip(got, oracle(mul, "bfloat16", a, b, d), "AB"):
        assert_bits_equal(g, e, a, b, d, what=f"δ{which} {mul}")


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_pattern_sum_code_with_pam_is_table_1(fmt, rng):
    """The slope with a constant (0 for PAM) is PAM's exact derivative, every pair."""
    a, b, d = pairs(fmt, rng)
    got = EM._product_grad(a, b, d, emu.format(fmt), emu.multiplier("pam"))
    for g, e, which in zip(got, emu.grad.pam_mul(a, b, d, fmt, "exact"), "AB"):
        assert_bits_equal(g, e, a, b, d, what=f"δ{which} {fmt}")


def test_lmul_slope_moves_with_the_constant():
    """L-Mul in bf16 adds 2^-4 to the mantissa sum: the carry (slope 2^(E_b + 1)) comes
    2^-4 earlier than PAM's."""
    a, b = np.float32(1.5), np.float32(1 + 7 / 16)       # M_a + M_b = 15/16
    da_pam, _ = emu.grad.mul(a, b, np.float32(1), "bfloat16", "exact", "pam")
    da_lmul, _ = emu.grad.mul(a, b, np.float32(1), "bfloat16", "exact", "lmul")
    assert (float(da_pam), float(da_lmul)) == (1.0, 2.0)


def fold_oracle(A, B, dY, fmt, acc, mul):
    """δA, δB of emu.matmul by the oracle: each term RM.grad's, folded over increasing
    index from +0 with one rounding into ``acc`` per step."""
    M, K = A.shape
    N = B.shape[1]
    dA = np.zeros((M, K), np.float32)
    dB = np.zeros((K, N), np.float32)
    for i in range(M):
        for k in range(K):
            s = 0.0
            for j in range(N):
                s = R._add_exact(s, RM.grad(A[i, k], B[k, j], dY[i, j], fmt, mul)[0], acc)
            dA[i, k] = s
    for k in range(K):
        for j in range(N):
            s = 0.0
            for i in range(M):
                s = R._add_exact(s, RM.grad(A[i, k], B[k, j], dY[i, j], fmt, mul)[1], acc)
            dB[k, j] = s
    return dA, dB


@pytest.mark.parametrize("mul,acc", [("lmul", "float32"), ("cpam1:3,-2,1,0", "bfloat16"),
                                     ("pam-2", "float16")])
def test_exact_matmul_fold(mul, acc, rng):
    fmt = "float8_e4m3fn"
    A, B, dY = (emu.quantize(rng.standard_normal(s) * 2, fmt).astype(np.float32)
                for s in ((5, 7), (7, 6), (5, 6)))
    A[0, 0], B[1, 2], dY[2, 3] = 0.0, 448.0, -0.0
    dA, dB = emu.grad.matmul(A, B, dY, fmt, acc, "exact", mul=mul)
    eA, eB = fold_oracle(A, B, dY, emu.format(fmt), emu.format(acc), mul)
    assert_bits_equal(dA, eA, what=f"δA {mul}")
    assert_bits_equal(dB, eB, what=f"δB {mul}")


def test_exact_matmul_batched_is_the_fold_per_batch(rng):
    """A 3-D A against a 2-D weight: δB folds over (batch, i) in order, as a 2-D matmul
    of the stacked rows."""
    fmt, mul = "bfloat16", "cpam2-unbiased"
    A = emu.quantize(rng.standard_normal((3, 4, 5)), fmt).astype(np.float32)
    B = emu.quantize(rng.standard_normal((5, 6)), fmt).astype(np.float32)
    dY = emu.quantize(rng.standard_normal((3, 4, 6)), fmt).astype(np.float32)
    dA, dB = emu.grad.matmul(A, B, dY, fmt, "float32", "exact", mul=mul)
    fA, fB = emu.grad.matmul(A.reshape(12, 5), B, dY.reshape(12, 6), fmt, "float32", "exact",
                             mul=mul)
    assert_bits_equal(dA, fA.reshape(3, 4, 5))
    assert_bits_equal(dB, fB)


@pytest.mark.parametrize("mul", ["exact", "float"])
def test_exact_matmul_of_exact_products_is_the_fused_fold(mul, rng):
    """For ``exact`` and ``float`` each exact term is B δY unrounded: the fold is the
    approximate derivative with the exact multiplier."""
    fmt = "bfloat16"
    A, B, dY = (emu.quantize(rng.standard_normal(s), fmt).astype(np.float32)
                for s in ((6, 8), (8, 5), (6, 5)))
    got = emu.grad.matmul(A, B, dY, fmt, "bfloat16", "exact", mul=mul)
    want = emu.grad.matmul(A, B, dY, fmt, "bfloat16", "approx", mul="exact")
    for g, w in zip(got, want):
        assert_bits_equal(g, w)

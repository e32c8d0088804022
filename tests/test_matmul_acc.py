"""The narrow-accumulator fast path (emu/_kernels_acc.py) against the integer fold.

Every narrow accumulator step is RNE_acc(x + y): the fold (emu/_kernels.py
matmul_fmtacc, one S.fp_add per step) is the definition; the fast kernel must give
its bits for every accumulator format, both step variants (PLAIN, STICKY) and every
block mode (CLEAN, ZEROS, GENERAL).  The Fraction oracle checks the fold on small
cases (tests/test_matmul.py) and the -0 case below.
"""
import numpy as np
import pytest

import emu
import emu.reference as R
from conftest import all_values, assert_bits_equal, corner_values
from emu import _kernels as K
from emu import _kernels_acc as KA

NARROW = ["bfloat16", "float16", "float8_e5m2", "float8_e4m3fn", "e4m3", "e5m7", "e3m2",
          "e6m3fn", "e8m21", "e8m3", "float8_e4m3fnuz", "float6_e3m2fn", "e5m4sat"]


#: the pattern-sum multipliers with one constant, which take every fast path: PAM, L-Mul
#: and offsets either way (emu/_scalar_mul.py), PAM with every accumulator, the others
#: with one of each kind (E = 8, binary16, fp8 with and without inf, E < 8 subnormals),
#: each constant (L-Mul, negative, with an offset) with two or more of them
ACC_MULS = [(acc, "pam") for acc in NARROW] + [
    ("bfloat16", "lmul"), ("float16", "pam-3"), ("float8_e4m3fn", "lmul+2"), ("e3m2", "lmul"),
    ("e8m21", "pam-3")]


def fold(A, B, fmt, acc, mul="pam"):
    """The integer fold on 2-D operands (the definition: one SM.mac per step)."""
    fmt, acc = emu.format(fmt), emu.format(acc)
    a = emu.quantize(A, fmt).view(np.int32)[None]
    b = emu.quantize(B, fmt).view(np.int32)[None]
    c = np.empty((1, A.shape[0], B.shape[1]), np.float32)
    z = np.zeros(1, np.int64)
    K.matmul_fmtacc(a, b, z, z, c.view(np.int32), fmt.consts, acc.consts,
                    emu.multiplier(mul).params(fmt))
    return c[0]


def narrow(A, B, fmt, acc, sticky, fast=None, mul="pam"):
    """The fast kernel on 2-D operands with the step variant forced (``fast`` None: the
    integer rounding)."""
    fmt, acc = emu.format(fmt), emu.format(acc)
    c32 = emu.multiplier(mul).params(fmt).c32
    a = emu.quantize(A, fmt).view(np.int32)
    b = emu.quantize(B, fmt).view(np.int32)[None]
    m, k = a.shape
    a = np.concatenate([a, np.zeros((-m % K.QR, k), np.int32)])[None]
    am, sta = K.matmul_prepare_a(a, fmt.consts)
    bp, bm, stb = K.matmul_prepare_b(b, fmt.consts, c32, K.NO_TABLE, 0)
    c = np.empty((1, m, B.shape[1]), np.float32)
    z = np.zeros(1, np.int64)
    KA.matmul_narrow(a, am, sta, b, bp, bm, stb, z, z, c.view(np.int32), fmt.consts,
                     acc.consts, sticky, fast, c32)
    return c[0]


def pairs(x, y):
    """Operands whose k = 2 matmul is C[i, j] = RNE_acc(x_i + y_j) for float32 fmt:
    first step 0 + x_i·̂1 = x_i (x an acc value, normal in float32), then + 1·̂y_j."""
    A = np.stack([x, np.ones_like(x)], 1).astype(np.float32)
    B = np.stack([np.ones_like(y), y]).astype(np.float32)
    return A, B


@pytest.mark.parametrize("acc", ["float8_e5m2", "float8_e4m3fn", "e4m3", "e3m2"])
def test_every_sum_of_two_fp8_values(acc):
    """Exhaustive: every acc value plus every value of each 8-bit format (PLAIN where
    the fast path picks it) and plus every bfloat16 value (STICKY), both variants."""
    x = all_values(acc)
    x = x[np.isfinite(x)]                       # inf/NaN accumulators: the specials test
    for fmt_y in ["float8_e5m2", "float8_e4m3fn", "bfloat16"]:
        y = all_values(fmt_y)
        A, B = pairs(x, y)
        want = fold(A, B, "float32", acc)
        assert_bits_equal(emu.pam_matmul(A, B, "float32", acc), want, what=f"{acc}+{fmt_y}")
        for sticky in (False, True):
            if sticky or not KA.needs_sticky(A.view(np.int32), B.view(np.int32),
                                             emu.float32.consts, emu.format(acc).consts):
                assert_bits_equal(narrow(A, B, "float32", acc, sticky), want,
                                  what=f"{acc}+{fmt_y} sticky={sticky}")


@pytest.mark.parametrize("acc", ["bfloat16", "float16"])
def test_every_16_bit_accumulator_value(acc, rng):
    """Every bf16/fp16 value as the accumulator plus corner and random addends: values
    of the format itself (PLAIN), float32 values (STICKY), midpoints with a low bit,
    overflow and the subnormal range."""
    f = emu.format(acc)
    x = all_values(acc)
    x = x[np.isfinite(x)]
    q = np.float32(f.smallest_subnormal)
    y = np.concatenate([
        emu.quantize(rng.standard_normal(24).astype(np.float32)
                     * np.float32(2.0) ** rng.integers(-30, 20, 24).astype(np.float32), f),
        np.float32([f.max, -f.max, f.max / 2, q, -q, 1.5 * q, f.smallest_normal, 0.0, -0.0]),
    ]).astype(np.float32)
    A, B = pairs(x, y)
    assert not KA.needs_sticky(A.view(np.int32), B.view(np.int32), emu.float32.consts, f.consts)
    want = fold(A, B, "float32", acc)
    assert_bits_equal(emu.pam_matmul(A, B, "float32", acc), want, what=f"{acc} PLAIN")
    assert_bits_equal(narrow(A, B, "float32", acc, True), want, what=f"{acc} STICKY on PLAIN")
    # float32 addends: a bf16/fp16 midpoint plus a low bit, tiny, huge, random
    ulp = np.float32(2.0) ** np.float32(-f.man_bits)
    y2 = np.concatenate([
        np.float32([1 + ulp / 2 + 2.0 ** -22, 1 + ulp / 2 - 2.0 ** -23, -(1 + ulp / 2 + 2.0 ** -23),
                    2.0 ** -100, -2.0 ** -126, 3e38, -3.3e38, 65519.0, 65520.0, 65535.99,
                    0.5 * q + 2.0 ** -60, 1.5 * q - 2.0 ** -60]),
        rng.standard_normal(20).astype(np.float32)
        * np.float32(2.0) ** rng.integers(-40, 40, 20).astype(np.float32)]).astype(np.float32)
    A, B = pairs(x, y2)
    want = fold(A, B, "float32", acc)
    assert_bits_equal(emu.pam_matmul(A, B, "float32", acc), want, what=f"{acc} STICKY")


def test_all_fp8_products_k1():
    """Every pair of e4m3 operands (k = 1) and every k = 2 pair of products from one
    row: the products themselves rounded into each accumulator."""
    v = all_values("e4m3")
    for acc in ["float8_e5m2", "e3m2", "bfloat16", "float16"]:
        A, B = v[:, None], v[None, :]
        assert_bits_equal(emu.pam_matmul(A, B, "e4m3", acc), fold(A, B, "e4m3", acc),
                          what=f"k=1 {acc}")
        A2 = np.stack([v, v[::-1]], 1)
        B2 = np.stack([v, np.roll(v, 77)])
        assert_bits_equal(emu.pam_matmul(A2, B2, "e4m3", acc), fold(A2, B2, "e4m3", acc),
                          what=f"k=2 {acc}")


def tiled(case, rng, fmt):
    """Sizes crossing every block edge (rows past a 128-row task and not a multiple of
    QR, columns past a 1024-column block and not a multiple of the panel, k not a
    multiple of the 8-k group) with each block mode."""
    A = rng.standard_normal((133, 37)).astype(np.float32)
    B = rng.standard_normal((37, 1041)).astype(np.float32)
    if case == "zeros":
        A = np.maximum(A, 0)
        B[:, ::3] = np.minimum(B[:, ::3], 0)
        A[:9, 8:24] = 0                         # whole zero blocks (SKIP for float32 acc)
    if case == "specials":
        f = emu.format(fmt)
        A[5, 17] = np.inf if f.has_inf else np.nan
        A[7, 8:16] = f.max                      # overflow of products and of the acc
        A[9, 3] = f.smallest_normal             # flush
        B[11, 1040] = np.nan
        B[20, 3] = f.max / 2
        B[30, 600] = f.smallest_subnormal
    if case == "cancel":                        # sums that cancel to (signed) zero
        A[:, 1::2] = A[:, ::2][:, :18]
        B[1::2] = -B[::2][:18]
    return A, B


@pytest.mark.parametrize("acc,mul", ACC_MULS)
@pytest.mark.parametrize("case", ["dense", "zeros", "specials", "cancel"])
def test_tiled_matches_fold(acc, case, mul, rng):
    fmt = "bfloat16" if acc != "float16" else "float16"
    for f in (fmt, "float32"):
        A, B = tiled(case, rng, f)
        want = fold(A, B, f, acc, mul)
        assert_bits_equal(emu.matmul(A, B, f, acc, mul=mul), want, what=f"{f}/{acc} {case}")
        assert_bits_equal(narrow(A, B, f, acc, True, mul=mul), want,
                          what=f"{f}/{acc} {case} STICKY")


def step_args(A, B, fmt, acc, mul="pam"):
    """The arguments step_kind reads, for 2-D operands."""
    fmt, acc = emu.format(fmt), emu.format(acc)
    c32 = emu.multiplier(mul).params(fmt).c32
    a = emu.quantize(A, fmt).view(np.int32)
    a = np.concatenate([a, np.zeros((-a.shape[0] % K.QR, a.shape[1]), np.int32)])[None]
    b = emu.quantize(B, fmt).view(np.int32)[None]
    return (a, K.matmul_prepare_a(a, fmt.consts)[1], b,
            K.matmul_prepare_b(b, fmt.consts, c32, K.NO_TABLE, 0)[2])


@pytest.mark.parametrize("acc,mul", ACC_MULS)
@pytest.mark.parametrize("case", ["dense", "zeros", "specials", "cancel"])
def test_fast_plain_steps_match_fold(acc, case, mul, rng):
    """Every fast PLAIN step the call admits (SCALED where scaled_ok, CLAMPED where
    clamped_ok, F16 for binary16, register-blocked where clean_ok) gives the fold's
    bits; bf16 data with a bf16 accumulator gets SCALED unless inf/NaN/overflow/flush
    occur (PAM)."""
    fmt = "bfloat16" if acc != "float16" else "float16"
    A, B = tiled(case, rng, fmt)
    f, fa = emu.format(fmt).consts, emu.format(acc).consts
    c32 = emu.multiplier(mul).params(fmt).c32
    a, sta, b, stb = step_args(A, B, fmt, acc, mul)
    if KA.needs_sticky(a, b, f, fa, abs(c32) & 0x7FFFFF):
        return
    ok = KA.scaled_ok(a, sta, b, stb, f, fa, c32)
    if acc == "bfloat16" and mul == "pam":
        assert ok == (case != "specials")
    want = fold(A, B, fmt, acc, mul)
    kinds = [KA.SCALED] if ok else []
    kinds += [KA.CLAMPED] if KA.clamped_ok(a, sta, b, stb, f, fa, c32) else []
    if KA.HAS_F16C and KA.is_binary16(fa):
        kinds += [KA.F16] + ([KA.F16_BLOCKED] if KA.clean_ok(sta, stb, f, c32) else [])
    for fast in kinds:
        assert_bits_equal(narrow(A, B, fmt, acc, False, fast, mul), want,
                          what=f"{acc} {case} {fast}")


# (CI time: e8m21 with PAM and bf16 with L-Mul left, 2026-11-28; e8m10 keeps L-Mul and
# a wide accumulator, the other three PAM at 7, 10 and 3 mantissa bits)
@pytest.mark.parametrize("acc,mul", [(a, "pam") for a in ("bfloat16", "float16", "e8m3")]
                         + [("e8m10", "lmul")])
@pytest.mark.parametrize("case", ["dense", "cancel", "tiny", "huge"])
def test_sticky_blocked_matches_fold(acc, case, mul, rng):
    """The register-blocked STICKY step (round-to-odd, then in place on an E = 8 grid or
    the F16 conversion) where every block is CLEAN: float32 operands (and bf16 ones,
    forced STICKY) crossing every block edge but the row padding (M a multiple of QR);
    sums that cancel to (signed) zero, sums in the accumulator's subnormal range, sums
    that overflow it."""
    A = rng.standard_normal((136, 37)).astype(np.float32)
    B = rng.standard_normal((37, 1041)).astype(np.float32)
    if case == "cancel":
        A[:, 1::2] = A[:, ::2][:, :18]
        B[1::2] = -B[::2][:18]
    if case == "tiny":      # products just above 2^-126 (fp16: 2^-26), sums that cancel
        e = -63 if acc != "float16" else -13    # into the acc's subnormals, and -0
        A = (rng.uniform(1, 2, A.shape) * rng.choice([-1, 1], A.shape) * 2.0 ** e)
        B = (rng.uniform(1, 2, B.shape) * rng.choice([-1, 1], B.shape) * 2.0 ** e)
        A, B = A.astype(np.float32), B.astype(np.float32)
    if case == "huge":
        A *= np.float32(2.0 ** 61)      # products up to ~2^127, sums past the max
        B *= np.float32(2.0 ** 62) if acc != "float16" else np.float32(2.0 ** -50)
    fa = emu.format(acc)
    if acc == "float16" and not KA.HAS_F16C:
        pytest.skip("the F16 step needs F16C")
    for fmt in ("float32", "bfloat16"):
        c32 = emu.multiplier(mul).params(fmt).c32
        a, sta, b, stb = step_args(A, B, fmt, acc, mul)
        kind = KA.step_kind(True, a, sta, b, stb, emu.format(fmt).consts, fa.consts, c32)
        assert kind == KA.STICKY_BLOCKED or mul != "pam"    # L-Mul's products may overflow
        want = fold(A, B, fmt, acc, mul)
        if kind == KA.STICKY_BLOCKED:
            assert_bits_equal(narrow(A, B, fmt, acc, True, KA.STICKY_BLOCKED, mul), want,
                              what=f"{fmt}/{acc} {case}")
        assert_bits_equal(emu.matmul(A, B, fmt, acc, mul=mul), want, what=f"{fmt}/{acc} {case}")


def test_bench_data_takes_the_blocked_steps(rng):
    """bf16 operands (the bench's): SCALED for a bf16 accumulator; for an fp16 one its
    tiny products can make sums subnormal, so CLAMPED, and with zeros (a ±0 product may
    meet -0) the column loops' F16 (with F16C)."""
    A = rng.standard_normal((40, 300)).astype(np.float32)
    B = rng.standard_normal((300, 70)).astype(np.float32)
    bf, h = emu.format("bfloat16").consts, emu.format("float16").consts
    args = step_args(A, B, "bfloat16", "bfloat16")
    assert KA.step_kind(False, *args, bf, bf) == KA.SCALED
    args = step_args(A, B, "bfloat16", "float16")
    assert KA.step_kind(False, *args, bf, h) == KA.CLAMPED
    if KA.HAS_F16C:
        A[3, 5] = 0
        args = step_args(A, B, "bfloat16", "float16")
        assert KA.step_kind(False, *args, bf, h) == KA.F16
    for acc in ("bfloat16", "float16"):
        assert_bits_equal(emu.pam_matmul(A, B, "bfloat16", acc), fold(A, B, "bfloat16", acc),
                          what=acc)


@pytest.mark.parametrize("acc", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                                 "float8_e4m3fnuz", "e3m2", "e6m3fn"])
def test_clamped_step_every_accumulator_value(acc):
    """CLAMPED (the clamp, then RN(RN(s - c) + c)) against the fold: every acc value
    normal in float32 and up to a quarter of _bounded's limit as the accumulator, plus
    addends of at most p_acc significant bits (PLAIN) from 2^-40 to that quarter: sums
    in acc's subnormal range and at its edge, ties, the sliver above each power of two,
    and last steps that round to -0 (+0 in fnuz formats).  Forced: every sum stays below
    half of that limit, which is what _bounded guarantees (it does not see it here)."""
    f = emu.format(acc)
    v = all_values(acc)
    lim = min(f.max, 2.0 ** (127 - (23 - f.man_bits))) / 4      # _bounded's limit / 2
    tiny = np.finfo(np.float32).tiny                            # CLEAN: normal operands
    x = v[np.isfinite(v) & (np.abs(v) >= tiny) & (np.abs(v) <= lim)]
    p = emu.format(f"e8m{f.man_bits}")
    q = np.float32(f.smallest_subnormal)
    y = np.concatenate([x[::max(1, x.size // 512)],
                        np.float32([s * q * m for s in (1, -1) for m in
                                    (2.0 ** -16, 0.375, 0.5, 0.625, 0.75, 1.0, 1.125, 1.5, 2.5)]),
                        np.float32([2.0 ** -40, -2.0 ** -33, f.smallest_normal * 0.9375])])
    y = y[(emu.quantize(y, p) == y) & (np.abs(y) >= tiny)].astype(np.float32)
    A, B = pairs(x, y)
    assert not KA.needs_sticky(A.view(np.int32), B.view(np.int32), emu.float32.consts, f.consts)
    got = narrow(A, B, "float32", acc, False, KA.CLAMPED)
    want = fold(A, B, "float32", acc)
    assert_bits_equal(got, want, what=acc)
    if f.exp_bits < 8:      # (E = 8: normal operands are multiples of q, so are the sums)
        assert np.signbit(want[want == 0]).any() == f.has_neg_zero
    # a sum that cancels to +0, then tiny addends (below q/2: each rounds to a zero of its
    # sign, some too small to scale), at the last step and before it
    t = y[np.abs(y) < q / 2]
    A = np.float32([[1, 1, 1, 1], [1, 1, 1, 2.0 ** -20]])
    B = np.stack([np.ones_like(t), -np.ones_like(t), t, t]).astype(np.float32)
    want = fold(A, B, "float32", acc)
    assert_bits_equal(narrow(A, B, "float32", acc, False, KA.CLAMPED), want, what=f"{acc} zeros")
    if f.exp_bits < 8:
        assert np.signbit(want[want == 0]).any() == f.has_neg_zero


def test_scaled_bound_at_the_range_end():
    """scaled_ok's bound: sums that may reach half of fp16's max take another step, and
    the result still overflows exactly as the fold does."""
    A = np.full((4, 64), 16.0, np.float32)
    B = np.full((64, 8), 31.5, np.float32)      # 64 · 16 · 31.5 = 32256 < 65504 / 2 ...
    args = step_args(A, B, "bfloat16", "float16")
    f, fa = emu.format("bfloat16").consts, emu.format("float16").consts
    assert not KA.scaled_ok(*args, f, fa)       # ... but (1 + 2^-11)^64 pushes it over
    assert KA.scaled_ok(*step_args(A, B / 2, "bfloat16", "float16"), f, fa)
    B[0] = 60000.0
    assert_bits_equal(emu.pam_matmul(A, B, "bfloat16", "float16"),
                      fold(A, B, "bfloat16", "float16"))


def test_negative_zero_accumulator_matches_oracle():
    """A negative sum that rounds to zero leaves -0 in the accumulator; a +0 product
    then gives +0 (-0 + +0 = +0).  The fold used to skip ±0 products and kept -0."""
    A = np.float32([[-2.0 ** -30, 0.0], [-2.0 ** -30, -0.0]])
    B = np.float32([[1.0], [1.0]])
    want = np.float32(R.pam_matmul(A.tolist(), B.tolist(), "bfloat16", "float16"))
    assert np.signbit(want[1, 0]) and not np.signbit(want[0, 0])
    for f in (fold, emu.pam_matmul):
        assert_bits_equal(f(A, B, "bfloat16", "float16"), want, what=f.__name__)


def test_wide_accumulator_keeps_the_fold(rng):
    """p_acc = 23 (e8m22) is beyond round-to-odd in float32: the integer fold runs."""
    assert not KA.fast_path(emu.format("e8m22")) and KA.fast_path(emu.format("e8m21"))
    A = rng.standard_normal((9, 20)).astype(np.float32)
    B = rng.standard_normal((20, 7)).astype(np.float32)
    assert_bits_equal(emu.pam_matmul(A, B, "float32", "e8m22"), fold(A, B, "float32", "e8m22"))


def test_batched_narrow(rng):
    A = rng.standard_normal((3, 1, 10, 20)).astype(np.float32)
    B = rng.standard_normal((2, 20, 9)).astype(np.float32)
    C = emu.pam_matmul(A, B, "bfloat16", "bfloat16")
    for i in range(3):
        for j in range(2):
            assert_bits_equal(C[i, j], fold(A[i, 0], B[j], "bfloat16", "bfloat16"))


# --- the exact PAM-matmul gradient with a narrow accumulator (emu/_kernels_grad.py) ---

def grad_operands(case, rng, fmt, P=13, R=40, C=37):
    """(g, x, w) patterns of fmt values for the gradient fold out[p, c] = fold over r of
    pam_mul_da(x[p, c], w[r, c], g[p, r]): dense, with zeros (signed, both operands and
    the gradient), with corner values, with terms that cancel, and with ranges where
    terms flush or overflow next to clean ones."""
    f = emu.format(fmt)
    g = rng.standard_normal((1, P, R))
    x = rng.standard_normal((1, P, C)) * 3
    w = rng.standard_normal((1, R, C))
    if case == "zeros":
        g[rng.random(g.shape) < 0.2] = -0.0
        g[0, :, 5] = 0.0
        w[rng.random(w.shape) < 0.3] = -0.0
        x[rng.random(x.shape) < 0.2] = 0.0
    elif case == "specials":
        c = corner_values(fmt)
        for v in (g, x, w):
            idx = rng.integers(0, v.size, max(1, v.size // 6))
            v.flat[idx] = c[rng.integers(0, c.size, idx.size)]
    elif case == "cancel":              # pairs of terms that cancel: (signed) zero sums
        g[..., 1::2] = -g[..., 0:-1:2]
        w[:, 1::2] = w[:, 0:-1:2]
        g *= 2.0 ** -60
    elif case == "ranges":
        w[:, ::3] *= f.max / 8
        g[..., ::4] *= f.smallest_normal * 4
    return tuple(emu.quantize(v.astype(np.float32), fmt).view(np.int32) for v in (g, x, w))


def grad_variants(g, fc, fca):
    """Every step of the narrow gradient kernel the operands admit: STICKY always, PLAIN
    (E = 8 or not, as the accumulator is) where needs_sticky allows it, F16 for binary16
    with F16C."""
    from emu import _kernels_grad as KG
    e8 = fca.exp_bits == 8 and fca.nan_kind == 0
    out = [(True, e8, False)]
    if not KA.needs_sticky(g, None, fc, fca, 0 if fc.has_inf else fc.max32 & 0x7FFFFF):
        out.append((False, e8, False))
        if KA.HAS_F16C and KA.is_binary16(fca):
            out.append((False, False, True))
    return [KG._make_grad(v) for v in out]


@pytest.mark.parametrize("acc", NARROW)
@pytest.mark.parametrize("case", ["dense", "zeros", "specials", "cancel", "ranges"])
def test_exact_grad_narrow_matches_fold(acc, case, rng):
    """Each step variant of the narrow exact-gradient kernel gives the fp_add fold's bits
    (operands of bf16/fp16, whose terms PLAIN admits for wide enough accumulators, and
    of float32, which need STICKY), and emu.grad.pam_matmul dispatches to it."""
    from emu import _kernels_grad as KG
    from emu import grad as G
    fa = emu.format(acc)
    z = np.zeros(1, np.int64)
    for fmt in ("bfloat16" if acc != "float16" else "float16", "float32", "float8_e4m3fn"):
        fc = emu.format(fmt).consts
        g, x, w = grad_operands(case, rng, fmt)
        want = KG._matmul_grad_fmtacc(g, x, w, z, z, fc, fa.consts)
        for kernel in grad_variants(g, fc, fa.consts):
            assert_bits_equal(kernel(g, x, w, z, z, fc, KA.acc_consts(fa.consts)), want,
                              what=f"{fmt}/{acc} {case}")
        # the public function: dA of A (P, C) @ B (C, R) with dY (P, R) is this fold
        gv, xv, wv = (v[0].view(np.float32) for v in (g, x, w))
        da, _ = G.pam_matmul(xv, wv.T, gv, fmt, acc, "exact", need=(True, False))
        assert_bits_equal(da, want[0], what=f"emu.grad {fmt}/{acc} {case}")

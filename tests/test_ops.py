"""PA operations and IEEE add/mul: Numba kernels == the exact oracle, bit for bit.

Exhaustive over all operand pairs of the 8-bit formats, every bfloat16 value
against thousands of partners, hypothesis + corner cases for float32 and float16.
"""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import emu
import emu.reference as R
from conftest import FP8, POLICIES, all_values, assert_bits_equal, corner_values

# every public op of the registry (fp_mul_daz is fp_mul(subnormals=False), tested below)
BINARY = [op.name for op in emu.registry.ops(2, public=True)]
UNARY = [op.name for op in emu.registry.ops(1, public=True)]


def oracle(name, fmt, *xs):
    f = emu.OPS[name].oracle
    return np.array([f(*map(float, args), fmt) for args in zip(*xs)], np.float32)


def all_pairs(fmt):
    v = all_values(fmt)
    a, b = np.meshgrid(v, v, indexing="ij")
    return a.ravel(), b.ravel()


@pytest.mark.parametrize("fmt", FP8 + POLICIES)
@pytest.mark.parametrize("op", BINARY)
def test_binary_exhaustive_8bit(fmt, op):
    a, b = all_pairs(fmt)
    assert_bits_equal(getattr(emu, op)(a, b, fmt), oracle(op, fmt, a, b), a, b,
                      what=f"{op} {fmt}")


@pytest.mark.parametrize("fmt", FP8 + POLICIES)
def test_fp_mul_without_subnormals_exhaustive_8bit(fmt):
    a, b = all_pairs(fmt)
    want = np.array([R.fp_mul(float(x), float(y), fmt, subnormals=False) for x, y in zip(a, b)],
                    np.float32)
    assert_bits_equal(emu.fp_mul(a, b, fmt, subnormals=False), want, a, b, what="fp_mul DAZ/FTZ")


@pytest.mark.parametrize("fmt", FP8 + POLICIES + ["e2m1", "e3m2fn", "e5m3", "e4m6", "e3m3sat"])
@pytest.mark.parametrize("op", UNARY)
def test_unary_exhaustive_small_formats(fmt, op):
    x = all_values(fmt)
    assert_bits_equal(getattr(emu, op)(x, fmt), oracle(op, fmt, x), x, what=f"{op} {fmt}")


@pytest.mark.parametrize("op", UNARY)
def test_unary_every_bfloat16(op):
    x = all_values("bfloat16")
    assert_bits_equal(getattr(emu, op)(x, "bf16"), oracle(op, "bf16", x), x, what=f"{op} bf16")


def bf16_partners(rng, n=2048):
    """n partners: every special class and boundary, the rest uniform over encodings."""
    v = all_values("bfloat16")
    corners = corner_values("bfloat16")
    return np.concatenate([corners, v[rng.integers(0, v.size, n - corners.size)]])


@pytest.mark.parametrize("op", ["pam_mul", "pa_div"])
def test_pa_every_bfloat16_against_2048_partners(op, rng):
    x = all_values("bfloat16")
    x = x[~np.isnan(x)]             # NaN operands: covered by the partners and fp8 sweeps
    vec = getattr(R, op + "_vec")
    for chunk in np.array_split(bf16_partners(rng), 32):
        a = np.repeat(x, chunk.size)
        b = np.tile(chunk, x.size)
        assert_bits_equal(getattr(emu, op)(a, b, "bf16"), vec(a, b, "bf16"), a, b,
                          what=f"{op} bf16")


@pytest.mark.parametrize("op,fmt", [("fp_add", "bfloat16"), ("fp_mul", "bfloat16"),
                                    ("fp_add", "float16"), ("fp_mul", "float16")])
def test_ieee_every_value_against_partners_vs_ml_dtypes(op, fmt, rng):
    """bfloat16/float16 arithmetic in ml_dtypes/numpy rounds a float32 result once more;
    with 24 >= 2p + 2 bits that double rounding is innocuous (Figueroa 1995), so it is
    the correctly rounded result emu must produce."""
    dt = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[fmt]
    x = all_values(fmt)
    partners = np.concatenate([corner_values(fmt), x[rng.integers(0, x.size, 500)]])
    npop = np.add if op == "fp_add" else np.multiply
    for chunk in np.array_split(partners, 8):
        a = np.repeat(x, chunk.size)
        b = np.tile(chunk, x.size)
        with np.errstate(all="ignore"):
            want = npop(a.astype(dt), b.astype(dt)).astype(np.float32)
        assert_bits_equal(getattr(emu, op)(a, b, fmt), want, a, b, what=f"{op} {fmt}")


def test_float32_add_mul_match_numpy(rng):
    """float32: emu's integer adder/multiplier == numpy float32 + and * (10^6 patterns)."""
    raw = rng.integers(0, 2 ** 32, (2, 1_000_000), dtype=np.uint64).astype(np.uint32)
    a, b = raw.view(np.float32)
    # pull a third of the pairs close in magnitude: cancellation, ties, subnormal sums
    close = rng.random(a.size) < 0.33
    b[close] = (a[close].view(np.uint32) ^ rng.integers(0, 1 << 12, close.sum(), dtype=np.uint32)
                ^ (rng.integers(0, 2, close.sum(), dtype=np.uint32) << 31)).view(np.float32)
    c = corner_values("float32")
    a = np.concatenate([a, np.repeat(c, c.size)])
    b = np.concatenate([b, np.tile(c, c.size)])
    with np.errstate(all="ignore"):
        assert_bits_equal(emu.fp_add(a, b), a + b, a, b, what="fp_add float32")
        assert_bits_equal(emu.fp_mul(a, b), a * b, a, b, what="fp_mul float32")


def test_vectorised_oracle_matches_fraction_oracle(rng):
    """The float64 oracle used for the bfloat16 sweeps agrees with the Fraction oracle."""
    for fmt in FP8 + ["e3m2b5fnuz", "float4_e2m1fn"]:        # + the fnuz and none policies
        a, b = all_pairs(fmt)
        for op in ("pam_mul", "pa_div"):
            assert_bits_equal(getattr(R, op + "_vec")(a, b, fmt), oracle(op, fmt, a, b),
                              a, b, what=f"vec oracle {op} {fmt}")
    x = emu.quantize(rng.standard_normal(3000) * 2.0 ** rng.integers(-130, 130, 3000), "float32")
    y = np.roll(x, 1)
    for op in ("pam_mul", "pa_div"):
        assert_bits_equal(getattr(R, op + "_vec")(x, y), oracle(op, "float32", x, y), x, y,
                          what=f"vec oracle {op} float32")


# --- float32 and float16: corners and hypothesis ------------------------------------

def threshold_pairs(fmt, rng, n=400):
    """Pairs whose PAM/PA-division result lands within a few ulps of the flush and
    overflow thresholds, and pairs whose mantissa sum is near 1 (carry)."""
    f = emu.format(fmt)
    ulp = 2.0 ** -f.man_bits
    a = emu.quantize((1 + rng.random(n)) * 2.0 ** rng.integers(f.emin, f.emax + 1, n), f)
    out = []
    for target in (f.smallest_normal, f.max):
        for k in (-2, -1, 0, 1, 2):
            t = target * (1 + k * ulp) if target == f.smallest_normal else target * (1 - k * ulp / 2)
            out.append((a, emu.pa_div(t, a, f)))        # a ·̂ (t ÷̂ a) ~ t
            out.append((t * np.ones_like(a), emu.pa_div(t, a, f)))
            out.append((a, emu.pam_mul(t, a, f)))
    ma = rng.random(n)
    mb = 1 - ma + (rng.integers(-2, 3, n) * ulp)
    out.append((emu.quantize(1 + ma, f), emu.quantize(1 + np.clip(mb, 0, 1 - ulp), f)))
    a = np.concatenate([p[0] for p in out]).astype(np.float32)
    b = np.concatenate([p[1] for p in out]).astype(np.float32)
    return a, b


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16", "e8m4", "e5m3"])
@pytest.mark.parametrize("op", BINARY)
def test_binary_corners_and_thresholds(fmt, op, rng):
    c = corner_values(fmt)
    ta, tb = threshold_pairs(fmt, rng)
    a = np.concatenate([np.repeat(c, c.size), ta, tb])
    b = np.concatenate([np.tile(c, c.size), tb, ta])
    assert_bits_equal(getattr(emu, op)(a, b, fmt), oracle(op, fmt, a, b), a, b,
                      what=f"{op} {fmt}")


@pytest.mark.parametrize("fmt", ["float32", "float16", "e8m4"])
@pytest.mark.parametrize("op", UNARY)
def test_unary_corners_and_dense_ranges(fmt, op, rng):
    f = emu.format(fmt)
    x = np.concatenate([corner_values(fmt),
                        rng.uniform(-140, 140, 2000), rng.uniform(-3, 3, 2000),
                        (1 + rng.random(2000)) * 2.0 ** rng.integers(f.emin - 3, f.emax + 1, 2000),
                        2.0 ** -np.arange(f.man_bits - 1, f.man_bits + 5)]).astype(np.float32)
    assert_bits_equal(getattr(emu, op)(x, fmt), oracle(op, fmt, x), x, what=f"{op} {fmt}")


finite32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@settings(max_examples=3000, deadline=None)
@given(a=finite32, b=finite32, op=st.sampled_from(BINARY), fmt=st.sampled_from(["float32", "float16"]))
def test_binary_hypothesis(a, b, op, fmt):
    got = getattr(emu, op)(np.float32(a), np.float32(b), fmt)
    want = emu.OPS[op].oracle(a, b, fmt)
    assert_bits_equal(got, want, a, b, what=f"{op} {fmt}")


@settings(max_examples=3000, deadline=None)
@given(x=finite32, op=st.sampled_from(UNARY), fmt=st.sampled_from(["float32", "float16"]))
def test_unary_hypothesis(x, op, fmt):
    assert_bits_equal(getattr(emu, op)(np.float32(x), fmt), emu.OPS[op].oracle(x, fmt), x,
                      what=f"{op} {fmt}")


# --- facts from the paper ---------------------------------------------------------------

def test_max_relative_error_is_minus_one_ninth_at_half_mantissas():
    """Sec. 2.7: the worst relative error of PAM is (2 - 2.25) / 2.25 = -1/9 at M_a = M_b = 0.5."""
    f = emu.bfloat16
    m = 1 + np.arange(1 << f.man_bits) / (1 << f.man_bits)
    a, b = np.meshgrid(m, m, indexing="ij")
    rel = (emu.pam_mul(a, b, f).astype(np.float64) - a * b) / (a * b)
    i = np.argmin(rel)
    assert rel.min() == pytest.approx(-1 / 9, abs=1e-12)
    assert (a.ravel()[i], b.ravel()[i]) == (1.5, 1.5)
    assert rel.max() == 0.0                     # PAM never overestimates


def test_exact_when_an_operand_is_a_power_of_two(rng):
    x = (rng.standard_normal(100_000) * 2.0 ** rng.integers(-60, 60, 100_000)).astype(np.float32)
    p = (2.0 ** rng.integers(-40, 40, 100_000) * rng.choice([-1, 1], 100_000)).astype(np.float32)
    assert np.array_equal(emu.pam_mul(x, p), x * p)
    assert np.array_equal(emu.pam_mul(p, x), x * p)
    assert np.array_equal(emu.pa_div(x, p), x / p)


def test_pam_is_integer_addition_for_float32(rng):
    """For E = 8 formats PAM is int32 addition of the patterns minus the bias (eqs. 5-8)."""
    x = rng.uniform(-4, 4, 10_000).astype(np.float32)
    y = rng.uniform(-4, 4, 10_000).astype(np.float32)
    s = (x.view(np.uint32) ^ y.view(np.uint32)) & np.uint32(0x80000000)
    r = ((x.view(np.uint32) & 0x7FFFFFFF).astype(np.int64) + (y.view(np.uint32) & 0x7FFFFFFF)
         - 0x3F800000).astype(np.uint32) | s
    assert np.array_equal(emu.pam_mul(x, y).view(np.uint32), r)


def test_special_values_table():
    """docs/semantics.md, PAM and PA division special cases, spelled out."""
    nan, inf = float("nan"), float("inf")
    tiny = emu.bfloat16.smallest_subnormal
    cases = [  # a, b, pam_mul, pa_div
        (nan, 1.0, nan, nan), (1.0, nan, nan, nan), (inf, 0.0, nan, inf), (inf, tiny, nan, inf),
        (inf, -2.0, -inf, -inf), (inf, inf, inf, nan), (0.0, inf, nan, 0.0),
        (-0.0, 3.0, -0.0, -0.0), (tiny, 3.0, 0.0, 0.0), (3.0, 0.0, 0.0, inf),
        (0.0, 0.0, 0.0, nan), (-3.0, -0.0, 0.0, inf), (2.0, 4.0, 8.0, 0.5),
    ]
    for a, b, m, d in cases:
        assert_bits_equal(emu.pam_mul(a, b, "bf16"), m, a, b, what="pam_mul")
        assert_bits_equal(emu.pa_div(a, b, "bf16"), d, a, b, what="pa_div")
    assert math.isnan(emu.pa_div(1.0, 0.0, "e4m3fn"))          # fn: no infinity
    assert emu.pam_mul(400.0, 400.0, "e4m3fn") == 448.0        # fn: saturate
    assert emu.pam_mul(1e30, 1e30, "bf16") == inf
    assert emu.pa_exp2(-inf) == 0.0 and emu.pa_log2(0.0) == -inf and emu.pa_log2(-0.0) == -inf
    assert math.isnan(emu.pa_log2(-1.0)) and math.isnan(emu.pa_sqrt(-4.0))
    assert_bits_equal(emu.pa_sqrt(-0.0), -0.0, what="pa_sqrt(-0)")
    assert emu.pa_log2(0.0, "e4m3fn") == -448.0


def test_nan_outputs_are_canonical(rng):
    x = np.float32([np.nan, -np.nan, np.inf, 0.0, -1.0])
    for name in BINARY + UNARY:
        f = getattr(emu, name)
        out = f(x, x[::-1]) if name in BINARY else f(x)
        bits = out.view(np.uint32)[np.isnan(out)]
        assert bits.size and np.all(bits == 0x7FC00000), name


def test_broadcasting_and_shapes():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert emu.pam_mul(a, np.float32(2)).shape == (2, 3)
    assert emu.pam_mul(a, np.ones((4, 1, 3))).shape == (4, 2, 3)
    assert np.array_equal(emu.pam_mul(a.T, 2.0), (a * 2).T)      # non-contiguous
    assert emu.pa_exp2(np.zeros((0, 3))).shape == (0, 3)
    with pytest.raises(ValueError, match=r"broadcast.*a.shape=\(2, 3\), b.shape=\(4,\)"):
        emu.pam_mul(a, np.ones(4))
    with pytest.raises(ValueError, match="fmt='e9m9'"):
        emu.pa_div(a, a, "e9m9")
    with pytest.raises(TypeError, match="b must have a real floating dtype"):
        emu.pam_mul(a, "x")

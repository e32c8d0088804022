"""quantize / to_bits / from_bits: against ml_dtypes (bit for bit) and the exact oracle."""
import math

import ml_dtypes
import numpy as np
import pytest

import emu
import emu.reference as R
from conftest import FP8, all_values, assert_bits_equal, corner_values

#: every ml_dtypes float type emu computes with (the unsigned E8M0 scale: tests/test_mx.py)
ML = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16,
      **{name: getattr(ml_dtypes, name) for name in (
          "float8_e5m2", "float8_e5m2fnuz", "float8_e4m3", "float8_e4m3fn", "float8_e4m3fnuz",
          "float8_e4m3b11fnuz", "float8_e3m4", "float6_e3m2fn", "float6_e2m3fn",
          "float4_e2m1fn")}}


def ml_round(x, fmt):
    with np.errstate(all="ignore"):
        return np.asarray(x, np.float32).astype(ML[fmt]).astype(np.float32)


def boundary_inputs(fmt) -> np.ndarray:
    """Every value of fmt, every midpoint (tie) between neighbours and past max, and
    the float32 neighbours of all of those, with both signs."""
    f = emu.format(fmt)
    v = all_values(f).astype(np.float64)
    v = np.unique(np.abs(v[np.isfinite(v)]))
    ulp_top = 2.0 ** (f.emax - f.man_bits)          # spacing in the top binade
    v = np.concatenate([v, [f.max + ulp_top, f.max + 2 * ulp_top]])
    mids = (v[:-1] + v[1:]) / 2
    pts = np.concatenate([v, mids])
    pts = pts[pts <= np.finfo(np.float32).max]
    assert np.all(pts.astype(np.float32).astype(np.float64) == pts)       # exact
    pts = pts.astype(np.float32)
    near = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                           np.nextafter(pts, np.float32(0)), np.float32([1e30, 3.4e38])])
    # NaNs of both signs, quiet and signalling: formats without NaN map them by sign
    nans = np.uint32([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF]).view(np.float32)
    return np.concatenate([near, -near, np.float32([np.inf, -np.inf]), nans])


@pytest.mark.parametrize("fmt", list(ML))
def test_rne_matches_ml_dtypes_at_every_rounding_boundary(fmt):
    x = boundary_inputs(fmt)
    assert_bits_equal(emu.quantize(x, fmt), ml_round(x, fmt), x, what=f"quantize {fmt}")


@pytest.mark.parametrize("fmt", list(ML))
def test_rne_matches_ml_dtypes_on_random_patterns(fmt, rng):
    x = rng.integers(0, 2 ** 32, 1_200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    assert_bits_equal(emu.quantize(x, fmt), ml_round(x, fmt), x, what=f"quantize {fmt}")


@pytest.mark.parametrize("fmt", list(ML))
def test_bits_match_ml_dtypes(fmt):
    x = boundary_inputs(fmt)
    x = x[~np.isnan(x) | (emu.format(fmt).nan == "none")]
    with np.errstate(all="ignore"):
        want = x.astype(ML[fmt])
    want = want.view(np.uint16 if want.itemsize == 2 else np.uint8).astype(np.uint32)
    got = emu.to_bits(x, fmt)
    # ml_dtypes keeps a NaN's sign when a float overflows into fn formats; emu's NaN
    # is canonical: compare NaN codes by class only.
    nan = np.isnan(emu.from_bits(want, fmt))
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(emu.from_bits(got[nan], fmt)).all()


@pytest.mark.parametrize("fmt", list(ML) + ["e2m1", "e3m2fn", "e5m7", "e8m3", "e3m3fnuz",
                                              "e5m2b13fnuz", "e3m3sat", "e4m2b5"])
def test_to_from_bits_roundtrip_exhaustive(fmt):
    f = emu.format(fmt)
    codes = np.arange(1 << f.width, dtype=np.uint32)
    vals = emu.from_bits(codes, f)
    back = emu.to_bits(vals, f)
    nan = np.isnan(vals)
    assert np.array_equal(back[~nan], codes[~nan])
    assert np.all(back[nan] == f.nan_encoding)
    assert np.all(vals[nan].view(np.uint32) == 0x7FC00000)      # canonical NaN
    if fmt in ML:
        ref = codes.astype(np.uint16 if f.width == 16 else np.uint8).view(ML[fmt])
        assert_bits_equal(vals, ref.astype(np.float32), codes, what=f"from_bits {fmt}")
    # decoding is the oracle's view of the same encodings
    assert_bits_equal(emu.quantize(vals, f), vals, what="values are fixed points")


@pytest.mark.parametrize("fmt", FP8 + ["bfloat16", "float16", "e8m4", "e5m7", "e2m1", "e3m2fn",
                                 "float8_e4m3b11fnuz", "float6_e3m2fn", "float4_e2m1fn"])
@pytest.mark.parametrize("rounding", ["nearest_even", "toward_zero"])
@pytest.mark.parametrize("subnormals", [True, False])
@pytest.mark.parametrize("overflow", [None, "saturate"])
def test_modes_match_oracle(fmt, rounding, subnormals, overflow, rng):
    x = np.concatenate([boundary_inputs(fmt) if emu.format(fmt).width <= 16 else [],
                        rng.standard_normal(3000) * emu.format(fmt).max ** rng.random(3000),
                        corner_values(fmt)]).astype(np.float32)
    x = x[rng.permutation(x.size)[:6000]]
    got = emu.quantize(x, fmt, rounding, subnormals=subnormals, overflow=overflow)
    want = [R.quantize(float(v), fmt, rounding, subnormals, overflow) for v in x]
    assert_bits_equal(got, want, x, what=f"{fmt} {rounding} sub={subnormals} {overflow}")


@pytest.mark.parametrize("fmt", ["bfloat16", "e8m4", "e8m1", "float32"])
def test_toward_zero_masks_mantissa_for_8_bit_exponents(fmt, rng):
    x = rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x)]
    drop = 23 - emu.format(fmt).man_bits
    want = (x.view(np.uint32) & np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)).view(np.float32)
    assert_bits_equal(emu.quantize(x, fmt, "toward_zero"), want, x, what="RTZ is masking")


@pytest.mark.parametrize("fmt", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "e3m2fn"])
def test_stochastic_matches_oracle_draw_for_draw(fmt, rng):
    f = emu.format(fmt)
    x = np.concatenate([rng.standard_normal(4000) * 4.0 ** rng.integers(-40, 40, 4000),
                        np.float32([f.smallest_subnormal / 3, 1e-30, f.max * 1.01, f.max]),
                        corner_values(fmt)]).astype(np.float32)
    seed = 987654321123
    got = emu.quantize(x, fmt, "stochastic", seed=seed)
    want = [R.quantize(float(v), fmt, "stochastic", u=R.rand32(seed, i)) for i, v in enumerate(x)]
    assert_bits_equal(got, want, x, what=f"stochastic {fmt}")


@pytest.mark.parametrize("fmt", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_stochastic_is_unbiased(fmt):
    """E[q(x)] = x: the sample mean stays within 5 standard errors for values across the
    normal range, the subnormal range and far below the smallest subnormal."""
    f = emu.format(fmt)
    n = 200_000
    lo_grid = f.smallest_subnormal
    cases = [1 + f.eps / 3, -(1 + 0.9 * f.eps), 3 + 2 * f.eps * 0.1, f.smallest_normal * 0.37,
             lo_grid * 0.25, lo_grid * 2 ** -9 * 1.7]
    for i, x in enumerate(cases):
        x32 = np.float32(x)
        q = emu.quantize(np.full(n, x32), fmt, "stochastic", seed=1000 + i).astype(np.float64)
        below = float(emu.quantize(x32, fmt, "toward_zero"))
        above = below + math.copysign(f.smallest_subnormal if abs(x) < f.smallest_normal
                                      else 2.0 ** (math.floor(math.log2(abs(x))) - f.man_bits),
                                      x)
        assert set(np.unique(q)) <= {below, above}
        p = (float(x32) - below) / (above - below)
        se = abs(above - below) * math.sqrt(max(p * (1 - p), 1e-12) / n)
        assert abs(q.mean() - float(x32)) <= 5 * se + 1e-9 * abs(above - below), (fmt, x)


def test_stochastic_is_deterministic_per_seed(rng):
    x = rng.standard_normal(10_000).astype(np.float32)
    a = emu.quantize(x, "bf16", "stochastic", seed=7)
    assert np.array_equal(a.view(np.uint32), emu.quantize(x, "bf16", "stochastic", seed=7).view(np.uint32))
    assert not np.array_equal(a, emu.quantize(x, "bf16", "stochastic", seed=8))
    # element i always uses draw i: a prefix rounds the same way
    assert np.array_equal(emu.quantize(x[:100], "bf16", "stochastic", seed=7), a[:100])


def test_overflow_rules():
    big = np.float32([1e6, -1e6, np.inf, -np.inf])
    assert_bits_equal(emu.quantize(big, "float8_e4m3fn"), [np.nan] * 4)
    assert_bits_equal(emu.quantize(big, "float8_e4m3fn", overflow="saturate"), [448, -448, 448, -448])
    assert_bits_equal(emu.quantize(big, "float16"), [np.inf, -np.inf, np.inf, -np.inf])
    assert_bits_equal(emu.quantize(big, "float16", overflow="saturate"),
                      [65504, -65504, np.inf, -np.inf])
    assert_bits_equal(emu.quantize(big, "float16", "toward_zero"), [65504, -65504, np.inf, -np.inf])
    # e4m3fn: 464 is the tie between 448 and the NaN code's value 480: even wins
    assert emu.quantize(np.float32(464), "e4m3fn") == 448
    assert np.isnan(emu.quantize(np.float32(465), "e4m3fn"))


def test_flush_subnormals():
    f = emu.float16
    x = np.float32([f.smallest_subnormal, -f.smallest_normal / 2, f.smallest_normal,
                    f.smallest_normal * (1 - 2 ** -12)])
    got = emu.quantize(x, f, subnormals=False)
    assert_bits_equal(got, [0.0, -0.0, f.smallest_normal, f.smallest_normal])


def test_input_dtypes():
    x32 = np.float32([1.5, -2.25, 3.0e-5])
    for x in (x32.astype(np.float16), x32.astype(ml_dtypes.bfloat16), x32.astype(np.float64),
              [1.5, -2.25, 3.0e-5]):
        got = emu.quantize(x, "bf16")
        assert got.dtype == np.float32 and got.shape == (3,)
    assert emu.quantize(np.arange(5), "e4m3fn").tolist() == [0, 1, 2, 3, 4]
    s = emu.quantize(1.7, "bf16")
    assert isinstance(s, np.float32) and s == np.float32(1.703125)
    nc = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2].T
    assert np.array_equal(emu.quantize(nc, "e4m3fn"), ml_round(nc, "float8_e4m3fn"))


@pytest.mark.parametrize("call,match", [
    (lambda: emu.quantize([1.0], "bf17"), "fmt='bf17'"),
    (lambda: emu.quantize([1.0], "bf16", rounding="up"), "rounding='up'.*nearest_even"),
    (lambda: emu.quantize([1.0], "bf16", overflow="clip"), "overflow='clip'"),
    (lambda: emu.quantize([1.0], "bf16", "stochastic", seed=-1), "seed"),
    (lambda: emu.quantize([1.0], "bf16", seed=3), "seed is only used"),
    (lambda: emu.quantize([1.0], "bf16", subnormals="no"), "subnormals"),
    (lambda: emu.from_bits([256], "e4m3fn"), r"\[0, 2\*\*8\)"),
    (lambda: emu.from_bits([-1], "e4m3fn"), r"\[0, 2\*\*8\)"),
])
def test_bad_arguments_are_clear_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("bad", [["a", "b"], np.array([1 + 2j]), np.array([object()])])
def test_non_numeric_inputs_are_type_errors(bad):
    with pytest.raises(TypeError, match="x must have a real floating dtype"):
        emu.quantize(bad, "bf16")
    with pytest.raises(TypeError):
        emu.from_bits(np.float32([1.0]), "bf16")

"""MX block formats and the E8M0 scale: against ml_dtypes and the exact oracle."""
import ml_dtypes
import numpy as np
import pytest

import emu
import emu.grad
import emu.mx
import emu.reference as R
from conftest import assert_bits_equal

MX = sorted(emu.MX_TYPES)


def e8m0_inputs(rng) -> np.ndarray:
    """Every power of two, its midpoints up and down, their float32 neighbours, the
    float32 subnormal range, specials, negatives, and random patterns."""
    e = np.arange(-149, 128)
    pts = np.concatenate([np.ldexp(1.0, e), np.ldexp(1.5, e), np.ldexp(1.25, e)])
    pts = pts[pts < 3.4e38].astype(np.float32)
    near = np.concatenate([pts, np.nextafter(pts, np.float32(0)),
                           np.nextafter(pts, np.float32(np.inf))])
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4028235e38])
    raw = rng.integers(0, 2 ** 32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([near, -near, specials, raw.view(np.float32)])


def test_e8m0_quantize_matches_ml_dtypes(rng):
    x = e8m0_inputs(rng)
    with np.errstate(all="ignore"):
        want = x.astype(ml_dtypes.float8_e8m0fnu)
    assert np.array_equal(emu.to_bits(x, "float8_e8m0fnu"), want.view(np.uint8))
    assert_bits_equal(emu.quantize(x, "e8m0fnu"), want.astype(np.float32), x,
                      what="quantize e8m0")


def test_e8m0_decodes_every_code_as_ml_dtypes():
    codes = np.arange(256)
    want = codes.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert_bits_equal(emu.from_bits(codes, "float8_e8m0fnu"), want, what="from_bits e8m0")
    assert emu.from_bits(127, "e8m0fnu") == 1.0


@pytest.mark.parametrize("call,match", [
    (lambda: emu.pam_mul(1.0, 2.0, "float8_e8m0fnu"), "scale format"),
    (lambda: emu.pam_matmul(np.ones((2, 2)), np.ones((2, 2)), "bf16", "e8m0fnu"),
     "acc=float8_e8m0fnu is a scale format"),
    (lambda: emu.mx_pam_matmul(np.ones((2, 2)), np.ones((2, 2)), "mxfp4", acc="e8m0fnu"),
     "acc=float8_e8m0fnu is a scale format"),
    (lambda: emu.grad.pam_matmul(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), "bf16",
                                 "e8m0fnu"), "acc=float8_e8m0fnu is a scale format"),
    (lambda: emu.quantize(1.0, "e8m0fnu", "toward_zero"), "defaults only"),
    (lambda: emu.from_bits([256], "e8m0fnu"), r"\[0, 2\*\*8\)"),
    (lambda: emu.mx_quantize([1.0], "mxfp5"), "elem='mxfp5'.*mxfp4_e2m1"),
    (lambda: emu.mx_quantize([1.0], "mxfp4", block=0), "block must be"),
    (lambda: emu.mx_quantize([1.0], "mxfp4", axis=1), "axis=1"),
    (lambda: emu.mx_dequantize([1.0, 2.0], np.uint8([127, 127]), block=32), "scales must"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def mx_rows(rng, n=70):
    """Rows exercising every block rule: random magnitudes, a zero block, signed zeros,
    a NaN and an inf block, ties, values at the float32 extremes."""
    rows = [rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30),
            rng.standard_normal(n) * 2.0 ** -140,             # float32 subnormal amax
            rng.standard_normal(n) * 1e38,                    # scale near 2^127
            np.where(rng.random(n) < 0.5, -0.0, 0.0),         # the amax = 0 block
            np.ldexp(rng.integers(-64, 64, n) + 0.5, -6)]     # ties of every grid
    odd = rng.standard_normal(n)
    odd[3], odd[40] = np.nan, np.inf                          # one NaN, one inf block
    rows.append(odd)
    for r in rows[:2]:
        r[[0, 33]] = 0.0
    return np.array(rows, np.float32)


@pytest.mark.parametrize("mx", MX)
def test_mx_quantize_matches_oracle(mx, rng):
    x = mx_rows(rng)
    el, sc = emu.mx_quantize(x, mx)
    assert el.shape == x.shape and sc.shape == (x.shape[0], 3) and sc.dtype == np.uint8
    for row, e, s in zip(x, el, sc):
        want_e, want_s = R.mx_quantize([float(v) for v in row], mx)
        assert s.tolist() == want_s
        assert_bits_equal(e, want_e, row, what=f"{mx} elements")
        assert_bits_equal(emu.mx_dequantize(e[None], s[None])[0],
                          R.mx_dequantize(want_e, want_s), row, what=f"{mx} dequantize")


@pytest.mark.parametrize("mx", MX)
def test_mx_quantize_is_idempotent_and_follows_axis(mx, rng):
    """Dequantized blocks quantize to themselves (the block max lands in the element's
    top binade), and axis=0 is axis=-1 of the transpose, with block 8."""
    x = mx_rows(rng)[[0, 2, 4]]
    el, sc = emu.mx_quantize(x, mx)
    v = emu.mx_dequantize(el, sc)
    el2, sc2 = emu.mx_quantize(v, mx)
    assert np.array_equal(sc2, sc)
    assert_bits_equal(el2, el, what="requantize")
    e0, s0 = emu.mx_quantize(x.T, mx, block=8, axis=0)
    e1, s1 = emu.mx_quantize(x, mx, block=8)
    assert np.array_equal(s0, s1.T)
    assert_bits_equal(e0, e1.T, what="axis")
    assert_bits_equal(emu.mx_dequantize(e0, s0, block=8, axis=0),
                      emu.mx_dequantize(e1, s1, block=8).T, what="dequantize axis")


@pytest.mark.parametrize("mx,acc", [(m, "float32") for m in MX] + [("mxfp4_e2m1", "bfloat16"),
                                                                   ("mxfp8_e4m3", "float16")])
def test_mx_pam_matmul_matches_oracle(mx, acc, rng):
    a = (rng.standard_normal((4, 70)) * 2.0 ** rng.integers(-8, 8, (4, 1))).astype(np.float32)
    b = (rng.standard_normal((70, 5)) * 2.0 ** rng.integers(-8, 8, (1, 5))).astype(np.float32)
    a[1, :32] = 0.0                                   # a zero block
    got = emu.mx_pam_matmul(a, b, mx, acc=acc)
    want = R.mx_pam_matmul(a.tolist(), b.tolist(), mx, acc=acc)
    assert_bits_equal(got, want, what=f"mx_pam_matmul {mx} acc={acc}")
    # 1-D operands follow np.matmul
    assert_bits_equal(emu.mx_pam_matmul(a[0], b, mx, acc=acc), got[0], what="1-D a")


@pytest.mark.parametrize("mx", ["mxfp4_e2m1", "mxfp6_e2m3", "mxfp8_e5m2"])
def test_mx_product_is_element_pam_with_scales_added(mx, rng):
    """pam_mul of dequantized operands == paexp2(palog2 P_a + palog2 P_b) 2^(s_a + s_b)."""
    x = rng.standard_normal((2, 64)).astype(np.float32) * np.float32([[3e3], [2e-3]])
    el, sc = emu.mx_quantize(x, mx)
    v = emu.mx_dequantize(el, sc)
    a, b = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    got = emu.pam_mul(v[0, a], v[1, b], "float32")
    s = sc.astype(int) - 127
    for i, j in zip(a.ravel()[::37], b.ravel()[::37]):
        pa, pb = R.Fraction(float(el[0, i])), R.Fraction(float(el[1, j]))
        if pa == 0 or pb == 0:
            assert got[i, j] == 0
            continue
        mag = R.paexp2_exact(R.palog2_exact(abs(pa)) + R.palog2_exact(abs(pb))) \
            * R._pow2(s[0, i // 32] + s[1, j // 32])
        assert abs(R.Fraction(float(got[i, j]))) == mag


@pytest.mark.parametrize("mx", MX)
def test_mx_scale_over_every_binade(mx):
    """One block per float32 binade (subnormals included), amax at 1, 1.5 and just
    below 2 of it: the scale code and elements of the oracle (the clamp at -127, the
    round-up of the block max into the next binade, the top binade of float32)."""
    e = np.arange(-149, 128)
    rows = []
    for f in (1.0, 1.5, 2 - 2.0 ** -23):
        amax = np.ldexp(f, e)
        amax = amax[amax < 3.5e38]
        rows.append(np.stack([amax, -amax * 0.3, amax * 2.0 ** -20, -amax * 0.77], 1))
    x = np.concatenate(rows).astype(np.float32)
    el, sc = emu.mx_quantize(x, mx)
    for row, e_, s in zip(x, el, sc):
        want_e, want_s = R.mx_quantize([float(v) for v in row], mx)
        assert s.tolist() == want_s, row
        assert_bits_equal(e_, want_e, row, what=f"{mx} elements")


@pytest.mark.parametrize("mx", MX)
def test_mx_dequantize_every_element_and_scale(mx):
    """Every element value of the type (every code; mxint8: every k) with scale codes at
    both ends, around 1 and NaN: the oracle's values (float32 subnormals and overflow
    to inf of user-made scales included)."""
    elem = emu.MX_TYPES[mx]
    p = (np.arange(-127, 128) / 64 if elem == "int8"
         else emu.from_bits(np.arange(1 << elem.width), elem)).astype(np.float32)
    codes = np.uint8([0, 1, 2, 20, 100, 126, 127, 128, 200, 250, 254, 255])
    el = np.tile(p, (codes.size, 1))
    sc = codes[:, None]
    got = emu.mx_dequantize(el, sc, block=p.size)
    for row, c, g in zip(el, codes, got):
        assert_bits_equal(g, R.mx_dequantize([float(v) for v in row], [int(c)], p.size),
                          row, what=f"{mx} code {c}")


def test_mx_layouts_and_empty_arrays(rng):
    """A middle axis (outer and inner dimensions), strided and float64 inputs, a last
    short block, and empty arrays."""
    x = rng.standard_normal((3, 37, 4)) * 2.0 ** rng.integers(-20, 20, (3, 1, 4))
    el, sc = emu.mx_quantize(x[:, ::1, ::-1], "mxfp6", block=8, axis=1)
    assert sc.shape == (3, 5, 4)
    e2, s2 = emu.mx_quantize(np.ascontiguousarray(
        np.moveaxis(x[:, :, ::-1].astype(np.float32), 1, -1)), "mxfp6", block=8)
    assert np.array_equal(np.moveaxis(sc, 1, -1), s2)
    assert_bits_equal(np.moveaxis(el, 1, -1), e2, what="axis 1")
    assert_bits_equal(emu.mx.MXFormat("mxfp6", 8).round(x[:, :, ::-1], 1),
                      emu.mx_dequantize(el, sc, block=8, axis=1), what="round")
    el, sc = emu.mx_quantize(np.zeros((0, 5), np.float32), "mxfp4")
    assert el.shape == (0, 5) and sc.shape == (0, 1)
    el, sc = emu.mx_quantize(np.zeros((2, 0), np.float32), "mxfp4", axis=1)
    assert el.shape == (2, 0) and sc.shape == (2, 0)
    assert emu.mx_dequantize(el, sc).shape == (2, 0)


def test_e8m0_scalars_and_bad_bits():
    assert emu.quantize(np.float32(3.0), "e8m0fnu") == 4.0
    assert emu.to_bits(0.75, "e8m0fnu") == 127
    with pytest.raises(TypeError, match="integer dtype"):
        emu.from_bits(np.float32([1.0]), "e8m0fnu")
    with pytest.raises(ValueError, match=r"\[0, 2\*\*8\)"):
        emu.from_bits(np.int64([-1]), "e8m0fnu")


@pytest.mark.parametrize("mx", [m for m in MX if m != "mxint8"])
def test_mx_quantize_fast_blocks_are_the_scalar_definition(mx, rng):
    """emu/_kernels_mx.py _block_fast (float elements) against emu/_scalar_mx.py's
    X.mx_element / X.mx_value called per element: blocks whose amax spans float32's range
    (subnormal amax, scale codes 0 and near 254), elements from amax down past the
    element's subnormals (every binade, random mantissas), grid ties, signed zeros."""
    from emu import _scalar_mx as X
    from emu.mx import _plan
    plan = _plan((1, 32), 32, -1, mx)
    rows = []
    for e in (-140, -126, -100, -20, 0, 3, 40, 126, 127):
        amax = np.ldexp(rng.uniform(1, 2), e)
        exps = rng.integers(e - 40, e + 1, 31)
        row = np.ldexp(rng.uniform(1, 2, 31), exps) * rng.choice([-1, 1], 31)
        rows.append(np.concatenate([[amax], np.minimum(np.abs(row), amax) * np.sign(row)]))
        # ties of the element grid (normal binades and subnormals) at this block's scale
        s = np.floor(np.log2(np.float32(amax))) - plan.emax
        top, man, emin = plan.emax, plan.efc.man_bits, plan.efc.emin
        grid = [(k + 0.5) * 2.0 ** (emin - man) for k in range(2 ** man)]
        grid += [(1 + (k + 0.5) / 2 ** man) * 2.0 ** E for E in range(emin, top + 1)
                 for k in range(2 ** man)]
        ties = np.ldexp(rng.choice(grid, 31), int(max(s, -127))) * rng.choice([-1, 1], 31)
        rows.append(np.concatenate([[amax], np.clip(ties, -amax, amax)]))
    x = np.array(rows, np.float32)
    x[2, 5:9] = [0.0, -0.0, 0.0, -0.0]
    el, sc = emu.mx_quantize(x, mx)
    vals = emu.mx.MXFormat(mx).round(x)
    f32c = emu.float32.consts
    for row, e_row, s, v_row in zip(x, el, sc, vals):
        bits = row.view(np.uint32)
        amax = max(int(b) & 0x7FFFFFFF for b in bits)
        code = int(X.mx_scale_code(amax, plan.emax))
        assert s == code
        want = [int(X.mx_element(int(b), code, plan.efc, f32c, False)) & 0xFFFFFFFF
                for b in bits]
        assert e_row.view(np.uint32).tolist() == want
        assert v_row.view(np.uint32).tolist() == [
            int(X.mx_value(w, code, f32c)) & 0xFFFFFFFF for w in want]

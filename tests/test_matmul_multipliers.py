"""emu.matmul with every multiplier (issue 23; docs/semantics.md §5 and "Multipliers").

The Fraction oracle (emu/reference_mul.py ``matmul``, ``fma``) is the definition; the
CPU's fold (emu/_kernels.py ``matmul_fmtacc``, one SM.mac per step) must equal it, and
every fast kernel must equal the fold (tests/test_matmul_acc.py runs the narrow-accumulator
steps with the constant multipliers; here the float32-accumulator kernels).  The CUDA
kernels are checked against the CPU in tests/test_cuda_sim.py.
"""
import itertools

import numpy as np
import pytest

import emu
from conftest import all_values, assert_bits_equal, corner_values
from emu import _scalar as S
from emu import reference_mul as RM

MULS = [*emu.MULTIPLIERS, "pam+3", "lmul-1", "cpam1:0,1,-1,0"]
CONSTANT = ["pam", "lmul", "pam+3", "pam-3", "lmul-1"]


def _operands(rng, fmt, m, k, n):
    """Random values of fmt over a wide range with zeros, subnormals, inf/NaN and the
    largest values mixed in."""
    f = emu.format(fmt)
    corners = corner_values(fmt)
    def draw(shape):
        x = (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))).astype(np.float32)
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, min(flat.size, 4), replace=False)
        flat[idx] = rng.choice(corners, idx.size)
        return emu.quantize(x, f)
    return draw((m, k)), draw((k, n))


def _oracle(A, B, fmt, acc, mul):
    return np.array(RM.matmul(A.tolist(), B.tolist(), fmt, acc, mul), np.float32).reshape(
        A.shape[0], B.shape[1])


PAIRS = [("float8_e4m3fn", "float32"), ("float8_e5m2", "bfloat16"), ("bfloat16", "float32"),
         ("bfloat16", "bfloat16"), ("float16", "float16"), ("float6_e3m2fn", "float8_e4m3fn"),
         ("float8_e4m3fnuz", "float16")]


@pytest.mark.parametrize("mul,fmt,acc", [
    (m, f, a) for m in MULS for f, a in PAIRS
    if emu.multiplier(m).k <= emu.format(f).man_bits])   # a table needs its mantissa bits
def test_every_multiplier_against_the_oracle(mul, fmt, acc, rng):
    """Random operands with every kind of special value: emu.matmul (whatever kernel it
    picks) equals the Fraction oracle bit for bit."""
    A, B = _operands(rng, fmt, 4, 7, 5)
    assert_bits_equal(emu.matmul(A, B, fmt, acc, mul=mul), _oracle(A, B, fmt, acc, mul),
                      what=f"{mul} {fmt}/{acc}")


@pytest.mark.parametrize("fmt,mul", [
    *(("float8_e4m3fn", m) for m in ("pam", "lmul", "exact", "float", "cpam2-unbiased")),
    # M = 0 with an even bias: the float product's flush tie goes to +0 (lmul and exact
    # on P3109 passed once, 2026-11-27; the ops are exhaustive in tests/test_ops.py)
    *(("p3109_k6p1se", m) for m in ("pam", "float"))])
def test_every_pair_k1(fmt, mul):
    """Exhaustive for an 8-bit and a 6-bit P3109 format: every pair of operands as a
    k = 1 matmul (the product rounded into each accumulator), against the scalar oracle."""
    v = all_values(fmt)
    for acc in ("float32", "bfloat16"):
        got = emu.matmul(v[:, None], v[None, :], fmt, acc, mul=mul)
        if mul == "exact":
            want = [[RM.fma(0.0, float(a), float(b), acc) for b in v] for a in v]
        else:
            want = [[RM.fma(0.0, RM.mul(float(a), float(b), fmt, mul), 1.0, acc)
                     for b in v] for a in v]
        assert_bits_equal(got, np.array(want, np.float32), what=f"{mul} acc {acc}")


@pytest.mark.parametrize("mul", CONSTANT)
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("case", ["dense", "zeros", "specials", "small"])
def test_constant_multipliers_take_the_fast_kernels(mul, fmt, case, rng):
    """A pattern sum with one constant runs PAM's float32-accumulator kernels (blocked,
    small) with another constant: their bits equal the fold's at shapes crossing every
    block edge, with CLEAN, MASKED, SKIP and GENERAL blocks."""
    from test_matmul_acc import fold, tiled
    if case == "small":
        A, B = _operands(rng, fmt, 9, 13, 11)
    else:
        A, B = tiled(case, rng, fmt)
    assert_bits_equal(emu.matmul(A, B, fmt, mul=mul), fold(A, B, fmt, "float32", mul),
                      what=f"{mul} {fmt} {case}")


@pytest.mark.parametrize("mul", ["pam", "float"])
def test_finite_general_blocks_take_the_flush_micro_kernels(mul, rng):
    """GENERAL blocks of finite fp8 operands (products that flush, or may overflow) run
    the vectorised FLUSH micro-kernels, not the scalar step; blocks with inf/NaN stay
    GENERAL.  Their bits are the fold's (test_constant_multipliers_take_the_fast_kernels,
    test_other_multipliers_take_the_vector_kernel)."""
    from emu import _kernels as K
    from emu import _scalar_mul as SM
    from test_matmul_acc import tiled

    def modes(case, fmt):
        A, B = tiled(case, rng, fmt)
        f = emu.format(fmt)
        a3 = emu.to_bits(emu.quantize(A, f), "float32").view(np.int32)[None]
        b3 = emu.to_bits(emu.quantize(B, f), "float32").view(np.int32)[None]
        a3 = np.concatenate([a3, np.zeros((1, -a3.shape[1] % K.QR, a3.shape[2]), np.int32)], 1)
        _, sta = K.matmul_prepare_a(a3, f.consts)
        if mul == "pam":
            kernel, mp = K.matmul_f32acc, SM.MulParams(SM.SUM, 0, K.NO_TABLE, 0)
        else:   # as HostBackend._matmul_other calls it: B packed as b itself
            kernel = K.blocked(prod=K.FMUL_ROUND, psh=23 - f.man_bits)
            mp = SM.MulParams(SM.FLOAT, S.ONE32, K.NO_TABLE, 0)
        _, _, stb = K.matmul_prepare_b(b3, f.consts, mp.c32, K.NO_TABLE, 0)
        ng = sta.shape[2]
        return {int(m) for bj in range(stb.shape[1]) for m in kernel.task_modes(
            sta, stb, 0, 0, 0, sta.shape[1], bj, ng, f.consts, mp).ravel()}

    fl = set(range(K._FLUSH, K._FLUSH + 4))
    ov = set(range(K._FLUSH_OVF, K._FLUSH_OVF + 4))
    dense = modes("dense", "float8_e4m3fn")
    assert dense & fl and K.GENERAL not in dense, dense
    specials = modes("specials", "float8_e4m3fn")     # f.max rows: products may overflow
    assert specials & ov and K.GENERAL in specials, specials     # and the NaN's blocks


@pytest.mark.parametrize("mul", ["exact", "float", "cpam2-unbiased", "cpam1:0,1,-1,0"])
@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("case", ["dense", "zeros", "specials", "tiny", "huge"])
def test_other_multipliers_take_the_vector_kernel(mul, fmt, case, rng):
    """The multipliers that are not one constant, with a float32 accumulator: the
    vectorised kernel (emu/_kernels_mul.py) where it applies, else the fold, equal the
    fold's bits; products that overflow float32, underflow it, straddle the smallest
    normal of fmt (the float multiplier's flush and round-up) and every special value."""
    from test_matmul_acc import fold, tiled
    f = emu.format(fmt)
    if case in ("tiny", "huge"):
        A = rng.uniform(1, 2, (37, 41)) * rng.choice([-1, 1], (37, 41))
        B = rng.uniform(1, 2, (41, 520)) * rng.choice([-1, 1], (41, 520))
        e = f.emin // 2 if case == "tiny" else (f.emax + 1) // 2
        A = emu.quantize((A * 2.0 ** (e + rng.integers(-2, 2, A.shape))).astype(np.float32), f)
        B = emu.quantize((B * 2.0 ** (e + rng.integers(-2, 2, B.shape))).astype(np.float32), f)
    else:
        A, B = tiled(case, rng, fmt)
    assert_bits_equal(emu.matmul(A, B, fmt, mul=mul), fold(A, B, fmt, "float32", mul),
                      what=f"{mul} {fmt} {case}")


def test_exact_vector_kernel_needs_exact_products():
    """exact_ok: fp16 and fp8 products are always exact in float32; bf16 ones only while
    they neither overflow float32 nor fall below 2^(2M + 2 - 149)."""
    from emu import _kernels_mul as KMul
    ok = lambda a, b, fmt: KMul.exact_ok(np.float32(a).view(np.int32),  # noqa: E731
                                         np.float32(b).view(np.int32), emu.format(fmt))
    assert ok([65504.0], [65504.0], "float16") and ok([448.0], [2.0 ** -9], "float8_e4m3fn")
    assert ok([1.0, 2.0 ** 60], [2.0 ** 60], "bfloat16")
    assert not ok([2.0 ** 64], [2.0 ** 64], "bfloat16")
    assert not ok([2.0 ** -70], [2.0 ** -70], "bfloat16")
    assert not ok([1.0], [1.0], "float32")


def test_pam_is_pam_matmul(rng):
    """``mul="pam"`` is emu.pam_matmul, batched and broadcast included."""
    A = rng.standard_normal((3, 1, 9, 20)).astype(np.float32)
    B = rng.standard_normal((4, 20, 7)).astype(np.float32)
    for acc in ("float32", "bfloat16"):
        assert_bits_equal(emu.matmul(A, B, "bfloat16", acc, mul="pam"),
                          emu.pam_matmul(A, B, "bfloat16", acc), what=acc)


def test_lmul_matmul_is_the_published_kernel(rng):
    """float32 L-Mul products summed in float32 (numpy, k in order) on operands whose
    products stay normal: Luo & Sun's ``|a|bits + |b|bits - 0x3F780000``."""
    A = (rng.uniform(0.5, 2, (6, 40)) * rng.choice([-1, 1], (6, 40))).astype(np.float32)
    B = (rng.uniform(0.5, 2, (40, 5)) * rng.choice([-1, 1], (40, 5))).astype(np.float32)
    ua = A.view(np.uint32).astype(np.int64)[:, :, None]
    ub = B.view(np.uint32).astype(np.int64)[None, :, :]
    p = (((ua & 0x7FFFFFFF) + (ub & 0x7FFFFFFF) - 0x3F780000) | ((ua ^ ub) & 0x80000000))
    p = p.astype(np.uint32).view(np.float32)
    want = np.zeros((6, 5), np.float32)
    for k in range(40):
        want += p[:, k, :]
    assert_bits_equal(emu.matmul(A, B, "float32", mul="lmul"), want)


def test_exact_is_one_rounding_per_step():
    """``exact`` rounds s + a·b once; ``float`` rounds the product into fmt first.  In
    bf16 (8 bits) 1 + 2^-7 is odd, and (1 + 2^-23)(1 - 2^-23) 2^-8 lies just below half
    its ULP: fused, the sum stays below the midpoint (1 + 2^-7); the float product is
    2^-8, a tie, which goes to the even 1 + 2^-6."""
    a = np.float32([[1.0, 1 + 2.0 ** -23]])
    b = np.float32([[1 + 2.0 ** -7], [2.0 ** -8 * (1 - 2.0 ** -23)]])
    assert emu.matmul(a, b, "float32", "bfloat16", mul="exact")[0, 0] == 1 + 2.0 ** -7
    assert emu.matmul(a, b, "float32", "bfloat16", mul="float")[0, 0] == 1 + 2.0 ** -6


def test_fma_scalar_against_the_oracle(rng):
    """S.fp_fma on every combination of corner values and random float32 values, into
    float32, bf16, fp16 and e4m3fn (the zeros' signs, inf - inf, overflow, subnormal
    results, cancellation)."""
    corners = [float(x) for x in corner_values("float32")]
    rand = (rng.standard_normal(12) * np.exp2(rng.integers(-140, 120, 12))).astype(np.float32)
    vals = corners + [float(x) for x in rand]
    for accname in ("float32", "bfloat16", "float16", "float8_e4m3fn"):
        acc = emu.format(accname)
        svals = sorted({float(emu.quantize(np.float32(v), acc)) for v in vals[::2]})
        for s, a, b in itertools.product(svals, vals[::3], vals[1::3]):
            got = np.uint32(S.fp_fma(int(np.float32(s).view(np.uint32)),
                                     int(np.float32(a).view(np.uint32)),
                                     int(np.float32(b).view(np.uint32)), acc.consts))
            want = np.float32(RM.fma(s, a, b, acc))
            assert_bits_equal(got.view(np.float32), want, what=f"fma({s}, {a}, {b}) {accname}")


def test_bad_multiplier_is_rejected_before_any_work():
    A = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="mul='bogus'"):
        emu.matmul(A, A, mul="bogus")
    with pytest.raises(ValueError, match="cpam4"):
        emu.matmul(A, A, "float8_e4m3fn", mul="cpam4-unbiased")


@pytest.mark.parametrize("mx,mul,acc", [("mxfp8_e4m3", "lmul", "float32"),
                                        ("mxfp4_e2m1", "cpam1:0,1,1,-1", "float32"),
                                        ("mxfp8_e5m2", "pam-2", "bfloat16"),
                                        ("mxfp6_e2m3", "exact", "float16")])
def test_mx_matmul_with_a_multiplier_matches_oracle(mx, mul, acc, rng):
    """MX operands, each product the multiplier's by the element format's rule on the
    scaled values (emu.mx_matmul), against the oracle's fold."""
    a = (rng.standard_normal((3, 40)) * 2.0 ** rng.integers(-8, 8, (3, 1))).astype(np.float32)
    b = (rng.standard_normal((40, 4)) * 2.0 ** rng.integers(-8, 8, (1, 4))).astype(np.float32)
    got = emu.mx_matmul(a, b, mx, acc=acc, mul=mul)
    assert_bits_equal(got, RM.mx_matmul(a.tolist(), b.tolist(), mx, acc=acc, mul=mul),
                      what=f"{mx} {mul} {acc}")
    assert not np.array_equal(got, emu.mx_pam_matmul(a, b, mx, acc=acc))


@pytest.mark.parametrize("mx,mul", [("mxfp8_e4m3", "float"), ("mxint8", "lmul")])
def test_mx_matmul_refuses_what_it_cannot_define(mx, mul):
    with pytest.raises(ValueError, match=f"mul='{mul}' with {mx}"):
        emu.mx_matmul(np.ones((2, 32), np.float32), np.ones((32, 2), np.float32), mx, mul=mul)

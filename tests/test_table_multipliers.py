"""Table multipliers (issue 24, emu/multipliers.py ``table_multiplier``, docs/semantics.md
"Multipliers"): any function of two operands of a format of at most 8 bits, given as
the table of its products.  Kernel == oracle (encodings decoded by ml_dtypes) on every
pair, every source (encodings, values, function, .npy file) gives one table, the exact
derivative is the secant to the neighbouring encoding, matmuls and their derivatives
fold the table's products, torch_bridge takes ``mul="table:..."``, bad input is
refused naming the argument."""
import math

import numpy as np
import pytest
import torch

import emu
import emu.grad
import emu.multipliers as EM
import emu.reference as R
import emu.reference_mul as RM
import torch_bridge as tb
from conftest import all_values, assert_bits_equal, spy


def truncated(a, b):
    """The exact product with its significand truncated to 4 bits: an approximate
    multiplier that a user might bring."""
    p = a * b
    if not math.isfinite(p) or p == 0:
        return p
    m, e = math.frexp(p)
    return math.ldexp(math.floor(m * 16) / 16, e)


@pytest.fixture(scope="module")
def trunc():
    return emu.table_multiplier(truncated, "float8_e4m3fn", "bfloat16", name="trunc_e4m3")


def finite_pairs(fmt):
    v = all_values(fmt)
    v = v[np.isfinite(v)]
    return tuple(x.ravel() for x in np.meshgrid(v, v, indexing="ij"))


def test_every_pair_is_the_table_entry(trunc):
    a, b = finite_pairs("float8_e4m3fn")
    want = np.array([RM.mul(float(x), float(y), "float8_e4m3fn", trunc)
                     for x, y in zip(a, b)], np.float32)
    assert_bits_equal(emu.mul(a, b, "float8_e4m3fn", trunc), want, a, b)
    # the function's own values, rounded into bf16
    assert_bits_equal(want, emu.quantize(np.array([truncated(float(x), float(y))
                                                   for x, y in zip(a, b)]), "bfloat16"))
    assert np.isnan(emu.mul(np.float32(np.nan), np.float32(1), "float8_e4m3fn", trunc))


def test_every_source_gives_one_table(trunc, tmp_path):
    fmt = emu.format("float8_e4m3fn")
    vals = EM._table("trunc_e4m3").values
    codes = emu.to_bits(vals, "bfloat16").astype(np.uint16)
    path = tmp_path / "trunc.npy"
    np.save(path, vals)
    made = [emu.table_multiplier(codes, fmt, "bfloat16", name="t_codes"),
            emu.table_multiplier(vals.astype(np.float64), fmt, "bfloat16", name="t_values"),
            emu.table_multiplier(str(path), fmt, "bfloat16", name="t_file"),
            emu.multiplier(f"table:{path}")]
    a, b = finite_pairs(fmt)
    want = emu.mul(a, b, fmt, trunc)
    for m in made:
        assert_bits_equal(emu.mul(a, b, fmt, m), want, what=str(m))
    assert len({EM._table(m.table).sha256 for m in made}) == 1
    assert str(made[3]) == f"table:{path}" and emu.multiplier(str(made[3])) == made[3]
    # the default name is the table's hash
    assert str(emu.table_multiplier(vals, fmt, "bfloat16")) == \
        "table:" + EM._table("trunc_e4m3").sha256[:12]


def test_exact_derivative_is_the_secant_on_every_fp4_pair():
    t = emu.table_multiplier(lambda x, y: round(x * y * 3) / 3, "float4_e2m1fn", "float16",
                             name="thirds_fp4")
    a, b = finite_pairs("float4_e2m1fn")
    d = np.float32(np.resize([1.0, -0.5, 3.0, 0.0, 6.0], a.size))
    got = emu.grad.mul(a, b, d, "float4_e2m1fn", "exact", t)
    want = [RM.grad(float(x), float(y), float(g), "float4_e2m1fn", t)
            for x, y, g in zip(a, b, d)]
    for g, w, which in zip(got, zip(*want), "AB"):
        assert_bits_equal(g, np.array(w, np.float32), a, b, d, what=f"δ{which}")


def test_exact_derivative_random_e4m3(trunc, rng):
    a, b = finite_pairs("float8_e4m3fn")
    pick = rng.choice(a.size, 1500, replace=False)
    a, b = a[pick], b[pick]
    d = emu.quantize(rng.standard_normal(a.size), "float8_e4m3fn").astype(np.float32)
    got = emu.grad.mul(a, b, d, "float8_e4m3fn", "exact", trunc)
    want = [RM.grad(float(x), float(y), float(g), "float8_e4m3fn", trunc)
            for x, y, g in zip(a, b, d)]
    for g, w, which in zip(got, zip(*want), "AB"):
        assert_bits_equal(g, np.array(w, np.float32), a, b, d, what=f"δ{which}")
    # the approximate derivative is the exact product's
    da, db = emu.grad.mul(a, b, d, "float8_e4m3fn", "approx", trunc)
    assert_bits_equal(da, emu.mul(d, b, "float8_e4m3fn", "exact"))


@pytest.mark.parametrize("acc", ["float32", "bfloat16"])
def test_matmul_and_its_derivatives_fold_the_table(trunc, acc, rng):
    fmt = "float8_e4m3fn"
    A, B, G = (emu.quantize(rng.standard_normal(s) * 3, fmt).astype(np.float32)
               for s in ((4, 9), (9, 5), (4, 5)))
    got = emu.matmul(A, B, fmt, acc, mul=trunc)
    assert_bits_equal(got, RM.matmul(A.tolist(), B.tolist(), fmt, acc, trunc))
    dA, dB = emu.grad.matmul(A, B, G, fmt, acc, "exact", mul=trunc)
    fa = emu.format(acc)
    eA = [[0.0] * 9 for _ in range(4)]
    eB = [[0.0] * 5 for _ in range(9)]
    for i in range(4):
        for k in range(9):
            s = 0.0
            for j in range(5):
                s = R._add_exact(s, RM.grad(A[i, k], B[k, j], G[i, j], fmt, trunc)[0], fa)
            eA[i][k] = s
    for k in range(9):
        for j in range(5):
            s = 0.0
            for i in range(4):
                s = R._add_exact(s, RM.grad(A[i, k], B[k, j], G[i, j], fmt, trunc)[1], fa)
            eB[k][j] = s
    assert_bits_equal(dA, np.array(eA, np.float32), what="exact δA")
    assert_bits_equal(dB, np.array(eB, np.float32), what="exact δB")
    aA, _ = emu.grad.matmul(A, B, G, fmt, acc, "approx", mul=trunc)
    assert_bits_equal(aA, emu.matmul(G, B.T, fmt, acc, mul="exact"), what="approx δA")


def test_torch_bridge_trains_with_a_table(trunc, rng):
    """pam_matmul and a training step under pam_mode with the table's name."""
    a = torch.tensor(rng.standard_normal((6, 10)), dtype=torch.float32)
    b = torch.tensor(rng.standard_normal((10, 4)), dtype=torch.float32)
    c = tb.functional.pam_matmul(a, b, "e4m3fn", mul="table:trunc_e4m3")
    assert_bits_equal(c.numpy(), emu.matmul(a.numpy(), b.numpy(), "e4m3fn", mul=trunc))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    cfg = tb.PAMConfig("e4m3fn", ops=("matmul",), mul="table:trunc_e4m3", backward="exact")
    with tb.pam_mode(cfg):
        loss = torch.nn.functional.cross_entropy(net(a), torch.arange(6) % 3)
        loss.backward()
    assert torch.isfinite(loss) and net[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("call,match", [
    (lambda: emu.table_multiplier(np.zeros((16, 16)), "bfloat16"), "at most 8 bits"),
    (lambda: emu.table_multiplier(np.zeros((16, 8)), "float4_e2m1fn"), "shape \\(16, 8\\)"),
    (lambda: emu.table_multiplier(np.zeros((16, 16)), "float4_e2m1fn", "e4m3fn"),
     "out_fmt='float8_e4m3fn'"),
    (lambda: emu.table_multiplier(np.full((16, 16), 70000), "float4_e2m1fn", "float16"),
     "encodings must lie in"),
    (lambda: emu.table_multiplier(np.zeros((16, 16)), "float4_e2m1fn", name="a b"),
     "name='a b'"),
    (lambda: emu.multiplier("table:no_such_table"), "no table multiplier of that name"),
    (lambda: emu.mul(np.ones(2), np.ones(2), "float8_e5m2", "table:trunc_e4m3"),
     "not of fmt=float8_e5m2"),
    (lambda: emu.mul(np.ones(2), np.ones(2), "float4_e2m1fn", "table:trunc_e4m3"),
     "needs 16x16"),
])
def test_bad_input_names_the_argument(trunc, call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("kernel", ["rows", "panels"])
def test_float32_accumulator_kernel_is_the_fold(kernel, trunc, rng, monkeypatch):
    """Both lookup kernels (float32 accumulator; per row, or by 32-column panels of the
    products of A's encodings) against the fold of SM.mac, batched and broadcast, with
    NaN, inf and zero operands, K and N past a block's edge."""
    from emu import _kernels as K
    from emu import _kernels_mul as KMul
    from emu import _scalar_mul as SM
    monkeypatch.setattr(KMul, "TABLE_PANEL_ROWS", 10 ** 9 if kernel == "rows" else 1)
    calls = spy(monkeypatch, KMul, "_table_f32acc" if kernel == "rows" else "_table_panels_f32acc")
    fmt = emu.format("float8_e4m3fn")
    A = emu.quantize(rng.standard_normal((3, 7, 43)) * 8, fmt).astype(np.float32)
    B = emu.quantize(rng.standard_normal((43, 45)) * 8, fmt).astype(np.float32)
    A[0, 1, 2], A[1, 2, 3], B[4, 5], B[40, 44] = np.nan, 0.0, -448.0, 448.0
    got = emu.matmul(A, B, fmt, mul=trunc)
    assert calls
    a3 = emu.quantize(A, fmt).view(np.int32).reshape(3, 7, 43)
    b3 = emu.quantize(B, fmt).view(np.int32).reshape(1, 43, 45)
    want = np.empty((3, 7, 45), np.int32)
    K.matmul_fmtacc(a3, b3, np.arange(3), np.zeros(3, np.int64), want, fmt.consts,
                    emu.float32.consts, trunc.params(fmt))
    assert_bits_equal(got, want.view(np.float32))
    assert np.isnan(got[0, 1]).all() and not np.isnan(got[1]).any()
    assert SM.TABLE == trunc.params(fmt).kind
    # entries that overflow fp16: sums inf - inf, the hardware's NaN made canonical
    huge = emu.table_multiplier(lambda x, y: x * y * 1024.0, fmt, "float16")
    got = emu.matmul(A, B, fmt, mul=huge)
    K.matmul_fmtacc(a3, b3, np.arange(3), np.zeros(3, np.int64), want, fmt.consts,
                    emu.float32.consts, huge.params(fmt))
    assert np.isnan(got[1]).any() and np.isinf(got).any()
    assert_bits_equal(got, want.view(np.float32), what="inf entries")
    assert (got.view(np.uint32)[np.isnan(got)] == emu.to_bits(np.float32(np.nan), "float32")).all()


def test_cost_of_a_table_is_one_read_of_its_memory(trunc):
    """costs.analytic prices a table multiplier as one 16-bit read of a 128 KB SRAM
    (Horowitz's 1 MB level: 100 pJ per 64 bits) and its bit cells' area."""
    from costs import analytic as CA
    got = CA.mul_cost(trunc, "float8_e4m3fn")
    assert got.energy_pj == pytest.approx(100 / 8 * 2)
    assert got.area_um2 == pytest.approx((1 << 16) * 16 * CA.SRAM_BIT_UM2)
    assert got.energy_pj > CA.fp_mul("float8_e4m3fn").energy_pj     # a 64 Ki-entry table
    assert EM.table_of("table:trunc_e4m3").out == emu.format("bfloat16")


def test_a_table_registered_first_leaves_the_shipped_cpam_tables():
    """In a fresh process, registering a table multiplier before any corrected PAM is
    looked up keeps the shipped cpam tables (they once shared one dict)."""
    import subprocess
    import sys
    code = ("import emu; emu.table_multiplier(lambda x, y: x * y, 'e4m3fn', name='t'); "
            "print(emu.multiplier('cpam2-unbiased').params('bf16').table.size)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.split() == ["16"], run.stderr

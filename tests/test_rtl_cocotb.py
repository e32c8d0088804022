"""The rtl units simulated from their emitted Verilog (Verilator by default, Icarus
with ``SIM=icarus`` and in the tests marked so below), driven by the cocotb benches
of sim/tb through cocotb_tools.runner, one build directory per parameter set
(sim.rtl_sim), and compared with emu bit for bit (NaNs by class).

Each test asserts the counts its bench reports, so the coverage the issue asks for
cannot silently shrink: every fp8 operand set, every operand set of the other encoding
policies (docs/semantics.md §9: fp4, both fp6, the fnuz fp8 formats and a fnuz format
with another bias), >= 100,000 vectors per wide format,
>= 200,000 for the float32 adder, 1,000 dot products per MAC flow.  The
combinational units are those of the registry (rtl.UNITS), each with its arity.
"""
import numpy as np
import pytest

import emu
import rtl
import sim
from rtl import registry
from rtl import vectors as V
from sim import rtl_sim
from sim.cli import main
from conftest import assert_bits_equal

FP8 = ["float8_e4m3fn", "float8_e5m2"]
#: the encoding policies beyond ieee/fn (saturating MX element types, fnuz), exhaustive
#: under Icarus: a build takes seconds where Verilator's takes minutes, and every
#: operand set of these formats simulates in seconds either way
POLICIES = ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fnuz"]
POLICIES_SLOW = ["float8_e5m2fnuz", "float8_e4m3b11fnuz", "e3m2b5fnuz"]
WIDE = ["bfloat16", "float16", "float32"]
COMB = list(registry.comb_units())
#: vectors per unit for the wide formats (corners + boundaries + random); the float32
#: adder needs >= 200,000 against numpy, and the other float32 units share its run
WIDE_VECTORS = {"bfloat16": 100_000, "float16": 100_000, "float32": 250_000}


def _comb(fmt, vectors, sim=None):
    """Run every unit's bench in one simulator process; {unit: {kind: vectors}}."""
    reports = rtl_sim.verify_unit(COMB, fmt, vectors, sim=sim)   # raises on any mismatch
    assert all(r["mismatches"] == 0 for r in reports)
    counts = {}
    for r in reports:
        counts.setdefault(r["unit"], {})[r["kind"]] = r["vectors"]
    return counts


def _every_set(fmt) -> dict:
    """{unit: {"exhaustive": every operand set of its arity}}."""
    return {u: {"exhaustive": 2 ** (emu.format(fmt).width * rtl.UNITS[u].arity)} for u in COMB}


@pytest.mark.parametrize("fmt", FP8)
def test_comb_fp8_exhaustive(fmt):
    assert _comb(fmt, 0) == _every_set(fmt)


@pytest.mark.parametrize("fmt", POLICIES + [pytest.param(f, marks=pytest.mark.slow)
                                             for f in POLICIES_SLOW])
def test_comb_policies_exhaustive(fmt):
    """No inf, one NaN or none, no −0, saturation, other biases: every operand set."""
    assert _comb(fmt, 0, sim="icarus") == _every_set(fmt)


@pytest.mark.parametrize("fmt", WIDE)
def test_comb_wide_random_and_corners(fmt):
    n = WIDE_VECTORS[fmt]
    counts = _comb(fmt, n)
    assert set(counts) == set(COMB)
    specials = V.special_encodings(fmt).size
    for unit, c in counts.items():
        assert c["corners"] == specials ** rtl.UNITS[unit].arity, unit
        assert c["boundaries"] > 0.45 * n and c["random"] > 0.45 * n, unit
        assert sum(c.values()) == n, unit


# --- PAMMac and PAMDotArray -------------------------------------------------------------

MAC_CASES = [
    ("bfloat16", "float32", 2, 1000),
    ("float32", "float32", 3, 1000),
    ("bfloat16", "float32", 1, 200),
    ("bfloat16", "bfloat16", 2, 200),            # narrow accumulators: emu's rounding per add
    ("float8_e4m3fn", "float16", 2, 200),
]
ARRAY_CASES = [
    (4, 4, "bfloat16", "float32", 2),
    (2, 3, "float32", "bfloat16", 3),
]
#: the MAC and the array with L-Mul (emu.matmul(..., mul="lmul")): bf16 into float32
#: (an fp8 into a narrow accumulator: the MAC under Icarus in test_cli_verify_lmul; the
#: 2x2 e4m3fn/bf16 array passed once, 2026-11-27, and left CI for its harness build)
LMUL_MAC_CASES = [("bfloat16", "float32", 2, 200)]
LMUL_ARRAY_CASES = [(4, 4, "bfloat16", "float32", 2)]     # the harness pamsim verify uses


@pytest.mark.parametrize("fmt,acc,stages,dots", MAC_CASES)
def test_mac_dot_products(fmt, acc, stages, dots):
    h = rtl_sim.Harness.mac(fmt, acc, stages)
    reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_mac", {"dots": dots})
    assert {r["kind"] for r in reports} == {"back_to_back", "random_gaps"}
    for r in reports:
        assert r["dots"] == dots and r["mismatches"] == 0 and r["dot_mismatches"] == 0
        assert r["vectors"] > dots * 100                  # lengths uniform in 1..256


@pytest.mark.parametrize("rows,cols,fmt,acc,stages", ARRAY_CASES)
def test_dot_array_tiles(rows, cols, fmt, acc, stages):
    h = rtl_sim.Harness.array(rows, cols, fmt, acc, stages)
    reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_dot_array", {"tiles": 150})
    assert {r["kind"] for r in reports} == {"back_to_back", "random_gaps"}
    assert all(r["tiles"] == 150 and r["mismatches"] == 0 for r in reports)


@pytest.mark.parametrize("fmt,acc,stages,dots", LMUL_MAC_CASES)
def test_lmul_mac_dot_products(fmt, acc, stages, dots):
    """The L-Mul MAC against emu.matmul(..., mul="lmul"): every prefix of every dot
    product, special values among the operands."""
    h = rtl_sim.Harness.mac(fmt, acc, stages, mul="lmul")
    assert h.module_names() == {"unit": f"lmul_mac_{fmt}_{acc}_s{stages}"}
    reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_mac", {"dots": dots})
    assert {r["kind"] for r in reports} == {"back_to_back", "random_gaps"}
    for r in reports:
        assert r["mul"] == "lmul" and r["dots"] == dots
        assert r["mismatches"] == 0 and r["dot_mismatches"] == 0
        assert r["vectors"] > dots * 100
        # operands of every special class: ±0, subnormals, inf/NaN, ±max
        assert set(r["specials"]) == {"zero", "subnormal", "inf_nan", "max"}
        assert all(n > 0 for n in r["specials"].values()), r["specials"]


@pytest.mark.parametrize("rows,cols,fmt,acc,stages", LMUL_ARRAY_CASES)
def test_lmul_dot_array_tiles(rows, cols, fmt, acc, stages):
    h = rtl_sim.Harness.array(rows, cols, fmt, acc, stages, mul="lmul")
    reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_dot_array", {"tiles": 150})
    assert {r["kind"] for r in reports} == {"back_to_back", "random_gaps"}
    assert all(r["mul"] == "lmul" and r["tiles"] == 150 and r["mismatches"] == 0
               for r in reports)
    assert all(n > 0 for r in reports for n in r["specials"].values()), reports


# --- rtl_matmul and pamsim verify -------------------------------------------------------

@pytest.mark.parametrize("unit", ["mac", "array"])
def test_rtl_matmul_shapes(unit, rng):
    kw = {"unit": unit, "rows": 4, "cols": 4}
    A = V.random_values(rng, "bf16", (2, 5, 33), 0.02)
    B = V.random_values(rng, "bf16", (33, 6), 0.02)
    assert sim.rtl_matmul is rtl_sim.rtl_matmul
    assert_bits_equal(sim.rtl_matmul(A, B, "bf16", "float32", **kw),
                      emu.pam_matmul(A, B, "bf16", "float32"), what="batched, B broadcast")
    v = V.random_values(rng, "bf16", 33)
    assert_bits_equal(rtl_sim.rtl_matmul(v, B, "bf16", **kw),
                      emu.pam_matmul(v, B, "bf16"), what="1-D A")
    assert_bits_equal(rtl_sim.rtl_matmul(A[0], v, "bf16", **kw),
                      emu.pam_matmul(A[0], v, "bf16"), what="1-D B")
    c = rtl_sim.rtl_matmul(np.ones((3, 0)), np.ones((0, 2)), "bf16", **kw)
    assert c.shape == (3, 2) and c.dtype == np.float32 and not c.view(np.uint32).any()


def test_rtl_matmul_rounds_inputs_like_emu(rng):
    """Unquantised float32 inputs are rounded into fmt first, exactly as emu does."""
    A = rng.standard_normal((3, 17)).astype(np.float32)
    B = rng.standard_normal((17, 2)).astype(np.float32)
    assert_bits_equal(rtl_sim.rtl_matmul(A, B, "bf16", "bf16"),
                      emu.pam_matmul(A, B, "bf16", "bf16"), what="bf16 acc")


@pytest.mark.parametrize("call,err,msg", [
    (lambda: rtl_sim.rtl_matmul(np.ones((2, 3)), np.ones((4, 2))), ValueError, "K=3"),
    (lambda: rtl_sim.rtl_matmul(np.ones((2, 2, 3)), np.ones((3, 3, 2))), ValueError, "broadcast"),
    (lambda: rtl_sim.rtl_matmul(np.ones(3), np.ones(3), "bf17"), ValueError, "fmt='bf17'"),
    (lambda: rtl_sim.rtl_matmul(np.ones(3), np.ones(3), acc="x"), ValueError, "acc='x'"),
    (lambda: rtl_sim.rtl_matmul(np.ones(3), np.ones(3), unit="mul"), ValueError, "unit='mul'"),
    (lambda: rtl_sim.rtl_matmul(np.ones(3), np.ones(3), sim="vcs"), ValueError, "sim='vcs'"),
    (lambda: rtl_sim.rtl_matmul(np.ones(3), np.ones(3), stages=4), ValueError, "stages=4"),
    (lambda: rtl_sim.rtl_matmul(np.float32(1), np.ones(3)), ValueError, "at least one dimension"),
    (lambda: rtl_sim.rtl_matmul(np.array(["a"]), np.ones(1)), TypeError, "dtype"),
])
def test_rtl_matmul_bad_input(call, err, msg):
    with pytest.raises(err, match=msg):
        call()


def test_prebuild_covers_the_suite():
    """`pamsim verify --prebuild` (the set-up step) builds every harness used here."""
    used = {(rtl_sim.Harness.comb(f).key, "verilator") for f in FP8 + WIDE}
    used |= {(rtl_sim.Harness.mac(f, a, s).key, "verilator") for f, a, s, _ in MAC_CASES}
    used |= {(rtl_sim.Harness.array(*c).key, "verilator") for c in ARRAY_CASES}
    used |= {(rtl_sim.Harness.mac(f, a, s, mul="lmul").key, "verilator")
             for f, a, s, _ in LMUL_MAC_CASES}
    used |= {(rtl_sim.Harness.array(*c, mul="lmul").key, "verilator") for c in LMUL_ARRAY_CASES}
    used |= {(rtl_sim.Harness.array(4, 4, "bfloat16", "float32", mul="lmul").key, "verilator"),
             (rtl_sim.Harness.mac("float8_e4m3fn", "bfloat16", mul="lmul").key, "icarus")}
    used |= {(rtl_sim.Harness.comb(f).key, "icarus") for f in POLICIES}
    used |= {(rtl_sim.Harness.comb("float8_e4m3fn", mul=m).key, "icarus") for m in NEW_MULS}
    used |= {(rtl_sim.Harness.mac("float8_e4m3fn", "bfloat16", 1, mul="exact").key, "icarus")}
    used |= {(rtl_sim.Harness.comb("float8_e5m2").key, "icarus"),
             (rtl_sim.Harness.mac("bfloat16", "float32").key, "icarus"),
             (rtl_sim.Harness.array(4, 4, "bfloat16", "float32").key, "icarus"),
             (rtl_sim.Harness.mac("float4_e2m1fn", "float8_e4m3fnuz").key, "icarus")}
    assert used == {(h.key, sim) for h, sim in rtl_sim.ci_harnesses()}


def test_simulator_selection(monkeypatch):
    monkeypatch.setenv("SIM", "icarus")
    assert rtl_sim.default_simulator() == "icarus"
    monkeypatch.delenv("SIM")
    assert rtl_sim.default_simulator() == "verilator"
    monkeypatch.setenv("SIM", "modelsim")
    with pytest.raises(ValueError, match="sim='modelsim'"):
        rtl_sim.default_simulator()


def test_cli_verify(capsys):
    assert main(["verify", "--unit", "mul", "--fmt", "bf16", "--vectors", "50000"]) == 0
    out = capsys.readouterr().out
    assert "total: 50,000 vectors, 0 mismatches" in out
    assert "/s through the simulator" in out
    assert main(["verify", "--unit", "mac", "--fmt", "bf16", "--vectors", "5000"]) == 0
    out = capsys.readouterr().out
    assert "multiply-accumulates, 0 of" in out and "/s end to end" in out
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--unit", "mac", "--vectors", "0"])
    assert exc.value.code == 2 and "argument --vectors: got '0'" in capsys.readouterr().err
    assert main(["verify", "--fmt", "bf16"]) == 2
    assert "--unit is required" in capsys.readouterr().err
    assert main(["verify", "--prebuild", "--sim", "icarus"]) == 0      # warm: checks stamps
    assert f"{6 + len(POLICIES) + len(NEW_MULS)} harnesses ready" in capsys.readouterr().out


# One case in CI (`make test` runs slow tests too; each builds its harness, ~8 s).  These
# passed once on 2026-11-27 (54 s): mac lmul e4m3fn/bf16 s2 verilator, mac float bf16/f32
# s2 verilator, mac float e5m2/f16 s1 icarus, mac lmul f16/f16 s3 verilator, array lmul
# bf16/bf16 s3 verilator, array float e4m3fn/f32 s1 verilator.
@pytest.mark.slow
@pytest.mark.parametrize("unit,mul,fmt,acc,stages,sim", [
    ("mac", "lmul", "float4_e2m1fn", "float8_e4m3fnuz", 2, "icarus")])
def test_mac_multipliers_more_formats(unit, mul, fmt, acc, stages, sim):
    """The float MAC (emu's ``float`` multiplier, the flushing FloatMultiplier) and more
    L-Mul formats, stage counts and both simulators; builds on demand (not prebuilt)."""
    if unit == "mac":
        h = rtl_sim.Harness.mac(fmt, acc, stages, mul=mul)
        reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_mac", {"dots": 300}, sim=sim)
        assert all(r["dots"] == 300 and r["dot_mismatches"] == 0 for r in reports)
    else:
        h = rtl_sim.Harness.array(3, 2, fmt, acc, stages, mul=mul)
        reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_dot_array", {"tiles": 200}, sim=sim)
    assert len(reports) == 2
    assert all(r["mul"] == mul and r["mismatches"] == 0 for r in reports)
    nonfinite = emu.format(fmt).nan != "none"           # float4_e2m1fn has neither
    assert all(n > 0 for r in reports for k, n in r["specials"].items()
               if nonfinite or k != "inf_nan"), reports


def test_cli_verify_lmul(capsys):
    """--mul: the MAC (e4m3fn into bf16, Icarus) and the 4x4 array (bf16 into float32,
    Verilator) with L-Mul against emu.matmul(..., mul="lmul"), specials among the
    operands; refused, one line and exit 2, where it does not apply."""
    assert main(["verify", "--unit", "mac", "--mul", "lmul", "--fmt", "e4m3fn", "--acc", "bf16",
                 "--vectors", "3000", "--sim", "icarus"]) == 0
    out = capsys.readouterr().out
    assert "--mul lmul (icarus, mac-lmul-float8_e4m3fn-bfloat16-s2-n256)" in out
    assert "0 of" in out and "differ from emu.matmul(mul='lmul')" in out
    assert main(["verify", "--unit", "array", "--mul", "lmul", "--fmt", "bf16",
                 "--vectors", "5000"]) == 0
    out = capsys.readouterr().out
    assert "(verilator, array-lmul-4x4-bfloat16-float32-s2-n256)" in out and "0 of" in out
    for argv, msg in ((["--unit", "lmul", "--mul", "lmul"], "unit='lmul' takes no mul option"),
                      (["--unit", "add", "--mul", "pam+3"], "unit='add' takes no mul option"),
                      (["--unit", "array", "--mul", "table:nosuch"],
                       "multiplier='table:nosuch'; expected"),
                      (["--unit", "mac", "--mul", "bogus"], "multiplier='bogus'; expected")):
        assert main(["verify", "--fmt", "bf16", "--vectors", "100", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("pamsim verify: error: ") and msg in err and "\n" not in err


#: the other registry multipliers (issue 24), exhaustive e4m3fn under Icarus in CI (an
#: offset: lmul, and lmul-3 in tests/test_rtl_units.py); every kind on both simulators,
#: e4m3fn/e5m2/bf16/fp16, ran once (docs/rtl.md)
NEW_MULS = ["cpam2-unbiased", "exact"]


@pytest.mark.parametrize("mul", NEW_MULS)
def test_registry_multipliers_e4m3_exhaustive(mul):
    reports = rtl_sim.verify_unit("mul", "float8_e4m3fn", 0, sim="icarus", mul=mul)
    assert [(r["mul"], r["kind"], r["vectors"], r["mismatches"]) for r in reports] == \
        [(mul, "exhaustive", 65536, 0)]


def test_fused_exact_mac():
    """mul="exact" in the MAC is fused: the exact product (subnormal operands too) and the
    accumulator rounded once into bf16 (emu.matmul's fp_fma step), every prefix checked."""
    h = rtl_sim.Harness.mac("float8_e4m3fn", "bfloat16", 1, mul="exact")
    assert h.module_names() == {"unit": "exact_mac_float8_e4m3fn_bfloat16_s1"}
    reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_mac", {"dots": 120, "max_len": 64},
                                 sim="icarus")
    assert len(reports) == 2
    assert all(r["mul"] == "exact" and r["mismatches"] == 0 and r["dot_mismatches"] == 0
               for r in reports)
    assert all(r["specials"]["subnormal"] > 0 for r in reports)


def test_table_multiplier_rtl(tmp_path, monkeypatch, rng):
    """A table multiplier's ROM: every pair of an fp4 table with fp16 results (some of
    them subnormal), as a combinational unit and in the MAC (stages 2: the synchronous
    ROM; float32 accumulator: the entries stored widened, every one a normal number)."""
    monkeypatch.setenv("PAMSIM_MULTIPLIERS", str(tmp_path))
    v = emu.from_bits(np.arange(16, dtype=np.uint32), "float4_e2m1fn").astype(np.float64)
    table = np.multiply.outer(v, v) * 2.0 ** -15 + rng.normal(0, 2.0 ** -20, (16, 16))
    m = emu.table_multiplier(table, "float4_e2m1fn", "float16", name="fp4_tiny")
    emu.multipliers.save_table(m)
    out = emu.to_bits(emu.multipliers.table_of(m).values, "float16")
    assert ((out & 0x7C00) == 0).sum() > 100                   # mostly fp16 subnormals
    reports = rtl_sim.verify_unit("mul", "float4_e2m1fn", 0, sim="icarus", mul=str(m))
    assert [(r["kind"], r["vectors"], r["mismatches"]) for r in reports] == \
        [("exhaustive", 256, 0)]
    h = rtl_sim.Harness.mac("float4_e2m1fn", "float32", 2, mul=str(m))
    reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_mac", {"dots": 100, "max_len": 32},
                                 sim="icarus")
    assert len(reports) == 2 and all(r["mismatches"] == 0 for r in reports)
    with pytest.raises(ValueError, match="registered in this process only"):
        rtl_sim.Harness.mac("float4_e2m1fn", mul=str(emu.table_multiplier(
            table, "float4_e2m1fn", "float16", name="fp4_unsaved")))


def test_bench_rtl_quick(capsys):
    assert main(["bench", "--quick", "--only", "rtl"]) == 0
    out = capsys.readouterr().out
    assert "0 mismatches" in out and "vectors/s simulated" in out


# --- Icarus: the same benches on the second simulator -----------------------------------

def test_icarus_comb_fp8_exhaustive():
    assert _comb("float8_e5m2", 0, sim="icarus") == _every_set("float8_e5m2")


def test_icarus_mac_and_matmul(rng):
    h = rtl_sim.Harness.mac("bfloat16", "float32")
    reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_mac", {"dots": 100, "max_len": 64},
                                 sim="icarus")
    assert len(reports) == 2 and all(r["mismatches"] == 0 and r["dots"] == 100 for r in reports)
    A = V.random_values(rng, "bf16", (5, 40), 0.02)
    B = V.random_values(rng, "bf16", (40, 3), 0.02)
    assert_bits_equal(rtl_sim.rtl_matmul(A, B, "bf16", unit="array", sim="icarus"),
                      emu.pam_matmul(A, B, "bf16"), what="icarus array")


def test_cli_verify_policy_formats(capsys):
    """Every policy reaches the CLI; the scale type, which has no arithmetic, is a
    one-line error."""
    assert main(["verify", "--unit", "div", "--fmt", "float4_e2m1fn", "--sim", "icarus"]) == 0
    out = capsys.readouterr().out
    assert "total: 256 vectors, 0 mismatches" in out and "every one of the 256" in out
    assert main(["verify", "--unit", "mul", "--fmt", "float8_e8m0fnu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pamsim verify: error: fmt=float8_e8m0fnu is the unsigned scale "
                          "type") and "\n" not in err


def test_icarus_mac_policies():
    """fp4 (saturating, no NaN) operands into a fnuz accumulator (one NaN, no −0)."""
    h = rtl_sim.Harness.mac("float4_e2m1fn", "float8_e4m3fnuz")
    reports = rtl_sim.run_cocotb(h, "sim.tb.test_pam_mac", {"dots": 100, "max_len": 64},
                                 sim="icarus")
    assert len(reports) == 2 and all(r["mismatches"] == 0 and r["dots"] == 100 for r in reports)


def test_icarus_cli_verify(capsys):
    assert main(["verify", "--unit", "mac", "--fmt", "bf16", "--vectors", "3000",
                 "--sim", "icarus"]) == 0
    out = capsys.readouterr().out
    assert "(icarus, mac-bfloat16-float32-s2-n256)" in out and "0 of" in out

"""The 45 nm model: Appendix B of Kosson & Jaggi, table points, scaling laws, bad input."""
import math

import pytest

import emu
from costs import analytic as A

# (what, energy %, area %) exactly as printed in the paper's Appendix B
PAPER = [("float32 PAM vs float32 multiply", "5.4", "3.6"),
         ("float32 PAM vs float16 multiply", "18", "17"),
         ("PAM MAC vs float32-multiply float32-accumulate", "24", "38"),
         ("PAM MAC vs float16-multiply float32-accumulate", "55", "77")]


def _as_printed(fraction: float, printed: str) -> str:
    """The percentage rounded to the digits the paper prints."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return f"{100 * fraction:.{decimals}f}"


def test_appendix_b_reproduced_from_the_table():
    rows = A.appendix_b()
    assert [r.what for r in rows] == [p[0] for p in PAPER]
    for row, (_, pe, pa) in zip(rows, PAPER):
        assert _as_printed(row.energy, pe) == pe, row
        assert _as_printed(row.area, pa) == pa, row
        assert (row.paper_energy_pct, row.paper_area_pct) == (float(pe), float(pa))
    # the paper's own arithmetic: 2*0.1/3.7, 2*137/7700, (2*0.1+0.9)/(1.1+0.9), ...
    assert rows[0].energy == pytest.approx(0.2 / 3.7, rel=1e-12)
    assert rows[0].area == pytest.approx(274 / 7700, rel=1e-12)
    assert rows[1].area == pytest.approx(274 / 1640, rel=1e-12)
    assert rows[2].energy == pytest.approx(1.1 / 4.6, rel=1e-12)
    assert rows[3].area == pytest.approx((274 + 4184) / (1640 + 4184), rel=1e-12)


TABLE = {("add", "int8"): (0.03, 36), ("add", "int16"): (0.05, 67), ("add", "int32"): (0.1, 137),
         ("add", "float16"): (0.4, 1360), ("add", "float32"): (0.9, 4184),
         ("mul", "int8"): (0.2, 282), ("mul", "int32"): (3.1, 3495),
         ("mul", "float16"): (1.1, 1640), ("mul", "float32"): (3.7, 7700)}


def test_data_file_is_table_4_with_sources():
    rows = A.table_rows()
    got = {(r["op"], r["dtype"]): (float(r["energy_pj"]), float(r["area_um2"])) for r in rows}
    assert got == TABLE
    assert all("Horowitz" in r["source"] for r in rows)


@pytest.mark.parametrize("key", sorted(TABLE))
def test_model_matches_every_table_point(key):
    op, dtype = key
    if dtype.startswith("int"):
        c = (A.int_add if op == "add" else A.int_mul)(int(dtype[3:]))
    else:
        c = (A.fp_add if op == "add" else A.fp_mul)(dtype)
    e, a = TABLE[key]
    assert c.energy_pj == pytest.approx(e, rel=1e-12)
    assert c.area_um2 == pytest.approx(a, rel=1e-12)


def test_integer_laws_monotonic_and_near_linear_or_quadratic():
    for law in (A.int_add, A.int_mul):
        costs = [law(n) for n in range(1, 65)]
        for lo, hi in zip(costs, costs[1:]):
            assert hi.energy_pj > lo.energy_pj and hi.area_um2 > lo.area_um2
    laws = {r["family"]: r for r in A.scaling_laws()}
    # adders ~ linear in bits, the multiplier's energy ~ n^2 (partial-product array)
    assert all(0.7 < x < 1.1 for x in laws["int_add"]["energy_exponents"]
               + laws["int_add"]["area_exponents"])
    assert 1.9 < laws["int_mul"]["energy_exponents"][0] < 2.1
    # the float multiplier's area follows the (M+1)^2 significand product
    assert 1.9 < laws["fp_mul_significand"]["area_exponents"][0] < 2.1
    # doubling n: an adder costs ~2x, a multiplier ~4x
    assert 1.6 < A.int_add(32).energy_pj / A.int_add(16).energy_pj < 2.4
    assert 3.3 < A.int_mul(16).energy_pj / A.int_mul(8).energy_pj < 4.7


def test_float_laws_monotonic_in_both_fields():
    for e in range(2, 9):
        prev_m = prev_a = None
        for m in range(1, 24):
            fm, fa = A.fp_mul(emu.Format(e, m)), A.fp_add(emu.Format(e, m))
            if prev_m:
                assert fm.energy_pj > prev_m.energy_pj and fm.area_um2 > prev_m.area_um2
                assert fa.energy_pj > prev_a.energy_pj and fa.area_um2 > prev_a.area_um2
            prev_m, prev_a = fm, fa
    for m in (3, 7, 10):
        assert A.fp_mul(emu.Format(8, m)).energy_pj > A.fp_mul(emu.Format(5, m)).energy_pj


def test_any_format_between_and_beyond_the_table():
    f32, bf16, f16 = (A.fp_mul(f) for f in ("float32", "bf16", "fp16"))
    # bf16's 8x8 significand product is cheaper than float16's 11x11
    assert bf16.energy_pj < f16.energy_pj < f32.energy_pj
    assert bf16.area_um2 < f16.area_um2
    fp8 = A.fp_mul("float8_e4m3fn")
    assert 0 < fp8.energy_pj < A.fp_mul("e8m4").energy_pj < bf16.energy_pj
    # the decomposition: significand power law at w = M+1 through float16/float32 (each
    # minus its exponent adder), plus an E-bit adder; int adders below 8 bits continue
    # the int8-int16 segment
    add5 = 0.03 * (5 / 8) ** math.log2(0.05 / 0.03)
    v16, v32 = 1.1 - add5, 3.7 - 0.03
    alpha = math.log(v32 / v16) / math.log(24 / 11)
    assert A.int_add(5).energy_pj == pytest.approx(add5, rel=1e-12)
    assert A.fp_mul("e8m4").energy_pj == pytest.approx(v32 * (5 / 24) ** alpha + 0.03, rel=1e-12)


def test_pam_rules():
    for fmt in ("float32", "bf16", "fp16", "e8m4", "float8_e4m3fn"):
        f = emu.format(fmt)
        paper, adders = A.pam_mul(f), A.pam_mul(f, "adders")
        assert paper == A.int_add(f.width) * 2
        assert adders == A.int_add(f.exp_bits + f.man_bits) + A.int_add(f.exp_bits)
        assert adders.energy_pj < paper.energy_pj
        assert paper.energy_pj < A.fp_mul(f).energy_pj
        assert A.pa_div(f) == paper
    assert A.pam_mul("float32").energy_pj == pytest.approx(0.2)


def test_mac_is_multiply_plus_accumulator_add_and_savings_split():
    s = A.savings_rows("bf16", "float32")
    assert s["float_mac"] == A.fp_mul("bf16") + A.fp_add("float32")
    assert s["pam_mac"] == A.pam_mul("bf16") + A.fp_add("float32")
    assert A.mac("bf16", "float32", "pam") == s["pam_mac"]
    assert A.mac("bf16", "float32") == s["float_mac"]
    # the accumulator dominates the PAM MAC: per-MAC saving far below multiply-only
    assert s["mul_ratio"][0] < 0.2 and s["mac_ratio"][0] > 0.3
    assert s["acc_add"].energy_pj > s["pam_mul"].energy_pj


def test_memory_energy_per_byte():
    assert A.memory_pj_per_byte("dram") == pytest.approx(1300 / 8)
    assert A.memory_pj_per_byte("sram_8kb") == pytest.approx(10 / 8)
    levels = [A.memory_pj_per_byte(lv) for lv in A.MEMORY_LEVELS]
    assert levels == sorted(levels)


@pytest.mark.parametrize("call,msg", [
    (lambda: A.fp_mul("bf17"), "fmt='bf17' is not a format"),
    (lambda: A.mac("bf16", "fp33"), "acc='fp33' is not a format"),
    (lambda: A.mac("bf16", "float32", mul="log"), "mul='log'"),
    (lambda: A.pam_mul("bf16", rule="guess"), "rule='guess'"),
    (lambda: A.int_add(0), "bits must be a positive int"),
    (lambda: A.int_mul(8.5), "bits must be a positive int"),
    (lambda: A.memory_pj_per_byte("l2"), "memory='l2'"),
])
def test_bad_input_is_a_clear_error(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()

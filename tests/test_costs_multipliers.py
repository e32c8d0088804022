"""Cost per MAC of every multiplier (issue 23): the pattern sums with a constant cost PAM,
corrected PAM adds its ROM and a second add, exact and float cost the IEEE multiplier;
``pamsim cost --mul``."""
import json

import pytest

import emu
from emu.multipliers import cpam_table
from costs import analytic as A
from sim.cli import main

FORMATS = ("bf16", "fp16", "float8_e4m3fn", "e8m4")


@pytest.mark.parametrize("fmt", FORMATS)
def test_constant_pattern_sums_cost_pam(fmt):
    for mul in ("pam", "lmul", "pam+3", "pam-2", "lmul+1", emu.multiplier("lmul")):
        for rule in A.PAM_RULES:
            assert A.mul_cost(mul, fmt, rule) == A.pam_mul(fmt, rule)
            assert A.mac(fmt, "float32", mul, rule) == A.pam_mul(fmt, rule) + A.fp_add("float32")


@pytest.mark.parametrize("fmt", FORMATS)
def test_exact_and_float_cost_the_ieee_multiplier(fmt):
    for mul in ("exact", "float", emu.multiplier("exact")):
        assert A.mul_cost(mul, fmt) == A.fp_mul(fmt)
        assert A.mac(fmt, "bf16", mul) == A.fp_mul(fmt) + A.fp_add("bf16")


def test_corrected_pam_is_pam_plus_rom_plus_an_add():
    # bf16 cpam2-unbiased: 16 corrections, the largest 17 ULPs -> 5-bit words
    table = cpam_table(7, 2, "unbiased")
    assert max(table) == 17 and min(table) >= 0
    rom = A.int_add(32) * (15 * 5 / 32)
    want = A.pam_mul("bf16") + rom + A.int_add(8 + 7)
    got = A.mul_cost("cpam2-unbiased", "bf16")
    assert got.energy_pj == pytest.approx(want.energy_pj, rel=1e-12)
    assert got.area_um2 == pytest.approx(want.area_um2, rel=1e-12)
    # a table given as data: negative entries need a sign bit (-3..2 -> 3 bits)
    data = A.mul_cost("cpam1:-3,2,0,1", "bf16")
    assert data.energy_pj == pytest.approx(
        (A.pam_mul("bf16") + A.int_add(32) * (3 * 3 / 32) + A.int_add(15)).energy_pj)
    # more index bits, more ROM: k = 1 < 2 < 3, all above PAM
    costs = [A.mul_cost(f"cpam{k}-unbiased", "bf16").energy_pj for k in (1, 2, 3)]
    assert A.pam_mul("bf16").energy_pj < costs[0] < costs[1] < costs[2]


def test_existing_spellings_unchanged():
    s = A.savings_rows("bf16", "float32")
    assert A.mac("bf16", "float32") == s["float_mac"]
    assert A.mac("bf16", "float32", "pam") == s["pam_mac"]
    assert A.mac("bf16", "float32", "pam", "adders") == \
        A.pam_mul("bf16", "adders") + A.fp_add("float32")


@pytest.mark.parametrize("call,msg", [
    (lambda: A.mul_cost("log", "bf16"), "mul='log' is not a multiplier"),
    (lambda: A.mac("bf16", "float32", mul=3), "mul=3 is not a multiplier"),
    (lambda: A.mul_cost("cpam2-unbiased", "float32"), "tables are shipped for mantissa"),
    (lambda: A.mul_cost("cpam3-unbiased", "e5m2"), "indexes 3 mantissa bits"),
    (lambda: A.mul_cost("pam", "bf17"), "fmt='bf17' is not a format"),
])
def test_bad_input(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_cost_cli_table_by_multiplier(capsys, tmp_path):
    js = tmp_path / "c.json"
    assert main(["cost", "--fmt", "bf16", "--mul", "pam,exact,cpam2-unbiased",
                 "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "Per MAC by multiplier: bfloat16 operands, float32 accumulator" in out
    assert "exact             0.6845     892.3   1.5845    5076.3 |    100.00 %   100.00 %" in out
    assert "pam               0.1000     134.0   1.0000    4318.0 |     63.11 %    85.06 %" in out
    rows = {r["mul"]: r for r in json.loads(js.read_text())["multipliers"]}
    assert list(rows) == ["pam", "exact", "cpam2-unbiased"]
    assert rows["exact"]["mac_ratio"] == [1.0, 1.0]
    assert 0.63 < rows["cpam2-unbiased"]["mac_ratio"][0] < 1
    # a table that does not fit the format is a line, not a crash
    assert main(["cost", "--fmt", "float32", "--mul", "cpam2-unbiased,lmul"]) == 0
    out = capsys.readouterr().out
    assert "cpam2-unbiased  n/a: cpam2-unbiased: tables are shipped" in out
    assert "lmul              0.2000" in out


def test_cost_cli_bad_mul(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["cost", "--mul", "pam,nope"])
    assert exc.value.code == 2
    assert "pamsim cost: error: argument --mul: mul='nope' is not a multiplier" \
        in capsys.readouterr().err
    assert main(["cost", "--model", "vit", "--mul", "lmul"]) == 2
    assert "--mul prices the per-MAC table" in capsys.readouterr().err

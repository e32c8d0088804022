"""``pamsim cost`` and ``pamsim fpga``: tables, per-step breakdown and PNG, the unit
registry driven through a stand-in rtl module, and clear errors for bad arguments."""
import json

import pytest
from amaranth import Module
from amaranth.back import verilog as amaranth_verilog
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sim.cli import main


def test_cost_tables(capsys, tmp_path):
    js = tmp_path / "cost.json"
    assert main(["cost", "--fmt", "bf16", "--acc", "float32", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    for line in ("float32 PAM vs float32 multiply", "5.41 %", "3.56 %", "5.4 % / 3.6 %",
                 "18 % / 17 %", "24 % / 38 %", "55 % / 77 %", "PAM bfloat16, rule 'paper'",
                 "float add float32 (accumulator)", "Multiply only:", "Per MAC",
                 "float8_e4m3fn", "e8m4"):
        assert line in out, line
    data = json.loads(js.read_text())
    assert data["fmt"] == "bfloat16" and data["acc"] == "float32"
    assert data["pam_mul"] == {"energy_pj": 0.1, "area_um2": 134.0}
    assert data["mul_ratio"][0] == pytest.approx(0.1 / data["fp_mul"]["energy_pj"])
    assert [round(100 * r["energy"], 1) for r in data["appendix_b"]] == [5.4, 18.2, 23.9, 55.0]


def test_cost_extra_format_row(capsys):
    assert main(["cost", "--fmt", "e5m7", "--rule", "adders"]) == 0
    out = capsys.readouterr().out
    assert "e5m7 " in out and "rule 'adders' (int12 + int5 add)" in out


def test_cost_model_breakdown_and_png(capsys, tmp_path):
    png, js = tmp_path / "vit.png", tmp_path / "vit.json"
    assert main(["cost", "--model", "vit", "--batch", "2", "--png", str(png),
                 "--json", str(js)]) == 0
    out = capsys.readouterr().out
    for line in ("One training step of vit (batch 2)", "MACs (matmul, conv)",
                 "activations saved for backward", "162.5 pJ/byte", "native float32",
                 "bfloat16 mixed", "PAM bfloat16", "fully PA bfloat16"):
        assert line in out, line
    assert "UNCLASSIFIED" not in out
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    data = json.loads(js.read_text())
    totals = [s["total_pj"] for s in data["scenarios"]]
    assert totals == sorted(totals, reverse=True)
    assert data["macs"]["backward"] > data["macs"]["forward"] > 0


def test_cost_charlm_sram(capsys, tmp_path):
    assert main(["cost", "--model", "charlm", "--batch", "1", "--memory", "sram_1mb",
                 "--fmt", "fp16", "--png", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "12.5 pJ/byte (sram_1mb" in out and "PAM float16" in out


@pytest.mark.parametrize("argv,msg", [
    (["cost", "--fmt", "bf17"], "fmt='bf17' is not a format"),
    (["cost", "--acc", "int8"], "'int8' is not a format"),
    (["cost", "--model", "resnet"], "invalid choice: 'resnet'"),
    (["cost", "--rule", "cheap"], "invalid choice: 'cheap'"),
    (["fpga", "--target", "vivado"], "invalid choice: 'vivado'"),
    (["fpga", "--unit", "nosuch"], "invalid choice: 'nosuch'"),
])
def test_bad_arguments(argv, msg, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert msg in capsys.readouterr().err


def test_bad_batch(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["cost", "--model", "vit", "--batch", "0"])
    assert exc.value.code == 2
    assert "argument --batch: got '0'" in capsys.readouterr().err


class _TinyMul(wiring.Component):
    """Stands in for an rtl unit: a 4x4 multiplier, ports a, b, y."""
    a: In(4)
    b: In(4)
    y: Out(8)

    def __init__(self, fmt):
        self.fmt = fmt
        super().__init__()

    module_name = "tiny_mul"

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(self.a * self.b)
        return m


@pytest.fixture
def fake_rtl(monkeypatch, tmp_path):
    """rtl whose make_unit builds a tiny design, to drive the CLI quickly (the real
    units are synthesized in tests/test_costs_fpga_units.py)."""
    import rtl
    monkeypatch.setattr(rtl, "make_unit", lambda unit, fmt, **kw: _TinyMul(fmt))
    monkeypatch.setattr(rtl, "verilog",
                        lambda comp, name: amaranth_verilog.convert(comp, name=name))
    monkeypatch.setenv("PAMSIM_CACHE", str(tmp_path))
    return rtl


def test_fpga_unit_through_the_cli(fake_rtl, capsys, tmp_path):
    js = tmp_path / "r.json"
    assert main(["fpga", "--unit", "mul", "--fmt", "bf16", "--target", "ice40", "--nodsp",
                 "--no-pnr", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "tiny_mul: PAM multiplier" in out and "up5k" in out
    assert "copies per device by resource: logic" in out
    row = json.loads(js.read_text())[0]
    assert row["dsps"] == 0 and row["luts"] > 10 and row["fit"] == 5280 // row["logic"]
    assert row["fmax_mhz"] is None


def test_bench_costs_quick(capsys):
    assert main(["bench", "--quick", "--only", "costs"]) == 0
    out = capsys.readouterr().out
    assert "count_step mlp batch 32" in out and "plain step mlp" in out

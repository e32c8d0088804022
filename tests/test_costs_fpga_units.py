"""Real synthesis of the rtl/ units (issue 3).

rtl is imported unconditionally: without issue 3's units this module fails at import,
loudly, instead of skipping.  One small unit is synthesized and placed in CI; the full
PAM-vs-float sweep (``pamsim fpga --sweep``: 60 syntheses + 20 place-and-routes, about
35 min on a cold cache on 2 busy cores) is marked slow and runs only with
PAMSIM_FPGA_SWEEP=1, because `make test` runs slow tests too.  It uses the persistent
result cache (a hit is the result of synthesizing the identical design with the same
tools and options), so only its first run pays for the syntheses.
"""
import os

import numpy as np
import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

import emu
import rtl
from rtl import PAMMac

from costs import units
from costs.fpga import fit

pytestmark = pytest.mark.xdist_group("costs_fpga")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("fpga_units_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PAMSIM_CACHE", str(path))
        yield path


def test_registry_covers_rtl_units():
    assert set(units.catalog()) == set(rtl.UNITS) | set(units.BASELINES)


def test_float_mac_baseline_is_the_pam_mac_with_the_ieee_multiplier():
    """fmac = rtl.PAMMac's interface and pipeline with rtl.FloatMultiplier inside."""
    flt, pam = units.float_mac("bf16"), PAMMac("bf16")
    assert isinstance(flt, PAMMac) and flt.signature == pam.signature
    for unit in (flt, pam):
        Fragment.get(unit, None)                    # both elaborate
    pam_v = units.unit_design("mac", "bf16")
    flt_v = units.unit_design("fmac", "bf16")
    assert flt_v.top == "fp_mac_bfloat16_float32_s2" and flt_v.key != pam_v.key
    # same hierarchy (top, .add, .mul); the adders are identical, only the IEEE .mul
    # has a significand product
    def modules(d):
        bodies = d.text.split("\nmodule ")[1:]
        return {b.split("(")[0].strip().replace(d.top, "top"): b.split(";", 1)[1]
                for b in bodies}
    pm, fm = modules(pam_v), modules(flt_v)
    assert set(pm) == set(fm) == {"top", "\\top.add", "\\top.mul"}
    assert pm["\\top.add"] == fm["\\top.add"]
    assert " * " in fm["\\top.mul"] and " * " not in pm["\\top.mul"]
    with pytest.raises(ValueError, match="unit='fmac' takes no rows/cols"):
        units.unit_design("fmac", "bf16", rows=2)
    with pytest.raises(ValueError, match="multiplier='int'; expected a multiplier"):
        PAMMac("bf16", multiplier="int")


def test_float_mac_computes_the_float_dot_product():
    """The synthesized baseline is a real MAC: stream two dot products through it (an
    idle cycle between) and compare every running sum, bit for bit, with emu's
    fp_mul (subnormals flushed) then fp_add into float32."""
    f, acc = emu.bfloat16, emu.float32
    rng = np.random.default_rng(6)
    dots = [emu.quantize(rng.standard_normal((2, n)), f) for n in (5, 4)]
    dut = units.float_mac(f, acc, 2)
    seq, want = [], []
    for x, y in dots:
        ax, bx = emu.to_bits(x, f), emu.to_bits(y, f)
        s = np.float32(0)
        for k in range(x.size):
            seq.append((1, int(ax[k]), int(bx[k]), int(k == 0)))
            s = emu.fp_add(s, emu.fp_mul(x[k], y[k], f, subnormals=False), acc)
            want.append(int(emu.to_bits(s, acc)))
        seq.append((0, 0x1234, 0x4321, 1))                    # idle: payload ignored
    outs = []

    async def bench(ctx):
        pay = dut.i_stream.payload
        for v, a, b, first in seq + [(0, 0, 0, 0)] * 3:
            ctx.set(dut.i_stream.valid, v)
            ctx.set(pay.a.as_value(), a)
            ctx.set(pay.b.as_value(), b)
            ctx.set(pay.first, first)
            await ctx.tick()
            if ctx.get(dut.o_stream.valid):
                outs.append(ctx.get(dut.o_stream.payload.result.as_value()))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert outs == want


def test_pam_multiplier_synthesis_and_fmax(cache):
    """CI: the bf16 PAM multiplier on ECP5 (synthesis + nextpnr) and the IEEE one."""
    pam = units.synthesize_unit("mul", "bf16", "ecp5")
    flt = units.synthesize_unit("fmul", "bf16", "ecp5", dsp=False, pnr=False)
    assert pam.resources.dsps == 0 and pam.resources.ffs == 0       # combinational
    assert set(pam.ports) == {"a", "b", "y"}
    assert all(p["width"] == 16 for p in pam.ports.values())
    assert pam.resources.other == {} and flt.resources.other == {}
    # the PAM datapath is an integer adder plus exponent checks: far smaller than an
    # 8x8 significand multiplier with rounding built from LUTs
    assert 2 * pam.resources.logic < flt.resources.logic
    assert pam.fmax_mhz > 20
    assert fit(pam).count == 83640 // pam.resources.logic


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PAMSIM_FPGA_SWEEP") != "1",
                    reason="the full sweep takes ~35 min on a cold cache: PAMSIM_FPGA_SWEEP=1")
def test_full_sweep():
    """PAM vs float for float32, bf16, fp16, fp8 on ECP5, iCE40 and Xilinx."""
    rows = units.sweep(progress=False)
    assert [r for r in rows if "error" in r] == []
    assert all(r["result"].resources.other == {} for r in rows)     # every cell classed
    assert len(rows) == len(units.SWEEP_UNITS) * len(units.SWEEP_FORMATS) * 3
    comp = units.compare(rows)
    assert len(comp) == len(units.SWEEP_FORMATS) * 3
    for c in comp:
        assert c["fmac_source"] == "measured", c
        # PAM needs no DSP and less logic than the IEEE multiplier, so at least as many
        # PAM MACs as float MACs fit every device
        assert c["mul_logic"] < c["fmul_logic"], c
        assert c["mac_fit"] >= c["fmac_fit"], c
        if c["target"] in units.FMAX_TARGETS:
            assert c["mul_fmax"] > c["fmul_fmax"], c
            assert c["mac_gops"] > 0 and c["fmac_gops"] > 0, c


def test_imported_multiplier_design_and_bad_input(tmp_path, monkeypatch, capsys):
    """``pamsim fpga --mul table:NAME`` of an imported multiplier synthesizes its Verilog
    file as given; an edited file, and bad --mul values, are one line and exit 2."""
    import hashlib
    from pathlib import Path

    import emu.multipliers as EM
    from sim.cli import main
    monkeypatch.setenv("PAMSIM_MULTIPLIERS", str(tmp_path))
    v = tmp_path / "m.v"
    v.write_text((Path(__file__).parent.parent / "examples" / "trunc_mul_e5m2.v").read_text())
    m = emu.table_multiplier(lambda x, y: x * y, "e5m2", "bf16", name="given_v")
    EM.save_table(m, verilog=str(v), verilog_sha256=hashlib.sha256(v.read_bytes()).hexdigest(),
                  top="trunc_mul")
    assert units.unit_design("mul", "e5m2", mul="table:given_v").text == v.read_text()
    # fp16 results can be subnormal where the float32 adder needs them normal: the MAC
    # instantiates the module behind a widening stage (rtl._float.Widen)
    m16 = emu.table_multiplier(lambda x, y: x * y * 2.0 ** -20, "e5m2", "fp16", name="given_16")
    EM.save_table(m16, verilog=str(v), verilog_sha256=hashlib.sha256(v.read_bytes()).hexdigest(),
                  top="trunc_mul")
    mac = units.unit_design("mac", "e5m2", mul="table:given_16").text
    assert ".mul.widen (y, a);" in mac and mac.endswith(v.read_text())
    v.write_text(v.read_text() + "// edited\n")
    for argv, msg in ((["--unit", "mul", "--fmt", "e5m2", "--mul", "table:given_v"],
                       "changed since its import"),
                      (["--unit", "mul", "--mul", "bogus"], "mul='bogus'; expected"),
                      (["--unit", "add", "--mul", "pam"], "unit='add' takes no mul option"),
                      (["--unit", "mac", "--fmt", "e5m2", "--mul", "cpam3-unbiased"],
                       "mul='cpam3-unbiased' has no RTL for fmt=float8_e5m2")):
        assert main(["fpga", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("pamsim fpga: error: ") and msg in err and "\n" not in err


def test_table_rom_mac_is_rtlil_with_one_meminit():
    """A NumPy table's MAC is synthesized from RTLIL: its 2^16-word ROM is one $meminit
    cell (the Verilog's 65,536 initial assignments kept yosys busy past 9 minutes; from
    RTLIL ECP5 maps it to 57 DP16KD in ~15 s, docs/costs.md)."""
    emu.table_multiplier(lambda x, y: 0.999 * x * y, "e4m3fn", "bf16", name="rom_e4m3_bf16")
    d = units.unit_design("mac", "e4m3fn", mul="table:rom_e4m3_bf16")
    assert d.lang == "rtlil" and d.text.count("cell $meminit") == 1
    assert "rom_e4m3_bf16" in d.top and "rom[" not in d.text
    assert units.unit_design("mac", "e4m3fn", mul="pam").lang == "verilog"
    with pytest.raises(ValueError, match="unit='mac', whose synchronous ROM is block RAM"):
        units.unit_design("mul", "e4m3fn", mul="table:rom_e4m3_bf16")

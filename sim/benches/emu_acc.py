"""Narrow accumulators: PAM matmul accumulating in bf16/fp16 vs in float32 (issue 16).

Each row times ``pam_matmul(a, b, fmt, acc)`` with a narrow ``acc`` against the same
call with ``acc="float32"`` (the register-blocked float32 kernel), in the same run.
bf16 operands have products of 8 significant bits, so bf16 and fp16 accumulators take
the PLAIN step (float32 add, one rounding), register-blocked: SCALED for bf16 (the
bounded data admits it), CLAMPED for fp16 (tiny products could make sums subnormal,
so the rounding constant is clamped at fp16's smallest normal); float32 operands with
a bf16 accumulator take the STICKY step (round-to-odd through 2Sum),
emu/_kernels_acc.py.  Then the exact PAM-matmul gradient
(emu.grad.pam_matmul, kind="exact": dA and dB) with a bf16 accumulator against float32
accumulation (emu/_kernels_grad.py), and the exact gradient against the approximate
one (two PAM matmuls), both with a float32 accumulator.  The last row is the torch bridge's ``acc=``
option (forward), against its own float32 accumulator.
"""
from __future__ import annotations

import numpy as np

import emu
import emu.grad
from sim.bench import Row, best_of, case, threads


@case("emu_acc")
def emu_acc_cases(quick: bool) -> list[Row]:
    rng = np.random.default_rng(0)
    n = 256 if quick else 1024
    reps = 3 if quick else 5
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    rows = []
    with threads(None) as used:
        for fmt, acc, target in [("bf16", "bf16", 3.0), ("bf16", "fp16", 3.0),
                                 ("float32", "bf16", None)]:
            tc, tb = best_of(lambda: emu.pam_matmul(a, b, fmt, acc),
                             lambda: emu.pam_matmul(a, b, fmt), reps)
            rows.append(Row(f"pam_matmul {fmt} {n}^3, acc {acc}, {used} threads", tc,
                            "same, acc float32", tb, target))
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

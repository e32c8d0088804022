"""emu kernels: PAM matmul vs BLAS matmul, elementwise PAM and rounding vs numpy.

Target (issue 13 §6): ``pam_matmul`` float32 1024^3 within 2x of ``torch.matmul`` on one
thread."""
from __future__ import annotations

import numpy as np

import emu
from sim.bench import Row, best_of, case, threads


def _matmul_baseline(a, b):
    """torch.matmul float32 if torch is installed, else numpy (both use a BLAS)."""
    try:
        import torch
    except ImportError:
        return "numpy.matmul fp32", lambda: a @ b
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return "torch.matmul fp32", lambda: torch.matmul(ta, tb)


@case("emu")
def emu_cases(quick: bool) -> list[Row]:
    rng = np.random.default_rng(0)
    n = 256 if quick else 1024
    # --quick: the same targets at sizes that take a millisecond or less, so each row is
    # the best of more runs (a single run there is within the noise of a shared machine)
    reps = 20 if quick else 5
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    base_name, base = _matmul_baseline(a, b)
    rows = []
    for nthreads in (1, None):
        with threads(nthreads) as used:
            tc, tb = best_of(lambda: emu.pam_matmul(a, b), base, reps)
            rows.append(Row(f"pam_matmul f32 {n}^3, {used} thread(s)", tc,
                            f"{base_name}, {used} thread(s)", tb, 2.0 if nthreads == 1 else None))
    with threads(None) as used:
        tc, tb = best_of(lambda: emu.pam_matmul(a, b, "bf16"), base, reps)
        rows.append(Row(f"pam_matmul bf16 {n}^3 incl. rounding, {used} threads", tc,
                        f"{base_name}, {used} threads", tb))
        m = (1 if quick else 16) << 20
        x = rng.standard_normal(m).astype(np.float32)
        y = rng.standard_normal(m).astype(np.float32)
        tc, tb = best_of(lambda: emu.pam_mul(x, y), lambda: x * y, reps)
        rows.append(Row(f"pam_mul f32, {m >> 20} M elements", tc, "numpy x * y", tb, 2.0))
        tc, tb = best_of(lambda: emu.quantize(x, "bf16"), lambda: x * y, reps)
        rows.append(Row(f"quantize bf16, {m >> 20} M elements", tc, "numpy x * y", tb))
    return rows



"""``pamsim bench``: speed as ratios against a baseline measured in the same run.

The machine is shared and noisy, so every case interleaves its candidate and its
baseline and keeps the best of several repetitions of each; only the ratio is
meaningful.  Cases register themselves with :func:`case`; later parts of pamsim
(torch bridge, RTL, GPU) add their own.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numba
import numpy as np

import emu


@dataclass
class Row:
    name: str
    seconds: float
    baseline: str
    baseline_seconds: float
    target: float | None = None     # the ratio we aim to stay under

    @property
    def ratio(self) -> float:
        return self.seconds / self.baseline_seconds


_CASES: list[tuple[str, Callable]] = []


def case(name: str):
    """Register a benchmark case: a function ``(quick: bool) -> list[Row]``."""
    def deco(fn):
        _CASES.append((name, fn))
        return fn
    return deco


def best_of(candidate, baseline, repeat=5):
    """Min-of-``repeat`` seconds of two callables, interleaved, after one warm-up each."""
    candidate()
    baseline()
    tc, tb = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        candidate()
        tc.append(time.perf_counter() - t)
        t = time.perf_counter()
        baseline()
        tb.append(time.perf_counter() - t)
    return min(tc), min(tb)


@contextmanager
def threads(n: int | None):
    """Run Numba (and torch, if installed) with ``n`` threads; None: all cores."""
    try:
        import torch
    except ImportError:
        torch = None
    old_nb = numba.get_num_threads()
    old_t = torch.get_num_threads() if torch else None
    n_eff = n or numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(n_eff)
    if torch:
        torch.set_num_threads(n_eff)
    try:
        yield n_eff
    finally:
        numba.set_num_threads(old_nb)
        if torch:
            torch.set_num_threads(old_t)


def _matmul_baseline(a, b):
    """torch.matmul float32 if torch is installed, else numpy (both use a BLAS)."""
    try:
        import torch
    except ImportError:
        return "numpy.matmul fp32", lambda: a @ b
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return "torch.matmul fp32", lambda: torch.matmul(ta, tb)


@case("emu")
def _emu_cases(quick: bool) -> list[Row]:
    rng = np.random.default_rng(0)
    n = 256 if quick else 1024
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    base_name, base = _matmul_baseline(a, b)
    rows = []
    for nthreads in (1, None):
        with threads(nthreads) as used:
            tc, tb = best_of(lambda: emu.pam_matmul(a, b), base, 3 if quick else 5)
            rows.append(Row(f"pam_matmul f32 {n}^3, {used} thread(s)", tc,
                            f"{base_name}, {used} thread(s)", tb, 3.0 if nthreads == 1 else None))
    with threads(None) as used:
        tc, tb = best_of(lambda: emu.pam_matmul(a, b, "bf16"), base, 3 if quick else 5)
        rows.append(Row(f"pam_matmul bf16 {n}^3 incl. rounding, {used} threads", tc,
                        f"{base_name}, {used} threads", tb))
        m = (1 if quick else 16) << 20
        x = rng.standard_normal(m).astype(np.float32)
        y = rng.standard_normal(m).astype(np.float32)
        tc, tb = best_of(lambda: emu.pam_mul(x, y), lambda: x * y, 3 if quick else 5)
        rows.append(Row(f"pam_mul f32, {m >> 20} M elements", tc, "numpy x * y", tb, 2.0))
        tc, tb = best_of(lambda: emu.quantize(x, "bf16"), lambda: x * y, 3 if quick else 5)
        rows.append(Row(f"quantize bf16, {m >> 20} M elements", tc, "numpy x * y", tb))
    return rows


def run(quick: bool = False, only: list[str] | None = None) -> list[Row]:
    rows = []
    for name, fn in _CASES:
        if only and name not in only:
            continue
        rows += fn(quick)
    return rows


def format_rows(rows: list[Row]) -> str:
    w = max(len(r.name) for r in rows)
    wb = max(len(r.baseline) for r in rows)
    out = [f"{'case':{w}}  {'time':>10}  {'baseline':{wb}}  {'time':>10}  {'ratio':>7}  target"]
    for r in rows:
        tgt = "" if r.target is None else (f"<= {r.target:g}x " + ("ok" if r.ratio <= r.target
                                                                   else "MISSED"))
        out.append(f"{r.name:{w}}  {r.seconds * 1e3:8.1f}ms  {r.baseline:{wb}}  "
                   f"{r.baseline_seconds * 1e3:8.1f}ms  {r.ratio:6.2f}x  {tgt}")
    return "\n".join(out)

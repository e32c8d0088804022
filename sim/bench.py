"""``pamsim bench``: speed as ratios against a baseline measured in the same run.

The machine is shared and noisy, so every case interleaves its candidate and its
baseline and keeps the best of several repetitions of each; only the ratio is
meaningful.  Case groups are modules of ``sim/benches/`` that register functions
with :func:`case`; each part of pamsim (emu, torch bridge, RTL, GPU) adds its own.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numba


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
#: case function -> the options (``pamsim bench`` arguments) it takes as keywords
OPTIONS: dict[Callable, tuple] = {}


def case(name: str, options: tuple = ()):
    """Register a benchmark case: a function ``(quick: bool, **options) -> list[Row]``;
    ``options``: the keyword arguments of :func:`run` it takes (e.g. ``("mul",)``)."""
    def deco(fn):
        _CASES.append((name, fn))
        OPTIONS[fn] = tuple(options)
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


def load_cases() -> list[str]:
    """Import every module of sim.benches (each registers its cases); return group names."""
    import importlib
    import pkgutil

    from . import benches
    for mod in pkgutil.iter_modules(benches.__path__):
        importlib.import_module(f"{benches.__name__}.{mod.name}")
    return [name for name, _ in _CASES]


def selected(only: list[str] | None = None, skip: list[str] | None = None) -> list[str]:
    """The groups :func:`run` runs with ``only`` and ``skip``; ValueError naming an
    unknown one."""
    names = load_cases()
    unknown = (set(only or ()) | set(skip or ())) - set(names)
    if unknown:
        raise ValueError(f"unknown bench case group(s) {sorted(unknown)}; available: {names}")
    return [n for n in dict.fromkeys(names)
            if not (only and n not in only) and not (skip and n in skip)]


def run(quick: bool = False, only: list[str] | None = None,
        skip: list[str] | None = None, **options) -> list[Row]:
    """Rows of every case group, or of the groups in ``only``, minus those in ``skip``;
    ``options`` (None: not given) go to the groups that take them (:func:`case`), and one
    that no selected group takes is a ValueError."""
    groups = selected(only, skip)
    given = {k: v for k, v in options.items() if v is not None}
    for k in given:
        if not any(k in OPTIONS[fn] for name, fn in _CASES if name in groups):
            takes = sorted({name for name, fn in _CASES if k in OPTIONS[fn]})
            raise ValueError(f"{k}={given[k]!r} is taken by the group(s) {takes}, which "
                             f"this run leaves out (groups: {groups})")
    rows = []
    for name, fn in _CASES:
        if name in groups:
            rows += fn(quick, **{k: v for k, v in given.items() if k in OPTIONS[fn]})
    return rows


def host_line() -> str:
    """The host and the kernel variants its rows ran: ratios differ between AVX2 and
    AVX-512 hosts (the matmul micro-kernel's lanes, the CLAMPED step's clamp)."""
    import platform

    from emu.lowlevel import RANGE_CLAMP, VECTOR_LANES
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    isa = "AVX-512" if VECTOR_LANES == 16 else "AVX2-width"
    clamp = "vrangeps clamp" if RANGE_CLAMP else "in place"
    return (f"host: {name}, {os.cpu_count()} CPUs; matmul micro-kernel {VECTOR_LANES} lanes "
            f"({isa}), CLAMPED step {clamp}"
            + ("; PAMSIM_VECTOR_LANES set" if "PAMSIM_VECTOR_LANES" in os.environ else ""))


def format_rows(rows: list[Row]) -> str:
    if not rows:
        return "(no rows)"
    w = max(len(r.name) for r in rows)
    wb = max(len(r.baseline) for r in rows)
    out = [f"{'case':{w}}  {'time':>10}  {'baseline':{wb}}  {'time':>10}  {'ratio':>7}  target"]
    for r in rows:
        tgt = "" if r.target is None else (f"<= {r.target:g}x " + ("ok" if r.ratio <= r.target
                                                                   else "MISSED"))
        out.append(f"{r.name:{w}}  {r.seconds * 1e3:8.1f}ms  {r.baseline:{wb}}  "
                   f"{r.baseline_seconds * 1e3:8.1f}ms  {r.ratio:6.2f}x  {tgt}")
    return "\n".join(out)

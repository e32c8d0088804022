"""Multipliers (issue 23): ``emu.matmul(a, b, fmt, mul=X)`` against PAM's own time
(``mul="pam"``), same operands, same run, 1024³, one thread, float32 accumulator.

* ``lmul`` and the constant offsets take PAM's kernels with another constant: <= 1.1x;
* corrected PAM with k = 2 (B packed once per table row, one add per product): <= 2x;
* ``exact`` (the float32 product and add where every product is exact) and ``float``
  (that product rounded onto fmt's grid in place) with bf16 or e4m3 operands: <= 1.5x;
* a table multiplier at e4m3 (issue 24; the exact product rounded into bf16, as a
  table: per 32-column panel and k the products of the encodings A's column holds,
  looked up once, then vector adds): <= 4x.

Operands: standard normal, rounded into fmt.  With e4m3 many products fall below its
smallest normal (PAM and ``float`` flush them): those blocks take the FLUSH
micro-kernels.
"""
from __future__ import annotations

import numpy as np

import emu
from sim.bench import Row, best_of, case, threads

#: the group's own rows (their targets: :func:`target`)
ROWS = ("lmul", "pam+3", "cpam2-unbiased", "exact", "float")
FORMATS = ("bfloat16", "float8_e4m3fn")


def table():
    """The group's table multiplier: e4m3fn operands, the exact product rounded into bf16."""
    return emu.table_multiplier(lambda x, y: x * y, "float8_e4m3fn", "bfloat16",
                                name="bench_e4m3_exact")


def target(mul) -> float | None:
    """Issues 23 and 24's speed targets of a multiplier against PAM: a constant pattern
    sum 1.1x, corrected PAM with k = 2 2x, exact and float 1.5x, a table 4x; None for
    the others."""
    m = emu.multiplier(mul)
    if m.kind == "table":
        return 4.0
    if m.constant:
        return None if str(m) == "pam" else 1.1
    return 2.0 if m.kind == "cpam" and m.k == 2 else 1.5 if m.kind in ("exact", "float") else None


def plan(muls=None) -> list:
    """[(fmt, multiplier)] the group times: its own rows (a constant only at bf16: one
    constant is one constant), or ``muls`` at every format whose table fits (every
    multiplier fits bf16's 7 mantissa bits)."""
    if muls is None:
        return [(f, emu.multiplier(m)) for f in FORMATS for m in ROWS
                if f == "bfloat16" or m not in ("pam+3", "lmul")] + [
            ("float8_e4m3fn", table())]
    out = []
    for f in FORMATS:
        for m in map(emu.multiplier, muls):
            try:
                m.params(f)
            except ValueError:          # a table indexing more mantissa bits than f has
                continue
            out.append((f, m))
    return out


@case("multipliers", options=("mul",))
def multiplier_cases(quick: bool, mul=None) -> list[Row]:
    """``mul``: the multipliers to time instead of the group's own (None)."""
    todo = plan(mul)
    rng = np.random.default_rng(0)
    n = 256 if quick else 1024
    reps = 3 if quick else 5
    rows = []
    with threads(1):
        for fmt in FORMATS:
            a = emu.quantize(rng.standard_normal((n, n)).astype(np.float32), fmt)
            b = emu.quantize(rng.standard_normal((n, n)).astype(np.float32), fmt)
            for f, m in todo:
                if f != fmt:
                    continue
                mul, tgt = str(m), target(m)
                tc, tb = best_of(lambda: emu.matmul(a, b, fmt, mul=mul),
                                 lambda: emu.matmul(a, b, fmt, mul="pam"), reps)
                rows.append(Row(f"matmul {fmt} {n}^3 mul={mul}, 1 thread", tc,
                                "same, mul=pam", tb, tgt))
    return rows

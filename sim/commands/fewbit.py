"""``pamsim fewbit-tables``: generate, check and report the memory-saving activation tables.

Without options it regenerates every table (few-bit derivative tables for all
activations, both weights, 1-8 bits; PA activations) and writes the versioned files
to torch_bridge/memory/data/.  ``--report`` prints the paper-style error table from
the stored data instead; ``--check`` regenerates a subset and compares it with the
stored data.
"""
from __future__ import annotations

import time

import numpy as np

from sim.cli import fail, output_dir

#: Few-Bit Backward, Table 1: error (3), uniform weight on [-10, 10], bits 1..4
PAPER_TABLE1 = {
    "relu": (0.0, None, None, None),
    "gelu": (0.1410, 0.0406, 0.0119, 0.0031),
    "silu": (0.2150, 0.0479, 0.0170, 0.0045),
    "sigmoid": (0.0181, 0.0038, 0.0009, 0.0002),
    "tanh": (0.1584, 0.0319, 0.0073, 0.0017),
    "selu": (0.2554, 0.1010, 0.0184, 0.0039),
    "softplus": (0.2902, 0.0541, 0.0121, 0.0029),
}


def register(sub):
    p = sub.add_parser("fewbit-tables",
                       help="generate/check/report the few-bit derivative and PA activation tables")
    p.add_argument("--only", choices=["fewbit", "pa"], help="only this kind of table")
    p.add_argument("--activations", nargs="+", metavar="NAME",
                   help="restrict to these activations (if not given: all)")
    p.add_argument("--out", type=output_dir, metavar="DIR",
                   help="write the files here instead of torch_bridge/memory/data")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--report", action="store_true",
                      help="print the paper-style error tables from the stored data (no solving)")
    mode.add_argument("--check", action="store_true",
                      help="regenerate (bits 1-3 / small PA tables unless --full) and "
                           "compare with the stored data; exit code 1 on a mismatch")
    p.add_argument("--full", action="store_true", help="with --check: every bit width")
    p.set_defaults(run=run)


def run(args) -> int:
    from torch_bridge.memory import tables
    from torch_bridge.memory.activations import activation

    try:
        names = [activation(n).name for n in args.activations] if args.activations else None
    except ValueError as exc:
        return fail(args, f"--activations: {exc}")
    if args.full and not args.check:
        return fail(args, "--full applies to --check only")
    if args.out and (args.report or args.check):
        return fail(args, "--out applies to generating tables, not to --report or --check")
    if args.report:
        print(report(names))
        return 0
    if args.check:
        return check(names, args.only, args.full)
    from pathlib import Path

    from torch_bridge.memory import pa
    out = Path(args.out or tables.DATA_DIR)
    t0 = time.perf_counter()
    # --only's kind: (its activations, generator, file, kind for _merge, tables' name, verb)
    kinds = {"fewbit": (tables.FEWBIT_ACTIVATIONS, tables.generate_fewbit, tables.FEWBIT_FILE,
                        "few-bit", "few-bit", "solved"),
             "pa": (pa.PA_ACTIVATIONS, pa.generate_pa, tables.PA_FILE, "PA activation", "PA",
                    "fitted")}
    for kind, (known, generate, file, merge_kind, what, verb) in kinds.items():
        if args.only not in (None, kind):
            continue
        doc = generate([n for n in (names or known) if n in known], progress=lambda s: print(
            f"  {verb} {s} ({time.perf_counter() - t0:.0f} s)", flush=True))
        doc = _merge(doc, out / file, merge_kind, names)
        tables.write(doc, out / file)
        print(f"wrote {len(doc['tables'])} {what} tables to {out / file}")
    return 0


def _merge(doc, path, kind, names):
    """With --activations, keep the other activations' tables of an existing file."""
    from torch_bridge.memory import tables
    if not names or not path.exists():
        return doc
    from torch_bridge.memory.activations import ACTIVATIONS
    from torch_bridge.memory.solver import WEIGHTS
    old = tables.read(path, kind)
    merged = [t for t in old["tables"] if t["activation"] not in names] + doc["tables"]
    doc["tables"] = sorted(merged, key=lambda t: (
        ACTIVATIONS.index(t["activation"]), WEIGHTS.index(t.get("weight", WEIGHTS[0])),
        t.get("bits", t.get("pieces"))))
    return doc


def check(names, only, full) -> int:
    """Regenerate and compare with the stored files (breakpoints, values, errors)."""
    from torch_bridge.memory import pa, tables
    bad = 0
    if only in (None, "fewbit"):
        stored = tables.stored_fewbit()
        fb = [n for n in (names or tables.FEWBIT_ACTIVATIONS) if n in tables.FEWBIT_ACTIVATIONS]
        bits = range(1, 9) if full else range(1, 4)
        for t in tables.generate_fewbit(fb, bits=bits)["tables"]:
            ref = stored[(t["activation"], t["weight"], t["bits"])]
            diff = max(np.abs(np.subtract(t["breakpoints"], ref.breakpoints)).max(),
                       np.abs(np.subtract(t["values"], ref.values)).max())
            ok = diff <= 1e-9 and abs(t["error"] - ref.error) <= 1e-9 * ref.error + 1e-15
            bad += not ok
            print(f"{t['activation']:10} {t['weight']:8} {t['bits']} bits: max |diff| "
                  f"{diff:.2e}  {'ok' if ok else 'MISMATCH'}")
    if only in (None, "pa"):
        stored = pa.stored_pa()
        pn = [n for n in (names or pa.PA_ACTIVATIONS) if n in pa.PA_ACTIVATIONS]
        pieces = pa.PIECES if full else [p for p in pa.PIECES if p <= 8]
        for t in pa.generate_pa(pn, pieces)["tables"]:
            ref = stored[(t["activation"], t["pieces"])]
            diff = max(np.abs(np.subtract(t["knots"], ref.knots)).max(),
                       np.abs(np.subtract(t["values"], ref.values)).max())
            ok = diff <= 1e-9
            bad += not ok
            print(f"PA {t['activation']:8} {t['pieces']:3} pieces: max |diff| {diff:.2e}  "
                  f"{'ok' if ok else 'MISMATCH'}")
    return 1 if bad else 0


def report(names=None) -> str:
    """The paper-style error tables of the stored data, next to the paper's Table 1."""
    from torch_bridge.memory import solver, tables
    from torch_bridge.memory.activations import ACTIVATIONS, activation

    stored = tables.stored_fewbit()
    names = names or list(ACTIVATIONS)
    lines = ["Error (3) = ∫(f' − q)² dx over [−10, 10], uniform weight (paper Table 1 in "
             "brackets; sigmoid/tanh quantise |x|)",
             f"{'activation':16}" + "".join(f"{f'{b} bit':>22}" for b in range(1, 5))]
    for n in names:
        row = []
        for b in range(1, 5):
            t = tables.fewbit_table(n, b)
            paper = PAPER_TABLE1.get(n, (None,) * 4)[b - 1]
            if activation(n).exact_bits and b > 1:
                row.append(f"{'(exact at 1 bit)':>22}")
                continue
            cell = f"{t.error:.6f}" + (f" [{paper:.4f}]" if paper is not None else " " * 9)
            row.append(f"{cell:>22}")
        lines.append(f"{n:16}" + "".join(row))
    for n in ("sigmoid", "tanh"):       # what the |x| trick buys: the same bits on x itself
        if n in names:
            plain = solver.solve(n, [1, 2, 3, 4], even=False, **tables.SOLVER)
            lines.append(f"{n + ' on x':16}" + "".join(
                f"{plain[b].error:>22.6f}" for b in range(1, 5)))
    lines += ["", "All bit widths (error (3); uniform on [-10, 10] | standard normal weight)",
              f"{'activation':16}" + "".join(f"{b:>10}" for b in range(1, 9))]
    for n in names:
        if activation(n).exact_bits:
            continue
        for w in solver.WEIGHTS:
            lines.append(f"{n + ' ' + w[:4]:16}" + "".join(
                f"{stored[(n, w, b)].error:10.2e}" for b in range(1, 9)))
    try:
        from torch_bridge.memory import pa
        lines += ["", pa.report()]
    except FileNotFoundError:
        pass
    return "\n".join(lines)

"""``pamsim audit``: which multiplies of a model still run natively under a PAMConfig.

Runs one forward and backward pass of a tiny random-initialised model
(:mod:`sim.tiny_models`, built offline) under :func:`torch_bridge.pam_mode` and prints
:func:`torch_bridge.audit`'s table: every multiply-bearing aten op that ran natively,
its count, share of the multiply work and source line.
"""
from __future__ import annotations

import json
from pathlib import Path

import emu
from sim.cli import format_arg
from sim.commands.train import ops_arg


def register(sub):
    p = sub.add_parser("audit", help="list the multiplies of a model that stay native under "
                                     "pam_mode (0 = fully emulated)")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="tiny built-in models of sim.tiny_models (default: all of them)")
    p.add_argument("--fmt", type=format_arg, default=emu.bfloat16,
                   help="PAM matmul operand format")
    p.add_argument("--ops", type=ops_arg, default="all",
                   help="op groups made PA: 'all' or a comma list")
    p.add_argument("--backward", choices=("approx", "exact"), default="approx",
                   help="derivative kind of every op group")
    p.add_argument("--forward-only", action="store_true", help="skip the backward pass")
    p.add_argument("--json", help="also write the reports as JSON to this file")
    p.add_argument("--summary", action="store_true",
                   help="print one Markdown row per model (docs/torch_bridge.md's audit "
                        "table) instead of each model's table")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch_bridge as tb
    from sim.tiny_models import TINY, build
    bad = [m for m in args.models if m not in TINY]
    if bad:
        print(f"pamsim audit: error: unknown model(s) {bad}; expected names from {list(TINY)}")
        return 2
    cfg = tb.PAMConfig(args.fmt, ops=args.ops, backward=args.backward)
    reports = {}
    if args.summary:
        print(f"{cfg.describe()}\n\n| model | native multiplies | escaped op calls | "
              "native by design |\n|---|---|---|---|")
    for name in args.models or TINY:
        model, inputs = build(name)
        rep = tb.audit(model, inputs, cfg, backward=not args.forward_only)
        reports[name] = rep
        if args.summary:
            design = ", ".join(f"{r.op} ×{r.count}" for r in rep.rows
                               if r.design) or "–"
            print(f"| {name} ({type(model).__name__}) | {rep.native_work:,} | {rep.escaped} | "
                  f"{design} |")
        else:
            print(f"## {name}\n\n{rep.table()}\n")
    clean = sum(r.escaped == 0 for r in reports.values())
    print(f"{clean}/{len(reports)} model(s) fully emulated")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({k: r.to_dict() for k, r in reports.items()},
                                              indent=2))
    return 0

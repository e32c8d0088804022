"""``pamsim ablate``: the paper's Table 3 in miniature — each op group made piecewise
affine alone with exact and with approximate derivatives, then cumulatively with the
better kind for each (sections 3.3-3.4)."""
from __future__ import annotations

import json
from pathlib import Path

import emu
from sim.cli import fail, format_arg, output_dir
from sim.commands.train import add_spec_arguments, seeds_arg, set_threads, spec_from_args


def register(sub):
    p = sub.add_parser("ablate", help="per-op exact vs approximate derivatives and the "
                                      "cumulative multiplication-free run (Table 3)")
    add_spec_arguments(p, epochs_default=2)
    p.set_defaults(data="mnist")
    p.add_argument("--fmt", type=format_arg, default=emu.float32,
                   help="format of the PAM matmul operands (default float32, as Table 3)")
    p.add_argument("--seeds", type=seeds_arg, default=2, help="seeds 0..N-1 (default 2)")
    p.add_argument("--out", type=output_dir, default="out/ablate")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from sim import train as T
    try:
        specs = [spec_from_args(args, seed=s) for s in range(args.seeds)]
    except ValueError as exc:
        return fail(args, exc)
    set_threads(args)
    from sim import study as S
    out = Path(args.out)
    spec0 = specs[0]
    key, label = T.metric_names(spec0)
    print(f"pamsim ablate: {spec0.label()}, {spec0.epochs} epochs, seeds 0..{args.seeds - 1}, "
          f"PAM format {args.fmt.name}; metric: {label}")
    runs, best, cumulative = S.table3(S.Runs(specs, out / "runs", not args.quiet), args.fmt,
                                      key)
    table, stats = S.table3_markdown(key, runs, best, cumulative)
    print(table)
    stem = f"ablate_{spec0.data}_{spec0.model}_{args.fmt.name}"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(
        {"spec": spec0.__dict__, "fmt": args.fmt.name, "seeds": args.seeds, "best": best,
         "table": table, "stats": stats,
         "runs": {k: [r.to_json() for r in v] for k, v in runs.items()}}, indent=1))
    S.plot_rows(spec0, [(n, r) for n, r in runs.items() if n != "cumulative up to matmul"],
                out / f"{stem}.png", f"{spec0.label()}: PA op groups, exact vs approximate "
                                     "derivatives (cf. Table 3)")
    print(f"wrote {out / stem}.json and {out / stem}.png")
    return 0

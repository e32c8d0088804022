"""``pamsim ablate``: the paper's Table 3 in miniature — each op group made piecewise
affine alone with exact and with approximate derivatives, then cumulatively with the
better kind for each (sections 3.3-3.4)."""
from __future__ import annotations

import emu
from sim.cli import fail, format_arg, multiplier_arg
from sim.commands.train import (MUL_HELP, add_spec_arguments, add_study_arguments, seed_specs,
                                seeds_arg, start_study, write_study)


def register(sub):
    p = sub.add_parser("ablate", help="per-op exact vs approximate derivatives and the "
                                      "cumulative multiplication-free run (Table 3)")
    add_spec_arguments(p, epochs_default=2)
    p.set_defaults(data="mnist")
    p.add_argument("--fmt", type=format_arg, default=emu.float32,
                   help="format of the PAM matmul operands (float32 as in Table 3)")
    p.add_argument("--mul", type=multiplier_arg, default="pam",
                   help=MUL_HELP.replace("the matmuls' multiplier", "the multiplier of every "
                                         "configuration"))
    p.add_argument("--seeds", type=seeds_arg, default=2, help="seeds 0..N-1")
    add_study_arguments(p, "out/ablate")
    p.set_defaults(run=run)


def run(args) -> int:
    from sim import train as T
    from sim import study as S
    try:
        specs = seed_specs(args)
        S.table3_configs(args.fmt, args.mul)
    except ValueError as exc:
        return fail(args, exc)
    spec0 = specs[0]
    key, label = T.metric_names(spec0)
    mul = "" if str(args.mul) == "pam" else f", mul={args.mul}"
    runs, best, cumulative = S.table3(
        start_study(args, specs, f"PAM format {args.fmt.name}{mul}; metric: {label}"),
        args.fmt, key, args.mul)
    table, stats = S.table3_markdown(key, runs, best, cumulative)
    print(table)
    write_study(args, f"ablate_{spec0.data}_{spec0.model}_{args.fmt.name}",
                {"spec": spec0.__dict__, "fmt": args.fmt.name, "mul": str(args.mul),
                 "seeds": args.seeds,
                 "best": best, "table": table, "stats": stats,
                 "runs": {k: [r.to_json() for r in v] for k, v in runs.items()}},
                spec0, [(n, r) for n, r in runs.items() if n != "cumulative up to matmul"],
                f"{spec0.label()}: PA op groups, exact vs approximate derivatives "
                "(cf. Table 3)")
    return 0

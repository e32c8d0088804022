"""``pamsim sweep``: the mantissa width of the PAM inputs (the paper's Table 6, Appendix D)."""
from __future__ import annotations

from sim.cli import fail, int_in, multiplier_arg
from sim.commands.train import (MUL_HELP, add_spec_arguments, add_study_arguments, ops_arg,
                                seed_specs, seeds_arg, start_study, write_study)


def mantissas_arg(text: str) -> list[int]:
    import argparse
    try:
        ms = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        ms = []
    if not ms or any(not 1 <= m <= 23 for m in ms):
        raise argparse.ArgumentTypeError(f"got {text!r}; expected comma-separated "
                                         "integers in [1, 23], e.g. 23,7,4,3,2")
    return ms


def rows_arg(text: str) -> list[str]:
    """Comma-separated operand formats PAMConfig's ``fmt`` takes, as canonical names:
    OCP MX types (mxfp8_e4m3, mxfp4/16), scaling recipes (nvfp4, fp8_current,
    fp8_block/32), formats (p3109_p4, e4m3fn)."""
    import argparse

    from torch_bridge.config import operand_format
    try:
        return [operand_format(t.strip(), argname="--fmt").name
                for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub):
    p = sub.add_parser("sweep", help="train with PAM at several mantissa widths, several seeds "
                                     "(Table 6 of the paper)")
    add_spec_arguments(p, epochs_default=3)
    p.set_defaults(data="mnist")
    p.add_argument("--mantissa", type=mantissas_arg, default=[23, 7, 4, 3, 2],
                   help="mantissa bits of the PAM operands (23 with 8 exponent bits is "
                        "float32)")
    p.add_argument("--exp-bits", type=int_in(2, 8), default=8,
                   help="exponent bits of the PAM operands")
    p.add_argument("--fmt", "--mx", dest="mx", type=rows_arg, default=[],
                   help="operand formats to add as rows next to the eXmY rows: OCP MX types "
                        "(mxfp8_e4m3,mxfp6_e3m2,mxfp4: blocks of 32 along K), scaling "
                        "recipes (nvfp4, fp8_current, fp8_delayed, fp8_block/32: "
                        "docs/semantics.md §10b) or any format (p3109_p4)")
    p.add_argument("--seeds", type=seeds_arg, default=3, help="seeds 0..N-1")
    p.add_argument("--ops", type=ops_arg, default="matmul",
                   help="op groups made PA (Appendix D narrows only the matmul inputs)")
    p.add_argument("--backward", choices=("approx", "exact"), default="approx",
                   help="derivative kind of the PA op groups")
    p.add_argument("--mul", type=multiplier_arg, default="pam", help=MUL_HELP)
    add_study_arguments(p, "out/sweep")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch_bridge as tb
    from sim import train as T
    try:
        specs = seed_specs(args)
        for f in [f"e{args.exp_bits}m{m}" for m in args.mantissa] + args.mx:
            # validates --exp-bits with each width, and the multiplier with each
            tb.PAMConfig(f, backward=args.backward, ops=args.ops, mul=args.mul)
    except ValueError as exc:
        return fail(args, exc)
    from sim import study as S
    spec0 = specs[0]
    key, label = T.metric_names(spec0)
    mul = "" if args.mul == tb.PAMConfig().mul else f", mul={args.mul}"
    runs = start_study(args, specs, f"PAM on {'+'.join(sorted(args.ops))}, {args.backward} "
                                    f"backward{mul}")
    rows = S.table6(runs, args.mantissa, args.exp_bits, args.ops, args.backward, mx=args.mx,
                    mul=args.mul)
    table, stats = S.table6_markdown(key, label, rows)
    print(table)
    write_study(args, f"sweep_{spec0.data}_{spec0.model}",
                {"spec": spec0.__dict__, "seeds": args.seeds, "ops": sorted(args.ops),
                 "backward": args.backward, "mul": str(args.mul), "stats": stats,
                 "rows": [{"name": n, "config": c.describe() if c else "native float32",
                           "mantissa": getattr(c.fmt, "man_bits", None) if c else None,
                           "runs": [r.to_json() for r in runs]} for n, c, runs in rows]},
                spec0, [(n, r) for n, _, r in rows],
                f"{spec0.label()}: PAM mantissa width (cf. Table 6)")
    return 0

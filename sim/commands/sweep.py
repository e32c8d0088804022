"""``pamsim sweep``: the mantissa width of the PAM inputs (the paper's Table 6, Appendix D)."""
from __future__ import annotations

import json
from pathlib import Path

from sim.cli import fail, int_in, output_dir
from sim.commands.train import add_spec_arguments, ops_arg, seeds_arg, set_threads, spec_from_args


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


def mx_arg(text: str) -> list[str]:
    """Comma-separated OCP MX types (emu.mx), e.g. mxfp8_e4m3,mxfp6_e3m2,mxfp4."""
    import argparse

    import emu.mx
    try:
        return [emu.mx.mx_format(t.strip(), argname="--mx").name
                for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub):
    p = sub.add_parser("sweep", help="train with PAM at several mantissa widths, several seeds "
                                     "(Table 6 of the paper)")
    add_spec_arguments(p, epochs_default=3)
    p.set_defaults(data="mnist")
    p.add_argument("--mantissa", type=mantissas_arg, default=[23, 7, 4, 3, 2],
                   help="mantissa bits of the PAM operands (default 23,7,4,3,2; 23 with 8 "
                        "exponent bits is float32)")
    p.add_argument("--exp-bits", type=int_in(2, 8), default=8, help="exponent bits (default 8)")
    p.add_argument("--mx", type=mx_arg, default=[],
                   help="OCP MX operand types to add as rows next to the eXmY rows, e.g. "
                        "mxfp8_e4m3,mxfp6_e3m2,mxfp4 (blocks of 32 along K; default none)")
    p.add_argument("--seeds", type=seeds_arg, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--ops", type=ops_arg, default=frozenset({"matmul"}),
                   help="op groups made PA (default matmul: Appendix D narrows only the "
                        "matmul inputs)")
    p.add_argument("--backward", choices=("approx", "exact"), default="approx")
    p.add_argument("--out", type=output_dir, default="out/sweep")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch_bridge as tb
    from sim import train as T
    try:
        specs = [spec_from_args(args, seed=s) for s in range(args.seeds)]
        for f in [f"e{args.exp_bits}m{m}" for m in args.mantissa] + args.mx:
            tb.PAMConfig(f)                     # validates --exp-bits with each width
    except ValueError as exc:
        return fail(args, exc)
    set_threads(args)
    from sim import study as S
    out = Path(args.out)
    spec0 = specs[0]
    key, label = T.metric_names(spec0)
    print(f"pamsim sweep: {spec0.label()}, {spec0.epochs} epochs, seeds 0..{args.seeds - 1}, "
          f"PAM on {'+'.join(sorted(args.ops))}, {args.backward} backward")
    rows = S.table6(S.Runs(specs, out / "runs", not args.quiet), args.mantissa,
                    args.exp_bits, args.ops, args.backward, mx=args.mx)
    table, stats = S.table6_markdown(key, label, rows)
    print(table)
    stem = f"sweep_{spec0.data}_{spec0.model}"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(
        {"spec": spec0.__dict__, "seeds": args.seeds, "ops": sorted(args.ops),
         "backward": args.backward, "stats": stats,
         "rows": [{"name": n, "config": c.describe() if c else "native float32",
                   "mantissa": getattr(c.fmt, "man_bits", None) if c else None,
                   "runs": [r.to_json() for r in runs]} for n, c, runs in rows]}, indent=1))
    S.plot_rows(spec0, [(n, r) for n, _, r in rows], out / f"{stem}.png",
                f"{spec0.label()}: PAM mantissa width (cf. Table 6)")
    print(f"wrote {out / stem}.json and {out / stem}.png")
    return 0

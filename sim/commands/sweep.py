"""``pamsim sweep``: the mantissa width of the PAM inputs (the paper's Table 6, Appendix D)."""
from __future__ import annotations

import json
from pathlib import Path

from sim.commands.train import add_spec_arguments, ops_arg, set_threads, spec_from_args


def mantissas_arg(text: str) -> list[int]:
    import argparse
    try:
        ms = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        ms = []
    if not ms or any(not 1 <= m <= 23 for m in ms):
        raise argparse.ArgumentTypeError(f"--mantissa {text!r}: expected comma-separated "
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
    p.add_argument("--exp-bits", type=int, default=8, help="exponent bits (default 8)")
    p.add_argument("--mx", type=mx_arg, default=[],
                   help="OCP MX operand types to add as rows next to the eXmY rows, e.g. "
                        "mxfp8_e4m3,mxfp6_e3m2,mxfp4 (blocks of 32 along K; default none)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--ops", type=ops_arg, default=frozenset({"matmul"}),
                   help="op groups made PA (default matmul: Appendix D narrows only the "
                        "matmul inputs)")
    p.add_argument("--backward", choices=("approx", "exact"), default="approx")
    p.add_argument("--out", default="out/sweep")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch_bridge as tb
    from sim import train as T
    try:
        set_threads(args)
        specs = [spec_from_args(args, seed=s) for s in range(args.seeds)]
        fmts = [tb.PAMConfig(f).fmt for f in [f"e{args.exp_bits}m{m}" for m in args.mantissa]
                + args.mx]
        if args.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {args.seeds}")
    except ValueError as exc:
        print(f"pamsim sweep: error: {exc}")
        return 2
    out = Path(args.out)
    spec0 = specs[0]
    key, label = T.metric_names(spec0)
    print(f"pamsim sweep: {spec0.label()}, {spec0.epochs} epochs, seeds 0..{args.seeds - 1}, "
          f"PAM on {'+'.join(sorted(args.ops))}, {args.backward} backward")
    rows = [("float32 (native)", None, [])]
    rows += [(f"PAM {f.name}", tb.PAMConfig(f, backward=args.backward, ops=args.ops), [])
             for f in fmts]
    for spec in specs:
        rows[0][2].append(T.cached_baseline(spec, out / "cache", not args.quiet)[0])
        for name, cfg, runs in rows[1:]:
            runs.append(T.train(spec, cfg, name, progress=not args.quiet))
            print(f"  seed {spec.seed} {name:24} {label} = {T.fmt_metric(key, runs[-1])}",
                  flush=True)
    print(T.seed_table(spec0, rows))
    stem = f"sweep_{spec0.data}_{spec0.model}"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(
        {"spec": spec0.__dict__, "seeds": args.seeds, "ops": sorted(args.ops),
         "backward": args.backward,
         "rows": [{"name": n, "config": c.describe() if c else "native float32",
                   "mantissa": getattr(c.fmt, "man_bits", None) if c else None,
                   "runs": [r.to_json() for r in runs]} for n, c, runs in rows]}, indent=1))
    _plot(spec0, rows, out / f"{stem}.png")
    print(f"wrote {out / stem}.json and {out / stem}.png")
    return 0


def _plot(spec, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from sim import train as T
    key, label = T.metric_names(spec)
    scale = 100 if key == "acc" else 1
    base = [scale * r.final.get(key, np.nan) for r in rows[0][2]]
    fig, ax = plt.subplots(figsize=(6, 4))
    m, s = T.mean_std(base)
    ax.axhspan(m - s, m + s, color="0.85", label="float32 native (mean ± std)")
    ax.axhline(m, color="0.5")
    mx = [(c.fmt.name, runs) for _, c, runs in rows[1:] if not hasattr(c.fmt, "man_bits")]
    for i, (name, runs) in enumerate(mx):                  # MX rows: one level each
        ax.axhline(T.mean_std([scale * r.final.get(key, np.nan) for r in runs])[0],
                   ls="--", color=f"C{i + 1}", label=f"PAM {name} (mean)")
    rows = [row for row in rows[1:] if hasattr(row[1].fmt, "man_bits")]
    xs = [c.fmt.man_bits for _, c, _ in rows]
    stats = [T.mean_std([scale * r.final.get(key, np.nan) for r in runs])
             for _, _, runs in rows]
    ax.errorbar(xs, [a for a, _ in stats], [b for _, b in stats], marker="o", capsize=4,
                label="PAM (mean ± std over seeds)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("mantissa bits of the PAM operands")
    ax.set_ylabel(label + (" (%)" if key == "acc" else ""))
    ax.set_title(f"{spec.label()}: PAM mantissa width (cf. Table 6)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""``pamsim ablate``: the paper's Table 3 in miniature — each op group made piecewise
affine alone with exact and with approximate derivatives, then cumulatively with the
better kind for each (sections 3.3-3.4)."""
from __future__ import annotations

import json
from pathlib import Path

import emu
from sim.cli import fail, format_arg, output_dir
from sim.commands.train import add_spec_arguments, seeds_arg, set_threads, spec_from_args

GROUPS = ("matmul", "softmax", "layernorm", "loss")     # those with a backward pass


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
    import torch_bridge as tb
    from sim import train as T
    try:
        specs = [spec_from_args(args, seed=s) for s in range(args.seeds)]
    except ValueError as exc:
        return fail(args, exc)
    set_threads(args)
    out = Path(args.out)
    spec0 = specs[0]
    key, label = T.metric_names(spec0)
    up = T.higher_is_better(key)
    print(f"pamsim ablate: {spec0.label()}, {spec0.epochs} epochs, seeds 0..{args.seeds - 1}, "
          f"PAM format {args.fmt.name}; metric: {label}")
    runs: dict[str, list] = {}

    def do(name, cfg):
        if name not in runs:
            runs[name] = []
            for spec in specs:
                if cfg is None:
                    r = T.cached_baseline(spec, out / "cache", not args.quiet)[0]
                else:
                    r = T.train(spec, cfg, name, progress=not args.quiet)
                runs[name].append(r)
                print(f"  seed {spec.seed} {name:28} {label} = {T.fmt_metric(key, r)}",
                      flush=True)
        return runs[name]

    do("baseline", None)
    best = {}
    for op in GROUPS:
        for kind in ("exact", "approx"):
            do(f"{op} {kind}", tb.PAMConfig(args.fmt, ops={op}, backward={op: kind}))
        ex, ap = (T.summary(key, runs[f"{op} {k}"])[0] for k in ("exact", "approx"))
        best[op] = "exact" if (ex > ap if up else ex < ap) else "approx"
    do("optimizer", tb.PAMConfig(args.fmt, ops={"optimizer"}))
    order = (*GROUPS, "optimizer")
    cumulative = {}
    for i, op in enumerate(order):
        ops = set(order[:i + 1])
        kinds = {g: best[g] for g in GROUPS if g in ops}
        name = f"cumulative up to {op}"
        if i == 0:
            runs[name] = runs[f"matmul {best['matmul']}"]
        else:
            do(name, tb.PAMConfig(args.fmt, ops=ops, backward=kinds))
        cumulative[op] = name
    table = _table(spec0, runs, best, cumulative)
    print(table)
    stem = f"ablate_{spec0.data}_{spec0.model}_{args.fmt.name}"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(
        {"spec": spec0.__dict__, "fmt": args.fmt.name, "seeds": args.seeds, "best": best,
         "table": table, "runs": {k: [r.to_json() for r in v] for k, v in runs.items()}},
        indent=1))
    _plot(spec0, runs, cumulative, out / f"{stem}.png")
    print(f"wrote {out / stem}.json and {out / stem}.png")
    return 0


def _table(spec, runs, best, cumulative) -> str:
    from sim import train as T
    key, label = T.metric_names(spec)
    base = T.summary(key, runs["baseline"])[0]
    w = 34
    lines = [f"{label}; baseline (native float32): {T.cell(key, runs['baseline'])}",
             f"{'PA op(s)':10}  {'exact bwd':{w}}  {'approx bwd':{w}}  {'cumulative':{w}}"]
    lines.append("-" * len(lines[-1]))
    for op in (*GROUPS, "optimizer"):
        if op == "optimizer":
            single = T.cell(key, runs["optimizer"], base)
            ex, ap = single, "(no backward pass)"
        else:
            ex = T.cell(key, runs[f"{op} exact"], base) + (" *" if best[op] == "exact" else "")
            ap = T.cell(key, runs[f"{op} approx"], base) + (" *" if best[op] == "approx" else "")
        lines.append(f"{op:10}  {ex:{w}}  {ap:{w}}  {T.cell(key, runs[cumulative[op]], base):{w}}")
    lines.append("* the better derivative, used in the cumulative column")
    return "\n".join(lines)


def _plot(spec, runs, cumulative, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from sim import train as T
    key, label = T.metric_names(spec)
    groups = (*GROUPS, "optimizer")
    series = {"exact bwd": [f"{g} exact" if g != "optimizer" else "optimizer" for g in groups],
              "approx bwd": [f"{g} approx" if g != "optimizer" else None for g in groups],
              "cumulative": [cumulative[g] for g in groups]}
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(groups))
    for i, (name, keys) in enumerate(series.items()):
        stats = [T.summary(key, runs[k]) if k else (np.nan, 0.0) for k in keys]
        ax.bar(x + (i - 1) * 0.27, [m for m, _ in stats], 0.27, yerr=[s for _, s in stats],
               capsize=3, label=name)
    m, _ = T.summary(key, runs["baseline"])
    ax.axhline(m, color="k", ls="--", lw=1, label="native float32")
    ax.set_xticks(x, groups)
    ax.set_ylabel(label + (" (%)" if key == "acc" else ""))
    lo = min(T.summary(key, v)[0] for v in runs.values())
    hi = max(T.summary(key, v)[0] for v in runs.values())
    if np.isfinite(lo) and np.isfinite(hi) and hi > lo:
        pad = 0.15 * (hi - lo)
        ax.set_ylim(lo - pad, hi + pad)
    ax.set_title(f"{spec.label()}: PA op groups, exact vs approximate derivatives (cf. Table 3)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""``pamsim study table3|table6|multipliers|recipes``: the paper's Tables 3 and 6, the
multipliers beside native float32 (issue 23) and the scaling recipes with each multiplier
(issue 26), on two set-ups, over seeds, with Welch's t-test against native float32, plots
and a markdown report (sim/study.py)."""
from __future__ import annotations

import json
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import emu
from sim.cli import fail, format_arg, int_in, multiplier_arg, output_dir, settings_tag
from sim.commands.sweep import mantissas_arg
from sim.commands.train import MAX_THREADS, MUL_HELP, multipliers_arg, ops_arg, seeds_arg

#: set-up -> (title, TrainSpec keywords, quick TrainSpec keywords) per study.  Sizes
#: were chosen so that the native baseline plateaus within the run (docs/studies.md
#: shows its per-epoch curve, and what a run twice as long reaches) and a study fits
#: about an hour of this 2-core CPU.  The LM's 1,000 steps take it well past the bigram
#: plateau (3.39 bits/char) where 100 steps left it; the ViT gains 0.3 points more in
#: twice its 8 epochs.
_LM = dict(data="text", model="charlm", dim=32, depth=1, seq_len=32, batch_size=32,
           text_chars=100_000, steps_per_epoch=100, lr=2e-2, epochs=10)
_VIT = dict(data="digits", model="vit", dim=32, depth=1, batch_size=32, lr=5e-3, epochs=8)
_CNN = dict(data="digits", model="cnn", batch_size=32, lr=5e-3, epochs=3)
_QUICK = dict(epochs=2, max_steps=4, batch_size=8)
_QUICK_MODEL = {"charlm": dict(dim=8, seq_len=8, steps_per_epoch=2, text_chars=20_000),
                "vit": dict(dim=8), "cnn": {}}
SETUPS = {"table3": {"lm": ("char transformer LM on KJV", _LM),
                     "vision": ("ViT on digits", _VIT)},
          "table6": {"lm": ("char transformer LM on KJV", _LM),
                     "vision": ("CNN on digits", _CNN)}}
SETUPS["multipliers"] = SETUPS["recipes"] = SETUPS["table3"]
#: the recipes study's defaults: float8 tensorwise (e4m3/e5m2 hybrid), MXFP8, NVFP4, MXFP4,
#: block-scaled float8, each with the exact product and with PAM, on the matmuls
RECIPE_DEFAULTS = {"formats": "fp8_current,mxfp8_e4m3,nvfp4,mxfp4_e2m1,fp8_block",
                   "muls": "exact,pam", "groups": "matmul"}


def _operand_formats_arg(text):
    """argparse type: comma-separated operand formats, MX types or scaling recipes."""
    import argparse

    from sim.commands.train import operand_format_arg
    fmts = [operand_format_arg(t.strip()) for t in text.split(",") if t.strip()]
    if not fmts:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected comma-separated formats "
                                         "or recipes, e.g. bf16,nvfp4")
    return fmts


def _groups_arg(text):
    """argparse type: op-group sets separated by '/', each what --ops takes (matmul, all,
    matmul+softmax written matmul,softmax)."""
    import argparse
    sets = [t.strip() for t in text.split("/") if t.strip()]
    if not sets:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected op-group sets separated by "
                                         "'/', e.g. matmul/all")
    return [(t, ops_arg(t)) for t in sets]


def _setups_arg(text):
    import argparse
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or set(names) - {"lm", "vision"}:
        raise argparse.ArgumentTypeError(f"--setups {text!r}: expected lm, vision or both")
    return names


def register(sub):
    p = sub.add_parser("study", help="the paper's Table 3 or Table 6, or the multipliers, on a "
                                     "char LM and a vision model, seeds, Welch's t-test, plots, "
                                     "markdown")
    p.add_argument("table", choices=("table3", "table6", "multipliers", "recipes"),
                   help="table3: per-op derivatives; table6: mantissa widths; multipliers: "
                        "native float32 beside each of --muls at each of --formats and "
                        "--groups; recipes: the same with scaling recipes as --formats ("
                        f"default {RECIPE_DEFAULTS['formats']}, --muls "
                        f"{RECIPE_DEFAULTS['muls']}, --groups {RECIPE_DEFAULTS['groups']})")
    p.add_argument("--setups", type=_setups_arg, default=["lm", "vision"],
                   help="comma-separated: lm (char transformer on KJV, val bits/char), "
                        "vision (digits: ViT for table3, CNN for table6)")
    p.add_argument("--seeds", type=seeds_arg, default=3, help="seeds 0..N-1")
    p.add_argument("--fmt", type=format_arg, default=emu.float32,
                   help="table3: format of the PAM matmul operands")
    p.add_argument("--mantissa", type=mantissas_arg, default=[23, 7, 4, 3, 2],
                   help="table6: mantissa bits of the PAM operands")
    p.add_argument("--mul", type=multiplier_arg, default="pam",
                   help="table3, table6: " + MUL_HELP.replace("the matmuls' multiplier",
                                                              "the multiplier of every config"))
    p.add_argument("--muls", type=multipliers_arg, default="exact,pam,lmul,cpam2-unbiased",
                   help="multipliers, recipes: the rows beside native float32")
    p.add_argument("--formats", type=_operand_formats_arg, default="bf16,float8_e4m3fn",
                   help="multipliers, recipes: operand formats (MX types and scaling "
                        "recipes too), one set-up each")
    p.add_argument("--groups", type=_groups_arg, default="matmul/all",
                   help="multipliers: op groups made PA, one set-up each, sets separated by "
                        "'/' (matmul: every matmul; all: every multiply)")
    p.add_argument("--quick", action="store_true", help="tiny models and a few steps "
                   "(tests; the numbers mean nothing)")
    p.add_argument("--out", type=output_dir, default="out/study",
                   help="directory: runs/ (one JSON per run: resumes), <table>.md/.json/.png")
    p.add_argument("--threads", type=int_in(0, MAX_THREADS), default=1,
                   help="torch threads (0: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from sim import study as S
    from sim import train as T
    try:
        setups = {}
        for name in args.setups:
            title, kw = SETUPS[args.table][name]
            if args.quick:
                kw = {**kw, **_QUICK, **_QUICK_MODEL[kw["model"]]}
            setups[name] = (title, [T.TrainSpec(**kw, seed=s) for s in range(args.seeds)])
        if args.table in ("multipliers", "recipes"):
            default = args.parser.get_default("mul")
            if str(args.mul) != default:
                raise ValueError(f"--mul {args.mul} is for table3 and table6; the "
                                 f"{args.table} study takes its rows from --muls")
        elif args.table == "table3":
            S.table3_configs(args.fmt, args.mul)
        else:
            S.table6_configs(args.mantissa, mul=args.mul)
    except ValueError as exc:
        return fail(args, exc)
    if args.table in ("multipliers", "recipes"):
        return _multipliers(args, setups, *_rows(args))
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    tag = settings_tag(args, ignore=("setups", "out", "threads", "quiet"))
    t0 = time.perf_counter()
    sections, summary, compute = [], {}, 0.0
    for name, (title, specs) in setups.items():
        key, label = T.metric_names(specs[0])
        print(f"pamsim study {args.table}: {title} ({specs[0].label()}), "
              f"{len(specs)} seeds; metric: {label}", flush=True)
        runs = S.Runs(specs, out / "runs" / name, progress=not args.quiet)
        if args.table == "table3":
            got, best, cumulative = S.table3(runs, args.fmt, key, args.mul)
            md, js = S.table3_markdown(key, got, best, cumulative)
            rows = [(n, got[n]) for n in got if not n.startswith("cumulative up to matmul")]
        else:
            got = S.table6(runs, args.mantissa, mul=args.mul)
            md, js = S.table6_markdown(key, label, got)
            rows = [(n, r) for n, _, r in got]
        compute += sum(r.seconds for _, rs in rows for r in rs)
        conv = S.converged(key, rows[0][1])
        png = out / f"{args.table}_{name}{tag}.png"
        S.plot_rows(specs[0], rows, png, f"{args.table}: {title}, {len(specs)} seeds")
        curve = ", ".join(f"{v:.2f}" if key == "acc" else f"{v:.3f}" for v in conv["curve"])
        sections.append(
            f"### {title}: {label}\n\n"
            f"`{_spec_text(specs[0])}`, seeds 0..{len(specs) - 1}.  Native float32 per "
            f"epoch (mean over seeds): {curve} (change in the last epoch: "
            f"{conv['last_change']:+.3g}).\n\n{md}\n\n![{args.table} {name}]"
            f"({png.name})\n")
        summary[name] = {"title": title, "spec": specs[0].__dict__, "metric": key,
                         "native_curve": conv, "rows": js,
                         **({"best": best} if args.table == "table3" else {})}
    wall = time.perf_counter() - t0
    command = (f"pamsim study {args.table} --setups {','.join(setups)} --seeds {args.seeds}"
               + (f" --fmt {args.fmt.name}" if args.table == "table3" else
                  f" --mantissa {','.join(map(str, args.mantissa))}")
               + ("" if str(args.mul) == "pam" else f" --mul {args.mul}")
               + (" --quick" if args.quick else "") + f" --out {args.out}")
    head = (f"## {'Table 3' if args.table == 'table3' else 'Table 6'} in miniature\n\n"
            f"Command: `{command}`"
            f"  \nMachine: {_machine()}; date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
            f"  \nRuntime: {wall / 60:.1f} min wall for this invocation; the runs took "
            f"{compute / 60:.1f} min of training in all (cached runs count their own time)\n")
    text = head + "\n" + "\n".join(sections)
    stem = (args.table if set(setups) == {"lm", "vision"} else
            f"{args.table}_{'_'.join(setups)}") + tag
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    print(text)
    print(f"wrote {out / stem}.md, .json and the PNGs")
    return 0


def _rows(args) -> tuple:
    """(formats, multipliers, op-group sets) of a multipliers or recipes study: the
    options, where the recipes study takes RECIPE_DEFAULTS for those left at default."""
    got = {k: getattr(args, k) for k in RECIPE_DEFAULTS}
    if args.table == "recipes":
        for k, text in RECIPE_DEFAULTS.items():
            action = next(a for a in args.parser._actions if a.dest == k)
            if got[k] == action.type(args.parser.get_default(k)):
                got[k] = action.type(text)
    return got["formats"], got["muls"], got["groups"]


def _multipliers(args, setups, formats, muls, groups) -> int:
    """``pamsim study multipliers|recipes``: per model set-up, per op-group set and operand
    format (or recipe), native float32 beside each multiplier of ``muls``; a set-up
    PAMConfig refuses is reported in one line and left out."""
    from sim import study as S
    from sim import train as T
    out = Path(args.out)
    tag = settings_tag(args, ignore=("setups", "out", "threads", "quiet"))
    t0 = time.perf_counter()
    sections, summary, compute, panels = [], {}, 0.0, {}
    for name, (title, specs) in setups.items():
        key, label = T.metric_names(specs[0])
        print(f"pamsim study {args.table}: {title} ({specs[0].label()}), {len(specs)} "
              f"seeds; metric: {label}", flush=True)
        runs = S.Runs(specs, out / "runs" / name, progress=not args.quiet)
        summary[name] = {"title": title, "spec": specs[0].__dict__, "metric": key, "setups": {}}
        sections.append(f"### {title}: {label}\n\n`{_spec_text(specs[0])}`, seeds "
                        f"0..{len(specs) - 1}.\n")
        native = None
        for gname, ops in groups:
            for fmt in formats:
                what = f"{fmt.name} operands, ops={gname}"
                configs, refused = S.multiplier_configs(fmt, ops, muls)
                why = "".join(f"\n* {m}: not runnable: {exc}" for m, exc in refused)
                for m, exc in refused:
                    print(f"pamsim study {args.table}: set-up {name}, {what}, {m}: not "
                          f"runnable: {exc}", flush=True)
                if not configs:
                    sections.append(f"#### {what}\n{why}\n")
                    summary[name]["setups"][what] = {"not_runnable": dict(refused)}
                    continue
                rows = S.multipliers(runs, configs)
                native = rows[0][2]
                facts = [T.multiplier_facts(None, fmt, emu.float32)] + [
                    T.multiplier_facts(c.mul, fmt, c.acc) for _, c in configs]
                md, js = S.multipliers_markdown(key, label, rows, facts)
                compute += sum(r.seconds for _, _, rs in rows[1:] for r in rs)
                panels.setdefault(name, []).append((what, rows, facts))
                sections.append(f"#### {what}\n\n{md}\n{why}\n" if why else
                                f"#### {what}\n\n{md}\n")
                summary[name]["setups"][what] = {"fmt": fmt.name, "ops": sorted(ops),
                                                 "rows": js, "not_runnable": dict(refused)}
        if native is not None:
            compute += sum(r.seconds for r in native)
            conv = S.converged(key, native)
            summary[name]["native_curve"] = conv
            curve = ", ".join(f"{v:.2f}" if key == "acc" else f"{v:.3f}" for v in conv["curve"])
            sections.append(f"Native float32 per epoch (mean over seeds): {curve} (change in "
                            f"the last epoch: {conv['last_change']:+.3g}).\n")
            png = out / f"{args.table}_{name}{tag}.png"
            S.plot_quality_vs_cost(key, label, panels[name], png,
                                   f"{args.table}: {title}, {len(specs)} seeds")
            sections.append(f"![{args.table} {name}]({png.name})\n")
    wall = time.perf_counter() - t0
    command = (f"pamsim study {args.table} --setups {','.join(setups)} --seeds {args.seeds} "
               f"--muls {','.join(map(str, muls))} "
               f"--formats {','.join(f.name for f in formats)} "
               f"--groups {'/'.join(g for g, _ in groups)}"
               + (" --quick" if args.quick else "") + f" --out {args.out}")
    head = (("## The multipliers" if args.table == "multipliers" else
             "## Scaling recipes and multipliers") + "\n\n"
            f"Command: `{command}`"
            f"  \nMachine: {_machine()}; date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
            f"  \nRuntime: {wall / 60:.1f} min wall for this invocation; the runs took "
            f"{compute / 60:.1f} min of training in all (cached runs count their own time)\n\n"
            "Cells: mean ± sd over seeds; change from native float32; p = Welch's t-test "
            "against native (resolved at p < 0.05, else 'not resolved'); the multiplier's "
            "relative error over every pair of normal mantissas of the operand format "
            "(a recipe's or MX type's: its forward elements) "
            "(sampled for float32); its MAC (float32 accumulator) in the 45 nm model of "
            "docs/costs.md, energy and area as % of the float-multiplier MAC in the same "
            "format.\n")
    text = head + "\n" + "\n".join(sections)
    stem = (args.table if set(setups) == {"lm", "vision"} else
            f"{args.table}_{'_'.join(setups)}") + tag
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    print(text)
    print(f"wrote {out / stem}.md, .json and the PNGs")
    return 0


def _spec_text(spec) -> str:
    keys = ("data", "model", "dim", "depth", "epochs", "batch_size", "lr", "seq_len",
            "steps_per_epoch", "text_chars", "max_steps")
    skip = {"seq_len", "steps_per_epoch", "text_chars"} if spec.data != "text" else set()
    return " ".join(f"{k}={getattr(spec, k)}" for k in keys
                    if k not in skip and getattr(spec, k) not in (0, ""))


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next(ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        model = platform.processor() or "unknown CPU"
    import os
    return f"{model}, {os.cpu_count()} logical CPUs"

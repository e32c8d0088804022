"""``pamsim train``: train a model on emulated PA hardware and its float32 baseline."""
from __future__ import annotations

import json
from pathlib import Path

import emu
from sim.cli import (fail, float_in, format_arg, int_in, multiplier_arg, nonneg_int, output_dir,
                     positive_int, settings_tag)

#: more threads than this is a typo, not a machine
MAX_THREADS = 1024
#: ablate/sweep train every configuration once per seed 0..N-1, N at most this
MAX_SEEDS = 100
seeds_arg = int_in(1, MAX_SEEDS)

OPS_HELP = ("comma-separated op groups made piecewise affine: matmul, softmax, layernorm, "
            "loss, optimizer, or 'all' (fully multiplication-free)")
MUL_HELP = ("the multiplier of every product of --ops: pam, lmul, exact, float, "
            "cpam2-unbiased, ... an offset such as pam+2, or table:NAME (pamsim multiplier "
            "import) (docs/semantics.md \"Multipliers\"); cpamK needs --pa-fmt of at most 10 "
            "mantissa bits unless --ops matmul")
MULS_HELP = ("comma-separated multipliers, one run each beside the one float32 baseline "
             "(e.g. exact,pam,lmul); " + MUL_HELP.split("; ", 1)[0].replace(
                 "the multiplier of every product of --ops: ", "names: ") + "; PAMConfig says what each "
             "supports with the other options")


def multipliers_arg(text: str) -> list:
    """argparse type: a comma-separated, non-empty list of distinct multipliers."""
    import argparse
    muls = [multiplier_arg(t.strip()) for t in text.split(",") if t.strip()]
    if not muls or len(set(muls)) < len(muls):
        raise argparse.ArgumentTypeError(f"got {text!r}; expected distinct comma-separated "
                                         "multipliers, e.g. exact,pam,lmul")
    return muls


def operand_format_arg(text: str):
    """argparse type: what PAMConfig's ``fmt`` accepts, a number format (bf16, e8m4,
    p3109_p4), an OCP MX type (mxfp8_e4m3, mxfp4/16) or a scaling recipe (nvfp4,
    fp8_current, fp8_delayed/h16, fp8_block/32)."""
    import argparse

    from torch_bridge.config import operand_format
    try:
        return operand_format(text, argname="--fmt")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def ops_arg(text: str) -> frozenset:
    """argparse type: 'all' or a comma-separated list of op groups."""
    import argparse

    from torch_bridge import OP_GROUPS
    names = OP_GROUPS if text == "all" else tuple(s.strip() for s in text.split(",") if s.strip())
    bad = sorted(set(names) - set(OP_GROUPS))
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown op group(s) {bad or [text]}; expected "
                                         f"'all' or names from {OP_GROUPS}")
    return frozenset(names)


def add_spec_arguments(p, epochs_default: int):
    """The options every training command shares (data, model, schedule, threads)."""
    from sim.train import DATASETS, MAX_BATCH, MAX_DEPTH, MAX_DIM
    from workloads.models import HEADS, MODELS
    p.add_argument("--data", choices=DATASETS, default="digits",
                   help="digits (sklearn 8x8), mnist (5,000-image subset) or text "
                        "(KJV characters)")
    p.add_argument("--model", choices=list(MODELS), default="",
                   help="if not given: mlp for digits, vit for mnist, charlm for text")
    p.add_argument("--epochs", type=positive_int, default=epochs_default,
                   help="passes over the training set (text: of --steps-per-epoch batches)")
    p.add_argument("--batch-size", type=int_in(1, MAX_BATCH), default=64,
                   help=f"examples per step, at most {MAX_BATCH}")
    p.add_argument("--lr", type=float_in(0), default=3e-3,
                   help="peak learning rate (linear warm-up over 5%% of the steps, then "
                        "cosine decay)")
    p.add_argument("--weight-decay", type=float_in(0), default=0.01,
                   help="decoupled weight decay (AdamW) or L2 (SGD)")
    p.add_argument("--label-smoothing", type=float_in(0, 1), default=0.1,
                   help="label smoothing of the cross-entropy loss, in [0, 1]")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="adamw, or sgd with momentum 0.9")
    p.add_argument("--max-steps", type=nonneg_int, default=0,
                   help="stop each run after this many steps (0: all epochs)")
    p.add_argument("--train-subset", type=nonneg_int, default=0,
                   help="train on only the first N training images (0: all)")
    p.add_argument("--dim", type=int_in(0, MAX_DIM), default=0,
                   help=f"transformer width (vit, charlm), a multiple of {HEADS} up to {MAX_DIM}")
    p.add_argument("--depth", type=int_in(0, MAX_DEPTH), default=0,
                   help=f"transformer blocks (vit, charlm), up to {MAX_DEPTH}")
    p.add_argument("--steps-per-epoch", type=positive_int, default=100,
                   help="text data: batches per epoch")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where tensors live: cpu, cuda (emu's CUDA kernels, same "
                        "bits for the PA ops), auto (cuda when torch sees a GPU)")
    p.add_argument("--threads", type=int_in(0, MAX_THREADS), default=1,
                   help="torch and Numba threads (0: torch's choice); 1 suits these small "
                        "models, which are dominated by per-op overhead, and on a shared "
                        "machine a parallel region waits for descheduled workers")


def set_threads(args):
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)


def device_from_args(args) -> str:
    """'cpu' or 'cuda' for --device (auto: cuda when torch sees a GPU); ValueError for
    cuda without one."""
    import torch
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device "
                         "(torch.cuda.is_available() is False)")
    return args.device


def spec_from_args(args, **override):
    from sim.train import TrainSpec
    kw = dict(data=args.data, model=args.model, epochs=args.epochs,
              batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
              label_smoothing=args.label_smoothing, optimizer=args.optimizer,
              max_steps=args.max_steps, train_subset=args.train_subset, dim=args.dim,
              depth=args.depth, steps_per_epoch=args.steps_per_epoch,
              seed=getattr(args, "seed", 0), device=device_from_args(args))
    return TrainSpec(**{**kw, **override})


def add_study_arguments(p, out_default: str):
    """A study's last options (ablate, sweep): --out and --quiet."""
    p.add_argument("--out", type=output_dir, default=out_default,
                   help="directory for runs/ (one JSON per run: a study resumes) and the "
                        "results' JSON and PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-run lines")


def seed_specs(args) -> list:
    """A multi-seed study's runs (ablate, sweep): one spec per seed 0..--seeds-1;
    ValueError for a bad combination of options."""
    return [spec_from_args(args, seed=s) for s in range(args.seeds)]


def start_study(args, specs, detail: str):
    """Set the threads and print a study's header line (seed 0's spec, the seeds, then
    ``detail``); the sim.study.Runs of ``specs`` under --out."""
    from sim import study as S
    set_threads(args)
    spec = specs[0]
    print(f"pamsim {args.command}: {spec.label()}, {spec.epochs} epochs, seeds "
          f"0..{args.seeds - 1}, {detail}")
    return S.Runs(specs, Path(args.out) / "runs", not args.quiet)


def write_study(args, stem: str, record: dict, spec, rows, title: str):
    """A study's results in --out: ``stem``.json (``record``) and ``stem``.png (``rows``
    plotted by sim.study.plot_rows), ``stem`` followed by the options changed from their
    defaults."""
    from sim import study as S
    out = Path(args.out)
    stem += settings_tag(args, ignore=("data", "model", "fmt", "out", "quiet", "threads"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
    S.plot_rows(spec, rows, out / f"{stem}.png", title)
    note = still_learning(spec, *rows[0][1])
    if note:
        print(note)
    print(f"wrote {out / stem}.json and {out / stem}.png")


def register(sub):
    from sim.train import MAX_SEED
    p = sub.add_parser("train", help="train on emulated PA hardware next to a float32 baseline "
                                     "(the main job)")
    add_spec_arguments(p, epochs_default=12)
    p.add_argument("--fmt", type=operand_format_arg, default=emu.bfloat16,
                   help="format of the PAM matmul operands, e.g. float32, e8m4, e5m2, "
                        "p3109_p4, an OCP MX type, e.g. mxfp8_e4m3, mxfp4/16, or a scaling "
                        "recipe, e.g. nvfp4, fp8_current, fp8_delayed, fp8_block/32 "
                        "(docs/semantics.md §10b)")
    p.add_argument("--ops", type=ops_arg, default="all", help=OPS_HELP)
    p.add_argument("--backward", choices=("approx", "exact", "paper"), default="paper",
                   help="derivative kind of every op group: approx, exact, or paper (approx "
                        "except exact for the loss, the choice of the paper's section 3.4 / "
                        "Table 3)")
    p.add_argument("--exact", type=ops_arg, default=frozenset(),
                   help="op groups that use the exact derivative regardless of --backward "
                        "(e.g. 'loss', the paper's best choice)")
    p.add_argument("--pa-fmt", type=format_arg, default=emu.float32,
                   help="format of the elementwise PA ops (softmax, layernorm, loss, optimizer)")
    p.add_argument("--mul", type=multipliers_arg, default="pam", help=MULS_HELP)
    p.add_argument("--rounding", choices=("nearest_even", "stochastic", "toward_zero"),
                   default="nearest_even", help="how operands are rounded into the formats")
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                   help=f"of the weights, the batches and stochastic rounding, in [0, {MAX_SEED}]")
    p.add_argument("--out", type=output_dir, default="out/train",
                   help="directory for the JSON and PNG (their names carry every option "
                        "changed from what this help shows)")
    p.add_argument("--no-cache", action="store_true",
                   help="retrain the float32 baseline instead of reusing the one cached "
                        "under --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--nproc", type=positive_int, default=1,
                   help="data-parallel processes (DDP over gloo on the CPU, nccl with --device "
                        "cuda; --batch-size is the global batch).  Under torchrun: its "
                        "WORLD_SIZE")
    p.set_defaults(run=run)


def config_from_args(args, mul=None):
    """The PAMConfig of ``args`` with the multiplier ``mul`` (None: the first of --mul)."""
    from torch_bridge import OP_GROUPS, PAMConfig
    base = {op: ("exact" if args.backward == "paper" and op == "loss" else
                 "approx" if args.backward == "paper" else args.backward) for op in OP_GROUPS}
    backward = {op: ("exact" if op in args.exact else base[op]) for op in OP_GROUPS}
    return PAMConfig(fmt=args.fmt, backward=backward, ops=args.ops, rounding=args.rounding,
                     pa_fmt=args.pa_fmt, mul=args.mul[0] if mul is None else mul)


#: a baseline whose headline metric moved more than this in its last epoch has not
#: converged (test accuracy in points, validation bits per character)
PLATEAU = {"acc": 1.0, "bpc": 0.01}


def still_learning(spec, *bases) -> str:
    """A note when the float32 baseline (the mean of ``bases``, one run per seed) is
    still improving at the end of its run: the
    comparison then measures how fast PA training learns, not how well (issue 17: the
    digits ViT with 2x2 patches at 5 epochs, native 37-65 % over seeds 0-4 and still up
    to +7.5 points an epoch)."""
    import math

    from sim import study as S
    from sim import train as T
    key = T.metric_names(spec)[0]
    change = S.converged(key, bases)["last_change"]
    if math.isnan(change) or abs(change) <= PLATEAU[key]:      # NaN: a single epoch
        return ""
    unit = " points" if key == "acc" else " bits/char"
    return (f"note: the float32 baseline is still learning ({change:+.3g}{unit} in its last "
            f"epoch), so this compares learning speed, not final quality; train longer "
            f"(--epochs) to compare converged models")


def _job(spec, configs, names, cache_dir, progress):
    """The float32 baseline (cached) and one run per config, on every rank of a DDP group."""
    from sim import train as T
    base, cached = T.cached_baseline(spec, cache_dir, progress=progress)
    return base, cached, [T.train(spec, c, n, progress=progress) for c, n in zip(configs, names)]


def run(args) -> int:
    import os

    from sim import train as T
    from sim import train_distributed as TD
    nproc = TD.torchrun_world_size() or args.nproc
    try:
        spec = spec_from_args(args)
        configs = [config_from_args(args, m) for m in args.mul]
        config = configs[0]
        # several: each beside its error statistics and cost per MAC, known before training
        facts = None if len(configs) == 1 else [
            T.multiplier_facts(m, config.fmt, config.acc) for m in (None, *args.mul)]
        if not 1 <= nproc <= spec.batch_size:
            raise ValueError(f"nproc must lie in [1, batch_size={spec.batch_size}], got {nproc}")
    except ValueError as exc:
        return fail(args, exc)
    set_threads(args)
    out = Path(args.out)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        backend = "nccl" if spec.device == "cuda" else "gloo"
        ddp = f"; DDP on {nproc} processes ({backend})" if nproc > 1 else ""
        what = (f"PAM config: {config.describe()}" if len(configs) == 1 else
                "configs: " + "; ".join(c.describe() for c in configs))
        print(f"pamsim train: {spec.label()}, {spec.epochs} epochs, seed {spec.seed}; "
              f"{what}{ddp}", flush=True)
    names = ["PAM"] if len(configs) == 1 else [T.run_name(m) for m in args.mul]
    base, cached, runs = TD.run(_job, nproc, spec, configs, names,
                                None if args.no_cache else out / "cache", not args.quiet,
                                threads=args.threads,
                                backend="nccl" if spec.device == "cuda" else "gloo")
    if not rank0:
        return 0
    if facts is None:
        print(T.comparison_table(spec, [base, *runs]))
    else:
        print(T.multiplier_table(spec, [base, *runs], facts))
    note = still_learning(spec, base)
    if note:
        print(note)
    if cached:
        print(f"(float32 baseline reused from {out / 'cache'}; --no-cache retrains it)")
    # '/' of a block size (mxfp4/16, fp8_block/32) is no file name character
    fmt = config.fmt.name.replace("/", "-")
    stem = f"train_{spec.data}_{spec.model}_{fmt}" + settings_tag(
        args, ignore=("data", "model", "fmt", "out", "no_cache", "quiet", "threads"))
    out.mkdir(parents=True, exist_ok=True)
    js = out / f"{stem}.json"
    png = out / f"{stem}.png"
    record = {"spec": spec.__dict__, "config": config.describe(), "nproc": nproc,
              "baseline_cached": cached, "runs": [r.to_json() for r in (base, *runs)]}
    if facts is None:
        js.write_text(json.dumps(record, indent=1))
        T.plot_runs(spec, [base, *runs], png)
    else:
        record["config"] = [c.describe() for c in configs]
        record["multipliers"] = facts
        js.write_text(json.dumps(record, indent=1))
        T.plot_multipliers(spec, [base, *runs], facts, png)
    print(f"wrote {js} and {png}")
    return 0

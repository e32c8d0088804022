"""``pamsim memory-errors | memory-saved | memory-study``: measurements of the
memory-saving activations (sim/memory_study.py; numbers recorded in docs/memory.md).

* ``memory-errors``: L2/L∞ error of the backward derivative, few-bit 1-8 bits vs the
  inverted activation (Inverted Activations, Fig. 5), table and ``--png`` plot.
* ``memory-saved``: bytes kept for backward (saved_tensors_hooks) per model and variant.
* ``memory-study``: an MLP (digits or MNIST subset) trained with every variant,
  several seeds; loss plot and final table.
"""
from __future__ import annotations

import time

from sim.cli import int_in, output_file, positive_int
from sim.commands.train import seeds_arg

#: grid points of memory-errors: more would not fit this machine's memory
MAX_POINTS = 20_000_001


def register(sub):
    p = sub.add_parser("memory-errors", help="backward-derivative error: few-bit 1-8 bits "
                                             "vs inverted activations (Inverted Act., Fig. 5)")
    p.add_argument("--activations", nargs="+", default=["gelu", "silu"],
                   choices=["gelu", "gelu_tanh", "silu", "mish"], help="activations to measure")
    p.add_argument("--points", type=int_in(2, MAX_POINTS), default=2_000_001,
                   help=f"float32 grid points on [-10, 10], at most {MAX_POINTS}")
    p.add_argument("--png", type=output_file, metavar="PATH",
                   help="write the Fig. 5-style plot here")
    p.set_defaults(run=run_errors)

    p = sub.add_parser("memory-saved", help="bytes saved for backward, measured with "
                                            "saved_tensors_hooks: native/few-bit/InvAct/PA")
    p.add_argument("--quick", action="store_true", help="small blocks, no MiniLM")
    p.set_defaults(run=run_saved)

    p = sub.add_parser("memory-study", help="train an MLP (digits or MNIST) with native / "
                                            "few-bit / inverted / PA activations, several seeds")
    p.add_argument("--seeds", type=seeds_arg, default=3, help="seeds 0..N-1")
    p.add_argument("--epochs", type=positive_int, default=30, help="epochs of each run")
    p.add_argument("--data", choices=["digits", "mnist"], default="digits",
                   help="sklearn digits (1,797) or the 5,000-image MNIST subset")
    p.add_argument("--png", type=output_file, metavar="PATH", default="out/memory_study.png",
                   help="loss-curve plot")
    p.set_defaults(run=run_study)


def _savefig(fig, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"wrote {path}")


def run_errors(args) -> int:
    from sim.memory_study import derivative_errors
    results = {}
    for act in args.activations:
        results[act] = derivative_errors(act, args.points)
        print(f"{act}: error of the backward derivative vs f'(x), {args.points} float32 points "
              f"on [-10, 10]  (L2 = sqrt(∫(g - f')² dx))")
        print(f"  {'variant':12} {'bits/elem':>9} {'L2':>10} {'L∞':>10}")
        for label, (l2, linf) in results[act].items():
            bits = label.split()[-1] if label.startswith("few-bit") else "1 + y"
            print(f"  {label:12} {bits:>9} {l2:10.3e} {linf:10.3e}")
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, len(results), figsize=(4.5 * len(results), 6), squeeze=False)
        for j, (act, res) in enumerate(results.items()):
            bits = [int(k.split()[-1]) for k in res if k.startswith("few-bit")]
            for i, name in enumerate(("L2", "L∞")):
                ax = axes[i, j]
                ax.semilogy(bits, [res[f"few-bit {b}"][i] for b in bits], "o-", label="few-bit")
                ax.axhline(res["InvAct fp32"][i], color="r", ls="--", label="InvAct (fp32 y)")
                ax.axhline(res["InvAct bf16"][i], color="m", ls=":", label="InvAct (bf16 y)")
                ax.set_xlabel("few-bit bits per element")
                ax.set_ylabel(f"{name} error of the derivative")
                if i == 0:
                    ax.set_title(act)
                ax.legend(fontsize=8)
        fig.tight_layout()
        _savefig(fig, args.png)
    return 0


def run_saved(args) -> int:
    from sim.memory_study import memory_cases, saved_memory
    for name, model, make_input, act_bytes in memory_cases(args.quick):
        t0 = time.perf_counter()
        res = saved_memory(model, make_input)
        base = res["native"].nbytes
        print(f"{name}: bytes kept for backward (parameters excluded); the native "
              f"activations' inputs are {act_bytes / 2**20:.2f} MiB  "
              f"({time.perf_counter() - t0:.0f} s)")
        print(f"  {'variant':10} {'saved MiB':>10} {'vs native':>10} {'Δ MiB':>9} "
              f"{'Δ / act. input':>14}")
        for label, s in res.items():
            d = s.nbytes - base
            print(f"  {label:10} {s.nbytes / 2**20:10.3f} {s.nbytes / base:10.3f} "
                  f"{d / 2**20:9.3f} {d / act_bytes:14.3f}")
    return 0


def run_study(args) -> int:
    import numpy as np

    from sim.memory_study import VARIANTS, train_mlp
    curves, rows = {}, {}
    t0 = time.perf_counter()
    for label, kwargs in VARIANTS.items():
        runs = [train_mlp(kwargs, seed, args.epochs, args.data) for seed in range(args.seeds)]
        curves[label] = np.array([r["train_loss"] for r in runs])
        rows[label] = (np.array([r["test_loss"] for r in runs]),
                       np.array([r["test_acc"] for r in runs]))
        print(f"  trained {label} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"{args.data} MLP (GELU, 2 x 128 hidden), Adam 3e-3, batch 64, {args.epochs} epochs, "
          f"{args.seeds} seeds: mean ± std over seeds")
    print(f"  {'variant':10} {'final train loss':>18} {'test loss':>18} {'test acc %':>16}")
    for label, (tl, acc) in rows.items():
        fl = curves[label][:, -1]
        print(f"  {label:10} {fl.mean():10.4f} ± {fl.std():.4f} {tl.mean():10.4f} ± "
              f"{tl.std():.4f} {100 * acc.mean():8.2f} ± {100 * acc.std():.2f}")
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, c in curves.items():
            ep = np.arange(1, c.shape[1] + 1)
            line, = ax.semilogy(ep, c.mean(0), label=label)
            ax.fill_between(ep, c.min(0), c.max(0), color=line.get_color(), alpha=0.15)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel("train loss (mean, min-max band over seeds)")
        ax.set_title(f"{args.data} MLP (GELU), {args.seeds} seeds")
        ax.legend(fontsize=8)
        _savefig(fig, args.png)
    return 0

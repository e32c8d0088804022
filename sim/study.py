"""Training studies: the paper's Tables 3 and 6 in miniature, over seeds, with statistics.

Kosson & Jaggi, Table 3 (sections 3.3-3.4): each op group piecewise affine alone, once
with exact and once with approximate derivatives, then the groups cumulatively with the
better kind for each.  Table 6 (Appendix D): PAM matmuls with input mantissas of 23, 7,
4, 3 and 2 bits against float32.  :func:`table3` and :func:`table6` define the rows;
``pamsim ablate``, ``pamsim sweep`` and ``pamsim study`` run them.

Every run is one JSON file (:class:`Runs`, through :func:`sim.train.cached_run`), so an
interrupted study resumes where it stopped and studies that share a run (the native
baseline, PAM float32 matmuls) train it once.  Each row is compared with native float32
by Welch's t-test over the seeds (:func:`welch_p`).
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import numpy as np

import emu
from sim import train as T

GROUPS = ("matmul", "softmax", "layernorm", "loss")     # the op groups with a backward pass
MANTISSAS = (23, 7, 4, 3, 2)


class Runs:
    """``runs(name, config)``: the runs of one row over ``specs`` (one per seed), each read
    from or written to ``root/<config>-<hash>-s<seed>.json``.  The file name depends on
    the configuration, not on the row's name, so rows of two studies that are the same
    run share the file."""

    def __init__(self, specs, root: Path, progress=False, log=print):
        self.specs, self.root, self.progress, self.log = list(specs), Path(root), progress, log
        self.trained = 0

    def path(self, spec, config) -> Path:
        what = "native" if config is None else config.describe()
        slug = re.sub(r"[^A-Za-z0-9]+", "-", what).strip("-")
        key = hashlib.sha256(T.run_key(spec.replace(seed=0), config).encode()).hexdigest()[:8]
        return self.root / f"{slug}-{key}-s{spec.seed}.json"

    def __call__(self, name, config) -> list:
        out = []
        key, label = T.metric_names(self.specs[0])
        for spec in self.specs:
            run, cached = T.cached_run(spec, config, name, self.path(spec, config),
                                       self.progress)
            run.name = name
            self.trained += not cached
            out.append(run)
            self.log(f"  seed {spec.seed} {name:26} {label} = {T.fmt_metric(key, run)}"
                     f"{' (cached)' if cached else f' ({run.seconds:.0f} s)'}")
        return out


def table3(runs, fmt=emu.float32, key="acc", mul="pam") -> tuple[dict, dict, dict]:
    """Table 3's rows through ``runs(name, config)``: returns (name -> runs, the better
    kind per group, group -> name of its cumulative row).  'better' compares the mean
    of ``key`` over seeds (higher is better for accuracy, lower for bits per char).
    ``mul``: the multiplier of every config (:func:`table3_configs` checks them all)."""
    import torch_bridge as tb
    up = T.higher_is_better(key)
    out = {"baseline": runs("baseline", None)}
    best = {}
    for op in GROUPS:
        for kind in ("exact", "approx"):
            out[f"{op} {kind}"] = runs(f"{op} {kind}", tb.PAMConfig(
                fmt, ops={op}, backward={op: kind}, mul=mul))
        ex, ap = (np.mean(values(key, out[f"{op} {k}"])) for k in ("exact", "approx"))
        best[op] = "exact" if (ex > ap if up else ex < ap) else "approx"   # NaN: approx
    out["optimizer"] = runs("optimizer", tb.PAMConfig(fmt, ops={"optimizer"}, mul=mul))
    cumulative = {}
    for i, op in enumerate(_ORDER):
        name = f"cumulative up to {op}"
        if i == 0:
            out[name] = out[f"matmul {best['matmul']}"]
        else:
            out[name] = runs(name, _cumulative(fmt, i, best, mul))
        cumulative[op] = name
    return out, best, cumulative


_ORDER = (*GROUPS, "optimizer")


def _cumulative(fmt, i, best, mul):
    """Table 3's cumulative config: the groups up to _ORDER[i], each with its better kind."""
    import torch_bridge as tb
    ops = set(_ORDER[:i + 1])
    return tb.PAMConfig(fmt, ops=ops, backward={g: best[g] for g in GROUPS if g in ops},
                        mul=mul)


def table3_configs(fmt=emu.float32, mul="pam") -> list:
    """Every config :func:`table3` may build with ``fmt`` and ``mul`` (each cumulative row
    with every choice of kinds), so that a refused one (PAMConfig's ValueError) stops a
    study before it trains."""
    import itertools

    import torch_bridge as tb
    out = [tb.PAMConfig(fmt, ops={op}, backward={op: kind}, mul=mul)
           for op in GROUPS for kind in ("exact", "approx")]
    out.append(tb.PAMConfig(fmt, ops={"optimizer"}, mul=mul))
    for kinds in itertools.product(("exact", "approx"), repeat=len(GROUPS)):
        out += [_cumulative(fmt, i, dict(zip(GROUPS, kinds)), mul) for i in range(1, len(_ORDER))]
    return out


def table6(runs, mantissas=MANTISSAS, exp_bits=8, ops=frozenset({"matmul"}),
           backward="approx", mx=(), mul="pam") -> list:
    """Table 6's rows through ``runs``: [(name, config, runs)], native float32 first, then
    PAM (or the multiplier ``mul``) with ``e<exp_bits>m<m>`` operands for each mantissa
    width (Appendix D: matmuls only, approximate derivatives, float32 accumulation), then
    with each OCP MX operand type in ``mx`` (e.g. "mxfp8_e4m3"; emu.mx)."""
    import torch_bridge as tb
    rows = [("float32 (native)", None, runs("float32 (native)", None))]
    name = "PAM" if str(mul) == "pam" else str(mul)
    for f in [f"e{exp_bits}m{m}" for m in mantissas] + list(mx):
        cfg = tb.PAMConfig(f, backward=backward, ops=ops, mul=mul)
        rows.append((f"{name} {cfg.fmt.name}", cfg, runs(f"{name} {cfg.fmt.name}", cfg)))
    return rows


#: the multipliers study's rows beside native float32 (issue 23, section 4)
MULTIPLIER_ROWS = ("exact", "pam", "lmul", "cpam2-unbiased")
#: its derivatives: approximate, exact for the loss (the paper's choice, sections 3.3-3.4)
MULTIPLIER_BACKWARD = {"loss": "exact"}


def multiplier_configs(fmt, ops, muls=MULTIPLIER_ROWS) -> tuple[list, list]:
    """The multipliers study's rows in one set-up (operand format ``fmt``, op groups
    ``ops``): ([(name, config)] of those PAMConfig takes, [(name, its ValueError's
    message)] of those it refuses)."""
    import torch_bridge as tb
    configs, refused = [], []
    for m in muls:
        try:
            configs.append((T.run_name(m), tb.PAMConfig(fmt, backward=MULTIPLIER_BACKWARD,
                                                        ops=ops, mul=m)))
        except ValueError as exc:
            refused.append((T.run_name(m), str(exc)))
    return configs, refused


def multipliers(runs, configs) -> list:
    """The rows of ``configs`` (:func:`multiplier_configs`) through ``runs``, native float32
    first: [(name, config, runs)]."""
    rows = [("float32 (native)", None, runs("float32 (native)", None))]
    return rows + [(name, cfg, runs(name, cfg)) for name, cfg in configs]


def multipliers_markdown(key: str, label: str, rows: list, facts: list) -> tuple[str, dict]:
    """The multipliers study of one set-up as markdown: per row the metric (mean ± sd over
    seeds), its change from native, Welch's p, the multiplier's error statistics and its
    cost per MAC (``facts``: sim.train.multiplier_facts per row); and the statistics."""
    unit = "points" if key == "acc" else "bits/char"
    d = 2 if key == "acc" else 4
    lines = [f"| row | {label} | change ({unit}) | p | resolved? | mean err | max abs err "
             "| MAC pJ | MAC energy | MAC area |", "|---|---|---|---|---|---|---|---|---|---|"]
    base = rows[0][2]
    stats = {}
    for i, ((name, _, runs), f) in enumerate(zip(rows, facts)):
        st = stats[name] = {**row_stats(key, runs, base), **f}
        p = st["p"]
        verdict = "" if i == 0 else "not resolved" if not p < 0.05 else (
            "better" if (st["delta"] > 0) == T.higher_is_better(key) else "worse")
        change = "" if i == 0 else f"{st['delta']:+.{d}f}"
        ptext = "" if i == 0 or not math.isfinite(p) else f"{p:.2g}"
        lines.append(f"| {name} | {st['mean']:.{d}f} ± {st['std']:.{d}f} | "
                     f"{change} | {ptext} | {verdict} | {100 * f['mean_err']:+.3f} % | "
                     f"{100 * f['max_err']:.3f} % | {f['mac_pj']:.3f} | "
                     f"{100 * f['energy_ratio']:.1f} % | {100 * f['area_ratio']:.1f} % |")
    return "\n".join(lines), stats


def plot_quality_vs_cost(key: str, label: str, panels: list, path: Path, title: str):
    """One panel per set-up (``panels``: [(title, rows, facts)]): each row's change from
    native (mean ± sd over seeds) against its MAC energy as % of the float multiplier's
    MAC in the same format."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    unit = " (points)" if key == "acc" else " (bits/char)"
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (ptitle, rows, facts) in zip(axes[0], panels):
        base = values(key, rows[0][2])
        ax.axhline(0, color="0.5", lw=1)
        for i, ((name, _, runs), f) in enumerate(zip(rows, facts)):
            if i == 0:
                continue
            v = values(key, runs) - np.nanmean(base)
            # PAM and L-Mul cost the same: markers tell overlapping points apart
            ax.errorbar([100 * f["energy_ratio"]], [np.nanmean(v)],
                        [np.nanstd(v, ddof=1) if len(v) > 1 else 0], fmt="osD^v"[(i - 1) % 5],
                        color=f"C{i - 1}", capsize=4, label=name, mfc="none" if i % 2 else None)
        ax.set_title(ptitle, fontsize=9)
        ax.set_xlabel("energy per MAC, % of the float-multiplier MAC (45 nm model)")
        ax.set_ylabel(f"change from native {label}{unit}")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def table6_configs(mantissas=MANTISSAS, exp_bits=8, ops=frozenset({"matmul"}),
                   backward="approx", mx=(), mul="pam") -> list:
    """Every config :func:`table6` builds, so that a refused one stops a study first."""
    import torch_bridge as tb
    return [tb.PAMConfig(f, backward=backward, ops=ops, mul=mul)
            for f in [f"e{exp_bits}m{m}" for m in mantissas] + list(mx)]


# --- statistics -----------------------------------------------------------------------

def values(key: str, runs) -> np.ndarray:
    """The final metric of each run (accuracy in %); a diverged run counts as NaN."""
    scale = 100 if key == "acc" else 1
    return np.array([scale * r.final.get(key, math.nan) if not r.diverged else math.nan
                     for r in runs], np.float64)


def welch_p(a, b) -> float:
    """Two-sided p of Welch's t-test (unequal variances) between two samples; NaN when
    it is undefined (fewer than two values, or both samples constant)."""
    from scipy import stats
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 2 or len(b) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return math.nan
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return 1.0 if a[0] == b[0] else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def row_stats(key: str, runs, base_runs) -> dict:
    """mean, std (ddof 1), change from the baseline's mean and Welch's p against it."""
    v, b = values(key, runs), values(key, base_runs)
    return {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
            "delta": float(np.mean(v) - np.mean(b)), "p": welch_p(v, b),
            "values": [float(x) for x in v]}


def cell(key: str, st: dict, base=True) -> str:
    """'mean ± std [change] (p)' in a table cell; the change and p only off baseline."""
    d = 2 if key == "acc" else 4
    text = f"{st['mean']:.{d}f} ± {st['std']:.{d}f}"
    if base:
        p = st["p"]
        text += f" [{st['delta']:+.{d}f}] p={p:.2g}" if math.isfinite(p) else \
            f" [{st['delta']:+.{d}f}]"
    return text


def converged(key: str, base_runs, epochs: int = 1) -> dict:
    """The native baseline's learning curve (mean over seeds per epoch) and how much it
    changed over its last ``epochs`` epochs: the evidence whether it has plateaued."""
    n = min(len(r.evals) for r in base_runs)
    scale = 100 if key == "acc" else 1
    curve = [float(np.mean([scale * r.evals[i][key] for r in base_runs])) for i in range(n)]
    k = min(epochs, n - 1)
    return {"curve": curve, "last_change": curve[-1] - curve[-1 - k] if k > 0 else math.nan,
            "over_epochs": k}


# --- plots ----------------------------------------------------------------------------

def plot_rows(spec, rows, path: Path, title: str):
    """Left: each row's final metric (mean ± std over seeds, seeds as dots) against the
    native band; right: the per-epoch metric (mean over seeds) of native and every row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    key, label = T.metric_names(spec)
    unit = " (%)" if key == "acc" else ""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2),
                                   gridspec_kw={"width_ratios": [1.3, 1]})
    base = values(key, rows[0][1])
    m, s = np.mean(base), np.std(base, ddof=1) if len(base) > 1 else 0.0
    ax1.axhspan(m - s, m + s, color="0.88", label="native float32 (mean ± std)")
    ax1.axhline(m, color="0.5", lw=1)
    for i, (name, runs) in enumerate(rows):
        v = values(key, runs)
        ax1.errorbar([i], [np.nanmean(v)], [np.nanstd(v, ddof=1) if len(v) > 1 else 0],
                     fmt="o", color="C0" if i else "0.3", capsize=4)
        ax1.plot(np.full(len(v), i) + 0.15, v, ".", color="C1", ms=4)
    ax1.set_xticks(range(len(rows)), [n for n, _ in rows], rotation=35, ha="right",
                   fontsize=8)
    ax1.set_ylabel(label + unit)
    ax1.legend(fontsize=8)
    colours = plt.get_cmap("tab20")           # 20 distinct colours: Table 3 has 14 rows
    for i, (name, runs) in enumerate(rows):
        n = min(len(r.evals) for r in runs)
        scale = 100 if key == "acc" else 1
        ax2.plot(range(1, n + 1), [np.mean([scale * r.evals[j][key] for r in runs])
                                   for j in range(n)],
                 color="k" if i == 0 else colours(i % 20), lw=2 if i == 0 else 1, label=name)
    ax2.set_xlabel("epoch")
    ax2.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax2.set_ylabel(label + unit + ", mean over seeds")
    ax2.legend(fontsize=6, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


# --- tables ---------------------------------------------------------------------------

def table3_markdown(key: str, got: dict, best: dict, cumulative: dict) -> tuple[str, dict]:
    """Table 3 as markdown (rows as in the paper) and its statistics per row."""
    base = got["baseline"]
    stats = {n: row_stats(key, r, base) for n, r in got.items()}
    lines = [f"Native float32: {cell(key, stats['baseline'], False)}.  Cells: mean ± std "
             f"over seeds [change from native] p = Welch's t-test against native; "
             f"* the better derivative, used cumulatively.\n",
             "| PA op(s) | exact bwd | approx bwd | cumulative |", "|---|---|---|---|"]
    for op in (*GROUPS, "optimizer"):
        if op == "optimizer":
            ex, ap = cell(key, stats["optimizer"]), "(no backward pass)"
        else:
            ex = cell(key, stats[f"{op} exact"]) + (" *" if best[op] == "exact" else "")
            ap = cell(key, stats[f"{op} approx"]) + (" *" if best[op] == "approx" else "")
        lines.append(f"| {op} | {ex} | {ap} | {cell(key, stats[cumulative[op]])} |")
    return "\n".join(lines), stats


def table6_markdown(key: str, label: str, rows: list) -> tuple[str, dict]:
    """Table 6 as markdown (one row per matmul type, the seeds' values) and statistics."""
    base = rows[0][2]
    lines = ["Cells: mean ± std over seeds [change from native] p = Welch's t-test "
             "against native.\n", f"| matmul type | {label} | seeds |", "|---|---|---|"]
    stats = {}
    for i, (name, _, runs) in enumerate(rows):
        st = stats[name] = row_stats(key, runs, base)
        vals = ", ".join(f"{v:.2f}" if key == "acc" else f"{v:.3f}" for v in st["values"])
        lines.append(f"| {name} | {cell(key, st, i > 0)} | {vals} |")
    return "\n".join(lines), stats

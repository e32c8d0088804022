"""How far piecewise-affine arithmetic is from the real thing, for a given format.

Statistics over a dense grid of operand pairs in [1, 2)² (PAM's error pattern repeats
every octave, Sec. 2.7), the multipliers' statistics (emu.multipliers.error_stats), and
the paper's Figure 2 heat map.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

import emu

_MAX_SIDE = 2048           # grid side: every mantissa up to 11 bits, evenly spaced beyond


@dataclass(frozen=True)
class ErrorStats:
    op: str
    measure: str           # "rel" (relative) or "abs" (absolute) error
    count: int
    min: float
    max: float
    mean: float            # the bias
    mean_abs: float
    rms: float
    worst_input: tuple
    left_out: dict = field(default_factory=dict)    # why -> how many inputs (RANGE_NOTES)

    @classmethod
    def of(cls, op, measure, err, inputs, left_out=None):
        err = np.asarray(err, np.float64)
        if not err.size:
            return cls(op, measure, 0, *[math.nan] * 5, (), left_out or {})
        i = int(np.argmax(np.abs(err)))
        return cls(op, measure, err.size, float(err.min()), float(err.max()), float(err.mean()),
                   float(np.abs(err).mean()), float(np.sqrt((err ** 2).mean())),
                   tuple(float(np.asarray(x).ravel()[i]) for x in inputs), left_out or {})


#: why an input is left out of the statistics: outside the format's normal range, PA
#: arithmetic flushes and overflows (docs/semantics.md section 3), which is range, not
#: the approximation error this report measures
RANGE_NOTES = {
    "operand": "operand outside the normal range: PA operations read subnormals as zero "
               "(log2/log give -inf, or -max without inf; sqrt gives 0)",
    "exact": "exact result outside the normal range: PA results flush to 0 below it and "
             "overflow above it",
    "pa": "PA result overflowed (or flushed to 0) although the exact result is in range",
}


def mantissa_grid(fmt) -> np.ndarray:
    """Values 1 + i/2^M of fmt in [1, 2): all of them, or 2048 evenly spaced ones."""
    fmt = emu.format(fmt)
    n = 1 << fmt.man_bits
    step = max(1, n // _MAX_SIDE)
    return (1 + np.arange(0, n, step) / n).astype(np.float32)


def _normal(fmt, v) -> np.ndarray:
    a = np.abs(v)
    return (a >= fmt.smallest_normal) & (a <= fmt.max)


def _row(fmt, op, measure, pa, exact, inputs, check) -> ErrorStats:
    """``op``'s error over ``inputs`` (arrays of fmt values): ``pa`` against ``exact``
    (float64), on the inputs whose operands (``check`` 'operand') or exact results
    ('exact') lie in fmt's normal range and whose PA result is finite (and, for a
    relative error, nonzero)."""
    keep = _normal(fmt, inputs[0]) if check == "operand" else np.ones(inputs[0].size, bool)
    want = exact(*(x[keep].astype(np.float64) for x in inputs))
    if check == "exact":
        keep[keep] = _normal(fmt, want)
        want = want[_normal(fmt, want)]
    left_out = {check: int(keep.size - keep.sum())}
    got = np.asarray(pa(*(x[keep] for x in inputs), fmt), np.float64)
    fine = np.isfinite(got) & ((got != 0) | (measure == "abs"))    # log2(1) = 0 is no flush
    left_out["pa"] = int(fine.size - fine.sum())
    kept = [x[keep][fine] for x in inputs]
    err = got[fine] / want[fine] - 1 if measure == "rel" else got[fine] - want[fine]
    return ErrorStats.of(op, measure, err, kept, {k: n for k, n in left_out.items() if n})


def error_report(fmt) -> list[ErrorStats]:
    """Error of every PA operation of emu in ``fmt`` against exact float64 arithmetic,
    over the inputs where both are normal numbers of ``fmt`` (:data:`RANGE_NOTES`)."""
    fmt = emu.format(fmt)
    m = mantissa_grid(fmt)
    xy = [v.ravel() for v in np.meshgrid(m, m, indexing="ij")]
    t = [emu.quantize(np.linspace(-8, 8, 40001, dtype=np.float32), fmt)]
    p = [emu.quantize(np.exp2(np.linspace(-8, 8, 40001)).astype(np.float32), fmt)]
    return [_row(fmt, "pam_mul", "rel", emu.pam_mul, np.multiply, xy, "exact"),
            _row(fmt, "pa_div", "rel", emu.pa_div, np.divide, xy, "exact"),
            _row(fmt, "pa_exp2", "rel", emu.pa_exp2, np.exp2, t, "exact"),
            _row(fmt, "pa_exp", "rel", emu.pa_exp, np.exp, t, "exact"),
            _row(fmt, "pa_log2", "abs", emu.pa_log2, np.log2, p, "operand"),
            _row(fmt, "pa_log", "abs", emu.pa_log, np.log, p, "operand"),
            _row(fmt, "pa_sqrt", "rel", emu.pa_sqrt, np.sqrt, p, "operand")]


def format_report(fmt, rows: list[ErrorStats]) -> str:
    fmt = emu.format(fmt)
    side = mantissa_grid(fmt).size
    lines = [f"Piecewise-affine error report: {fmt.name} (e{fmt.exp_bits}m{fmt.man_bits}, "
             f"bias {fmt.bias}, NaN policy {fmt.nan}); pam_mul/pa_div over {side}x{side} = "
             f"{side * side:,} operand pairs in [1,2)^2,",
             "exp2/exp over [-8, 8], log2/log/sqrt over [2^-8, 2^8] (40,001 points each)", "",
             f"{'op':9} {'error':5} {'min':>10} {'max':>10} {'mean(bias)':>11} {'mean|e|':>10} "
             f"{'rms':>10}  worst at"]
    for r in rows:
        if not r.count:
            lines.append(f"{r.op:9} {r.measure:5} undefined: every input is left out (below)")
            continue
        pct = r.measure == "rel"
        f = (lambda v: f"{100 * v:9.4f}%") if pct else (lambda v: f"{v:10.5f}")
        lines.append(f"{r.op:9} {r.measure:5} {f(r.min)} {f(r.max)} {f(r.mean):>11} "
                     f"{f(r.mean_abs)} {f(r.rms)}  {', '.join(f'{v:g}' for v in r.worst_input)}")
    notes = [f"  {r.op}: {n:,} of {r.count + sum(r.left_out.values()):,}: {RANGE_NOTES[why]}"
             for r in rows for why, n in r.left_out.items()]
    if notes:
        lines += ["", f"Left out of the statistics ({fmt.name}'s normal range is "
                      f"[{fmt.smallest_normal:g}, {fmt.max:g}]; docs/semantics.md section 3):",
                  *notes]
    worst = rows[0]
    lines += ["", f"PAM worst case {worst.worst_input[0]:g} x {worst.worst_input[1]:g}: relative error "
              f"{100 * worst.min:.4f}% (paper, Sec. 2.7: -1/9 = -11.1111% at M_a = M_b = 0.5); "
              f"PAM never overestimates (max {100 * worst.max:.4f}%)."]
    return "\n".join(lines)


def multiplier_report(fmt, muls) -> list:
    """emu.multipliers.error_stats of each multiplier in ``fmt``."""
    from emu.multipliers import error_stats
    return [error_stats(m, fmt) for m in muls]


def format_multipliers(fmt, rows) -> str:
    fmt = emu.format(fmt)
    how = (f"every pair of normal mantissas ({rows[0].pairs:,} pairs)" if rows[0].exhaustive
           else f"{rows[0].pairs:,} random pairs of normal mantissas")
    lines = [f"Multiplier error report: {fmt.name} (e{fmt.exp_bits}m{fmt.man_bits}); relative "
             f"error over {how},", "operands in [1,2): a product away from the range ends has "
             "the same error (docs/semantics.md, Multipliers)", "",
             f"{'multiplier':16} {'mean(bias)':>11} {'min':>10} {'max':>10} {'max|e|':>10} "
             f"{'rms':>10}"]
    for r in rows:
        lines.append(f"{r.mul:16} " + " ".join(f"{100 * v:9.4f}%" for v in
                                               (r.mean, r.min, r.max, r.max_abs, r.rms)))
    return "\n".join(lines)


def figure2(fmt, path, mul="pam") -> None:
    """The paper's Figure 2 for ``fmt``: the product of the multiplier ``mul`` (a name of
    emu.multiplier), the exact product, relative error (%)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fmt = emu.format(fmt)
    m = mantissa_grid(fmt)
    if m.size > 512:
        m = m[:: m.size // 512]
    x, y = np.meshgrid(m, m, indexing="ij")
    pam = emu.mul(x, y, fmt, mul).astype(np.float64)
    name = "PAM" if str(emu.multiplier(mul)) == "pam" else str(emu.multiplier(mul))
    exact = x.astype(np.float64) * y
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    extent = (1, 2, 1, 2)
    for ax, data, title, cmap in [(axes[0], pam, f"{name}  $x_1 \\hat{{\\cdot}} x_2$", "viridis"),
                                  (axes[1], exact, "exact  $x_1 x_2$", "viridis"),
                                  (axes[2], 100 * (pam / exact - 1), "relative error [%]", "magma")]:
        im = ax.imshow(data.T, origin="lower", extent=extent, cmap=cmap, aspect="equal")
        ax.set_title(title)
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
        fig.colorbar(im, ax=ax, shrink=0.85)
    fig.suptitle(f"Multiplier {name} in {fmt.name} on [1, 2]$^2$ "
                 "(Kosson & Jaggi, Fig. 2)")
    fig.savefig(path, dpi=110, bbox_inches="tight")     # the x_1 labels lie below the axes box
    plt.close(fig)

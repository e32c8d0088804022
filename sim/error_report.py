"""How far piecewise-affine arithmetic is from the real thing, for a given format.

Statistics over a dense grid of operand pairs in [1, 2)² (PAM's error pattern repeats
every octave, Sec. 2.7), and the paper's Figure 2 heat map.
"""
from __future__ import annotations

from dataclasses import dataclass

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

    @classmethod
    def of(cls, op, measure, err, inputs):
        err = np.asarray(err, np.float64)
        i = int(np.argmax(np.abs(err)))
        return cls(op, measure, err.size, float(err.min()), float(err.max()), float(err.mean()),
                   float(np.abs(err).mean()), float(np.sqrt((err ** 2).mean())),
                   tuple(float(np.asarray(x).ravel()[i]) for x in inputs))


def mantissa_grid(fmt) -> np.ndarray:
    """Values 1 + i/2^M of fmt in [1, 2): all of them, or 2048 evenly spaced ones."""
    fmt = emu.format(fmt)
    n = 1 << fmt.man_bits
    step = max(1, n // _MAX_SIDE)
    return (1 + np.arange(0, n, step) / n).astype(np.float32)


def error_report(fmt) -> list[ErrorStats]:
    """Error of every PA operation of emu in ``fmt`` against exact float64 arithmetic."""
    fmt = emu.format(fmt)
    m = mantissa_grid(fmt)
    x, y = (v.ravel() for v in np.meshgrid(m, m, indexing="ij"))
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    rows = [
        ErrorStats.of("pam_mul", "rel", emu.pam_mul(x, y, fmt) / (xd * yd) - 1, (x, y)),
        ErrorStats.of("pa_div", "rel", emu.pa_div(x, y, fmt) / (xd / yd) - 1, (x, y)),
    ]
    t = emu.quantize(np.linspace(-8, 8, 40001, dtype=np.float32), fmt)
    rows.append(ErrorStats.of("pa_exp2", "rel", emu.pa_exp2(t, fmt) / np.exp2(t.astype(np.float64)) - 1, (t,)))
    rows.append(ErrorStats.of("pa_exp", "rel", emu.pa_exp(t, fmt) / np.exp(t.astype(np.float64)) - 1, (t,)))
    p = emu.quantize(np.exp2(np.linspace(-8, 8, 40001)).astype(np.float32), fmt)
    pd = p.astype(np.float64)
    rows.append(ErrorStats.of("pa_log2", "abs", emu.pa_log2(p, fmt) - np.log2(pd), (p,)))
    rows.append(ErrorStats.of("pa_log", "abs", emu.pa_log(p, fmt) - np.log(pd), (p,)))
    rows.append(ErrorStats.of("pa_sqrt", "rel", emu.pa_sqrt(p, fmt) / np.sqrt(pd) - 1, (p,)))
    return rows


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
        pct = r.measure == "rel"
        f = (lambda v: f"{100 * v:9.4f}%") if pct else (lambda v: f"{v:10.5f}")
        lines.append(f"{r.op:9} {r.measure:5} {f(r.min)} {f(r.max)} {f(r.mean):>11} "
                     f"{f(r.mean_abs)} {f(r.rms)}  {', '.join(f'{v:g}' for v in r.worst_input)}")
    worst = rows[0]
    lines += ["", f"PAM worst case {worst.worst_input[0]:g} x {worst.worst_input[1]:g}: relative error "
              f"{100 * worst.min:.4f}% (paper, Sec. 2.7: -1/9 = -11.1111% at M_a = M_b = 0.5); "
              f"PAM never overestimates (max {100 * worst.max:.4f}%)."]
    return "\n".join(lines)


def figure2(fmt, path) -> None:
    """The paper's Figure 2 for ``fmt``: PAM product, exact product, relative error (%)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fmt = emu.format(fmt)
    m = mantissa_grid(fmt)
    if m.size > 512:
        m = m[:: m.size // 512]
    x, y = np.meshgrid(m, m, indexing="ij")
    pam = emu.pam_mul(x, y, fmt).astype(np.float64)
    exact = x.astype(np.float64) * y
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    extent = (1, 2, 1, 2)
    for ax, data, title, cmap in [(axes[0], pam, "PAM  $x_1 \\hat{\\cdot} x_2$", "viridis"),
                                  (axes[1], exact, "exact  $x_1 x_2$", "viridis"),
                                  (axes[2], 100 * (pam / exact - 1), "relative error [%]", "magma")]:
        im = ax.imshow(data.T, origin="lower", extent=extent, cmap=cmap, aspect="equal")
        ax.set_title(title)
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
        fig.colorbar(im, ax=ax, shrink=0.85)
    fig.suptitle(f"Piecewise affine multiplication in {fmt.name} on [1, 2]$^2$ "
                 "(Kosson & Jaggi, Fig. 2)")
    fig.savefig(path, dpi=110)
    plt.close(fig)

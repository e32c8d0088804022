"""Text tables and the bar chart printed by ``pamsim cost`` and ``pamsim fpga``."""
from __future__ import annotations

import emu

from . import analytic as A

__all__ = ["op_table", "format_table", "multiplier_table", "step_table", "plot_step", "compare_table",
           "TABLE_FORMATS"]

#: Formats of the all-formats table (plus the requested one if it is not among them).
TABLE_FORMATS = ("float32", "bfloat16", "float16", "e8m4", "float8_e5m2", "float8_e4m3fn")


def _pct(x: float) -> str:
    return f"{100 * x:6.2f} %"


def op_table(fmt, acc, rule: str = "paper") -> str:
    """Appendix B check, per-operation costs and multiply-only / per-MAC savings."""
    fmt = emu.format(fmt)
    acc = emu.format(acc, argname="acc")
    out = ["45 nm, 0.9 V model: Horowitz (ISSCC 2014) via Kosson & Jaggi Table 4 "
           "(costs/data/ops45nm.csv);",
           "other widths/formats by the scaling laws of docs/costs.md.", "",
           f"{'Appendix B, recomputed from the table':<52}{'energy':>9}{'area':>10}   paper"]
    for c in A.appendix_b():
        out.append(f"  {c.what:<50}{_pct(c.energy)}{_pct(c.area):>10}   "
                   f"{c.paper_energy_pct:g} % / {c.paper_area_pct:g} %")
    s = A.savings_rows(fmt, acc, rule)
    other = "adders" if rule == "paper" else "paper"
    alt = A.pam_mul(fmt, other)
    rule_txt = {"paper": f"2 x int{fmt.width} add", "adders":
                f"int{fmt.exp_bits + fmt.man_bits} + int{fmt.exp_bits} add"}
    rows = [(f"float multiply {fmt.name} (e{fmt.exp_bits}m{fmt.man_bits})", s["fp_mul"]),
            (f"PAM {fmt.name}, rule '{rule}' ({rule_txt[rule]})", s["pam_mul"]),
            (f"PAM {fmt.name}, rule '{other}' ({rule_txt[other]})", alt),
            (f"PA division {fmt.name} (as PAM, eq. 9)", A.pa_div(fmt, rule)),
            (f"float add {fmt.name}", A.fp_add(fmt)),
            (f"float add {acc.name} (accumulator)", s["acc_add"]),
            (f"float MAC: {fmt.name} multiply + {acc.name} add", s["float_mac"]),
            (f"PAM MAC: PAM {fmt.name} + {acc.name} add", s["pam_mac"])]
    out += ["", f"{'Per operation':<52}{'energy pJ':>10}{'area um2':>11}"]
    out += [f"  {name:<50}{c.energy_pj:10.4f}{c.area_um2:11.1f}" for name, c in rows]
    me, ma = s["mul_ratio"]
    ce, ca = s["mac_ratio"]
    share = s["acc_add"].energy_pj / s["pam_mac"].energy_pj
    out += ["",
            f"Multiply only: PAM = {_pct(me).strip()} of the float multiply's energy "
            f"({1 / me:.1f}x less), {_pct(ma).strip()} of its area ({1 / ma:.1f}x less)",
            f"Per MAC ({acc.name} accumulate): PAM MAC = {_pct(ce).strip()} of the float "
            f"MAC's energy ({1 / ce:.2f}x less), {_pct(ca).strip()} of its area "
            f"({1 / ca:.2f}x less);",
            f"  the {acc.name} accumulator is {100 * share:.0f} % of the PAM MAC's energy."]
    return "\n".join(out)


def format_table(acc, rule: str = "paper", extra=None) -> str:
    """Multiply-only and per-MAC savings for a range of formats."""
    acc = emu.format(acc, argname="acc")
    fmts = [emu.format(f) for f in TABLE_FORMATS]
    if extra is not None and emu.format(extra) not in fmts:
        fmts.append(emu.format(extra))
    head = (f"{'format':<15}{'fmul pJ':>9}{'PAM pJ':>8}{'fmul um2':>10}{'PAM um2':>9}"
            f" | {'mul-only energy':>15}{'area':>9} | {'per-MAC energy':>14}{'area':>9}")
    out = [f"All formats: PAM (rule '{rule}') vs IEEE multiply; MACs accumulate in {acc.name}",
           head, "-" * len(head)]
    for f in fmts:
        s = A.savings_rows(f, acc, rule)
        out.append(f"{f.name:<15}{s['fp_mul'].energy_pj:9.3f}{s['pam_mul'].energy_pj:8.3f}"
                   f"{s['fp_mul'].area_um2:10.0f}{s['pam_mul'].area_um2:9.0f}"
                   f" | {_pct(s['mul_ratio'][0]):>15}{_pct(s['mul_ratio'][1]):>9}"
                   f" | {_pct(s['mac_ratio'][0]):>14}{_pct(s['mac_ratio'][1]):>9}")
    return "\n".join(out)


def multiplier_table(fmt, acc, muls, rule: str = "paper") -> str:
    """The multiply and the MAC of each multiplier in ``muls`` (emu.multiplier names or
    objects) in ``fmt``, accumulating in ``acc``, against the float multiplier's MAC; a
    corrected PAM without a table for ``fmt`` gets a line saying so."""
    fmt = emu.format(fmt)
    acc = emu.format(acc, argname="acc")
    base = A.mac(fmt, acc, "float", rule)
    w = max([16, *(len(str(m)) + 1 for m in muls)])       # a table's name can be long
    head = (f"{'multiplier':<{w}}{'mul pJ':>8}{'mul um2':>10}{'MAC pJ':>9}{'MAC um2':>10}"
            f" | {'MAC energy':>11}{'area':>11}")
    out = [f"Per MAC by multiplier: {fmt.name} operands, {acc.name} accumulator, against the "
           f"float multiplier's MAC (PAM rule '{rule}'; docs/costs.md)", head, "-" * len(head)]
    for m in muls:
        try:
            c, mc = A.mul_cost(m, fmt, rule), A.mac(fmt, acc, m, rule)
        except ValueError as exc:
            out.append(f"{str(m):<{w}}n/a: {exc}")
            continue
        e, a = mc.ratio(base)
        out.append(f"{str(m):<{w}}{c.energy_pj:8.4f}{c.area_um2:10.1f}{mc.energy_pj:9.4f}"
                   f"{mc.area_um2:10.1f} | {_pct(e):>11}{_pct(a):>11}")
    return "\n".join(out)


def _si(n: float) -> str:
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suf}"
    return f"{n:.3g}"


def step_table(title: str, counts, energies, memory: str, rule: str) -> str:
    """Op counts per phase and the energy of one step per scenario."""
    phases = ("forward", "backward", "optimizer")
    out = [title, "",
           f"{'counts (PyTorch FlopCounterMode + decomposed dispatch)':<56}"
           + "".join(f"{p:>11}" for p in phases) + f"{'total':>11}",
           f"  {'MACs (matmul, conv)':<54}" + "".join(f"{_si(counts.macs.get(p, 0)):>11}"
                                                     for p in phases)
           + f"{_si(counts.total_macs):>11}"]
    names = {"mul": "elementwise multiplies", "div": "elementwise divisions",
             "add": "elementwise adds/subs/sum terms", "special":
             "exp/log/sqrt/erf/tanh (not priced)", "compare": "compare/select/max (not priced)"}
    for kind, label in names.items():
        out.append(f"  {label:<54}" + "".join(
            f"{_si(counts.ops.get(p, {}).get(kind, 0)):>11}" for p in phases)
            + f"{_si(counts.total_ops(kind)):>11}")
    out.append(f"  activations saved for backward: {counts.saved_bytes:,} bytes "
               f"(float32 run; {counts.params:,} trainable parameters)")
    if counts.unclassified:
        out.append(f"  UNCLASSIFIED ops (elements): {counts.unclassified}")
    pjb = A.memory_pj_per_byte(memory)
    base = energies[0].total_pj
    out += ["", f"Energy per step: 45 nm model (PAM rule '{rule}'); activation traffic = "
                f"saved bytes written + read at {pjb:g} pJ/byte ({memory}, Horowitz ISSCC 2014)",
            f"{'scenario':<24}{'multiply uJ':>12}{'accumulate uJ':>14}{'act. memory uJ':>15}"
            f"{'total uJ':>11}{'vs fp32':>9}{'arith. vs fp32':>16}"]
    base_arith = energies[0].multiply_pj + energies[0].accumulate_pj
    for e in energies:
        arith = e.multiply_pj + e.accumulate_pj
        out.append(f"{e.scenario.name:<24}{e.multiply_pj / 1e6:12.2f}{e.accumulate_pj / 1e6:14.2f}"
                   f"{e.memory_pj / 1e6:15.2f}{e.total_pj / 1e6:11.2f}"
                   f"{_pct(e.total_pj / base):>9}{_pct(arith / base_arith):>16}")
    return "\n".join(out)


def plot_step(title: str, energies, path) -> None:
    """Stacked bars (multiply, accumulate, activation memory) per scenario, and the
    arithmetic alone on a second panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [e.scenario.name for e in energies]
    parts = [("multiply", [e.multiply_pj / 1e6 for e in energies], "#c44e52"),
             ("accumulate", [e.accumulate_pj / 1e6 for e in energies], "#4c72b0"),
             ("activation memory", [e.memory_pj / 1e6 for e in energies], "#8c8c8c")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, use in ((axes[0], parts), (axes[1], parts[:2])):
        bottom = [0.0] * len(names)
        for label, vals, color in use:
            ax.bar(names, vals, bottom=bottom, label=label, color=color)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("energy per training step [µJ]")
        ax.tick_params(axis="x", labelrotation=15)
        ax.legend()
    axes[0].set_title("arithmetic + activation traffic")
    axes[1].set_title("arithmetic only")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare_table(rows: list[dict]) -> str:
    """``costs.units.compare`` rows as text."""
    head = (f"{'format':<15}{'target':<8}{'PAM mul logic':>14}{'fmul logic':>11}"
            f"{'fmul DSP':>9}{'PAM MACs/dev':>13}{'float MACs/dev':>15}{'PAM GMAC/s':>11}"
            f"{'float GMAC/s':>13}  float MAC")
    out = [head, "-" * len(head)]
    for r in rows:
        def g(k, fmt="{:,}"):
            v = r.get(k)
            return "-" if v is None else fmt.format(v)
        out.append(f"{r['fmt']:<15}{r['target']:<8}{g('mul_logic'):>14}{g('fmul_logic'):>11}"
                   f"{g('fmul_dsps'):>9}{g('mac_fit'):>13}{g('fmac_fit'):>15}"
                   f"{g('mac_gops', '{:.2f}'):>11}{g('fmac_gops', '{:.2f}'):>13}"
                   f"  {r.get('fmac_source', '-')}")
    return "\n".join(out)

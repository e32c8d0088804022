"""``pamsim cost``: energy/area per operation and per MAC (45 nm model), or the energy
of one training step of a model (op counts from PyTorch, bar chart PNG)."""
import argparse
import json

import emu
from sim.cli import fail, format_arg, int_in, multiplier_arg, output_file


def multipliers_arg(text: str) -> list:
    """argparse type: 'all' (every member of emu.MULTIPLIERS) or comma-separated
    multiplier names."""
    import argparse
    if text == "all":
        return list(emu.MULTIPLIERS.values())
    muls = [multiplier_arg(t.strip()) for t in text.split(",") if t.strip()]
    if not muls:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected 'all' or comma-separated "
                                         "multipliers, e.g. pam,lmul,exact")
    return muls


def register(sub):
    from costs.analytic import MEMORY_LEVELS, PAM_RULES
    from costs.step import step_models
    from sim.train import MAX_BATCH
    p = sub.add_parser("cost", help="energy/area of PAM vs float per op and per MAC, or per "
                                    "training step of a model (--model)")
    p.add_argument("--fmt", type=format_arg, default=emu.bfloat16,
                   help="multiply format, e.g. bf16, float32, fp16, e8m4, e4m3fn")
    p.add_argument("--acc", type=format_arg, default=emu.float32,
                   help="accumulator format of a MAC")
    p.add_argument("--rule", choices=PAM_RULES, default="paper",
                   help="how PAM is priced: 'paper' = 2 full-width int adds (App. B), "
                        "'adders' = (E+M)-bit + E-bit int adds only")
    p.add_argument("--mul", type=multipliers_arg, default="all",
                   help="multipliers of the per-MAC table by multiplier: 'all' (every member "
                        "of emu.MULTIPLIERS) or names such as pam,lmul,pam+3,cpam2-unbiased")
    p.add_argument("--model", choices=step_models(),
                   help="price one training step (forward+backward+AdamW) of this model")
    p.add_argument("--batch", type=int_in(1, MAX_BATCH), default=32,
                   help=f"batch size for --model, at most {MAX_BATCH}")
    p.add_argument("--memory", choices=MEMORY_LEVELS, default="dram",
                   help="where saved activations live, for their pJ/byte")
    p.add_argument("--png", type=output_file,
                   help="bar chart path for --model (if not given: out/cost_<model>.png)")
    p.add_argument("--json", type=output_file, help="also write the numbers as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from costs import analytic, report
    if args.model is None and args.png:
        return fail(args, f"--png {str(args.png)!r} needs --model (the bar chart is of a "
                          "model's training step)")
    if args.model is not None and args.mul != list(emu.MULTIPLIERS.values()):
        return fail(args, "--mul prices the per-MAC table by multiplier, which --model "
                          "does not print (a training step's scenarios are PAM and float)")
    if args.model is None:
        print(report.op_table(args.fmt, args.acc, args.rule))
        print()
        print(report.format_table(args.acc, args.rule, extra=args.fmt))
        print()
        print(report.multiplier_table(args.fmt, args.acc, args.mul, args.rule))
        if args.json:
            s = analytic.savings_rows(args.fmt, args.acc, args.rule)
            data = {k: (v.__dict__ if isinstance(v, analytic.Cost) else
                        v.name if isinstance(v, emu.Format) else v) for k, v in s.items()}
            data["appendix_b"] = [c.__dict__ for c in analytic.appendix_b()]
            data["multipliers"] = _mul_rows(args)
            _write_json(args.json, data)
        return 0
    try:
        png = args.png or output_file(f"out/cost_{args.model}.png")
    except argparse.ArgumentTypeError as exc:
        return fail(args, f"--png (default): {exc}")
    from costs.step import count_step, model_step, scenarios, step_energy
    model, loss_fn = model_step(args.model, args.batch)
    counts = count_step(model, loss_fn)
    energies = [step_energy(counts, s, rule=args.rule, memory=args.memory)
                for s in scenarios(args.fmt, args.acc)]
    title = (f"One training step of {args.model} (batch {args.batch}): forward + backward + "
             f"AdamW; matmuls in {args.fmt.name}, accumulate in {args.acc.name}")
    print(report.step_table(title, counts, energies, args.memory, args.rule))
    png.parent.mkdir(parents=True, exist_ok=True)
    report.plot_step(title, energies, png)
    print(f"\nBar chart written to {png}")
    if args.json:
        _write_json(args.json, {
            "model": args.model, "batch": args.batch, "macs": counts.macs, "ops": counts.ops,
            "saved_bytes": counts.saved_bytes, "params": counts.params,
            "pj_per_byte": analytic.memory_pj_per_byte(args.memory),
            "scenarios": [{"name": e.scenario.name, "multiply_pj": e.multiply_pj,
                           "accumulate_pj": e.accumulate_pj, "memory_pj": e.memory_pj,
                           "activation_bytes": e.activation_bytes, "total_pj": e.total_pj}
                          for e in energies]})
    return 0


def _mul_rows(args) -> list:
    """The per-MAC table by multiplier as JSON rows (null costs where a table does not
    fit the format)."""
    from costs import analytic
    base = analytic.mac(args.fmt, args.acc, "float", args.rule)
    rows = []
    for m in args.mul:
        try:
            c, mc = (analytic.mul_cost(m, args.fmt, args.rule),
                     analytic.mac(args.fmt, args.acc, m, args.rule))
        except ValueError as exc:
            rows.append({"mul": str(m), "error": str(exc)})
            continue
        rows.append({"mul": str(m), "mul_cost": c.__dict__, "mac": mc.__dict__,
                     "mac_ratio": mc.ratio(base)})
    return rows


def _write_json(path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))

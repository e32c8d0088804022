"""``pamsim verilog``: synthesizable Verilog of an rtl unit (rtl.make_unit + rtl.verilog)."""
import sys

import emu
from sim.cli import format_arg, output_file, positive_int


def register(sub):
    import rtl
    units = ", ".join(f"{k} ({u.description})" for k, u in rtl.UNITS.items())
    p = sub.add_parser("verilog", help="write synthesizable Verilog of an rtl unit",
                       description=f"Units: {units}.")
    p.add_argument("--unit", required=True, choices=sorted(rtl.UNITS), help="which unit")
    p.add_argument("--fmt", type=format_arg, default=emu.bfloat16,
                   help="operand format, e.g. bf16, float32, e4m3fn")
    p.add_argument("--acc", type=format_arg, help="accumulation format of mac/array (default float32)")
    p.add_argument("--stages", type=positive_int, help="pipeline stages of mac/array, 1-3 (default 2)")
    p.add_argument("--mul", help="multiplier of mul/mac/array, a name of emu's registry: "
                                 f"{'/'.join(_muls())} (default pam)")
    p.add_argument("--rows", type=positive_int, help="array rows (default 4)")
    p.add_argument("--cols", type=positive_int, help="array columns (default 4)")
    p.add_argument("--name", help="Verilog module name (if not given: from the unit and "
                                  "formats)")
    p.add_argument("-o", "--output", type=output_file,
                   help="output file (if not given: standard output)")
    p.set_defaults(run=run)


def _muls():
    from rtl.mac import PAMMac
    return PAMMac.MULTIPLIERS


def run(args) -> int:
    import rtl
    try:
        unit = rtl.make_unit(args.unit, args.fmt, acc=args.acc, stages=args.stages,
                             rows=args.rows, cols=args.cols, mul=args.mul)
        text = rtl.verilog(unit, args.name)
    except (ValueError, TypeError) as exc:
        print(f"pamsim verilog: error: {exc}", file=sys.stderr)
        return 2
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"module {args.name or unit.module_name} ({args.unit}, {args.fmt.name}) "
              f"written to {args.output}")
    else:
        sys.stdout.write(text)
    return 0

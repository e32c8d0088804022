"""``pamsim error``: error statistics of the PA operations and the paper's Figure 2; with
``--mul``, of the multipliers (emu.multipliers.error_stats)."""
import json

import emu
from sim.cli import fail, format_arg, mul_arg, output_file


def register(sub):
    p = sub.add_parser("error", help="error of PAM and the PA operations vs exact arithmetic")
    p.add_argument("--fmt", type=format_arg, default=emu.bfloat16,
                   help="number format, e.g. bf16, float32, e8m4, e4m3fn")
    p.add_argument("--mul", type=mul_arg, nargs="+",
                   help="report these multipliers instead (pam, lmul, lmul+3, exact, float, "
                        "cpam2-unbiased, cpam1:0,1,1,0, ...; all: every named one): bias, "
                        "max and RMS relative error over every pair of normal mantissas")
    p.add_argument("--png", type=output_file,
                   help="write the paper's Figure 2 heat map to this PNG (with --mul: of the "
                        "one multiplier given)")
    p.add_argument("--json", type=output_file, help="also write the statistics as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from sim.error_report import error_report, figure2, format_multipliers, format_report
    muls = []
    for m in args.mul or []:
        if m == "all":
            muls += [x for x in emu.MULTIPLIERS.values() if _why_not(x, args.fmt) is None]
        elif _why_not(m, args.fmt):
            return fail(args, f"argument --mul: {_why_not(m, args.fmt)}")
        else:
            muls.append(m)
    if args.png and len(muls) > 1:
        return fail(args, f"--png draws one multiplier's heat map; got --mul with {len(muls)}")
    if muls:
        from sim.error_report import multiplier_report
        rows = multiplier_report(args.fmt, muls)
        print(format_multipliers(args.fmt, rows))
    else:
        rows = error_report(args.fmt)
        print(format_report(args.fmt, rows))
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        figure2(args.fmt, args.png, muls[0] if muls else "pam")
        print(f"\nFigure 2 heat map written to {args.png}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r._asdict() if muls else r.__dict__ for r in rows],
                                        indent=2))
    return 0


def _why_not(m, fmt) -> str | None:
    """Why multiplier ``m`` is not defined in ``fmt`` (a corrected PAM needs a table for
    its mantissa width), or None."""
    try:
        m.params(fmt)
    except ValueError as exc:
        return str(exc)
    return None

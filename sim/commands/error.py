"""``pamsim error``: error statistics of the PA operations and the paper's Figure 2."""
import json

import emu
from sim.cli import format_arg, output_file


def register(sub):
    p = sub.add_parser("error", help="error of PAM and the PA operations vs exact arithmetic")
    p.add_argument("--fmt", type=format_arg, default=emu.bfloat16,
                   help="number format, e.g. bf16, float32, e8m4, e4m3fn")
    p.add_argument("--png", type=output_file,
                   help="write the paper's Figure 2 heat map to this PNG")
    p.add_argument("--json", type=output_file, help="also write the statistics as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from sim.error_report import error_report, figure2, format_report
    rows = error_report(args.fmt)
    print(format_report(args.fmt, rows))
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        figure2(args.fmt, args.png)
        print(f"\nFigure 2 heat map written to {args.png}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    return 0

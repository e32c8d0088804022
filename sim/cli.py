"""The ``pamsim`` command line.  Bare ``pamsim`` runs the main job on its default."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import emu


def _fmt(text: str):
    try:
        return emu.format(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_error(args) -> int:
    from .error_report import error_report, figure2, format_report
    rows = error_report(args.fmt)
    print(format_report(args.fmt, rows))
    if args.png:
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        figure2(args.fmt, args.png)
        print(f"\nFigure 2 heat map written to {args.png}")
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    return 0


def _cmd_bench(args) -> int:
    from . import bench
    rows = bench.run(quick=args.quick, only=args.only)
    print(bench.format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(
            [dict(r.__dict__, ratio=r.ratio) for r in rows], indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pamsim",
        description="Bit-accurate emulation of piecewise-affine arithmetic. Without a "
                    "command, runs the main job on its default (the bfloat16 error report).")
    sub = p.add_subparsers(dest="command", metavar="command")

    e = sub.add_parser("error", help="error of PAM and the PA operations vs exact arithmetic")
    e.add_argument("--fmt", type=_fmt, default=emu.bfloat16,
                   help="number format, e.g. bf16, float32, e8m4, e4m3fn (default bf16)")
    e.add_argument("--png", help="write the paper's Figure 2 heat map to this PNG")
    e.add_argument("--json", help="also write the statistics as JSON")
    e.set_defaults(run=_cmd_error)

    b = sub.add_parser("bench", help="speed ratios against baselines measured in the same run")
    b.add_argument("--quick", action="store_true", help="small sizes (seconds, for CI)")
    b.add_argument("--only", nargs="+", metavar="CASE", help="run only these case groups")
    b.add_argument("--json", help="also write the rows as JSON")
    b.set_defaults(run=_cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["error", "--png", "out/pam_error_bf16.png"])
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
